"""Hand-written Triton kernels for a Linear→ReLU→…→Linear(out=1) MLP trained with MSE and Adam (the `triton` mode).

One training step is 2L launches for L linear layers (6 for the house-price MLP), all replayed from one CUDA graph on
the GPU by engine/modes/triton_mlp.py:

- `linear_fwd_kernel`   out = relu?(x Wᵀ + b): a tiled matmul with the bias and the ReLU in its epilogue.
- `mse_head_kernel`     the last layer (one output) fused with the loss and its backward: y = h·w + b,
                        loss = mean((y - t)²), dy = 2 (y - t) / B, the last layer's weight and bias gradients, and
                        dz = dy wᵀ masked by the previous ReLU (h > 0); it also advances Adam's step counter and writes
                        this step's bias corrections for the update kernel (one program, so no race on the counter).
- `linear_bwd_kernel`   one launch per hidden layer for all three gradients: programs [0, n_w) reduce dW = dzᵀ a and
                        db = Σ dz over the batch (no atomics), programs [n_w, …) compute the input gradient dz @ W,
                        masked by the ReLU before it (a > 0) — i.e. the next layer's dz.
- `adam_kernel`         torch.optim.Adam's update over one flat buffer holding every parameter (the mode makes the
                        model's parameters views into it), so all parameters update in one launch.

Every matmul uses input_precision="ieee": Triton's default for fp32 dots is TF32, which would miss eager's fp32 by
~1e-3. On CPU the kernels run under TRITON_INTERPRET=1 (set before triton is imported; slow, for tests).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import is_interpreted  # also patches the 3.6 interpreter's program_id indexing


@triton.jit
def linear_fwd_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
                      RELU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc = tl.dot(a, w, acc, input_precision="ieee")  # w is the [BK, BN] tile of Wᵀ
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if RELU:
        acc = tl.maximum(acc, 0.0)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def mse_head_kernel(h_ptr, w_ptr, b_ptr, t_ptr, loss_ptr, dz_ptr, gw_ptr, gb_ptr, step_ptr, corr_ptr, M, H,
                    log2_beta1, log2_beta2, BM: tl.constexpr, BH: tl.constexpr):
    rh = tl.arange(0, BH)
    hmask = rh < H
    w = tl.load(w_ptr + rh, mask=hmask, other=0.0)
    b = tl.load(b_ptr)
    sq = tl.zeros((BM,), dtype=tl.float32)
    for m0 in range(0, M, BM):
        rm = m0 + tl.arange(0, BM)
        mmask = rm < M
        h = tl.load(h_ptr + rm[:, None] * H + rh[None, :], mask=mmask[:, None] & hmask[None, :], other=0.0)
        d = tl.where(mmask, tl.sum(h * w[None, :], axis=1) + b - tl.load(t_ptr + rm, mask=mmask, other=0.0), 0.0)
        sq += d * d
    tl.store(loss_ptr, tl.sum(sq, axis=0) / M)
    # Second pass recomputes y instead of reading back values this program stored (no cross-thread store→load).
    gw = tl.zeros((BH,), dtype=tl.float32)
    gb = tl.zeros((BM,), dtype=tl.float32)
    for m0 in range(0, M, BM):
        rm = m0 + tl.arange(0, BM)
        mmask = rm < M
        h = tl.load(h_ptr + rm[:, None] * H + rh[None, :], mask=mmask[:, None] & hmask[None, :], other=0.0)
        d = tl.where(mmask, tl.sum(h * w[None, :], axis=1) + b - tl.load(t_ptr + rm, mask=mmask, other=0.0), 0.0)
        dy = d * (2.0 / M)
        gw += tl.sum(dy[:, None] * h, axis=0)
        gb += dy
        dz = tl.where(h > 0.0, dy[:, None] * w[None, :], 0.0)  # the ReLU before this layer: h = relu(z)
        tl.store(dz_ptr + rm[:, None] * H + rh[None, :], dz, mask=mmask[:, None] & hmask[None, :])
    tl.store(gw_ptr + rh, gw, mask=hmask)
    tl.store(gb_ptr, tl.sum(gb, axis=0))
    step = tl.load(step_ptr) + 1.0
    tl.store(step_ptr, step)
    tl.store(corr_ptr, 1.0 - tl.exp2(step * log2_beta1))  # 1 - beta1^step
    tl.store(corr_ptr + 1, tl.sqrt_rn(1.0 - tl.exp2(step * log2_beta2)))  # sqrt(1 - beta2^step)


@triton.jit
def _weight_grad_tile(dz_ptr, a_ptr, gw_ptr, gb_ptr, tile, M, N, K, k_tiles,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # dW[rn, rk] = Σ_m dz[m, rn] a[m, rk]; db[rn] = Σ_m dz[m, rn] (written by the k-tile-0 programs).
    rn = (tile // k_tiles) * BN + tl.arange(0, BN)
    rk = (tile % k_tiles) * BK + tl.arange(0, BK)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    gb = tl.zeros((BN,), dtype=tl.float32)
    for m0 in range(0, M, BM):
        rm = m0 + tl.arange(0, BM)
        dz = tl.load(dz_ptr + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        acc = tl.dot(tl.trans(dz), a, acc, input_precision="ieee")
        gb += tl.sum(dz, axis=0)
    tl.store(gw_ptr + rn[:, None] * K + rk[None, :], acc, mask=(rn[:, None] < N) & (rk[None, :] < K))
    tl.store(gb_ptr + rn, gb, mask=(rn < N) & (tile % k_tiles == 0))


@triton.jit
def _input_grad_tile(dz_ptr, a_ptr, w_ptr, da_ptr, tile, M, N, K, k_tiles,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # da[rm, rk] = (Σ_n dz[rm, n] W[n, rk]) · (a[rm, rk] > 0): the previous layer's dz.
    rm = (tile // k_tiles) * BM + tl.arange(0, BM)
    rk = (tile % k_tiles) * BK + tl.arange(0, BK)
    acc = tl.zeros((BM, BK), dtype=tl.float32)
    for n0 in range(0, N, BN):
        rn = n0 + tl.arange(0, BN)
        dz = tl.load(dz_ptr + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc = tl.dot(dz, w, acc, input_precision="ieee")
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=mask, other=0.0)
    tl.store(da_ptr + rm[:, None] * K + rk[None, :], tl.where(a > 0.0, acc, 0.0), mask=mask)


@triton.jit
def linear_bwd_kernel(dz_ptr, a_ptr, w_ptr, gw_ptr, gb_ptr, da_ptr, M, N, K, n_w_programs, k_tiles,
                      HAS_DA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # Programs [0, n_w_programs) reduce the weight / bias gradients, the rest compute the input gradient.
    pid = tl.program_id(0)
    if pid < n_w_programs:
        _weight_grad_tile(dz_ptr, a_ptr, gw_ptr, gb_ptr, pid, M, N, K, k_tiles, BM, BN, BK)
    elif HAS_DA:
        _input_grad_tile(dz_ptr, a_ptr, w_ptr, da_ptr, pid - n_w_programs, M, N, K, k_tiles, BM, BN, BK)


@triton.jit
def adam_kernel(p_ptr, g_ptr, m_ptr, v_ptr, corr_ptr, n, lr, beta1, beta2, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    bias_correction1 = tl.load(corr_ptr)
    bias_correction2_sqrt = tl.load(corr_ptr + 1)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    m = m + (1.0 - beta1) * (g - m)  # torch: exp_avg.lerp_(grad, 1 - beta1)
    v = v * beta2 + (1.0 - beta2) * g * g
    denom = tl.sqrt_rn(v) / bias_correction2_sqrt + eps
    p = p - (lr / bias_correction1) * (m / denom)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(p_ptr + offs, p, mask=mask)


def _rows_block(m: int) -> int:
    """Row tile: the batch rounded up to a power of two, 16 (tl.dot's minimum) to 32. Small tiles, many programs:
    fp32 IEEE dots run on the CUDA cores, so at these sizes spreading the work over SMs beats bigger tiles."""
    return max(16, min(32, triton.next_power_of_2(m)))


def _k_block(k: int) -> int:
    return max(16, min(32, triton.next_power_of_2(k)))


def interpreted() -> bool:
    """True when these kernels run in Triton's interpreter (decided when this module was imported)."""
    return is_interpreted(linear_fwd_kernel)


def interpreter_consistent() -> bool:
    """Whether triton itself was imported in the same mode as these kernels. Its own jit helpers (tl.zeros, tl.sum)
    are decorated when triton is imported: interpreted kernels calling GPU-compiled helpers fail at the first launch."""
    import triton.language.standard as standard

    return is_interpreted(standard.zeros) == interpreted()


def linear_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor, relu: bool) -> None:
    """out[M, N] = relu?(x[M, K] @ w[N, K]ᵀ + b[N]); all contiguous float32."""
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk = _rows_block(m), 32 if n > 16 else 16, _k_block(k)
    linear_fwd_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](x, w, b, out, m, n, k, RELU=relu, BM=bm, BN=bn,
                                                                 BK=bk, num_warps=4)


def mse_head(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, target: torch.Tensor, loss: torch.Tensor,
             dz: torch.Tensor, gw: torch.Tensor, gb: torch.Tensor, step: torch.Tensor, corr: torch.Tensor,
             betas: tuple[float, float]) -> None:
    """Last layer (h[M, H] → 1) + MSE + its backward; also Adam's step += 1 and corr = (1 - β1^t, sqrt(1 - β2^t))."""
    m, hid = h.shape
    bh = triton.next_power_of_2(hid)
    bm = max(1, min(32, 8192 // bh))  # a [BM, BH] tile of at most 8192 floats per pass
    mse_head_kernel[(1,)](h, w, b, target, loss, dz, gw, gb, step, corr, m, hid, math.log2(betas[0]),
                          math.log2(betas[1]), BM=bm, BH=bh, num_warps=8)


def linear_bwd(dz: torch.Tensor, a: torch.Tensor, w: torch.Tensor, gw: torch.Tensor, gb: torch.Tensor,
               da: torch.Tensor | None) -> None:
    """gw = dzᵀ a, gb = Σ dz, and (if da is given) da = (dz @ w) * (a > 0); dz [M, N], a [M, K], w [N, K]."""
    m, n = dz.shape
    k = a.shape[1]
    bm, bn, bk = _rows_block(m), 32, _k_block(k)
    k_tiles = triton.cdiv(k, bk)
    n_w = triton.cdiv(n, bn) * k_tiles
    n_da = triton.cdiv(m, bm) * k_tiles if da is not None else 0
    linear_bwd_kernel[(n_w + n_da,)](dz, a, w, gw, gb, da if da is not None else gw, m, n, k, n_w, k_tiles,
                                     HAS_DA=da is not None, BM=bm, BN=bn, BK=bk, num_warps=4)


def adam(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, corr: torch.Tensor, lr: float,
         betas: tuple[float, float], eps: float) -> None:
    """torch.optim.Adam's step over flat buffers, the bias corrections read from corr (written by mse_head)."""
    n = p.numel()
    block = 1024
    adam_kernel[(triton.cdiv(n, block),)](p, g, m, v, corr, n, lr, betas[0], betas[1], eps, BLOCK=block, num_warps=4)
