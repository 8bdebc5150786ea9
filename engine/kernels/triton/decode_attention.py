"""Decode attention (one new token per sequence against a static KV cache), split over the sequence: flash-decoding.

Why: at decode, attention is one query row per head against L cached keys: a memory-bound read of the cache. A
prefill-style kernel gives one program per (batch, kv head) — 8 programs for the 1B preset at B=1 on a 132-SM H100 —
so it streams the cache at a fraction of the bandwidth (cuDNN's SDPA kernel in the 1B decode step reads 1.3 MB of
cache a layer at ~0.1 TB/s). Here every (batch, kv head, split of SPLIT positions) is a program:

    split kernel  — its query rows (the GQA group that shares this kv head: REP rows, padded to a power of two) against
                    positions [s·SPLIT, min((s+1)·SPLIT, L)) of the cache, in BLOCK_S chunks with an online softmax;
                    writes the running max m, the sum l and the unnormalised output o (fp32) of its split;
    combine kernel — per (batch, head): out = Σ exp(m_i − M)·o_i / Σ exp(m_i − M)·l_i over the splits, M = max m_i.

How many splits: engine.kernels.choice.attention_splits (split_plan), the power of two at which batch × kv heads ×
splits fills the device, each split at least the tile's length — so a long cache at small batch is split finely,
since a few programs walking it one tile at a time wait on memory at every tile, and a large batch or a short cache
takes few splits (or one). Where one split covers the whole cache, the split kernel writes the output itself and
no combine runs. Positions are one for the whole batch (input_pos[-1]) or one per sequence (`positions`: a ragged
batch). The combine stays a kernel of its own: under PDL it is resident before the split ends, which costs less
than combining inside the split kernel (a fence and an atomic count) or inside a thread-block cluster
(docs/quantization.md).

L = input_pos + 1 is read from a device tensor and the grids depend only on the static cache length, so a CUDA graph
captures both kernels once for every position. Splits that start at or beyond L write m = −inf, l = 0 and add nothing.
Compiled with a 16-bit cache, both products run on the tensor cores (tl.dot, the REP rows padded to 16); under the
interpreter and for float32 caches they are fp32 broadcast-multiply-and-sum (the interpreter mishandles bf16 dot
operands). `decode_attention` is a torch custom op (`modelab::decode_attention`), so torch.compile keeps it
as one opaque call; `_reference` is SDPA's math with the decode mask, in float64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import is_interpreted, pdl_enabled


@triton.jit
def _rope(ptr, dims, rot, sign, cos, sin, mask):
    """x · cos + rotate_half(x) · sin for rows of D values at ptr (+ dims), rounded to the stored dtype as the
    eager model rounds it (rotate_half(x)[d] = -x[d + D/2] below D/2, x[d - D/2] above)."""
    x = tl.load(ptr + dims, mask=mask, other=0.0)
    x_rot = tl.load(ptr + rot, mask=mask, other=0.0).to(tl.float32)
    out = x.to(tl.float32) * cos + x_rot * sign * sin
    return out.to(x.dtype)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, o_ptr, scale,
                  KVH, S_MAX, NUM_SPLITS,
                  REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_S: tl.constexpr, PDL: tl.constexpr = False,
                  FROM_QKV: tl.constexpr = False, cos_ptr=None, sin_ptr=None, QKV_ROW=0,
                  USE_DOT: tl.constexpr = False, out_ptr=None, FINAL: tl.constexpr = False,
                  RAGGED: tl.constexpr = False):
    """FROM_QKV: q_ptr is the qkv projection's output row per sequence, [q heads | k heads | v heads] before
    RoPE; each program applies RoPE to its q rows, and the program whose split holds the new position also applies it
    to that position's k and writes k and v into the cache (no other program reads that position).
    USE_DOT (compiled, 16-bit cache, REP_PAD ≥ 16): both products on the tensor cores, the query rows padded to 16
    and P rounded to the cache's dtype for P·V (as flash attention does); else fp32 broadcast-multiply-and-sum.
    FINAL (one split covers the whole cache): the program normalises its rows and writes the attention output to
    out_ptr itself, so no combine kernel runs.
    RAGGED: sequence b at its own position pos_ptr[b] (a ragged batch); else every sequence at pos_ptr[0]."""
    bk = tl.program_id(0)  # b * KVH + kv head
    split = tl.program_id(1)
    b = bk // KVH
    if PDL:  # programmatic dependent launch: the next kernel may start once every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if RAGGED:
        length = tl.load(pos_ptr + b) + 1  # positions 0 .. input_pos are valid
    else:
        length = tl.load(pos_ptr) + 1
    rows = tl.arange(0, REP_PAD)
    dims = tl.arange(0, D)
    row_ok = rows < REP
    kv_base = bk.to(tl.int64) * S_MAX * D
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, length)
    first_pos = lo + tl.arange(0, BLOCK_S)
    first = kv_base + first_pos[:, None] * D + dims[None, :]  # this split's first tile
    if FROM_QKV:
        # This kernel writes the new position itself; the position and the cached positions before it were written
        # before this step's first kernel, which PDL never overlaps: the first tile is loaded before waiting for the
        # previous kernel (q, the new k and v), and the new position patched in below.
        k_next = tl.load(k_ptr + first, mask=(first_pos < hi)[:, None], other=0.0)
        v_next = tl.load(v_ptr + first, mask=(first_pos < hi)[:, None], other=0.0)
        # the rotary tables' row for the new position: static tables, so also read before the wait
        cos = tl.load(cos_ptr + (length - 1) * D + dims).to(tl.float32)
        sin = tl.load(sin_ptr + (length - 1) * D + dims).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if not FROM_QKV:  # the new position was written by the kernels just before: only after the wait
        k_next = tl.load(k_ptr + first, mask=(first_pos < hi)[:, None], other=0.0)
        v_next = tl.load(v_ptr + first, mask=(first_pos < hi)[:, None], other=0.0)
    if FROM_QKV:
        head = bk % KVH
        rot = (dims + D // 2) % D
        sign = tl.where(dims < D // 2, -1.0, 1.0)
        row = q_ptr + b * QKV_ROW
        q = _rope(row + (head * REP + rows)[:, None] * D, dims[None, :], rot[None, :], sign[None, :], cos[None, :],
                  sin[None, :], row_ok[:, None])
        k_new = _rope(row + (KVH * REP + head) * D, dims, rot, sign, cos, sin, dims < D).to(k_ptr.dtype.element_ty)
        v_new = tl.load(row + (KVH * REP + KVH + head) * D + dims).to(v_ptr.dtype.element_ty)
        if split == (length - 1) // SPLIT:
            tl.store(k_ptr + kv_base + (length - 1) * D + dims, k_new)
            tl.store(v_ptr + kv_base + (length - 1) * D + dims, v_new)
        tl.debug_barrier()  # the new position's k and v, stored by some threads, may be read below by others
        is_new = (first_pos == length - 1)[:, None]  # the prefetched tile predates the store: patch it in
        k_next = tl.where(is_new, k_new[None, :], k_next)
        v_next = tl.where(is_new, v_new[None, :], v_next)
    else:
        # q is (B, H, D) with H = KVH * REP: this kv head's query rows are contiguous.
        q = tl.load(q_ptr + (bk * REP + rows)[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0.0)
    q_low = q.to(k_ptr.dtype.element_ty)  # the tensor cores' operand (USE_DOT): q as the model stores it
    q = q.to(tl.float32) * scale
    m_i = tl.full((REP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((REP_PAD,), tl.float32)
    acc = tl.zeros((REP_PAD, D), tl.float32)
    for s0 in range(lo, hi, BLOCK_S):
        pos = s0 + tl.arange(0, BLOCK_S)
        ok = pos < hi
        k_tile = k_next
        v_tile = v_next
        after = pos + BLOCK_S  # the next tile, loaded while this one is used
        k_next = tl.load(k_ptr + kv_base + after[:, None] * D + dims[None, :], mask=(after < hi)[:, None], other=0.0)
        v_next = tl.load(v_ptr + kv_base + after[:, None] * D + dims[None, :], mask=(after < hi)[:, None], other=0.0)
        if USE_DOT:  # (REP_PAD ≥ 16 rows, padded) · kᵀ on the tensor cores
            s = tl.dot(q_low, tl.trans(k_tile)) * scale
        else:
            s = tl.sum(q[:, None, :] * k_tile.to(tl.float32)[None, :, :], axis=2)  # (REP_PAD, BLOCK_S)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen only masked positions keeps m = -inf: exp(-inf - -inf) would be NaN, so use 0 there.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            pv = tl.dot(p.to(v_tile.dtype), v_tile)
        else:
            pv = tl.sum(p[:, :, None] * v_tile.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if FINAL:  # position 0 is in this (only) split, so every real row has l > 0
        rows_out = (bk * REP + rows)[:, None] * D + dims[None, :]  # (B, H, 1, D): this kv head's query rows
        tl.store(out_ptr + rows_out, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        out = (bk * NUM_SPLITS + split) * REP_PAD + rows
        tl.store(m_ptr + out, m_i)
        tl.store(l_ptr + out, l_i)
        tl.store(o_ptr + out[:, None] * D + dims[None, :], acc)


@triton.jit
def _combine_kernel(m_ptr, l_ptr, o_ptr, out_ptr, NUM_SPLITS,
                    REP: tl.constexpr, REP_PAD: tl.constexpr, D: tl.constexpr, SPLITS_PAD: tl.constexpr,
                    PDL: tl.constexpr = False):
    if PDL:  # the o projection's GEMV after this one loads its first weight tile while this runs
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    bh = tl.program_id(0)  # b * H + head
    bk = bh // REP
    r = bh % REP
    splits = tl.arange(0, SPLITS_PAD)
    ok = splits < NUM_SPLITS
    idx = (bk * NUM_SPLITS + splits) * REP_PAD + r
    m = tl.load(m_ptr + idx, mask=ok, other=float("-inf"))
    l = tl.load(l_ptr + idx, mask=ok, other=0.0)  # noqa: E741 - softmax's running sum, as in the papers
    m_max = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
    dims = tl.arange(0, D)
    o = tl.load(o_ptr + idx[:, None] * D + dims[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * l, axis=0)
    tl.store(out_ptr + bh * D + dims, out.to(out_ptr.dtype.element_ty))


# The split kernel's tile: (SPLIT positions per program, BLOCK_S positions per inner step, num_warps). A tile passed
# with SPLIT 0 keeps the split count of the rule (or of `splits`) and sets the rest
# (benchmarks/decode_attention_bench.py --long).
# With tl.dot (GQA groups, 16-bit cache) one 64-position tile per split: the fastest in the 1B decode step, and
# within a few percent of the fastest of the 39 tiles `python benchmarks/decode_attention_bench.py --preset 1B` times
# alone. Many short splits keep their loads in flight at once, where a few long ones wait on memory at every tile.
TILE_DOT = (64, 64, 4)
# One query row per kv head (the 7B), on the tensor cores (the row padded to 16) for a 16-bit cache and as broadcast
# products for a float32 one. The fastest tile of `decode_attention_bench.py --long --preset 7B` at P = 8192 (of
# BLOCK_S 32–128 × 2–8 warps, with and without the tensor cores, with and without a pipelined loop): 42.4 µs, 76 % of
# the copy bandwidth on the 136 MB cache, where the broadcast products at this tile took 59.8 µs (54 %) — a
# program's fixed work (RoPE of its rows, the new position's write, m / l / o out) is what the short splits pay,
# and more of them in flight at 2 warps each hide it better.
TILE_ROWS = (32, 32, 2)
# GQA groups on the broadcast path (a float32 cache): REP rows × BLOCK_S × D products per step, so registers bound the
# tile (the bench does not sweep this path).
TILE_GROUPS = (64, 32, 4)
INTERPRETER = {"SPLIT": 16, "BLOCK_S": 8}  # small tiles under the interpreter: CPU tests use short caches
INTERPRETER_SMS = 2  # the "device" the split count fills under the interpreter (engine.kernels.choice)


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_plan(batch: int, kv_heads: int, rep: int, s_max: int, dtype: torch.dtype, device: torch.device | str,
               splits: int | None = None, tile: tuple[int, int, int] | None = None
               ) -> tuple[int, int, int, int, bool]:
    """(SPLIT positions per program, number of splits, BLOCK_S, num_warps, USE_DOT) of the split kernel for this
    shape. The split count is engine.kernels.choice.attention_splits (a power of two: batch × kv heads × splits
    fills the device, never splits shorter than the tile's own SPLIT) unless `splits` asks for one or `tile` forces
    the tile (benchmarks/decode_attention_bench.py; SPLIT 0: the count as without a tile). A split's length is
    rounded up to whole BLOCK_S steps, so the count that runs may be below the one asked for where it does not divide
    the cache; the last split is the short one."""
    from engine.kernels.choice import attention_splits

    device = torch.device(device)
    interpreted = is_interpreted(_split_kernel)
    # Compiled, with a 16-bit cache: tl.dot on the query rows padded to 16, even for one row per kv head (the
    # broadcast products of a 4 × 32 × 64 tile need 255 registers per thread, the dot 113; for one row the 15
    # padded rows cost the tensor cores nothing, and the 7B's split runs 1.4× faster on them: TILE_ROWS).
    # The interpreter keeps the broadcast form (it mishandles bf16 dot operands), as do float32 caches (a dot would
    # round them to tf32).
    use_dot = not interpreted and dtype in (torch.bfloat16, torch.float16)
    split, block_s, warps = tile or (TILE_ROWS if rep == 1 else TILE_DOT if use_dot else TILE_GROUPS)
    if interpreted and tile is None:
        split, block_s = INTERPRETER["SPLIT"], INTERPRETER["BLOCK_S"]
    if tile is None or split == 0:
        count = splits or attention_splits(batch, s_max, _sms(device), kv_heads, min_positions=split or block_s)
        split = max(block_s, triton.cdiv(triton.cdiv(s_max, max(1, count)), block_s) * block_s)
    return split, triton.cdiv(s_max, split), block_s, warps, use_dot


def decode_attention_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, input_pos: torch.Tensor,
                         splits: int | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, H, 1, D) at position input_pos[-1] against k_cache, v_cache (B, KVH, S_max, D) → (B, H, 1, D).
    `splits`: the split count to ask for (default: engine.kernels.choice's rule); `positions` (B,): each sequence's
    own position instead of input_pos (a ragged batch)."""
    b, h, t, d = q.shape
    if t != 1:
        raise ValueError(f"decode attention takes one query position, got {t}")
    _, kvh, s_max, d_k = k_cache.shape
    if d_k != d or v_cache.shape != k_cache.shape or h % kvh:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if d & (d - 1):
        raise ValueError(f"head dim {d} is not a power of two")
    return _attend(q.reshape(b, h, d).contiguous(), k_cache.contiguous(), v_cache.contiguous(),
                   _positions(input_pos, positions, b), b, h, d, splits=splits)


def _positions(input_pos: torch.Tensor, positions: torch.Tensor | None, b: int) -> torch.Tensor:
    """What the kernel reads its positions from: input_pos[-1] (read as it is, int64: no cast kernel per layer),
    or one position per sequence."""
    if positions is None:
        return input_pos.reshape(-1)[-1:]
    if positions.numel() != b:
        raise ValueError(f"positions has {positions.numel()} elements for a batch of {b}")
    return positions.reshape(-1).contiguous()


def _attend(q: torch.Tensor, k_c: torch.Tensor, v_c: torch.Tensor, input_pos: torch.Tensor, b: int, h: int, d: int,
            rope: dict | None = None, tile: tuple[int, int, int] | None = None, splits: int | None = None
            ) -> torch.Tensor:
    """Both kernels over q (B, H·D: q rows, or with `rope` the qkv rows) and the cache → (B, H, 1, D). `pos`: one
    position for every sequence, or one per sequence. `tile` (SPLIT, BLOCK_S, num_warps of the split kernel) forces
    one (benchmarks/decode_attention_bench.py's sweep); `splits` asks for a split count (split_plan)."""
    _, kvh, s_max, _ = k_c.shape
    rep = h // kvh
    interpreted = is_interpreted(_split_kernel)
    split, num_splits, block_s, warps, use_dot = split_plan(b, kvh, rep, s_max, k_c.dtype, q.device, splits, tile)
    rep_pad = max(16, triton.next_power_of_2(rep)) if use_dot else triton.next_power_of_2(rep)
    tiles = {"SPLIT": split, "BLOCK_S": block_s}
    pos = input_pos
    out = torch.empty(b, h, 1, d, device=q.device, dtype=q.dtype)
    pdl = {} if interpreted or not pdl_enabled(q.device) else {"PDL": True, "launch_pdl": True}
    args = (1.0 / math.sqrt(d), kvh, s_max, num_splits)
    consts = dict(REP=rep, REP_PAD=rep_pad, D=d, **tiles, num_warps=warps, **pdl, **(rope or {}), USE_DOT=use_dot,
                  RAGGED=pos.numel() > 1)
    if num_splits == 1:  # one program per kv head walks the whole cache and writes the output: no combine
        _split_kernel[(b * kvh, 1)](q, k_c, v_c, pos, None, None, None, *args, **consts, out_ptr=out, FINAL=True)
        return out
    m = torch.empty(b * kvh * num_splits * rep_pad, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)  # noqa: E741 - the running sums the split kernel writes
    o = torch.empty(b * kvh * num_splits * rep_pad, d, device=q.device, dtype=torch.float32)
    _split_kernel[(b * kvh, num_splits)](q, k_c, v_c, pos, m, l, o, *args, **consts)
    _combine_kernel[(b * h,)](m, l, o, out, num_splits, REP=rep, REP_PAD=rep_pad, D=d,
                              SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=4, **pdl)
    return out


def decode_attention_qkv_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                             v_cache: torch.Tensor, input_pos: torch.Tensor, tile: tuple[int, int, int] | None = None,
                             splits: int | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The decode step's attention from the qkv projection's output (B, 1, (H + 2·KVH)·D), before RoPE: RoPE on q
    and the new k (cos, sin: the rotary tables, (positions ≥ S_max, D), read at input_pos[-1] on the device, so no
    indexing kernel runs per step), k and v written into the cache at input_pos[-1], then
    flash-decoding → (B, H, 1, D). One kernel does what RoPE, the cache writes and a copy of q would do in four.
    `splits` and `positions` (B,) as in decode_attention_fwd."""
    _, kvh, s_max, d = k_cache.shape
    b = qkv.shape[0]
    if qkv.numel() != b * qkv.shape[-1] or qkv.shape[-1] % d or qkv.shape[-1] // d <= 2 * kvh:
        raise ValueError(f"qkv {tuple(qkv.shape)} is not one row of [q | k | v] heads for the cache "
                         f"{tuple(k_cache.shape)}")
    h = qkv.shape[-1] // d - 2 * kvh
    tables_ok = all(t.dim() == 2 and t.shape[0] >= s_max and t.shape[1] == d for t in (cos, sin))
    if h % kvh or d & (d - 1) or not tables_ok or v_cache.shape != k_cache.shape:
        raise ValueError(f"qkv {tuple(qkv.shape)}, rotary tables {tuple(cos.shape)}/{tuple(sin.shape)} (want at "
                         f"least {s_max} × {d}) and the cache {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not "
                         "fit together")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the cache must be contiguous: it is written in place")
    rope = {"FROM_QKV": True, "cos_ptr": cos.contiguous(), "sin_ptr": sin.contiguous(),
            "QKV_ROW": qkv.shape[-1]}
    return _attend(qkv.reshape(b, -1).contiguous(), k_cache, v_cache, _positions(input_pos, positions, b), b, h, d,
                   rope, tile, splits)


@torch.library.custom_op("modelab::decode_attention_qkv", mutates_args=("k_cache", "v_cache"))
def decode_attention_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """RoPE, the cache write and flash-decoding in one kernel (decode_attention_qkv_fwd); writes the cache."""
    return decode_attention_qkv_fwd(qkv, cos, sin, k_cache, v_cache, input_pos)


@decode_attention_qkv.register_fake
def _(qkv, cos, sin, k_cache, v_cache, input_pos):
    d, kvh = k_cache.shape[3], k_cache.shape[1]
    return qkv.new_empty(qkv.shape[0], qkv.shape[-1] // d - 2 * kvh, 1, d)


@torch.library.custom_op("modelab::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, input_pos: torch.Tensor
                     ) -> torch.Tensor:
    """Flash-decoding over the static cache: keys 0..input_pos[-1] of each kv head, GQA groups read the cache once."""
    return decode_attention_fwd(q, k_cache, v_cache, input_pos)


@decode_attention.register_fake
def _(q, k_cache, v_cache, input_pos):
    return torch.empty_like(q)


def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, input_pos: torch.Tensor,
               positions: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA's math in float64 with the decode mask (keys at positions <= input_pos, or per sequence <=
    positions[b]), GQA by repeating kv heads."""
    rep = q.shape[1] // k_cache.shape[1]
    k = k_cache.double().repeat_interleave(rep, dim=1)
    v = v_cache.double().repeat_interleave(rep, dim=1)
    scores = (q.double() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    last = input_pos.reshape(-1)[-1:] if positions is None else positions.reshape(-1)
    valid = torch.arange(k.shape[2], device=q.device)[None, :] <= last[:, None]  # (1 or B, S)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
