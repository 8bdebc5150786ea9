"""Y = X @ dequant(W).T for a few rows X (a decode step at 2 ≤ B ≤ 16) and int4 weights: the codes dequantized in
the loads, the products on the tensor cores. W is never materialised.

Why: at B = 1 the int4 products are GEMVs (engine/kernels/triton/quant_gemv.py). With a few more rows, the lab's
other path dequantizes the whole weight into a bf16 copy and hands it to cuBLAS: a decode step then writes and reads
the model in 16 bits (for a 7B: 3.8 GB of codes read, 13.5 GB written and read again) where the codes alone would do.
Here each program owns BLOCK_N output features and walks K GROUPS groups of 64 at a time: it loads the (BLOCK_N,
GROUPS · 8) int32 words of its rows once, turns every nibble into (code − 8) · scale in fp32 (the same bits as
dequantize_int4), rounds that to X's dtype and multiplies it by all rows of X at once with tl.dot (the rows padded
to 16, the smallest tensor-core tile): the bytes a step reads stay the codes' 3.8 GB whatever B is, and the unpacking
work per weight is the GEMV's, shared by every row.

The words hold k = 64·g + 8·j + t in nibble j of word t (engine/kernels/int4_layout.py). Nibble j of every word a
step loads is a (BLOCK_N, GROUPS · 8) operand as it stands — column 8·g + t holds k = 64·g + 8·j + t — so the step
runs eight dots, one per nibble position, each against X's columns at those k: no tile is joined, permuted or
reshaped. With its tile per product (tile_for) a 7B layer's four products take 209–243 µs for B = 2..16 on an H200,
where a form that assembled one (GROUPS · 64)-long tile through those shuffles took 269–448 µs at its best tile
(benchmarks/quant_rows_bench.py). Yᵀ is accumulated: the features are the dots' M side, the rows (padded to 16)
their N side. The nibbles become floats as in the GEMV (`_int4_words_to_f32`: on the GPU one LOP3 each into the
mantissa of 2^23).

`int4_rows(x, q, scales)` launches it; `int4_rows_linear` is the torch custom op (`modelab::quant_rows_int4`)
engine.llm.quant.QuantLinear calls where engine.kernels.choice.quant_products says "rows". `tile` (BLOCK_N, GROUPS,
num_warps) is a parameter for benchmarks/quant_rows_bench.py, which times the tiles and this kernel against the
dequantize-then-cuBLAS path per B. The checks (interpreted, against float64) sit in
tests/engine/kernels/test_quant_rows.py, the offline sm_90 compile in benchmarks/triton_aot_check.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import is_interpreted
from engine.kernels.triton.quant_gemv import GROUP, _by_nibble, _int4_operands, _int4_words_to_f32

MAX_ROWS = 64  # the most rows one call takes: beyond it the padded dot wastes nothing and a GEMM is the right tool
# (BLOCK_N, GROUPS, num_warps) on the GPU, the widest that still gives the product MIN_PROGRAMS programs: wide tiles
# unpack more words per program (gate_up, qkv), narrow ones keep ~one program per SM on the 2048- and 4096-wide
# products. GROUPS ≥ 2: each nibble's dot then has K = 16, the tensor cores' least. By benchmarks/quant_rows_bench.py
# on an H200 this picks the fastest of the six AOT_TILES (or one within 1 %) for all eight 1B and 7B weight shapes at
# B = 2..16 (7B gate_up 64x2g 71.4-81.0 µs, the next tile 123.0; 1B down 16x4g 40.5-48.6, 32x4g 63.6-71.3).
TILES = ((64, 2, 4), (32, 8, 4), (16, 4, 4))
MIN_PROGRAMS = 96
INTERPRETER_TILE = (16, 2, 1)  # ragged K and N tails at the test shapes
# what benchmarks/quant_rows_bench.py times (TILES among them) and benchmarks/triton_aot_check.py builds for sm_90,
# at the rows of a batch up to 16 (BLOCK_M 16)
AOT_TILES = (*TILES, (32, 4, 4), (64, 4, 4), (128, 2, 4))
AOT_ROWS = (16,)
FORMS = ("dot", "fma")
# The multiply-add form (_int4_rows_fma_kernel): its accumulator holds BLOCK_M rows × the word tile in registers, so
# its tiles are small and it takes at most FMA_MAX_ROWS rows. Not yet timed on a GPU: quant_rows_bench.py times it
# beside the dot form; the lab runs the dot form until it has.
FMA_MAX_ROWS = 16
FMA_TILES = ((8, 2, 4), (16, 1, 4), (4, 4, 4), (32, 1, 4), (16, 2, 8), (8, 4, 8), (64, 1, 8), (32, 2, 8))
FMA_AOT_ROWS = (8, 16)


@triton.jit
def _nibble_dot(acc, f, shift_scale, offset, s, x_rows, k_j, x_ok, IEEE: tl.constexpr):
    """acc (BLOCK_N, BLOCK_M) += v · X[:, k_j]ᵀ for one nibble position: v = (f · shift_scale − offset) · s is
    code − 8 times the group's scale (f as _int4_words_to_f32 gives it), rounded to X's dtype."""
    v = ((f * shift_scale - offset) * s).to(x_rows.dtype.element_ty)
    x = tl.load(x_rows + k_j[None, :], mask=x_ok, other=0.0)  # (BLOCK_M, GROUPS · 8)
    if IEEE:
        return tl.dot(v, tl.trans(x), acc, input_precision="ieee")
    return tl.dot(v, tl.trans(x), acc)


@triton.jit
def _int4_rows_kernel(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_sn, stride_ym,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, ASM: tl.constexpr = False,
                      IEEE: tl.constexpr = False):
    """Y[m, n] = Σ_k X[m, k] · rnd((code[n, k] − 8) · s[n, k // 64]), rnd rounding to X's dtype; M ≤ BLOCK_M rows.
    IEEE: fp32 X multiplied exactly (no tf32)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    groups = (K + 63) // 64
    # column c = 8·g + t of a step's (BLOCK_N, GROUPS · 8) words: word t of group g0 + g, whose nibble j holds
    # k = 64·(g0 + g) + 8·j + t
    c = tl.arange(0, GROUPS * 8)
    words = q_ptr + offs_n[:, None].to(tl.int64) * stride_qn + c[None, :]
    scales = s_ptr + offs_n[:, None].to(tl.int64) * stride_sn + (c // 8)[None, :]  # each group's scale, 8 times
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # Yᵀ: the features are the dot's M side (swap AB)
    for g0 in range(0, groups, GROUPS):
        g_ok = (g0 + c // 8) < groups
        ok = n_ok[:, None] & g_ok[None, :]
        w = tl.load(words + g0 * 8, mask=ok, other=0, eviction_policy="evict_first")
        s = tl.load(scales + g0, mask=ok, other=0.0).to(tl.float32)
        f0, f1, f2, f3, f4, f5, f6, f7 = _int4_words_to_f32(w, ASM)
        k0 = 64 * (g0 + c // 8) + c % 8  # nibble 0's k per column; nibble j's is k0 + 8·j
        x_ok = m_ok[:, None] & g_ok[None, :]
        # f_j = 2^23 + code_j · 16^i (i = j mod 4): f_j · 16^-i − (2^23 · 16^-i + 8) is code_j − 8 exactly
        acc = _nibble_dot(acc, f0, 1.0, 8388616.0, s, x_rows, k0, x_ok & (k0 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f1, 0.0625, 524296.0, s, x_rows, k0 + 8, x_ok & (k0 + 8 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f2, 0.00390625, 32776.0, s, x_rows, k0 + 16, x_ok & (k0 + 16 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f3, 0.000244140625, 2056.0, s, x_rows, k0 + 24, x_ok & (k0 + 24 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f4, 1.0, 8388616.0, s, x_rows, k0 + 32, x_ok & (k0 + 32 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f5, 0.0625, 524296.0, s, x_rows, k0 + 40, x_ok & (k0 + 40 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f6, 0.00390625, 32776.0, s, x_rows, k0 + 48, x_ok & (k0 + 48 < K)[None, :], IEEE)
        acc = _nibble_dot(acc, f7, 0.000244140625, 2056.0, s, x_rows, k0 + 56, x_ok & (k0 + 56 < K)[None, :], IEEE)
    tl.store(y_ptr + offs_m[None, :].to(tl.int64) * stride_ym + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=n_ok[:, None] & m_ok[None, :])


@triton.jit
def _int4_rows_fma_kernel(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_sn, stride_ym,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                          ASM: tl.constexpr = False):
    """The same product as _int4_rows_kernel by multiply-adds, as the one-row GEMV forms it (quant_gemv's
    _wo_int4_kernel) with a leading row axis: each code − 8 is formed once in fp32 and multiplied by every row's x
    (M ≤ BLOCK_M rows), the group's scale applied to the sums; no operand is converted for the tensor cores and the
    weight is never rounded to x's dtype. Tiles are [row, group, feature, word]."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    groups = (K + 63) // 64
    offs_g = tl.arange(0, GROUPS)
    words = q_ptr + offs_n[None, :, None].to(tl.int64) * stride_qn + tl.arange(0, 8)[None, None, :]
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_M, GROUPS, BLOCK_N, 8), dtype=tl.float32)
    for g0 in range(0, groups, GROUPS):
        gs = g0 + offs_g
        g_mask = gs < groups
        w = tl.load(words + gs[:, None, None] * 8, mask=n_mask[None, :, None] & g_mask[:, None, None], other=0,
                    eviction_policy="evict_first")
        offs_k = g0 * 64 + tl.arange(0, GROUPS * 64)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0).to(tl.float32)
        # x[m, 64 g + 8 j + t] for each nibble position j, as (BLOCK_M, GROUPS, 8 t): split out of [m, g, t, j]
        x = tl.reshape(tl.permute(tl.reshape(x, (BLOCK_M, GROUPS, 8, 8)), (0, 1, 3, 2)), (BLOCK_M, GROUPS, 8, 2, 2, 2))
        x0, x1, x2, x3, x4, x5, x6, x7 = _by_nibble(x)
        f0, f1, f2, f3, f4, f5, f6, f7 = _int4_words_to_f32(w, ASM)
        # f_j · 16^-i − (2^23 + 8 · 16^i) · 16^-i is code_j − 8 exactly (i = j mod 4), once for every row
        part = (f0 - 8388616.0)[None] * x0[:, :, None, :]
        part += (f1 * 0.0625 - 524296.0)[None] * x1[:, :, None, :]
        part += (f2 * 0.00390625 - 32776.0)[None] * x2[:, :, None, :]
        part += (f3 * 0.000244140625 - 2056.0)[None] * x3[:, :, None, :]
        part += (f4 - 8388616.0)[None] * x4[:, :, None, :]
        part += (f5 * 0.0625 - 524296.0)[None] * x5[:, :, None, :]
        part += (f6 * 0.00390625 - 32776.0)[None] * x6[:, :, None, :]
        part += (f7 * 0.000244140625 - 2056.0)[None] * x7[:, :, None, :]
        s = tl.load(s_ptr + offs_n[None, :].to(tl.int64) * stride_sn + gs[:, None],
                    mask=n_mask[None, :] & g_mask[:, None], other=0.0).to(tl.float32)
        acc += part * s[None, :, :, None]
    y = tl.sum(tl.sum(acc, axis=3), axis=1)  # (BLOCK_M, BLOCK_N)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_mask[None, :])


def int4_rows(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
              tile: tuple[int, int, int] | None = None, form: str = "dot") -> torch.Tensor:
    """x (..., K) of at most MAX_ROWS rows · dequant(q).T for q (N, ceil(K/64)·32) packed uint8 and scales (N,
    ceil(K/64)): (..., N) in x's dtype, accumulated in fp32. `tile` (BLOCK_N, GROUPS, num_warps) overrides
    tile_for(N). `form`: "dot" (the tensor cores, what the lab runs) or "fma" (multiply-adds, at most FMA_MAX_ROWS
    rows: a candidate benchmarks/quant_rows_bench.py times beside it, at its FMA_TILES)."""
    if form not in FORMS:
        raise ValueError(f"int4_rows: form {form!r}; use one of {', '.join(FORMS)}")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], q.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"int4_rows takes 1 to {MAX_ROWS} rows; x has {m}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    words, scales = _int4_operands(q, scales, k, f"x's {k} features")
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    interpreted = is_interpreted(_int4_rows_kernel)
    args = (x2, words, scales, y, m, n, k, x2.stride(0), words.stride(0), scales.stride(0), y.stride(0))
    if form == "fma":
        if m > FMA_MAX_ROWS:
            raise ValueError(f"int4_rows: the fma form takes at most {FMA_MAX_ROWS} rows; x has {m}")
        bn, groups, warps = tile or (INTERPRETER_TILE if interpreted else FMA_TILES[0])
        _int4_rows_fma_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=bn,
                                                     GROUPS=groups, ASM=not interpreted, num_warps=warps)
        return y.reshape(*x.shape[:-1], n)
    bn, groups, warps = tile or (INTERPRETER_TILE if interpreted else tile_for(n))
    _int4_rows_kernel[(triton.cdiv(n, bn),)](
        *args, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=bn, GROUPS=groups, ASM=not interpreted,
        IEEE=x.dtype == torch.float32, num_warps=warps)
    return y.reshape(*x.shape[:-1], n)


def tile_for(n: int) -> tuple[int, int, int]:
    """The tile for N output features: the first of TILES that gives at least MIN_PROGRAMS programs (else the
    narrowest)."""
    return next((t for t in TILES if n // t[0] >= MIN_PROGRAMS), TILES[-1])


def takes(x: torch.Tensor) -> bool:
    """Whether int4_rows runs where x is: a CUDA tensor, or any under the interpreter (CPU tests)."""
    return x.is_cuda or is_interpreted(_int4_rows_kernel)


@torch.library.custom_op("modelab::quant_rows_int4", mutates_args=())
def int4_rows_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for a few rows of x and group-wise int4 codes, through int4_rows: one opaque kernel to
    torch.compile, captured by CUDA graphs."""
    return int4_rows(x, q, scales)


@int4_rows_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


assert GROUP == 64  # the kernel's tile arithmetic assumes groups of 64 weights
