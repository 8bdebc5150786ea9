"""y = x @ dequant(W).T for one row x, with W stored weight-only quantized: int8 or fp8 (e4m3) per output channel,
or int4 in groups of 64 along K. The dequantization happens inside the weight loads; W is never materialised.

Same structure as engine/kernels/triton/gemv.py: each program owns BLOCK_N output features and walks K in BLOCK_K
chunks of its rows (contiguous along K, so every load is coalesced), products accumulate in fp32 and are reduced once
at the end; PDL (programmatic dependent launch, sm_90+) lets the packed-weight stream of one GEMV start while the
kernel before it drains. What changes is what a weight load brings in:

- int8 (`_wo_word_kernel`, K % 4 == 0): a (BLOCK_N, BLOCK_K / 4) tile of 32-bit words, four codes each. One XOR
  per word makes each byte code + 128; one PRMT per code (inline PTX on the GPU; shifts and masks under the
  interpreter) places that byte in the mantissa of 2^23, the float 2^23 + 128 + code exactly; one subtract and one
  FMA with x[4t + j] follow, into one fp32 accumulator per word. The plain conversion (`.to(tl.float32)`) is an
  I2F per code, and I2F runs on the SM's narrow conversion pipe, which would then limit the kernel before memory
  does (Nsight Compute shows that pipe busy and DRAM well short of its peak).
- fp8 (the same kernel, FP8, K % 4 == 0): the same word tiles; each word's two 16-bit halves go through
  cvt.rn.f16x2.e4m3x2 (two codes per instruction, subnormals exact), then f16 → f32 per code, then the FMA; a byte
  tile would pay byte extraction and packing (PRMT) per code around the same conversion.
- int8 or fp8 with K % 4 != 0 (`_wo_channel_kernel`): a (BLOCK_N, BLOCK_K) tile of 1-byte codes, converted to
  fp32 in registers.
  For all three, the per-output-channel scale is the same along the whole row, so it multiplies the row's sum once at
  the end (y[n] = s[n] · Σ_k q[n, k] x[k]): one scale load per row, no multiply per weight.
- int4 (`_wo_int4_kernel`): a (GROUPS, BLOCK_N, 8) tile of 32-bit words, eight codes each, in the order
  engine/kernels/int4_layout.py packs them (nibble j of word t of a group holds k = 64·g + 8·j + t). At batch 1
  this kernel is bound by the work of unpacking, not by memory, so everything is chosen for the fewest
  instructions per weight: one LOP3 per nibble (inline PTX: the nibble masked in place and OR-ed into the mantissa
  of 2^23 is the float 2^23 + code · 16^i exactly, i = j mod 4; one shift per word for j ≥ 4), then one FMA
  f · 16^-i − (2^23 · 16^-i + 8) gives code − 8 exactly (a subtract for i = 0; x is not rescaled), and one FMA
  multiplies it by x[64 g + 8 j + t]; each group's
  8 products per word are summed, then scaled by the group's scale (one per 64 weights of a row, loaded with the
  tile). The tile is [group, row, word] so that Triton lays the lanes along each row's contiguous words and a
  thread holds several rows, reusing its x values (and the norm work on them) across those rows (with rows first
  each thread would hold one row and convert an x value for every 8 codes). Offline SASS (sm_90, the fused tiles):
  4.3–5.3 instructions per weight in the loop. Symmetric codes (value = (code − 8) · scale). On an H100 the decode
  step's fused int4 products
  of K >= 2048 take the tensor-core kernel instead (engine/kernels/cuda_quant.py, over a tile-order copy of the
  codes; $MODELAB_INT4_GEMV says which, docs/quantization.md why).

Tiles are fixed, not autotuned: per code, fusion and output size (`channel_tile`, `int4_tile`), chosen from the tile
sweeps of benchmarks/quant_gemv_bench.py on an H100 (--fused: as the decode step launches them); INTERPRETER_CONFIG
under the interpreter.

`channel_linear(x, q, scales)` and `int4_linear(x, q, scales, k)` are torch custom ops (`modelab::quant_gemv_channel`,
`modelab::quant_gemv_int4`): opaque single kernels to torch.compile, captured by CUDA graphs. Several rows (prefill,
B > 1) take dequantize-then-F.linear, the weight dequantized by one Triton kernel (`dequantize_channel_fused`,
`dequantize_int4_fused`: the plain way's values, one pass where its torch ops make three or six over N × K), then
cuBLAS's GEMM; engine.llm.quant.QuantLinear reaches that kernel through the triton_op `dequantized_weight`, which
torch.compile traces into (Inductor launches the kernel itself, so the compiled prefill has no opaque op whose host
cost would leave the device idle). The references
are float64 dequantize-then-matmul (`_reference_channel`, `_reference_int4`); the checks sit in
tests/engine/kernels/test_quant_gemv.py, the offline sm_90 compile in benchmarks/triton_aot_check.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

from engine.kernels import int4_layout
from engine.kernels.triton._common import is_interpreted, load_fused_x, output_rows, pdl_enabled, store_output
from engine.workloads.llama import rms_norm  # the decoder's own RMSNorm: the unfused fallbacks compute exactly it

GROUP = int4_layout.GROUP  # int4 group size along K (engine.llm.quant.INT4_GROUP is this value)

# (BLOCK_N, BLOCK_K, num_warps) launched on the GPU, and every tile the offline compile check
# (benchmarks/triton_aot_check.py) builds. Each launched tile is the fastest of the candidates
# `python benchmarks/quant_gemv_bench.py --preset 1B,7B --schemes SCHEME --fused` times for its fusion and shape, the
# GEMV launched as the decode step launches it -- with the RMSNorm, the residual or SwiGLU fused in, and PDL
# (`channel_tile`, `int4_tile`). Why the rule goes by fusion: a norm-fused GEMV forms its input in every program (the
# norm's sum of squares over all of K), so that work scales with the number of programs and wants more rows per
# program; a residual-only GEMV wants long K tiles; under PDL a program's first weight tile, loaded before it waits,
# overlaps the kernel before it. docs/figures.md has the times.
# int8 and fp8 (`_wo_word_kernel`, codes read as words):
TILE_WORDS = (16, 1024, 4)  # no fusion (not in the decode step): the best single tile over the fused shapes
TILE_WORDS_NORM_LONG = (32, 512, 4)  # +norm, K >= 4096 (7B qkv, gate_up, lm_head)
TILE_WORDS_NORM_WIDE = (16, 256, 4)  # +norm, K < 4096, N >= 8192 (1B gate_up, lm_head)
TILE_WORDS_NORM = (4, 1024, 4)  # +norm, K < 4096, N < 8192 (1B qkv)
TILE_WORDS_ADD = (4, 1024, 4)  # +residual (o), 2048 < K < 8192 (7B o)
TILE_WORDS_ADD_SHORT = (4, 2048, 4)  # +residual, K <= 2048 (a whole row per tile; 1B o)
# down, its input already SwiGLU'd by gate_up's epilogue:
TILE_WORDS_ADD_LONG = (8, 2048, 8)  # +residual, K >= 8192, N < 4096 (1B down)
TILE_WORDS_ADD_LONG_WIDE = (8, 1024, 4)  # +residual, K >= 8192, N >= 4096 (7B down)
# fp8 codes, read as words too, take the same tiles except where fp8's conversion makes it want its own: the
# norm-fused GEMVs with K >= 4096, more rows per program on fewer words. (o and down: fp8's best tile is level with
# int8's, so they keep it.)
TILE_FP8_NORM_LONG = (16, 256, 8)  # N < 16384 (7B qkv)
TILE_FP8_NORM_WIDE = (8, 512, 4)  # 16384 <= N < 32000 (7B gate_up)
TILE_FP8_NORM_VOCAB = (16, 256, 4)  # N >= 32000 (7B lm_head)
# Codes with K % 4 != 0 (no LLM shape) take the byte kernel (`_wo_channel_kernel`) at one tile.
TILE_BYTES = (4, 1024, 4)
# int4: (BLOCK_N, GROUPS of 64 weights per tile, num_warps), by fusion and shape:
TILE_INT4 = (16, 16, 4)  # no fusion (not in the decode step): the best single tile over the fused shapes
TILE_INT4_NORM_VOCAB = (128, 4, 8)  # +norm, N >= 32000 (lm_head)
TILE_INT4_NORM_WIDE = (64, 8, 4)  # +norm, N >= 16384 (gate_up)
TILE_INT4_NORM_LONG = (32, 8, 4)  # +norm, K >= 4096, N < 16384 (7B qkv)
TILE_INT4_NORM = (8, 32, 4)  # +norm, K < 4096, N < 16384 (1B qkv)
TILE_INT4_ADD = (8, 32, 4)  # +residual (o, down)
AOT_TILES_BYTES = (TILE_BYTES,)  # the byte kernel, int8 and fp8
# what channel_tile returns, int8 or fp8 codes
LAUNCHED_TILES_WORDS = (TILE_WORDS, TILE_WORDS_NORM_LONG, TILE_WORDS_NORM_WIDE, TILE_WORDS_NORM, TILE_WORDS_ADD,
                        TILE_WORDS_ADD_SHORT, TILE_WORDS_ADD_LONG, TILE_WORDS_ADD_LONG_WIDE, TILE_FP8_NORM_LONG,
                        TILE_FP8_NORM_WIDE, TILE_FP8_NORM_VOCAB)
AOT_TILES_WORDS = ((4, 1024, 4), (16, 1024, 4), (32, 512, 4), (16, 256, 4), (4, 2048, 4), (16, 1024, 8), (8, 2048, 8),
                   (8, 1024, 4), (64, 256, 4), (8, 2048, 4), (16, 256, 8), (8, 512, 4))
AOT_TILES_INT4 = ((16, 16, 4), (128, 4, 8), (64, 8, 4), (32, 8, 4), (8, 32, 4), (16, 32, 4), (32, 8, 8))
LAUNCHED_TILES_INT4 = (TILE_INT4, TILE_INT4_NORM_VOCAB, TILE_INT4_NORM_WIDE, TILE_INT4_NORM_LONG, TILE_INT4_NORM,
                       TILE_INT4_ADD)
# One fixed config for the interpreter (CPU tests): few programs (each one runs in Python), K tiles small enough that
# the test shapes have ragged tails along K and N.
INTERPRETER_CONFIG = {"BLOCK_N": 32, "BLOCK_K": 128}
INTERPRETER_CONFIG_INT4 = {"BLOCK_N": 32, "GROUPS": 2}


@triton.jit
def _channel_epilogue(row_sums, sumsq, s_ptr, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, K, eps,
                      BLOCK_N: tl.constexpr, NORM: tl.constexpr, ADD: tl.constexpr, GLU: tl.constexpr):
    """What the per-channel kernels (bytes and words) do after K: each row's sum times its scale, the RMSNorm's
    1/rms (NORM), then the residual (ADD) or SwiGLU of row pairs (GLU) as the store (`store_output`)."""
    s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    y = row_sums * s
    if NORM:
        y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
    store_output(y, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, BLOCK_N, ADD, GLU)


@triton.jit
def _wo_channel_kernel(x_ptr, q_ptr, s_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_qn, eps, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, FP8: tl.constexpr = False, NORM: tl.constexpr = False,
                       ADD: tl.constexpr = False, PDL: tl.constexpr = False, GLU: tl.constexpr = False):
    """y[n] = s[n] · Σ_k q[n, k] · x[k]; q 1 byte per weight, passed as uint8 and bitcast in registers to int8 or
    (FP8) float8e4nv (so a masked-off lane's 0 byte is a 0 weight either way), s one scale per output row.
    NORM / ADD / GLU as in gemv._gemv_kernel: x RMS-normalised and scaled by g (the sum of squares taken in the
    same pass over x), r added to y, or silu(gate) · up of the row pairs [gate; up] stored (N / 2 values)."""
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n, n_mask = output_rows(pid_n, N, BLOCK_N, GLU)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    rows = q_ptr + offs_n[:, None] * stride_qn
    offs_k = tl.arange(0, BLOCK_K)
    # the weight tiles are loaded one iteration ahead; they do not depend on the previous kernel (PDL)
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k < K)[None, :], other=0,
                eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        offs_next = offs_k + BLOCK_K
        w_next = tl.load(rows + offs_next[None, :], mask=n_mask[:, None] & (offs_next < K)[None, :], other=0,
                         eviction_policy="evict_first")
        x, sumsq = load_fused_x(x_ptr, g_ptr, offs_k, k_mask, sumsq, NORM)
        if FP8:
            wf = w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            wf = w.to(tl.int8, bitcast=True).to(tl.float32)
        acc += wf * x[None, :]
        w = w_next
    _channel_epilogue(tl.sum(acc, axis=1), sumsq, s_ptr, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, K, eps,
                      BLOCK_N, NORM, ADD, GLU)


@triton.jit
def _int8_words_to_f32(w, ASM: tl.constexpr):
    """The four int8 codes of each 32-bit word w as fp32 2^23 + 128 + code, exactly (byte j is code j, two's
    complement). XOR 0x80 turns each code into code + 128 (0..255); that byte, placed in the low mantissa bits of
    2^23 (0x4B000000), is the float 2^23 + code + 128. ASM (the GPU): one PRMT per code (byte select and exponent in
    one instruction) after one XOR per word; otherwise (the interpreter) the same bits by shifts and masks."""
    if ASM:
        f0, f1, f2, f3 = tl.inline_asm_elementwise(
            "{ .reg .b32 t; xor.b32 t, $4, 0x80808080; prmt.b32 $0, t, 0x4B000000, 0x7540; "
            "prmt.b32 $1, t, 0x4B000000, 0x7541; prmt.b32 $2, t, 0x4B000000, 0x7542; "
            "prmt.b32 $3, t, 0x4B000000, 0x7543; }",
            "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        wx = w ^ -2139062144  # 0x80808080 as an int32
        f0 = ((wx & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
        f1 = (((wx >> 8) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
        f2 = (((wx >> 16) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
        f3 = (((wx >> 24) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
    return f0, f1, f2, f3


@triton.jit
def _fp8_words_to_f32(w, ASM: tl.constexpr):
    """The four e4m3 codes of each 32-bit word w as fp32, exactly (subnormals included; byte j is code j). ASM (the
    GPU): the word's two halves through cvt.rn.f16x2.e4m3x2 (one instruction per two codes), then f16 → f32 per
    code; otherwise (the interpreter) each byte bitcast to float8e4nv and converted."""
    if ASM:
        f0, f1, f2, f3 = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi, a0, a1, a2, a3; .reg .b32 p, q; mov.b32 {lo, hi}, $4; "
            "cvt.rn.f16x2.e4m3x2 p, lo; cvt.rn.f16x2.e4m3x2 q, hi; mov.b32 {a0, a1}, p; mov.b32 {a2, a3}, q; "
            "cvt.f32.f16 $0, a0; cvt.f32.f16 $1, a1; cvt.f32.f16 $2, a2; cvt.f32.f16 $3, a3; }",
            "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        f0 = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        f1 = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        f2 = ((w >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        f3 = ((w >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return f0, f1, f2, f3


@triton.jit
def _wo_word_kernel(x_ptr, q_ptr, s_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_qn, eps, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, NORM: tl.constexpr = False, ADD: tl.constexpr = False,
                    PDL: tl.constexpr = False, ASM: tl.constexpr = False, FP8: tl.constexpr = False,
                    GLU: tl.constexpr = False):
    """y[n] = s[n] · Σ_k q[n, k] · x[k] for int8 (or, FP8, e4m3) codes read as 32-bit words (K % 4 == 0; q_ptr
    int32, stride_qn in words): a (BLOCK_N, BLOCK_K / 4) tile of words, each word's four codes converted by
    `_int8_words_to_f32` (`_fp8_words_to_f32`) and multiplied by x[4t + j] (x's chunk split four ways in
    registers), one fp32 accumulator per word. NORM / ADD / GLU as in the channel kernel."""
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n, n_mask = output_rows(pid_n, N, BLOCK_N, GLU)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 4), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    rows = q_ptr + offs_n[:, None] * stride_qn
    words = K // 4
    offs_w = tl.arange(0, BLOCK_K // 4)
    # the weight tiles are loaded one iteration ahead; they do not depend on the previous kernel (PDL)
    w = tl.load(rows + offs_w[None, :], mask=n_mask[:, None] & (offs_w < words)[None, :], other=0,
                eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_next = (k0 + BLOCK_K) // 4 + offs_w
        w_next = tl.load(rows + offs_next[None, :], mask=n_mask[:, None] & (offs_next < words)[None, :], other=0,
                         eviction_policy="evict_first")
        x, sumsq = load_fused_x(x_ptr, g_ptr, offs_k, offs_k < K, sumsq, NORM)
        x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_K // 4, 2, 2)))  # [t, a] = x[4t + 2a], x[4t + 2a + 1]
        x0, x2 = tl.split(x_even)
        x1, x3 = tl.split(x_odd)
        if FP8:
            f0, f1, f2, f3 = _fp8_words_to_f32(w, ASM)
            acc += f0 * x0[None, :]
            acc += f1 * x1[None, :]
            acc += f2 * x2[None, :]
            acc += f3 * x3[None, :]
        else:
            f0, f1, f2, f3 = _int8_words_to_f32(w, ASM)
            acc += (f0 - 8388736.0) * x0[None, :]  # f − (2^23 + 128) is the code, exactly
            acc += (f1 - 8388736.0) * x1[None, :]
            acc += (f2 - 8388736.0) * x2[None, :]
            acc += (f3 - 8388736.0) * x3[None, :]
        w = w_next
    _channel_epilogue(tl.sum(acc, axis=1), sumsq, s_ptr, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, K, eps,
                      BLOCK_N, NORM, ADD, GLU)


@triton.jit
def _int4_words_to_f32(w, ASM: tl.constexpr):
    """The eight nibbles of each 32-bit word w as fp32: nibble j (bits 4j..4j+3; i = j mod 4 within its 16-bit
    half) masked in place and OR-ed into the mantissa of 2^23 gives 2^23 + code_j · 16^i exactly. ASM (the GPU):
    one LOP3 per nibble ((w & mask) | 0x4B000000 in one instruction) after one shift of the word by 16 for j ≥ 4;
    otherwise (the interpreter) the same bits by shifts and masks."""
    if ASM:
        f0, f1, f2, f3, f4, f5, f6, f7 = tl.inline_asm_elementwise(
            "{ .reg .b32 h; shr.u32 h, $8, 16; "
            "lop3.b32 $0, $8, 0xF, 0x4B000000, 0xEA; lop3.b32 $1, $8, 0xF0, 0x4B000000, 0xEA; "
            "lop3.b32 $2, $8, 0xF00, 0x4B000000, 0xEA; lop3.b32 $3, $8, 0xF000, 0x4B000000, 0xEA; "
            "lop3.b32 $4, h, 0xF, 0x4B000000, 0xEA; lop3.b32 $5, h, 0xF0, 0x4B000000, 0xEA; "
            "lop3.b32 $6, h, 0xF00, 0x4B000000, 0xEA; lop3.b32 $7, h, 0xF000, 0x4B000000, 0xEA; }",
            "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        h = w >> 16  # the sign bits an arithmetic shift drags in are masked off below
        f0 = ((w & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        f1 = ((w & 0xF0) | 0x4B000000).to(tl.float32, bitcast=True)
        f2 = ((w & 0xF00) | 0x4B000000).to(tl.float32, bitcast=True)
        f3 = ((w & 0xF000) | 0x4B000000).to(tl.float32, bitcast=True)
        f4 = ((h & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        f5 = ((h & 0xF0) | 0x4B000000).to(tl.float32, bitcast=True)
        f6 = ((h & 0xF00) | 0x4B000000).to(tl.float32, bitcast=True)
        f7 = ((h & 0xF000) | 0x4B000000).to(tl.float32, bitcast=True)
    return f0, f1, f2, f3, f4, f5, f6, f7


@triton.jit
def _by_nibble(x):
    """x[..., t, b0, b1, b2], the inputs of nibble position j = 4·b0 + 2·b1 + b2 of word t, split into the eight
    x[..., t] of j = 0 … 7 (three splits of the last axis, in registers)."""
    xa, xb = tl.split(x)  # j % 2 = 0, 1
    xa0, xa1 = tl.split(xa)
    xb0, xb1 = tl.split(xb)
    x0, x4 = tl.split(xa0)
    x2, x6 = tl.split(xa1)
    x1, x5 = tl.split(xb0)
    x3, x7 = tl.split(xb1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _wo_int4_kernel(x_ptr, q_ptr, s_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_qn, stride_sn, eps, BLOCK_N: tl.constexpr,
                    GROUPS: tl.constexpr, NORM: tl.constexpr = False, ADD: tl.constexpr = False,
                    PDL: tl.constexpr = False, ASM: tl.constexpr = False, GLU: tl.constexpr = False):
    """y[n] = Σ_g s[n, g] · Σ_{k in g} (code[n, k] − 8) · x[k]; q is int32 words, (N, ceil(K/64)·8), in
    engine/kernels/int4_layout.py's order (stride_qn in words), s one scale per 64 weights of a row. Each iteration
    takes GROUPS groups of BLOCK_N rows. NORM / ADD / GLU as in the channel kernel."""
    # Tiles are [group, row, word]: Triton lays the lanes along the first dimension it finds no contiguity in, so
    # with groups first the lanes run along each row's contiguous words and a thread keeps several rows in
    # registers, reusing its x values across them (rows first, each thread held one row and converted an x value
    # for every 8 codes it read).
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n, n_mask = output_rows(pid_n, N, BLOCK_N, GLU)
    groups = (K + 63) // 64
    offs_g = tl.arange(0, GROUPS)
    offs_t = tl.arange(0, 8)
    acc = tl.zeros((GROUPS, BLOCK_N, 8), dtype=tl.float32)
    sumsq = tl.zeros((GROUPS * 64,), dtype=tl.float32)
    words = q_ptr + offs_n[None, :, None] * stride_qn + offs_t[None, None, :]
    rows = n_mask[None, :, None]
    # the word tiles are loaded one iteration ahead; they do not depend on the previous kernel (PDL)
    w = tl.load(words + offs_g[:, None, None] * 8, mask=rows & (offs_g < groups)[:, None, None], other=0,
                eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    for g0 in range(0, groups, GROUPS):
        gs = g0 + offs_g
        g_mask = gs < groups
        g_next = gs + GROUPS
        w_next = tl.load(words + g_next[:, None, None] * 8, mask=rows & (g_next < groups)[:, None, None], other=0,
                         eviction_policy="evict_first")
        offs_k = g0 * 64 + tl.arange(0, GROUPS * 64)
        x, sumsq = load_fused_x(x_ptr, g_ptr, offs_k, offs_k < K, sumsq, NORM)
        # x[64 g + 8 j + t] for each nibble position j, as (GROUPS, 8 t): split out of [g, t, j] in registers
        x = tl.reshape(tl.permute(tl.reshape(x, (GROUPS, 8, 8)), (0, 2, 1)), (GROUPS, 8, 2, 2, 2))
        x0, x1, x2, x3, x4, x5, x6, x7 = _by_nibble(x)
        f0, f1, f2, f3, f4, f5, f6, f7 = _int4_words_to_f32(w, ASM)
        # f_j · 16^-i − (2^23 + 8 · 16^i) · 16^-i is code_j − 8 exactly, in one FMA (for i = 0 a subtract)
        part = (f0 - 8388616.0) * x0[:, None, :]
        part += (f1 * 0.0625 - 524296.0) * x1[:, None, :]
        part += (f2 * 0.00390625 - 32776.0) * x2[:, None, :]
        part += (f3 * 0.000244140625 - 2056.0) * x3[:, None, :]
        part += (f4 - 8388616.0) * x4[:, None, :]
        part += (f5 * 0.0625 - 524296.0) * x5[:, None, :]
        part += (f6 * 0.00390625 - 32776.0) * x6[:, None, :]
        part += (f7 * 0.000244140625 - 2056.0) * x7[:, None, :]
        s = tl.load(s_ptr + offs_n[None, :] * stride_sn + gs[:, None], mask=n_mask[None, :] & g_mask[:, None],
                    other=0.0).to(tl.float32)
        acc += part * s[:, :, None]
        w = w_next
    y = tl.sum(tl.sum(acc, axis=2), axis=0)
    if NORM:
        y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
    store_output(y, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, BLOCK_N, ADD, GLU)


def _one_row(x: torch.Tensor) -> torch.Tensor:
    if x.numel() != x.shape[-1]:
        raise ValueError(f"the quantized GEMV takes one row; x has shape {tuple(x.shape)}")
    return x.reshape(-1).contiguous()


def _fusion_args(x_row: torch.Tensor, n: int, k: int, norm_weight: torch.Tensor | None,
                 residual: torch.Tensor | None, glu: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(g, r, flags) for the kernels' NORM / ADD / GLU, checked against the weight's (n, k)."""
    if glu and (n % 2 or residual is not None):
        raise ValueError(f"the quantized GEMV: glu needs an even number of rows ([gate; up], got {n}) and no "
                         "residual")
    if norm_weight is not None and norm_weight.numel() != k:
        raise ValueError(f"norm weight has {norm_weight.numel()} elements for {k} features")
    if residual is not None and residual.numel() != n:
        raise ValueError(f"residual has {residual.numel()} elements for {n} outputs")
    g = norm_weight.reshape(-1).contiguous() if norm_weight is not None else x_row  # unread unless NORM
    r = residual.reshape(-1).contiguous() if residual is not None else x_row  # unread unless ADD
    return g, r, dict(NORM=norm_weight is not None, ADD=residual is not None, GLU=glu)


def channel_tile(n: int, norm: bool = False, add: bool = False, k: int = 0, fp8: bool = False
                 ) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) the GPU launches the word kernel with (int8 and fp8 codes) for n output rows of
    k inputs with these fusions (TILE_WORDS_*; fp8's own where measured better, TILE_FP8_*)."""
    if fp8 and norm and k >= 4096:
        return TILE_FP8_NORM_VOCAB if n >= 32000 else TILE_FP8_NORM_WIDE if n >= 16384 else TILE_FP8_NORM_LONG
    if norm:
        return TILE_WORDS_NORM_LONG if k >= 4096 else TILE_WORDS_NORM_WIDE if n >= 8192 else TILE_WORDS_NORM
    if add:
        if k >= 8192:
            return TILE_WORDS_ADD_LONG_WIDE if n >= 4096 else TILE_WORDS_ADD_LONG
        return TILE_WORDS_ADD_SHORT if k <= 2048 else TILE_WORDS_ADD
    return TILE_WORDS


def int4_tile(n: int, norm: bool = False, add: bool = False, k: int = 0) -> tuple[int, int, int]:
    """(BLOCK_N, GROUPS, num_warps) the GPU launches for n output rows of k inputs with these fusions (TILE_INT4*)."""
    if norm:
        if n >= 16384:
            return TILE_INT4_NORM_VOCAB if n >= 32000 else TILE_INT4_NORM_WIDE
        return TILE_INT4_NORM_LONG if k >= 4096 else TILE_INT4_NORM
    return TILE_INT4_ADD if add else TILE_INT4


def gemv_channel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, norm_weight: torch.Tensor | None = None,
                 eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """x (K,) or (1, K) · dequant(q).T for q (N, K) int8 or float8_e4m3fn and scales (N,): (N,) or (1, N) in x's
    dtype, accumulated in fp32. norm_weight / residual / glu fuse as engine.kernels.triton.gemv.gemv's do
    (glu: N / 2 outputs, silu(gate) · up of q = [gate; up])."""
    x_row = _one_row(x)
    k = x.shape[-1]
    if q.dim() != 2 or q.shape[1] != k:
        raise ValueError(f"quantized weight {tuple(q.shape)} does not match x's {k} features")
    n = q.shape[0]
    if scales.numel() != n:
        raise ValueError(f"{scales.numel()} scales for {n} output channels")
    fp8 = q.dtype == torch.float8_e4m3fn
    if not fp8 and q.dtype != torch.int8:
        raise ValueError(f"per-channel codes are int8 or float8_e4m3fn, got {q.dtype}")
    g, r, flags = _fusion_args(x_row, n, k, norm_weight, residual, glu)
    y = torch.empty(n // 2 if glu else n, device=x.device, dtype=x.dtype)
    if k % 4 == 0:
        return _gemv_words(x, x_row, q, scales, y, g, r, n, k, float(eps), dict(flags, FP8=fp8))
    q = (q if q.stride(1) == 1 else q.contiguous()).view(torch.uint8)
    args = (x_row, q, scales.reshape(-1).contiguous(), y, g, r, n, k, q.stride(0), float(eps))
    if is_interpreted(_wo_channel_kernel):
        cfg = INTERPRETER_CONFIG
        _wo_channel_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, FP8=fp8, **flags)
    else:
        bn, bk, warps = TILE_BYTES
        pdl = pdl_enabled(x.device)
        _wo_channel_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, BLOCK_K=bk, FP8=fp8, **flags, PDL=pdl,
                                                  num_warps=warps, num_stages=1, launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], y.numel())


def _gemv_words(x: torch.Tensor, x_row: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, y: torch.Tensor,
                     g: torch.Tensor, r: torch.Tensor, n: int, k: int, eps: float, flags: dict) -> torch.Tensor:
    """gemv_channel's launch when K % 4 == 0: the int8 or fp8 codes read as int32 words by _wo_word_kernel."""
    if q.stride(1) != 1 or q.stride(0) % 4 or q.data_ptr() % 16:
        q = q.clone(memory_format=torch.contiguous_format)  # a fresh allocation: contiguous and 16-byte aligned
    words = q.view(torch.uint8).view(torch.int32)  # fp8 tensors do not view as int32 directly
    args = (x_row, words, scales.reshape(-1).contiguous(), y, g, r, n, k, words.stride(0), eps)
    if is_interpreted(_wo_word_kernel):
        cfg = INTERPRETER_CONFIG
        _wo_word_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, **flags)
    else:
        bn, bk, warps = channel_tile(n, flags["NORM"], flags["ADD"], k, flags["FP8"])
        pdl = pdl_enabled(x.device)
        _wo_word_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, BLOCK_K=bk, **flags, PDL=pdl, ASM=True,
                                               num_warps=warps, num_stages=1, launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], y.numel())


def _int4_operands(q: torch.Tensor, scales: torch.Tensor, k: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed codes as int32 words (rows are whole groups: 32 bytes, 8 words) and the scales contiguous along a
    row, as the int4 kernels read them; ValueError where q or scales do not hold `k` inputs per row (`what` names
    them in the message)."""
    n = q.shape[0]
    row_bytes = int4_layout.int4_row_bytes(k)
    if q.dim() != 2 or q.dtype != torch.uint8 or q.shape[1] != row_bytes:
        raise ValueError(f"packed int4 weight {tuple(q.shape)} {q.dtype} does not match {what} "
                         f"(expected uint8 ({n}, {row_bytes}))")
    if scales.shape != (n, triton.cdiv(k, GROUP)):
        raise ValueError(f"int4 scales {tuple(scales.shape)}: expected ({n}, {triton.cdiv(k, GROUP)})")
    # the offset into the storage, not data_ptr(): traceable (dequantized_weight), and a CUDA allocation starts
    # 512-byte aligned
    if q.stride(1) != 1 or q.stride(0) % 4 or q.storage_offset() % 16:
        q = q.clone(memory_format=torch.contiguous_format)  # a fresh allocation: contiguous and 16-byte aligned
    return q.view(torch.int32), (scales if scales.stride(1) == 1 else scales.contiguous())


def gemv_int4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, norm_weight: torch.Tensor | None = None,
              eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """x (K,) or (1, K) · dequant(q).T for q (N, ceil(K/64)·32) uint8 (symmetric 4-bit codes packed as
    engine/kernels/int4_layout.py says) and scales (N, ceil(K/64)): (N,) or (1, N) in x's dtype, accumulated in fp32.
    norm_weight / residual / glu fuse as in gemv_channel."""
    x_row = _one_row(x)
    k = x.shape[-1]
    n = q.shape[0]
    words, scales = _int4_operands(q, scales, k, f"x's {k} features")
    g, r, flags = _fusion_args(x_row, n, k, norm_weight, residual, glu)
    y = torch.empty(n // 2 if glu else n, device=x.device, dtype=x.dtype)
    args = (x_row, words, scales, y, g, r, n, k, words.stride(0), scales.stride(0), float(eps))
    if is_interpreted(_wo_int4_kernel):
        cfg = INTERPRETER_CONFIG_INT4
        _wo_int4_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, **flags)
    else:
        bn, groups, warps = int4_tile(n, flags["NORM"], flags["ADD"], k)
        pdl = pdl_enabled(x.device)
        _wo_int4_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, GROUPS=groups, **flags, PDL=pdl, ASM=True,
                                               num_warps=warps, num_stages=1, launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], y.numel())


def gemv_quant(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, **fusions: object) -> torch.Tensor:
    """gemv_int4 for packed uint8 codes, gemv_channel for int8 / fp8."""
    return (gemv_int4 if q.dtype == torch.uint8 else gemv_channel)(x, q, scales, **fusions)  # type: ignore[arg-type]


def _takes(x: torch.Tensor, kernel: object) -> bool:
    return x.numel() == x.shape[-1] and (x.is_cuda or is_interpreted(kernel))


@torch.library.custom_op("modelab::quant_gemv_channel", mutates_args=())
def channel_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for per-channel int8 / fp8 codes: one row through the Triton kernel, several rows
    (or a device Triton cannot run on) dequantized first."""
    if _takes(x, _wo_channel_kernel):
        return gemv_channel(x, q, scales)
    return F.linear(x, dequantize_channel_fused(q, scales, x.dtype))


@channel_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def dequantize_channel(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) int8 / fp8 codes + (N,) scales → (N, K) weights in `dtype` (the plain way)."""
    return (q.to(torch.float32) * scales.to(torch.float32)[:, None]).to(dtype)


@triton.jit
def _dequant_channel_kernel(q_ptr, s_ptr, w_ptr, N, K, stride_qn, stride_wn, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, FP8: tl.constexpr):
    """W[n, k] = code[n, k] · s[n] in fp32, rounded once to W's dtype (dequantize_channel's values, bit for bit), for
    BLOCK_N rows × BLOCK_K inputs: q 1 byte a weight, passed as uint8 and bitcast to int8 or (FP8) float8e4nv, both
    converted to fp32 exactly."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    code = tl.load(q_ptr + rows[:, None].to(tl.int64) * stride_qn + cols[None, :], mask=ok, other=0)
    if FP8:
        f = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        f = code.to(tl.int8, bitcast=True).to(tl.float32)
    scale = tl.load(s_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
    tl.store(w_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :],
             (f * scale[:, None]).to(w_ptr.dtype.element_ty), mask=ok)


# (BLOCK_N, BLOCK_K, num_warps): 4 KB of codes in, 8 KB of bf16 out. Within 1 % of the fastest of the ten tiles
# benchmarks/prefill_dequant_bench.py times, on every 1B and 7B shape, int8 and fp8
TILE_DEQUANT_CHANNEL = (16, 256, 4)
INTERPRETER_TILE_DEQUANT_CHANNEL = (8, 64, 1)


def _dequant_tile(tile: tuple[int, int, int] | None, kernel: object, interpreted: tuple[int, int, int],
                  default: tuple[int, int, int]) -> tuple[int, int, int]:
    """A dequantization's tile: the one asked for (the benchmark's sweep), else the interpreter's or the GPU's."""
    return tile if tile is not None else interpreted if is_interpreted(kernel) else default


def dequantize_channel_fused(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                             tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """dequantize_channel's (N, K) weight, bit for bit, in one Triton kernel where Triton runs (a CUDA weight, or the
    interpreter): the codes read once and W written once (3 bytes a bf16 weight), where the torch form makes three
    N × K passes through fp32 (19). The int8 / fp8 modes' products over several rows (prefill) multiply by it.
    `tile` (BLOCK_N, BLOCK_K, num_warps) overrides TILE_DEQUANT_CHANNEL (benchmarks/prefill_dequant_bench.py)."""
    if not (q.is_cuda or is_interpreted(_dequant_channel_kernel)):
        return dequantize_channel(q, scales, dtype)
    fp8 = q.dtype == torch.float8_e4m3fn
    if q.dim() != 2 or not (fp8 or q.dtype == torch.int8):
        raise ValueError(f"per-channel codes are (N, K) int8 or float8_e4m3fn, got {tuple(q.shape)} {q.dtype}")
    n, k = q.shape
    if scales.numel() != n:
        raise ValueError(f"{scales.numel()} scales for {n} output channels")
    codes = (q if q.stride(1) == 1 else q.contiguous()).view(torch.uint8)
    w = torch.empty(n, k, device=q.device, dtype=dtype)
    bn, bk, warps = _dequant_tile(tile, _dequant_channel_kernel, INTERPRETER_TILE_DEQUANT_CHANNEL, TILE_DEQUANT_CHANNEL)
    _launch(_dequant_channel_kernel, w)[(triton.cdiv(n, bn), triton.cdiv(k, bk))](
        codes, scales.reshape(-1).contiguous(), w, n, k, codes.stride(0), w.stride(0), BLOCK_N=bn, BLOCK_K=bk,
        FP8=fp8, num_warps=warps)
    return w


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype = torch.float32
                     ) -> torch.Tensor:
    """(N, ceil(K/64)·32) packed uint8 + (N, ceil(K/64)) scales → (N, K) weights in `dtype` (the plain way)."""
    codes = int4_layout.unpack_int4(q, k).to(torch.int16) - 8
    s = scales.to(torch.float32).repeat_interleave(GROUP, dim=1)[:, :k]
    return (codes.to(torch.float32) * s).to(dtype)


@triton.jit
def _dequant_int4_kernel(q_ptr, s_ptr, w_ptr, N, K, stride_qn, stride_sn, stride_wn, BLOCK_N: tl.constexpr,
                         GROUPS: tl.constexpr):
    """W[n, k] = (code[n, k] − 8) · s[n, k // 64], in fp32 rounded once to W's dtype (dequantize_int4's values, bit
    for bit), for BLOCK_N rows × GROUPS groups: q is int32 words in int4_layout's order, so nibble j of word t of a
    group is k = 64 g + 8 j + t and each nibble position stores 8 consecutive k per row and group."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    gs = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    t = tl.arange(0, 8)
    ok = (rows < N)[:, None] & (gs < (K + 63) // 64)[None, :]
    words = tl.load(q_ptr + rows[:, None, None].to(tl.int64) * stride_qn + gs[None, :, None] * 8 + t[None, None, :],
                    mask=ok[:, :, None], other=0)
    scale = tl.load(s_ptr + rows[:, None].to(tl.int64) * stride_sn + gs[None, :], mask=ok, other=0.0)
    scale = scale.to(tl.float32)[:, :, None]
    out = w_ptr + rows[:, None, None].to(tl.int64) * stride_wn
    for j in tl.static_range(8):
        code = (words >> (4 * j)) & 0xF  # an arithmetic shift's sign bits are masked off
        k = gs[None, :, None] * 64 + 8 * j + t[None, None, :]
        tl.store(out + k, ((code - 8).to(tl.float32) * scale).to(w_ptr.dtype.element_ty),
                 mask=ok[:, :, None] & (k < K))


# (BLOCK_N, GROUPS, num_warps): 2 KB of codes in, 8 KB of bf16 out a program. The fastest of the ten tiles
# benchmarks/prefill_dequant_bench.py times, on every 1B and 7B shape
TILE_DEQUANT = (8, 8, 4)
INTERPRETER_TILE_DEQUANT = (8, 2, 1)


def dequantize_int4_fused(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype,
                          tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """dequantize_int4's (N, K) weight, bit for bit, in one Triton kernel where Triton runs (a CUDA weight, or the
    interpreter): the codes and scales read once and W written once, where the torch form makes six N × K passes
    (unpack, two integer casts, the scales repeated, the product and the cast, four of them fp32). The quantized
    modes' products over several rows (prefill) multiply by it; elsewhere dequantize_int4 itself. `tile` (BLOCK_N,
    GROUPS, num_warps) overrides TILE_DEQUANT (benchmarks/prefill_dequant_bench.py)."""
    if not (q.is_cuda or is_interpreted(_dequant_int4_kernel)):
        return dequantize_int4(q, scales, k, dtype)
    n = q.shape[0]
    words, scales = _int4_operands(q, scales, k, f"{k} inputs per row")
    w = torch.empty(n, k, device=q.device, dtype=dtype)
    bn, groups, warps = _dequant_tile(tile, _dequant_int4_kernel, INTERPRETER_TILE_DEQUANT, TILE_DEQUANT)
    grid = (triton.cdiv(n, bn), triton.cdiv(triton.cdiv(k, GROUP), groups))
    _launch(_dequant_int4_kernel, w)[grid](words, scales, w, n, k, words.stride(0), scales.stride(0), w.stride(0),
                                           BLOCK_N=bn, GROUPS=groups, num_warps=warps)
    return w


def _launch(kernel: object, like: torch.Tensor) -> object:
    """A dequantization kernel as it is launched: through wrap_triton while a graph is traced (`like` is a fake
    tensor), so that the graph over dequantized_weight holds the kernel itself; eagerly, the kernel as it is (a
    plain launch; wrap_triton's eager path would go through its higher-order op every call)."""
    return wrap_triton(kernel) if is_fake(like) and not is_interpreted(kernel) else kernel


def _dequantized(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The weight the lab's ops multiply several rows by: dequantized in one kernel (int4, int8 or fp8 codes)."""
    if q.dtype == torch.uint8:
        return dequantize_int4_fused(q, scales, k, dtype)
    return dequantize_channel_fused(q, scales, dtype)


@triton_op("modelab::quant_dequantize", mutates_args={})
def dequantized_weight(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The (N, K) weight of int4 (packed uint8), int8 or fp8 codes in `dtype`, formed by one kernel: what a quantized
    layer multiplies several rows (the prefill) by. A triton_op, not an opaque custom op: torch.compile traces into
    it and launches the kernel from its own generated code, so a compiled prefill pays Inductor's launch per weight
    rather than a Python op's dispatch, checks and Triton launch (~0.1 ms of host a product under the profiler,
    enough to leave the device idle most of a 1B prefill)."""
    int4 = q.dtype == torch.uint8
    if is_interpreted(_dequant_int4_kernel if int4 else _dequant_channel_kernel) and is_fake(q):
        # traced under the interpreter (CPU tests): its kernels cannot run on fake tensors, so the graph takes the
        # torch form, whose values are the kernel's bit for bit
        return dequantize_int4(q, scales, k, dtype) if int4 else dequantize_channel(q, scales, dtype)
    return _dequantized(q, scales, k, dtype)


@torch.library.custom_op("modelab::quant_gemv_int4", mutates_args=())
def int4_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for group-wise int4 codes (K = x's last dimension)."""
    if _takes(x, _wo_int4_kernel):
        return gemv_int4(x, q, scales)
    return F.linear(x, dequantize_int4_fused(q, scales, x.shape[-1], x.dtype))


@int4_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


# -- the triton-fused step's fused products over quantized weights (engine.kernels.triton.gemv.FusedDecodeOps) --
# The unfused fallbacks (several rows, a device Triton cannot run on) compute exactly what the decoder's own modules
# do: rms_norm in the decoder's way, then the dequantized product.

@torch.library.custom_op("modelab::quant_norm_linear", mutates_args=())
def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, q: torch.Tensor,
                scales: torch.Tensor) -> torch.Tensor:
    """F.linear(rms_norm(x, norm_weight, eps), dequant(q)): for one row, the norm inside the quantized GEMV."""
    if _takes(x, _wo_channel_kernel):
        return gemv_quant(x, q, scales, norm_weight=norm_weight, eps=eps)
    return F.linear(rms_norm(x, norm_weight, eps), _dequantized(q, scales, x.shape[-1], x.dtype))


@norm_linear.register_fake
def _(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


@torch.library.custom_op("modelab::quant_norm_swiglu", mutates_args=())
def norm_swiglu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, q: torch.Tensor,
                scales: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up for [gate, up] = F.linear(rms_norm(x, norm_weight, eps), dequant(q)): for one row, the norm
    and the SwiGLU inside the quantized gate_up GEMV (its rows paired gate j, up j; half as many outputs)."""
    if _takes(x, _wo_channel_kernel):
        return gemv_quant(x, q, scales, norm_weight=norm_weight, eps=eps, glu=True)
    gate, up = F.linear(rms_norm(x, norm_weight, eps), _dequantized(q, scales, x.shape[-1], x.dtype)).chunk(2, -1)
    return F.silu(gate) * up


@norm_swiglu.register_fake
def _(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0] // 2))


@torch.library.custom_op("modelab::quant_linear_add", mutates_args=())
def linear_add(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + F.linear(x, dequant(q)): for one row, the residual added in the quantized GEMV's epilogue."""
    if _takes(x, _wo_channel_kernel) and residual.shape == (*x.shape[:-1], q.shape[0]):
        return gemv_quant(x, q, scales, residual=residual)
    return residual + F.linear(x, _dequantized(q, scales, x.shape[-1], x.dtype))


@linear_add.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(residual)


def _reference_channel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 dequantize-then-matmul."""
    w = q.to(torch.float64) * scales.to(torch.float64)[:, None]
    return F.linear(x.double(), w)


def _reference_int4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), dequantize_int4(q, scales, x.shape[-1], torch.float64))
