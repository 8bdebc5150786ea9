"""Greedy decoding's argmax over each row of the logits (B, V) → (B, 1) int64, as torch.argmax gives it.

Why: at B = 1 it is one long row (V = 32000 for the presets, 128256 for Llama 3), and torch's compiled argmax is one
reduction kernel over the row, a few µs on the decode step's critical path. Here the row is split in CHUNK-sized
programs that each load their whole chunk at once, and a second kernel reduces their (max, index) pairs; a row of up to
CHUNK values is one program.

Semantics are torch.argmax's: the first index of the maximum; a NaN counts as larger than everything (the first NaN
wins); a row of -inf gives 0. Each program reduces three things in one pass over its values: the first NaN's index,
the largest non-NaN value, and the first index holding it.

The lab's Triton decode modes take their next token with it (engine.llm.modes), which makes their step faster than
torch's argmax does; `benchmarks/argmax_bench.py` times both alone (docs/figures.md). In the CUDA-graphed step they
run in place (`argmax_rows_into`): the token straight into the decoder's token buffer and its position one on, in the
last kernel, where a copy and an add would be two more kernels a step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import check_device, is_interpreted, pdl_enabled

# Values per program: 8 warps, 32 a thread (sm_90 build: 144 registers, no spills). A whole row of 32768 in one
# program of 16 warps spilled (104 bytes of stack, benchmarks/triton_aot_check.py), so longer rows take chunks.
CHUNK = 8192
ONE_PROGRAM_MAX = CHUNK  # a row up to this long is one program and one kernel
_NONE = 2**31 - 1  # "no index": larger than any index of a row (V < 2**31)


@triton.jit
def _reduce(x, offs, ok):
    """(first NaN's index or _NONE, the largest non-NaN value, the first index holding it) of the values x at offs."""
    nan = (x != x) & ok
    nan_at = tl.min(tl.where(nan, offs, 2147483647), axis=0)  # 2**31 - 1: _NONE, "no index"
    v = tl.where(nan | ~ok, float("-inf"), x)
    best = tl.max(v, axis=0)
    at = tl.min(tl.where((v == best) & ok, offs, 2147483647), axis=0)
    return nan_at, best, at


@triton.jit
def _advance(pos_ptr, row):
    """The decode position one on (row 0's program only): the step's last kernel, every reader of it done."""
    if row == 0:
        tl.store(pos_ptr, tl.load(pos_ptr) + 1)


@triton.jit
def _chunk_kernel(x_ptr, out_ptr, part_val_ptr, part_at_ptr, part_nan_ptr, N, stride_row, CHUNKS,
                  BLOCK: tl.constexpr, WHOLE_ROW: tl.constexpr, PDL: tl.constexpr = False, pos_ptr=None,
                  ADVANCE: tl.constexpr = False):
    """Program (row, c): values c·BLOCK … of the row. WHOLE_ROW (one program per row): the answer into out_ptr
    (and with ADVANCE the position at pos_ptr one on); else the chunk's (max, its first index, first NaN's index)
    into the partials at row · CHUNKS + c."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    if PDL:  # the step's next kernel may start; the logits are the kernel before's: wait for them
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    offs = c * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(x_ptr + row.to(tl.int64) * stride_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
    nan_at, best, at = _reduce(x, offs, ok)
    if WHOLE_ROW:
        tl.store(out_ptr + row, tl.where(nan_at < 2147483647, nan_at, at).to(tl.int64))
        if ADVANCE:
            _advance(pos_ptr, row)
    else:
        part = row * CHUNKS + c
        tl.store(part_val_ptr + part, best)
        tl.store(part_at_ptr + part, at)
        tl.store(part_nan_ptr + part, nan_at)


@triton.jit
def _final_kernel(part_val_ptr, part_at_ptr, part_nan_ptr, out_ptr, CHUNKS, CHUNKS_PAD: tl.constexpr,
                  PDL: tl.constexpr = False, pos_ptr=None, ADVANCE: tl.constexpr = False):
    """Program row: the row's answer from its CHUNKS partials (indices are the row's, so the smallest wins ties);
    with ADVANCE the position at pos_ptr one on."""
    row = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    c = tl.arange(0, CHUNKS_PAD)
    ok = c < CHUNKS
    part = row * CHUNKS + c
    vals = tl.load(part_val_ptr + part, mask=ok, other=float("-inf"))
    ats = tl.load(part_at_ptr + part, mask=ok, other=2147483647)
    nans = tl.load(part_nan_ptr + part, mask=ok, other=2147483647)
    nan_at = tl.min(nans, axis=0)
    best = tl.max(vals, axis=0)
    at = tl.min(tl.where((vals == best) & ok, ats, 2147483647), axis=0)
    tl.store(out_ptr + row, tl.where(nan_at < 2147483647, nan_at, at).to(tl.int64))
    if ADVANCE:
        _advance(pos_ptr, row)


def _warps(block: int) -> int:
    return 4 if block <= 4096 else 8 if block <= 8192 else 16


def argmax_rows_fwd(x: torch.Tensor) -> torch.Tensor:
    """x (B, V) → (B, 1) int64: each row's argmax, as torch.argmax(x, -1, keepdim=True)."""
    check_device(_chunk_kernel, "argmax_rows", x)
    _check_rows(x)
    out = torch.empty(x.shape[0], 1, device=x.device, dtype=torch.int64)
    _launch(x, out, None)
    return out


def argmax_rows_into(x: torch.Tensor, token: torch.Tensor, pos: torch.Tensor) -> None:
    """The decode step's last work in place: each row's argmax of x (B, V) into token (B, 1) int64, and the
    position pos (1,) int64 one on — what argmax_rows, a copy into the decoder's token buffer and an add to its
    position did in four kernels, in two (one for rows up to ONE_PROGRAM_MAX values). The kernel that writes them
    runs after every reader of token and pos in the step (it waits for the kernel before it, which waited for its
    own before it)."""
    check_device(_chunk_kernel, "argmax_rows_into", x)
    _check_rows(x)
    b = x.shape[0]
    if token.shape != (b, 1) or token.dtype != torch.int64 or not token.is_contiguous():
        raise ValueError(f"argmax_rows_into: token must be ({b}, 1) contiguous int64 for logits {tuple(x.shape)}, "
                         f"got {token.dtype} {tuple(token.shape)}")
    if pos.shape != (1,) or pos.dtype != torch.int64 or len({x.device, token.device, pos.device}) != 1:
        raise ValueError(f"argmax_rows_into: pos must be one int64 on the logits' device, got {pos.dtype} "
                         f"{tuple(pos.shape)} on {pos.device}")
    _launch(x, token, pos)


def _check_rows(x: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows takes rows (B, V) with V > 0, got {tuple(x.shape)}")
    if x.shape[1] >= _NONE:
        raise ValueError(f"argmax_rows: rows of {x.shape[1]} values are too long (at most {_NONE - 1})")


def _launch(x: torch.Tensor, out: torch.Tensor, pos: torch.Tensor | None) -> None:
    """The kernels over x's rows (checked: _check_rows) into out (B, 1) int64; with pos, the last moves it one on."""
    if x.stride(1) != 1:
        x = x.contiguous()
    b, n = x.shape
    pdl = {} if is_interpreted(_chunk_kernel) or not pdl_enabled(x.device) else {"PDL": True, "launch_pdl": True}
    advance = {} if pos is None else {"pos_ptr": pos, "ADVANCE": True}
    if n <= ONE_PROGRAM_MAX:
        block = triton.next_power_of_2(n)
        _chunk_kernel[(b, 1)](x, out, out, out, out, n, x.stride(0), 1, BLOCK=block, WHOLE_ROW=True,
                              num_warps=_warps(block), **pdl, **advance)
        return
    chunks = triton.cdiv(n, CHUNK)
    part_val = torch.empty(b * chunks, device=x.device, dtype=torch.float32)
    part_at = torch.empty(b * chunks, device=x.device, dtype=torch.int32)
    part_nan = torch.empty_like(part_at)
    _chunk_kernel[(b, chunks)](x, out, part_val, part_at, part_nan, n, x.stride(0), chunks, BLOCK=CHUNK,
                               WHOLE_ROW=False, num_warps=_warps(CHUNK), **pdl)
    _final_kernel[(b,)](part_val, part_at, part_nan, out, chunks, CHUNKS_PAD=triton.next_power_of_2(chunks),
                        num_warps=1, **pdl, **advance)


@torch.library.custom_op("modelab::argmax_rows", mutates_args=())
def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (B, V) → (B, 1) int64 (argmax_rows_fwd); one opaque call to torch.compile."""
    return argmax_rows_fwd(x)


@argmax_rows.register_fake
def _(x):
    return x.new_empty(x.shape[0], 1, dtype=torch.int64)


def _reference(x: torch.Tensor) -> torch.Tensor:
    return torch.argmax(x, dim=-1, keepdim=True)
