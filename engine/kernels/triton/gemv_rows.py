"""Y = X @ W.T for a few rows X (a decode step at 2 ≤ B ≤ 64) and 16-bit weights, with the fused decode step's
prologue and epilogues: the few-row counterpart of engine/kernels/triton/gemv.py.

Why: a decode step at B rows still reads every weight once, so its products are bandwidth-bound up to B in the
tens; what the step needs is a kernel that streams W at the copy bandwidth whatever B is. cuBLAS's GEMMs for M = 2–32
are tiles built for compute and reach ~78 % of the copy bandwidth on the 7B's layer where the one-row GEMV reaches
~91 % (benchmarks/decode_envelope.py). Here each program owns BLOCK_N output features and walks K in BLOCK_K chunks
through Triton's pipelined loop (STAGES − 1 tiles of W in flight through shared memory, streamed with evict_first);
the rows (padded to 16, the smallest tensor-core tile) are multiplied by each W tile with tl.dot. The bytes a step
reads stay W's, and the few rows cost the tensor cores nothing.

The decode step's fusions ride along as in the GEMV: NORM — the RMSNorm of each row, its sum of squares taken in the
same pass over X and X scaled by the norm weight before the dot (the row's rstd multiplies the result, a scalar per
row); GLU — W is [gate; up] and the program takes interleaved gate and up rows (engine.kernels.triton._common
.output_rows), so SwiGLU is formed in the epilogue; ADD — the residual added in the epilogue.

`rows(x, w, …)` launches it; `rows_linear` is the torch custom op (`modelab::gemv_rows`) the fused decode step
(engine.kernels.triton.gemv.FusedDecodeOps) calls where engine.kernels.choice.decode_products says "rows". `tile`
(BLOCK_N, BLOCK_K, num_warps, STAGES) is a parameter for benchmarks/decode_envelope.py, which times the tiles and
this kernel against cuBLAS per B. The checks (interpreted, against float64) sit in tests/engine/kernels/
test_gemv_rows.py, the offline sm_90 compile in benchmarks/triton_aot_check.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import is_interpreted, output_rows

MAX_ROWS = 64  # the most rows one call takes: beyond that a decode step is a GEMM's work
# (BLOCK_N, BLOCK_K, num_warps, STAGES) on the GPU: 32 features a program give the 7B's 4096-wide products 128
# programs and its gate_up 688; 256 of K a step with 4 stages keep 3 × 16 KB of W in flight per program.
TILE = (32, 256, 4, 4)
INTERPRETER_TILE = (16, 32, 1, 1)  # ragged K and N tails at the test shapes
# what benchmarks/decode_envelope.py --rows-tiles times (TILE among them) and benchmarks/triton_aot_check.py builds
AOT_TILES = (TILE, (16, 256, 4, 4), (16, 512, 4, 3), (32, 128, 4, 4), (64, 128, 4, 4), (64, 256, 8, 3))


@triton.jit
def _rows_kernel(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, M, N, K, stride_xm, stride_wn, stride_ym, eps,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 NORM: tl.constexpr, ADD: tl.constexpr, GLU: tl.constexpr, IEEE: tl.constexpr = False):
    """Y[m] = X[m] @ W.T for M ≤ BLOCK_M rows; NORM: X[m] RMS-normalised and scaled by g first; ADD: Y += R (M × N,
    y's row stride); GLU: W = [gate; up], Y[m] = silu(X[m] @ gate.T) · (X[m] @ up.T), N / 2 values a row.
    IEEE: fp32 operands multiplied exactly (no tf32)."""
    pid_n = tl.program_id(0)
    offs_n, n_mask = output_rows(pid_n, N, BLOCK_N, GLU)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_cols = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn  # W's rows as the columns of a (K, N) tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(w_cols + offs_k[:, None], mask=k_ok[:, None] & n_mask[None, :], other=0.0,
                    eviction_policy="evict_first")
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            xf = x.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
            g = tl.load(g_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            x = (xf * g[None, :]).to(w.dtype)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if NORM:
        acc = acc * tl.rsqrt(sumsq / K + eps)[:, None]
    y_rows = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym
    if GLU:
        gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        offs = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(y_rows + offs[None, :], (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & (offs < N // 2)[None, :])
    else:
        if ADD:
            r_rows = r_ptr + offs_m[:, None].to(tl.int64) * stride_ym
            acc += tl.load(r_rows + offs_n[None, :], mask=m_ok[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
        tl.store(y_rows + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_mask[None, :])


def rows(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
         residual: torch.Tensor | None = None, glu: bool = False,
         tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x (..., K) of at most MAX_ROWS rows · W (N, K) → (..., N) (with `glu`: (..., N / 2)) in x's dtype, accumulated
    in fp32. `norm_weight` (K,): each row RMS-normalised first; `residual` (..., N): added; `glu`: W is [gate; up] and
    the result silu(gate) · up. `tile` (BLOCK_N, BLOCK_K, num_warps, STAGES) overrides TILE."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m, (n, k_w) = x2.shape[0], w.shape
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"gemv_rows takes 1 to {MAX_ROWS} rows; x has {m}")
    if k_w != k:
        raise ValueError(f"weight {tuple(w.shape)} does not match x's {k} features")
    if norm_weight is not None and norm_weight.numel() != k:
        raise ValueError(f"norm weight has {norm_weight.numel()} elements for {k} features")
    if glu and (n % 2 or residual is not None):
        raise ValueError(f"gemv_rows: glu needs an even number of rows ([gate; up], got {n}) and no residual")
    if residual is not None and residual.numel() != m * n:
        raise ValueError(f"residual has {residual.numel()} elements for {m} rows of {n} outputs")
    x2 = x2.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    y = torch.empty(m, n // 2 if glu else n, device=x.device, dtype=x.dtype)
    g = norm_weight.reshape(-1).contiguous() if norm_weight is not None else x2  # unread unless NORM
    r = residual.reshape(m, n).contiguous() if residual is not None else y  # unread unless ADD
    interpreted = is_interpreted(_rows_kernel)
    bn, bk, warps, stages = tile or (INTERPRETER_TILE if interpreted else TILE)
    _rows_kernel[(triton.cdiv(n, bn),)](
        x2, w, y, g, r, m, n, k, x2.stride(0), w.stride(0), y.stride(0), float(eps),
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=bn, BLOCK_K=bk, STAGES=stages,
        NORM=norm_weight is not None, ADD=residual is not None, GLU=glu, IEEE=x.dtype == torch.float32,
        num_warps=warps)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def takes(x: torch.Tensor) -> bool:
    """Whether the kernel runs where x is: a CUDA tensor, or any under the interpreter (CPU tests)."""
    return x.is_cuda or is_interpreted(_rows_kernel)


@torch.library.custom_op("modelab::gemv_rows", mutates_args=())
def rows_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
                residual: torch.Tensor | None, glu: bool) -> torch.Tensor:
    """`rows` as one opaque kernel to torch.compile, captured by CUDA graphs."""
    return rows(x, weight, norm_weight, eps, residual, glu)


@rows_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
      residual: torch.Tensor | None, glu: bool) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2 if glu else weight.shape[0]))
