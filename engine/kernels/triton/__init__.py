"""Hand-written Triton kernels; each file: a kernel, its checked wrapper and a torch `_reference`.

Kernel Levels (L4):
- `attention.attention`: flash-attention forward (online softmax, causal block skipping, autotuned tiles; TMA on
  Hopper); on Hopper it times it once per shape against `attention_ws` (the same forward in Gluon, warp-specialised)
  and keeps the faster.
- `patch_embed.patch_embed`: ViT patch embedding as one GEMM with im2col inside the A-tile loads, bias + pos (+ the cls
  row) in the epilogue.
- `message_passing.message_passing`: out[d] = sum/mean of w_e * x[src_e] over the edges into d; a segment reduce over
  CSR (no atomics); unsorted edges are linked into one list per destination on the device by default (or bucketed
  into a CSR, or scattered with fp32 atomics); `csr_from_edges` builds the CSR.

The LLM decode step:
- `gemv`: the one-row products (with the RMSNorm, SwiGLU or residual fused) and `FusedDecodeOps`, which sends each
  product to cuBLAS or the Triton GEMV, whichever is faster for its shape and fusion.
- `quant_gemv`: the same products over int8 / fp8 / int4 codes, and the quantized prefill's dequantization.
- `decode_attention`: flash-decoding over the KV cache, with RoPE and the cache write fused.
- `argmax`: the next token, written in place into the decoder's token buffer.

The triton mode: `mlp` (the house-price MLP's training step). `_common`: interpreter detection, PDL, launch caching.

Import the functions from their modules (`from engine.kernels.triton.attention import attention`): this package does
not re-export them, so that `engine.kernels.triton.attention` stays the module. The modules import `triton`
(ImportError where it is missing). On CPU the kernels run only under Triton's interpreter: set TRITON_INTERPRET=1
before `triton` is first imported; `interpreted()` says which mode is active.
"""

from __future__ import annotations


def interpreted() -> bool:
    """True when these kernels run in Triton's interpreter (timings then are 'interpreted', never plotted as GPU)."""
    from engine.kernels.triton._common import is_interpreted
    from engine.kernels.triton.attention import _attn_fwd_kernel

    return is_interpreted(_attn_fwd_kernel)
