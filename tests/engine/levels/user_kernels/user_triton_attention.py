"""A user's Triton kernel for the causal_attention component: `attention(q, k, v) -> out`, a causal flash-attention
forward written the way Triton's official tutorial does it (triton-lang/triton, python/tutorials/06-fused-attention.py:
`_attn_fwd` and `_attn_fwd_inner`), as a user would bring it to the lab (`--impl user_triton_attention:attention`).

Followed from the tutorial:
- one program per BLOCK_M query rows of one (batch, head), grid (cdiv(N_CTX, BLOCK_M), Z * H); the Q tile stays on chip
  while BLOCK_N-wide K/V tiles stream by through block pointers (`tl.make_block_ptr`, `tl.advance`);
- online softmax in fp32 with exp2: sm_scale is multiplied by log2(e) (1.44269504) once, a running row max `m_i` and
  row sum `l_i`, the accumulator rescaled by exp2(m_old - m_new), divided by `l_i` at the end;
- the causal split: STAGE 3 runs `_attn_fwd_inner` with stage 1 (the key blocks left of the diagonal, no mask) and then
  stage 2 (the diagonal block, masked with `offs_m >= start_n + offs_n`, -1.0e6 added where masked);
- a small `@triton.autotune` keyed on N_CTX and HEAD_DIM: BLOCK_M in {64, 128}, BLOCK_N in {32, 64}, num_stages in
  {3, 4}, num_warps in {4, 8} through the tutorial's `keep` filter (8 warps only for 128 x 128 tiles, so 8 configs of
  4 warps remain), BLOCK_N <= HEAD_DIM; one config when TRITON_INTERPRET=1 (the interpreter is slow and its timings
  mean nothing). Every config compiles for sm_90 (checked offline with Triton 3.6's ptxas); fp32 tiles that need more
  shared memory than the device has are skipped by the autotuner.

Changed from it: causal forward only (no backward, no logsumexp `M` for it, no non-causal stage), no FP8 and no
TMA/tensor-descriptor paths (this runs in the interpreter and on Triton 3.6 on sm_90); any N_CTX, not only multiples
of the block: Q, the diagonal's K/V tiles and the output go through the block pointers' `boundary_check` with zero
padding (padded keys sit right of every real query row's diagonal, so the causal mask drops them; padded query rows
are never stored), and stage 2 stops at N_CTX; `p` is cast to V's dtype rather than fp16 (fp32 and bf16 inputs); fp32
inputs multiply with "tf32x3" dots (about fp32 accuracy; the default "tf32" is ~1e-3 off) — the interpreter multiplies
in full fp32 anyway.
Inputs: q, k, v (B, H, S, D), one dtype (float32 or bfloat16), D in {32, 64, 128}; output a new tensor like q.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

HEAD_DIMS = (32, 64, 128)
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # what triton.jit decides on when this module loads


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    K_block_ptr, V_block_ptr,  #
                    start_m, qk_scale,  #
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,  #
                    STAGE: tl.constexpr, offs_m, offs_n,  #
                    N_CTX, DOT_PREC: tl.constexpr):
    # range of values handled by this stage
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    else:
        tl.static_assert(STAGE == 2)  # causal only: the tutorial's non-causal stage 3 is left out
        lo, hi = start_m * BLOCK_M, tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
        lo = tl.multiple_of(lo, BLOCK_M)
    K_block_ptr = tl.advance(K_block_ptr, (0, lo))
    V_block_ptr = tl.advance(V_block_ptr, (lo, 0))
    # loop over k, v and update accumulator
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        # -- compute qk ----
        if STAGE == 1:  # every key block lies inside N_CTX
            k = tl.load(K_block_ptr)
        else:
            k = tl.load(K_block_ptr, boundary_check=(1,), padding_option="zero")
        qk = tl.dot(q, k, input_precision=DOT_PREC)
        if STAGE == 2:
            mask = offs_m[:, None] >= (start_n + offs_n[None, :])
            qk = qk * qk_scale + tl.where(mask, 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        # -- update m_i and l_i
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        # -- update output accumulator --
        acc = acc * alpha[:, None]
        if STAGE == 1:
            v = tl.load(V_block_ptr)
        else:
            v = tl.load(V_block_ptr, boundary_check=(0,), padding_option="zero")
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        # update m_i and l_i
        m_i = m_ij
        V_block_ptr = tl.advance(V_block_ptr, (BLOCK_N, 0))
        K_block_ptr = tl.advance(K_block_ptr, (0, BLOCK_N))
    return acc, l_i, m_i


configs = [
    triton.Config({"BLOCK_M": BM, "BLOCK_N": BN}, num_stages=s, num_warps=w)
    for BM in [64, 128]
    for BN in [32, 64]
    for s in [3, 4]
    for w in [4, 8]
]


def keep(conf: triton.Config) -> bool:
    """The tutorial's filter: 8 warps only for tiles of at least 128 x 128."""
    BLOCK_M = conf.kwargs["BLOCK_M"]
    BLOCK_N = conf.kwargs["BLOCK_N"]
    return not (BLOCK_M * BLOCK_N < 128 * 128 and conf.num_warps == 8)


def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The tutorial's static_assert(BLOCK_N <= HEAD_DIM), as a prune rather than failed compiles (D = 32)."""
    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    return [c for c in configs if c.kwargs["BLOCK_N"] <= head_dim] or configs[:1]


# The interpreter: one config, no tuning (it would time numpy).
CONFIGS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32})] if INTERPRET else list(filter(keep, configs))


@triton.autotune(CONFIGS, key=["N_CTX", "HEAD_DIM"], prune_configs_by={"early_config_prune": prune})
@triton.jit
def _attn_fwd(Q, K, V, sm_scale, Out,  #
              stride_qz, stride_qh, stride_qm, stride_qk,  #
              stride_kz, stride_kh, stride_kn, stride_kk,  #
              stride_vz, stride_vh, stride_vk, stride_vn,  #
              stride_oz, stride_oh, stride_om, stride_on,  #
              Z, H, N_CTX,  #
              HEAD_DIM: tl.constexpr,  #
              BLOCK_M: tl.constexpr,  #
              BLOCK_N: tl.constexpr,  #
              STAGE: tl.constexpr,  #
              DOT_PREC: tl.constexpr  #
              ):
    tl.static_assert(BLOCK_N <= HEAD_DIM)
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # stage 1 ends on a BLOCK_N boundary
    tl.static_assert(STAGE == 3)  # causal: stage 1 (off-band), then stage 2 (on-band)
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    q_offset = off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_offset = off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_offset = off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    o_offset = off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh

    # block pointers
    Q_block_ptr = tl.make_block_ptr(
        base=Q + q_offset,
        shape=(N_CTX, HEAD_DIM),
        strides=(stride_qm, stride_qk),
        offsets=(start_m * BLOCK_M, 0),
        block_shape=(BLOCK_M, HEAD_DIM),
        order=(1, 0),
    )
    V_block_ptr = tl.make_block_ptr(
        base=V + v_offset,
        shape=(N_CTX, HEAD_DIM),
        strides=(stride_vk, stride_vn),
        offsets=(0, 0),
        block_shape=(BLOCK_N, HEAD_DIM),
        order=(1, 0),
    )
    K_block_ptr = tl.make_block_ptr(
        base=K + k_offset,
        shape=(HEAD_DIM, N_CTX),
        strides=(stride_kk, stride_kn),
        offsets=(0, 0),
        block_shape=(HEAD_DIM, BLOCK_N),
        order=(0, 1),
    )
    O_block_ptr = tl.make_block_ptr(
        base=Out + o_offset,
        shape=(N_CTX, HEAD_DIM),
        strides=(stride_om, stride_on),
        offsets=(start_m * BLOCK_M, 0),
        block_shape=(BLOCK_M, HEAD_DIM),
        order=(1, 0),
    )
    # initialize offsets
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    # initialize pointer to m and l
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # load scales
    qk_scale = sm_scale
    qk_scale *= 1.44269504  # 1/log(2)
    # load q: it will stay in SRAM throughout
    q = tl.load(Q_block_ptr, boundary_check=(0,), padding_option="zero")
    # stage 1: off-band
    # For causal = True, STAGE = 3 and _attn_fwd_inner gets 1 as its STAGE
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_block_ptr, V_block_ptr,  #
                                        start_m, qk_scale,  #
                                        BLOCK_M, HEAD_DIM, BLOCK_N,  #
                                        4 - STAGE, offs_m, offs_n, N_CTX, DOT_PREC  #
                                        )
    # stage 2: on-band
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_block_ptr, V_block_ptr,  #
                                        start_m, qk_scale,  #
                                        BLOCK_M, HEAD_DIM, BLOCK_N,  #
                                        2, offs_m, offs_n, N_CTX, DOT_PREC  #
                                        )
    # epilogue
    acc = acc / l_i[:, None]
    tl.store(O_block_ptr, acc.to(Out.type.element_ty), boundary_check=(0,))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √D + causal mask) v for q, k, v (B, H, S, D); a new tensor of q's shape and dtype."""
    HEAD_DIM_Q, HEAD_DIM_K, HEAD_DIM_V = q.shape[-1], k.shape[-1], v.shape[-1]
    assert HEAD_DIM_Q == HEAD_DIM_K == HEAD_DIM_V and HEAD_DIM_K in HEAD_DIMS, f"head dim must be one of {HEAD_DIMS}"
    assert q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype, "q, k, v must match in shape and dtype"
    assert q.dtype in (torch.float32, torch.bfloat16), f"float32 or bfloat16 inputs, not {q.dtype}"
    if q.device.type != "cuda" and not INTERPRET:
        raise RuntimeError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before triton is imported")
    o = torch.empty_like(q)
    sm_scale = HEAD_DIM_K ** -0.5
    stage = 3  # causal

    def grid(args: dict) -> tuple[int, int, int]:
        return (triton.cdiv(q.shape[2], args["BLOCK_M"]), q.shape[0] * q.shape[1], 1)

    _attn_fwd[grid](
        q, k, v, sm_scale, o,  #
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),  #
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),  #
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),  #
        o.stride(0), o.stride(1), o.stride(2), o.stride(3),  #
        q.shape[0], q.shape[1],  #
        N_CTX=q.shape[2],  #
        HEAD_DIM=HEAD_DIM_K,  #
        STAGE=stage,  #
        DOT_PREC="tf32x3" if q.dtype == torch.float32 else "tf32",
    )
    return o
