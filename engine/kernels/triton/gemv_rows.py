"""Y = X @ W.T for a few rows X (a decode step at 2 ≤ B ≤ 32) and a 16-bit weight, split over K: a candidate for
the products the decode step hands cuBLAS from B = 2, not yet timed on a GPU and not used by the lab.

Why: from B = 2 the fused decode step's products are cuBLAS GEMMs (engine/kernels/choice.py), which stream a 7B
layer's weights at ~77 % of the copy bandwidth where the one-row GEMV reaches ~91 % (benchmarks/decode_envelope.py). A
first rows kernel (one program per BLOCK_N features walking all of K) ran at 47 %: a 4096-wide product gave it 64–128
programs for 132 SMs. Here the grid is (features / BLOCK_N) × SPLIT_K, each program a BLOCK_N × (K / SPLIT_K) slice
of W, so even the 2048-wide products of a 1B fill the device:

    split kernel  — W's slice (BLOCK_N × BLOCK_K at a time, K contiguous, streamed once with evict_first, STAGES − 1
                    tiles in flight through Triton's pipelined loop) times X's rows on the tensor cores: the features
                    are the dot's M side and the rows, padded to 16, its N side (Yᵀ is accumulated, so BLOCK_N can
                    be 64 or 128 while B is 2); fp32 partial sums to a (SPLIT_K, M, N) workspace, or, with SPLIT_K 1,
                    straight to Y;
    reduce kernel — Y = Σ over the splits, in X's dtype.

`rows(x, w, split_k, tile)` launches it; benchmarks/rows_gemm_bench.py times it at each tile and split count against
cuBLAS per weight shape and B. tests/engine/kernels/test_gemv_rows.py checks it interpreted against float64;
benchmarks/triton_aot_check.py --kernels gemv_rows builds it for sm_90.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import is_interpreted

MAX_ROWS = 32  # the most rows one call takes: the rows are the dot's N side, padded to a power of two ≥ 16
# (BLOCK_N, BLOCK_K, num_warps, STAGES) the benchmark times; the first is the default
TILES = ((64, 128, 8, 4), (128, 128, 8, 4), (64, 64, 4, 4), (128, 64, 8, 4), (32, 256, 4, 4), (32, 128, 4, 4))
SPLITS = (1, 2, 4, 8)  # the split counts the benchmark times at each tile
INTERPRETER_TILE = (16, 32, 1, 1)  # ragged K and N tails at the test shapes
REDUCE_BLOCK = 1024


@triton.jit
def _split_kernel(x_ptr, w_ptr, out_ptr, M, N, K, K_PER, stride_xm, stride_wn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                  IEEE: tl.constexpr = False):
    """out[pid_k, m, n] = Σ_{k in split pid_k} X[m, k] · W[n, k] in fp32 (out is the workspace, or Y itself when
    there is one split: then stored in Y's dtype). IEEE: fp32 operands multiplied exactly (no tf32)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    k_lo = pid_k * K_PER
    k_hi = tl.minimum(k_lo + K_PER, K)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    x_cols = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_hi
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                    eviction_policy="evict_first")  # (BLOCK_N, BLOCK_K)
        x = tl.load(x_cols + offs_k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)  # (BLOCK_K, BLOCK_M)
        if IEEE:
            acc = tl.dot(w, x, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x, acc)
    out = out_ptr + (pid_k * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


@triton.jit
def _reduce_kernel(ws_ptr, y_ptr, MN, SPLIT_K, BLOCK: tl.constexpr):
    """y[i] = Σ_s ws[s, i] over the SPLIT_K partial sums, in y's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


def rows(x: torch.Tensor, w: torch.Tensor, split_k: int = 1,
         tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x (..., K) of at most MAX_ROWS rows · W (N, K) → (..., N) in x's dtype, accumulated in fp32 over `split_k`
    slices of K (each at least one BLOCK_K step; fewer run where K is short). `tile` (BLOCK_N, BLOCK_K, num_warps,
    STAGES) overrides TILES[0]."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m, (n, k_w) = x2.shape[0], w.shape
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"gemv_rows takes 1 to {MAX_ROWS} rows; x has {m}")
    if k_w != k:
        raise ValueError(f"weight {tuple(w.shape)} does not match x's {k} features")
    if split_k < 1:
        raise ValueError(f"gemv_rows: split_k must be at least 1, got {split_k}")
    x2 = x2.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    interpreted = is_interpreted(_split_kernel)
    bn, bk, warps, stages = tile or (INTERPRETER_TILE if interpreted else TILES[0])
    k_per = triton.cdiv(triton.cdiv(k, split_k), bk) * bk
    splits = triton.cdiv(k, k_per)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    out = y if splits == 1 else torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
    _split_kernel[(triton.cdiv(n, bn), splits)](
        x2, w, out, m, n, k, k_per, x2.stride(0), w.stride(0), BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, IEEE=x.dtype == torch.float32, num_warps=warps)
    if splits > 1:
        _reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](out, y, m * n, splits, BLOCK=REDUCE_BLOCK, num_warps=4)
    return y.reshape(*x.shape[:-1], n)
