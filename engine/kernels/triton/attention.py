"""Flash-attention forward in Triton (Kernel Levels, L4), kernel and plain-torch check side by side.

out = softmax(q @ k^T * scale [+ causal mask]) @ v, for q, k, v of shape (B, H, S, D).

How it works (Flash-Attention 2, after Triton's 06-fused-attention tutorial):
- one program per (BLOCK_M query rows, batch*head); its Q tile stays on chip while K/V tiles of BLOCK_N keys stream by;
- online softmax in fp32: a running row max `m_i` and row sum `l_i`; the accumulator is rescaled by
  exp2(m_old - m_new) when the max grows, and divided by `l_i` once at the end (exp2, log2(e) folded into the scale);
- causal: key blocks entirely above the diagonal are never loaded (the loop stops at the diagonal), blocks entirely
  below it run unmasked, and only the BLOCK_M/BLOCK_N diagonal blocks apply the mask;
- ragged S (e.g. 197): full key blocks run unmasked; the one partial tail block is loaded with a bounds mask and its
  missing columns get -inf scores; query rows past S are never stored;
- on Hopper (sm_90+) and in the interpreter, the Q block and the K/V blocks that lie inside S are read through tensor
  descriptors (TMA on the GPU), and O is stored through one where S % BLOCK_M == 0; elsewhere, and for blocks that
  may cross S (the K/V tail; the diagonal when S % BLOCK_N != 0; a ragged last O block), through masked pointer
  accesses (a flat (B*H*S, D) descriptor would reach the next head's rows there). Q and O through descriptors is
  what keeps a 128-row tile's registers: with pointers, the int64 offsets of every Q element stay live across the
  loop until the store (sm_90, D=128, 128x128 tiles on 8 warps: 255 registers and 224 spill stores with pointers,
  188 and none with descriptors; Triton's ptxas, offline);
- causal programs are launched heaviest first (the last query block needs the most key blocks) so that the short
  ones fill the tail of the schedule; query blocks of one head are adjacent in the launch order so K/V stay in L2;
- tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) are autotuned on the GPU, keyed on S, D, causal (and dtype); the
  interpreter uses one fixed small config, since timing there means nothing.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import LaunchCache, check_device, is_hopper_or_newer, is_interpreted
from engine.runner.device_lock import exclusive

try:  # host-side tensor descriptors (TMA): Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: pointer path only
    TensorDescriptor = None

HEAD_DIMS = (32, 64, 128)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LOG2E = 1.4426950408889634
# float32 inputs: "tf32x3" splits each operand into a TF32 high part and a TF32 remainder and sums three tensor-core
# products -- about fp32 accuracy. Plain "ieee" fp32 dots compile to FMA loops that spill heavily on sm_90 (ptxas:
# 27 KB of spill stores for 64x64 tiles); Triton's default "tf32" would miss fp32 by ~1e-3. The interpreter ignores
# the setting and multiplies in full fp32.
FP32_DOT = "tf32x3"


@triton.jit
def _attn_inner(acc, l_i, m_i, q, K, V, k_desc, v_desc, kv_row0, lo, hi, offs_m, S, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL_MASK: tl.constexpr, TAIL_MASK: tl.constexpr, USE_DESC: tl.constexpr,
                DOT_PREC: tl.constexpr):
    """Key blocks [lo, hi) of one head into the running (acc, l_i, m_i); masks only where the flags say."""
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        if USE_DESC:
            k = k_desc.load([kv_row0 + start_n, 0])
        else:
            kv_off = (kv_row0 + offs_n).to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
            if TAIL_MASK:
                k = tl.load(K + kv_off, mask=(offs_n < S)[:, None], other=0.0)
            else:
                k = tl.load(K + kv_off)
        qk = tl.dot(q, k.T, input_precision=DOT_PREC)
        if CAUSAL_MASK or TAIL_MASK:
            if CAUSAL_MASK:
                keep = offs_m[:, None] >= offs_n[None, :]
                if TAIL_MASK:
                    keep = keep & (offs_n[None, :] < S)
            else:
                keep = (offs_m[:, None] >= 0) & (offs_n[None, :] < S)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)  # rescales what was accumulated under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_DESC:
            v = v_desc.load([kv_row0 + start_n, 0])
        else:
            if TAIL_MASK:
                v = tl.load(V + kv_off, mask=(offs_n < S)[:, None], other=0.0)
            else:
                v = tl.load(V + kv_off)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _row_offsets(row0, offs_m, HEAD_DIM: tl.constexpr):
    """Element offsets of rows row0 + offs_m of a (rows, HEAD_DIM) view, in int64."""
    return (row0 + offs_m).to(tl.int64)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def _attn_fwd_kernel(Q, K, V, O, q_desc, k_desc, v_desc, o_desc, S, H, qk_scale,  # noqa: E741 - the paper's names
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, USE_DESC: tl.constexpr,
                     DOT_PREC: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # the causal split needs the diagonal on a BLOCK_N boundary
    pid_m = tl.program_id(0)
    bh = tl.program_id(2) * H + tl.program_id(1)
    if CAUSAL:
        start_m = tl.cdiv(S, BLOCK_M) - 1 - pid_m  # heaviest query block first
    else:
        start_m = pid_m
    kv_row0 = bh * S  # first row of this head in the (B*H*S, D) view
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if USE_DESC:
        # Q through TMA straight into shared memory, where the wgmma reads it. Rows past S (a ragged last block)
        # read the next head's rows or zeros; their outputs are never stored.
        q = q_desc.load([kv_row0 + start_m * BLOCK_M, 0])
    else:
        q = tl.load(Q + _row_offsets(kv_row0, offs_m, HEAD_DIM), mask=(offs_m < S)[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    TAIL: tl.constexpr = not EVEN_N
    DIAG_DESC: tl.constexpr = USE_DESC and EVEN_N
    if CAUSAL:
        diag = start_m * BLOCK_M
        # below the diagonal: every key is visible, no mask; above it: never loaded.
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, k_desc, v_desc, kv_row0, 0, diag, offs_m, S, qk_scale,
                                    HEAD_DIM, BLOCK_N, False, False, USE_DESC, DOT_PREC)
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, k_desc, v_desc, kv_row0, diag,
                                    tl.minimum(diag + BLOCK_M, S), offs_m, S, qk_scale,
                                    HEAD_DIM, BLOCK_N, True, TAIL, DIAG_DESC, DOT_PREC)
    else:
        n_full = (S // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, k_desc, v_desc, kv_row0, 0, n_full, offs_m, S, qk_scale,
                                    HEAD_DIM, BLOCK_N, False, False, USE_DESC, DOT_PREC)
        if TAIL:
            acc, l_i, m_i = _attn_inner(acc, l_i, m_i, q, K, V, k_desc, v_desc, kv_row0, n_full, n_full + BLOCK_N,
                                        offs_m, S, qk_scale, HEAD_DIM, BLOCK_N, False, True, False, DOT_PREC)
    acc = acc / l_i[:, None]
    if USE_DESC and EVEN_M:
        o_desc.store([kv_row0 + start_m * BLOCK_M, 0], acc.to(O.dtype.element_ty))
    else:  # a block that may cross S: a TMA store there would write the next head's rows
        o_off = _row_offsets(kv_row0, offs_m, HEAD_DIM)
        tl.store(O + o_off, acc.to(O.dtype.element_ty), mask=(offs_m < S)[:, None])


_attn_fwd = triton.heuristics({"EVEN_M": lambda a: a["S"] % a["BLOCK_M"] == 0,
                               "EVEN_N": lambda a: a["S"] % a["BLOCK_N"] == 0})(_attn_fwd_kernel)


def _set_desc_blocks(nargs: dict) -> None:
    """Autotune pre-hook: a descriptor's block shape follows the config being tried."""
    for name, rows in (("q_desc", "BLOCK_M"), ("k_desc", "BLOCK_N"), ("v_desc", "BLOCK_N"), ("o_desc", "BLOCK_M")):
        desc = nargs.get(name)
        if desc is not None:
            desc.block_shape = [nargs[rows], nargs["HEAD_DIM"]]


def _gpu_configs() -> list[triton.Config]:
    shapes = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
        (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 32, 4, 4),
    ]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, pre_hook=_set_desc_blocks)
            for bm, bn, w, s in shapes]


def _prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
    """Drop tiles that cannot pay: wide tiles for a short S; tiny key tiles or spilling ones at D=128."""
    s, d = nargs["S"], kwargs.get("HEAD_DIM", nargs.get("HEAD_DIM"))
    kept = [c for c in configs
            if not (c.kwargs["BLOCK_M"] > 64 and s <= 64)
            and not (d == 128 and c.kwargs["BLOCK_N"] < 64)
            # 128x64 tiles on 4 warps spill registers at D=128 (ptxas, sm_90; through descriptors too, less): at 2
            # stages such a tile can win do_bench's autotuning yet run slower than 64x64 in the level's own timing
            # (rotating inputs), so it is not a candidate
            and not (d == 128 and c.kwargs["BLOCK_M"] == 128 and c.num_warps == 4)]
    return kept or configs[-1:]


_attn_fwd_tuned = triton.autotune(_gpu_configs(), key=["S", "HEAD_DIM", "CAUSAL", "USE_DESC"],
                                  prune_configs_by={"early_config_prune": _prune})(_attn_fwd)
_LAUNCH = LaunchCache(_attn_fwd_kernel)  # tuned launches after the first per key, without Triton's per-call Python


def tuned_tile(S: int, D: int, causal: bool) -> str | None:
    """The tile the autotuner chose in this process for (S, D, causal), in words; None before any tuned launch."""
    for key, cfg in list(_attn_fwd_tuned.cache.items()):
        if tuple(key[:3]) == (S, D, causal):  # key: S, HEAD_DIM, CAUSAL, USE_DESC, then the tensors' dtypes
            tried = len(_prune(_gpu_configs(), {"S": S}, HEAD_DIM=D, USE_DESC=key[3]))
            bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
            paths = ""
            if key[3]:
                paths = (", Q/K/V/O through TMA descriptors" if S % bm == 0 and S % bn == 0 else
                         ", Q/K/V through TMA descriptors, the blocks crossing S and O through pointers")
            return (f"autotuned tile for S={S}, D={D}{', causal' if causal else ''}: BLOCK_M={bm}, BLOCK_N={bn}, "
                    f"{cfg.num_warps} warps, {cfg.num_stages} stages (fastest of {tried} candidates{paths})")
    return None


# One fixed config for the interpreter: autotuning there is slow and measures nothing.
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32}


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be (B, H, S, D), got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"attention: {name} must be contiguous")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"attention: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"attention: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in DTYPES:
        raise ValueError(f"attention: dtype must be one of bfloat16, float16, float32, got {q.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"attention: head dim D must be one of {HEAD_DIMS}, got {q.shape[-1]}")
    if q.shape[2] < 1:
        raise ValueError("attention: sequence length S must be >= 1")
    if not isinstance(causal, bool):
        raise ValueError(f"attention: causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise ValueError(f"attention: scale must be a finite float or None, got {scale!r}")
    if q.shape[0] > 65535 or q.shape[1] > 65535:
        raise ValueError(f"attention: B and H must each be <= 65535 (launch grid), got {q.shape[0]}, {q.shape[1]}")


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None,
               use_desc: bool | None = None, config: dict | None = None) -> torch.Tensor:
    """`attention` with the path (descriptors or pointers) and a fixed tile config selectable, for tests/benchmarks."""
    _check_inputs(q, k, v, causal, scale)
    device = check_device(_attn_fwd_kernel, "attention", q, k, v)
    B, H, S, D = q.shape
    scale = float(D ** -0.5 if scale is None else scale)
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    interpreted = is_interpreted(_attn_fwd_kernel)
    if use_desc is None:
        use_desc = interpreted or is_hopper_or_newer(device)
    # TMA needs 16-byte aligned bases (a contiguous view at an odd storage offset is not): else plain loads.
    use_desc = bool(use_desc and TensorDescriptor is not None
                    and all(t.data_ptr() % 16 == 0 for t in (q, k, v, out)))
    if interpreted and config is None:
        config = dict(INTERPRETER_CONFIG)
    q_desc = k_desc = v_desc = o_desc = None
    key = (tuple(q.shape), q.dtype, q.device.index, causal, use_desc, LaunchCache.aligned(q, k, v, out))
    tuned = _LAUNCH.meta(key) if config is None and not interpreted else None
    if use_desc:
        # the autotune pre-hook resets the block shape per config tried; a kept launch uses its winner's
        tile = config or tuned or {"BLOCK_M": 64, "BLOCK_N": 64}
        q_desc, k_desc, v_desc, o_desc = (
            TensorDescriptor(t, shape=[B * H * S, D], strides=[D, 1], block_shape=[tile[rows], D])
            for t, rows in ((q, "BLOCK_M"), (k, "BLOCK_N"), (v, "BLOCK_N"), (out, "BLOCK_M")))

    def grid(meta: dict) -> tuple[int, int, int]:
        return (triton.cdiv(S, meta["BLOCK_M"]), H, B)

    args = (q, k, v, out, q_desc, k_desc, v_desc, o_desc, S, H, scale * LOG2E)
    meta = dict(HEAD_DIM=D, CAUSAL=causal, USE_DESC=use_desc,
                DOT_PREC=FP32_DOT if q.dtype == torch.float32 else None)
    if config is not None:
        cfg = dict(config)
        launch = {key: cfg.pop(key) for key in ("num_warps", "num_stages") if key in cfg}
        if interpreted:
            launch = {}
        _attn_fwd[grid](*args, **meta, **cfg, **launch)
    elif tuned is not None and _LAUNCH.launch(key, grid(tuned), *args):
        pass
    elif not interpreted and key not in _LAUNCH.entries:
        _LAUNCH.first(key, lambda: _attn_fwd_tuned[grid](*args, **meta), len(args))
    else:
        _attn_fwd_tuned[grid](*args, **meta)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              scale: float | None = None) -> torch.Tensor:
    """Flash-attention forward: softmax(q k^T * scale, causal-masked if `causal`) v; scale defaults to D**-0.5.

    q, k, v: (B, H, S, D), contiguous, one dtype (bfloat16/float16; float32 too, with 3xTF32 dots, see FP32_DOT),
    D in {32, 64, 128}, any S >= 1. Returns a new (B, H, S, D) tensor of the same dtype. Softmax in fp32.
    On Hopper with inputs the warp-specialised Gluon kernel takes (attention_ws.py: 16-bit, D 64 or 128), the first
    call of each shape times it and this module's kernel and keeps the faster (l4_choice says which).
    """
    if isinstance(q, torch.Tensor) and q.is_cuda:
        chosen = _CHOICES.get(_choice_key(q, causal))
        if chosen is not None and chosen["impl"] == "triton":  # the per-call host cost stays the tl kernel's
            return _attention(q, k, v, causal, scale)
        from engine.kernels.triton.attention_ws import attention_ws, unsupported

        _check_inputs(q, k, v, causal, scale)
        if unsupported(q) is None and all(t.data_ptr() % 16 == 0 for t in (q, k, v)):
            if _choose(q, k, v, causal, scale, attention_ws) == "gluon":
                return attention_ws(q, k, v, causal, scale)
    return _attention(q, k, v, causal, scale)


# (B, H, S, D, dtype, device index, causal) → {"impl": "triton" | "gluon", "triton_us": …, "gluon_us": …}
_CHOICES: dict[tuple, dict] = {}


def _choice_key(q: torch.Tensor, causal: bool) -> tuple:
    return (*q.shape, q.dtype, q.device.index, causal)


def _choose(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
            gluon_fn) -> str:  # type: ignore[no-untyped-def]
    """The faster kernel for this shape: both timed once per process as device time (four calls in a CUDA graph,
    the device this run's alone — per call from Python the Gluon launch's host cost, ~130 µs measured, hides a short
    kernel), their outputs checked against each other first. The Gluon kernel wins on long rows (S=4096) and loses on
    short ones (S=1024, the ViT's S=197): hence a choice per shape, not a rule. Inside a CUDA graph capture nothing can
    be timed: a shape not yet chosen runs the tl kernel."""
    key = _choice_key(q, causal)
    if key not in _CHOICES:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            return "triton"
        ours = _attention(q, k, v, causal, scale)  # also the tl autotuner's run for this shape, outside the timing
        theirs = gluon_fn(q, k, v, causal, scale)
        err = float((theirs.float() - ours.float()).norm() / ours.float().norm().clamp_min(1e-30))
        if not err < 3e-2:  # two 16-bit kernels, each within 1.5e-2 of float64 where they are right
            _CHOICES[key] = {"impl": "triton", "why": f"the Gluon kernel's output differs by {err:.1e}: not used"}
            return "triton"
        from engine.measure.timing import time_in_graph

        with exclusive():  # its times are shown: the device is this run's alone while they are taken
            times = {f"{name}_us": time_in_graph([lambda fn=fn: fn(q, k, v, causal, scale)] * 4,
                                                 replays=10).stats.median
                     for name, fn in (("triton", _attention), ("gluon", gluon_fn))}
        _CHOICES[key] = {"impl": "gluon" if times["gluon_us"] < times["triton_us"] else "triton", **times}
    return _CHOICES[key]["impl"]


def l4_choice(S: int, D: int, causal: bool) -> str | None:
    """The kernel chosen in this process for (S, D, causal), in words with both times; None before any choice."""
    for key, choice in list(_CHOICES.items()):
        if (key[2], key[3], key[6]) == (S, D, causal):
            if "why" in choice:
                return f"L4 attention for S={S}, D={D}: the tl kernel ({choice['why']})"
            name = ("the warp-specialised Gluon kernel (attention_ws.py)" if choice["impl"] == "gluon"
                    else "the tl kernel (attention.py)")
            return (f"L4 attention for S={S}, D={D}{', causal' if causal else ''}: {name}, the faster of the two "
                    f"timed on this device (Gluon {choice['gluon_us']:.1f} µs, tl {choice['triton_us']:.1f} µs "
                    "device time per call, in a CUDA graph)")
    return None


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               scale: float | None = None) -> torch.Tensor:
    """Plain-torch attention in float64 (the check the kernel is held to); returns float64."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    S, D = q.shape[-2], q.shape[-1]
    scale = D ** -0.5 if scale is None else scale
    scores = (q64 @ k64.transpose(-2, -1)) * scale
    if causal:
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64
