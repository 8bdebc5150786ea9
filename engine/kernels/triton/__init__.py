"""Kernel Levels L4: hand-written Triton kernels; each file: a kernel, its checked wrapper and a torch `_reference`.

- `attention.attention`: flash-attention forward (online softmax, causal block skipping, autotuned tiles; TMA on
  Hopper).
- `patch_embed.patch_embed`: ViT patch embedding as one GEMM with im2col inside the A-tile loads, bias + pos (+ the cls
  row) in the epilogue.
- `message_passing.message_passing`: out[d] = sum/mean of w_e * x[src_e] over the edges into d; a segment reduce over
  CSR (no atomics); unsorted edges are first bucketed by destination on the device (`bucket_by_destination`, counted
  in the call) or, with `unsorted="atomic"`, scattered with fp32 atomics; `csr_from_edges` builds the CSR.

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
