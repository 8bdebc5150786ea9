"""Kernel Levels' L4 attention on Hopper in Triton's Gluon dialect: warp-specialised, FlashAttention-3's layout of
work (sm_90, bf16/fp16, D 64 or 128, causal or not, any S).

Why: the tl kernel (attention.py) stays behind SDPA at S = 4096 on Hopper, and what is left is FlashAttention-3's
design — a producer warp loading by TMA while consumer warpgroups run the matrix products — which tl cannot express
on Hopper (docs/kernel-levels.md). Gluon, Triton 3.6's lower-level dialect, can: explicit layouts, shared memory,
mbarriers, TMA copies, asynchronous warpgroup MMAs and `warp_specialize` with a register count per partition.

One program owns 128 query rows of one (batch, head), as three partitions of 4 warps:
- the producer (24 registers a thread) loads q once (two 64-row boxes), then key and value tiles of 128 rows into a
  ring of STAGES slots each; a slot's "full" mbarrier completes when its bytes land, its "empty" one when both
  consumers have released it;
- two consumers (the default partition and one worker, 64 query rows each): S = q kᵀ on the tensor cores (both
  operands from shared memory), the online softmax in registers (exp2, log2(e) folded into the scale), then
  O += P v with P from registers; rows are scaled by the new maximum before P v is issued.
Causal: key tiles past the block's last row are never loaded; the diagonal tile is masked. The (B·H·S, D) tensors
are read through one flat descriptor each, so a tile crossing S reads the next head's rows (or zeros past the end):
their scores are masked to -inf and their P is 0. The output is stored through pointers, rows < S only.

Inside each consumer FlashAttention-3's order: q K(n)ᵀ issued with O += P(n-1) V(n-1), the softmax of S(n) while
that P V runs (in the sm_90 SASS all 66 exponentials of a tile sit between the two waits; a test reads them).

It is ahead of the tl kernel at S = 4096 and behind it at S = 1024 and on the ViT's short rows
(docs/kernel-levels.md), so `attention.attention` times both once per shape and keeps the faster.
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_M = 128  # query rows per program: two consumers of 64
BLOCK_N = 128  # keys per tile
STAGES = 2  # key and value tiles in flight
HEAD_DIMS = (64, 128)
LOG2E = 1.4426950408889634


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty,
              q_row, kv_row, num_n):
    """One warp issues every load: q (two 64-row boxes), then K(n) and V(n) into slot n % STAGES once it is empty."""
    n_stages: gl.constexpr = k_smem.shape[0]
    block_n: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + 64, 0], q_bar, q_smem.index(1))
    for n in range(num_n):
        slot = n % n_stages
        phase = (n // n_stages) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)  # a fresh barrier passes parity 1: the first round is free
        mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + n * block_n, 0], k_full.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + n * block_n, 0], v_full.index(slot), v_smem.index(slot))


@gluon.jit
def _softmax_tile(qk, m_i, l_i, rows, n, S, qk_scale, causal, MASK: gl.constexpr):
    """Tile n's raw scores → (P unnormalised, alpha for O's rows, the new row max, the new row sum); the row max is
    kept in scaled units, so each probability is one fused multiply-add and one exp2. MASK: the tile holds keys past
    S or (causal) past a row — only a block's last tile can; the others skip the mask's compares and selects."""
    if MASK:
        block_n: gl.constexpr = qk.shape[1]
        cols = n * block_n + gl.arange(0, block_n, layout=gl.SliceLayout(0, qk.type.layout))
        keep = gl.expand_dims(cols < S, 0)
        keep = keep & ((gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1)) | (causal == 0))
        qk = gl.where(keep, qk, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: keep exp2 finite
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(qk * qk_scale - gl.expand_dims(m_use, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _rescale(acc, alpha):
    """O's rows times alpha (the row max grew)."""
    return acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)


@gluon.jit
def _store_rows(c: gl.constexpr, acc, l_i, o_ptr, head_row0, m0, S):
    """O / row sum into consumer c's rows of the output, rows < S only."""
    head_dim: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / gl.expand_dims(gl.where(l_o > 0, l_o, 1.0), 1)
    o_rows = m0 + c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, head_dim, layout=gl.SliceLayout(0, o_layout))
    ptrs = o_ptr + gl.expand_dims((head_row0 + o_rows).to(gl.int64) * head_dim, 1) + gl.expand_dims(o_cols, 0)
    gl.store(ptrs, out.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(o_rows < S, 1))


@gluon.jit
def _consumer_start(c: gl.constexpr, k_smem, m0):
    """Consumer c's rows and starting state: (its query rows, row max -inf, row sum 0, O = 0, a zero score tile), in
    the layouts of the wgmma accumulators (scores 64 x BLOCK_N, O 64 x D)."""
    block_n: gl.constexpr = k_smem.shape[1]
    head_dim: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, block_n, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, head_dim, 16])
    rows = m0 + c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([64], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([64, head_dim], gl.float32, layout=o_layout)
    return rows, m_i, l_i, acc, gl.zeros([64, block_n], gl.float32, layout=s_layout)


@gluon.jit
def _overlapped_step(c: gl.constexpr, n, q, k_smem, v_smem, k_full, k_empty, v_full, v_empty, sink, rows, S, qk_scale,
                     causal, acc, p_op, alpha, m_i, l_i, no_scores, MASK: gl.constexpr):
    """One tile in FlashAttention-3's order: q K(n)ᵀ issued together with O += P(n-1) V(n-1), the softmax of S(n)
    while that P V runs. Returns (O, P(n) as the next product's operand, alpha, row max, row sum)."""
    n_stages: gl.constexpr = k_smem.shape[0]
    slot = n % n_stages
    prev = (n - 1) % n_stages
    mbarrier.wait(k_full.index(slot), (n // n_stages) & 1)
    mbarrier.wait(v_full.index(prev), ((n - 1) // n_stages) & 1)
    qk = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), no_scores, use_acc=False, is_async=True)
    acc = _rescale(acc, alpha)  # O to tile n-1's row max while q K(n)ᵀ runs
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))  # S(n) has landed; P(n-1) V(n-1) may still run
    mbarrier.arrive(k_empty.index(slot))
    p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, rows, n, S, qk_scale, causal, MASK)
    # P(n-1) V(n-1) done with P's registers. The row sums, which need every probability of the tile, are stored to
    # shared memory first: that store stays in order with the wait, so the softmax runs before it (the compiler
    # otherwise sinks most of the softmax below the wait, and the overlap this order exists for is lost)
    sink.index(c).store(l_i)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    mbarrier.arrive(v_empty.index(prev))
    p_op = gl.convert_layout(p.to(q.dtype), p_op.type.layout)
    return acc, p_op, alpha, m_i, l_i


@gluon.jit
def _consume(c: gl.constexpr, q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty, o_ptr, head_row0, m0,
             S, qk_scale, num_n, causal, sink):
    """Consumer c: query rows m0 + 64c … of the head starting at flat row head_row0, over num_n key tiles, in
    FlashAttention-3's order inside the warpgroup (_overlapped_step). Only the last tile is masked: the unmasked
    tiles run in the loop, the last one after it."""
    n_stages: gl.constexpr = k_smem.shape[0]
    rows, m_i, l_i, acc, no_scores = _consumer_start(c, k_smem, m0)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    mbarrier.wait(q_bar, 0)
    q = q_smem.index(c)
    # tile 0: scores only
    mbarrier.wait(k_full.index(0), 0)
    qk = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), no_scores, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
    mbarrier.arrive(k_empty.index(0))
    if num_n == 1:
        p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, rows, 0, S, qk_scale, causal, True)
    else:
        p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, rows, 0, S, qk_scale, causal, False)
    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    step = (q, k_smem, v_smem, k_full, k_empty, v_full, v_empty, sink, rows, S, qk_scale, causal)
    for n in range(1, num_n - 1):
        acc, p_op, alpha, m_i, l_i = _overlapped_step(c, n, *step, acc, p_op, alpha, m_i, l_i, no_scores, False)
    if num_n > 1:
        acc, p_op, alpha, m_i, l_i = _overlapped_step(c, num_n - 1, *step, acc, p_op, alpha, m_i, l_i, no_scores,
                                                      True)
    last = (num_n - 1) % n_stages
    mbarrier.wait(v_full.index(last), ((num_n - 1) // n_stages) & 1)
    acc = _rescale(acc, alpha)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(v_empty.index(last))
    _store_rows(c, acc, l_i, o_ptr, head_row0, m0, S)


@gluon.jit
def _consumer_0(q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty, o_ptr, head_row0, m0, S, qk_scale,
                num_n, causal, sink):
    _consume(0, q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty, o_ptr, head_row0, m0, S, qk_scale,
             num_n, causal, sink)


@gluon.jit
def _consumer_1(q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty, o_ptr, head_row0, m0, S, qk_scale,
                num_n, causal, sink):
    _consume(1, q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty, o_ptr, head_row0, m0, S, qk_scale,
             num_n, causal, sink)


@gluon.jit
def _attn_ws_kernel(q_desc, k_desc, v_desc, o_ptr, S, qk_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    m_block = gl.num_programs(0) - 1 - gl.program_id(0)  # causal: the longest rows of a head are dispatched first
    bh = gl.program_id(1)  # head-major grid: a few heads' K and V are read from DRAM about once
    m0 = m_block * 128
    if CAUSAL:
        n_end = gl.minimum(S, m0 + 128)
    else:
        n_end = S
    num_n = gl.cdiv(n_end, BLOCK_N)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 64, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrive per consumer
        mbarrier.init(v_empty.index(i), count=2)
    sink = gl.allocate_shared_memory(gl.float32, [2, 64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    fence_async_shared()
    head_row0 = bh * S
    # partitions take tensors, not constexprs: sizes come back from the shared-memory shapes, causal as an int
    consume = (q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty, o_ptr, head_row0, m0, S, qk_scale,
               num_n, 1 if CAUSAL else 0, sink)
    produce = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, k_empty, v_full, v_empty,
               head_row0 + m0, head_row0, num_n)
    gl.warp_specialize([(_consumer_0, consume), (_consumer_1, consume), (_producer, produce)], [4, 4], [232, 24])


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


def descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[TensorDescriptor, ...]:
    """q in 64-row boxes, k and v in BLOCK_N-row boxes, each over the flat (B·H·S, D) view, 128-byte swizzled."""
    d = q.shape[-1]
    lay_q = gl.NVMMASharedLayout.get_default_for([64, d], _gl_dtype(q.dtype))
    lay_kv = gl.NVMMASharedLayout.get_default_for([BLOCK_N, d], _gl_dtype(q.dtype))
    flat = [t.reshape(-1, d) for t in (q, k, v)]
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [64 if i == 0 else BLOCK_N, d],
                                  lay_q if i == 0 else lay_kv) for i, t in enumerate(flat))


def unsupported(q: torch.Tensor) -> str | None:
    """Why this kernel cannot run these inputs (None: it can)."""
    if q.device.type != "cuda":
        return "the Gluon kernel runs on CUDA only"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Gluon kernel is built for compute capability 9.0 (Hopper)"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"the Gluon kernel takes bfloat16 or float16, not {q.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"the Gluon kernel takes D in {HEAD_DIMS}, not {q.shape[-1]}"
    if q.dim() != 4 or q.shape[0] * q.shape[1] > 65535:
        return "the Gluon kernel's grid takes (B, H, S, D) with B·H ≤ 65535 (heads on its second axis)"
    return None


def attention_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale [+ causal mask]) v for contiguous (B, H, S, D) CUDA tensors (see unsupported)."""
    why = unsupported(q)
    if why:
        raise ValueError(why)
    if not all(t.data_ptr() % 16 == 0 for t in (q, k, v)):
        raise ValueError("the Gluon kernel reads through TMA descriptors: q, k, v must be 16-byte aligned")
    b, h, s, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = torch.empty_like(q)
    q_desc, k_desc, v_desc = descriptors(q, k, v)
    grid = (-(-s // BLOCK_M), b * h)
    _attn_ws_kernel[grid](q_desc, k_desc, v_desc, out, s, scale * LOG2E, HEAD_DIM=d, BLOCK_N=BLOCK_N, STAGES=STAGES,
                          CAUSAL=bool(causal), num_warps=4)
    return out

