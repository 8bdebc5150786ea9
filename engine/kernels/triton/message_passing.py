"""GNN message passing in Triton (Kernel Levels, L4), kernels and plain-torch check side by side.

out[d] = sum over edges e with dst[e] == d of w[e] * x[src[e]]      (aggr="sum")
out[d] = that sum / in-degree(d), 0 for a node with no in-edges     (aggr="mean")

Two formulations:
- sorted edges (CSR, `rowptr` given; see `csr_from_edges`): a segment reduce with NO atomics. One program owns ROWS
  destination rows and one BLOCK_F slice of the features. It reads its rows' edge ranges [rowptr[d], rowptr[d+1])
  once, then walks them in lock-step: step j gathers, for every one of its rows at once, the j-th in-edge's source
  row x[src[e]] (ROWS independent 16-byte-vectorised row reads in flight per step), scales it by w[e] and adds it to
  that row's fp32 accumulator held in registers. Each output row is written once. Rows with fewer edges are masked
  out of the later steps (a block of ROWS rows runs max(in-degree) steps; skewed degrees waste lanes, not bytes).
  Summation order is fixed (edge order), so the result is deterministic.
- unsorted edges (rowptr None), by default (`unsorted="bucket"`): the edges are bucketed by destination on the device
  first — a count per destination (integer atomics), a scan into a row pointer, then each edge placed at its bucket's
  next free slot (an atomic cursor per destination) — and the sorted kernel above runs on the result. Bucketing moves
  ~E·(3·index + 2·weight) bytes, a fraction of the gather's E·F·itemsize, and turns F float atomics per edge into
  two integer ones. Within a bucket the placement order varies from run to run, so the fp32 rounding of the sums
  does too (not bit-reproducible). The timed call includes the bucketing.
- unsorted edges, `unsorted="atomic"`: one program per block of edges gathers x[src] * w and scatters it with fp32
  atomic adds into a zeroed fp32 buffer (and counts in-degrees for "mean"); a second small kernel divides by the
  degree and casts to x's dtype. Atomic order varies here too.

Indices are trusted, as in torch's index_add_ on CUDA: out-of-range src/dst or an inconsistent rowptr reads or
writes out of bounds (`csr_from_edges` checks its inputs' ranges). Accumulation is fp32 for every dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import check_device, is_interpreted

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IDX_DTYPES = (torch.int32, torch.int64)
AGGRS = ("sum", "mean")
UNSORTED = ("bucket", "atomic")
UNSORTED_NOTE = ("unsorted edges: bucketed by destination on the device (count, scan, place; in the timed call), then "
                 "the sorted segment reduce")


@triton.jit
def _segment_reduce_kernel(x, src, w, rowptr, out, N, F,
                           MEAN: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr,
                           EVEN_F: tl.constexpr, IDX64: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    row_ok = rows < N
    f_ok = offs_f < F
    start = tl.load(rowptr + rows, mask=row_ok, other=0)
    end = tl.load(rowptr + rows + 1, mask=row_ok, other=0)
    if not IDX64:
        start = start.to(tl.int32)
        end = end.to(tl.int32)
    deg = end - start
    n_steps = tl.max(deg, 0)
    acc = tl.zeros([ROWS, BLOCK_F], dtype=tl.float32)
    for j in range(0, n_steps):
        e_ok = j < deg
        e = start + j
        s = tl.load(src + e, mask=e_ok, other=0)
        we = tl.load(w + e, mask=e_ok, other=0.0).to(tl.float32)
        if IDX64:
            s = s.to(tl.int64)
        else:
            s = s.to(tl.int32)
        x_ptrs = x + s[:, None] * F + offs_f[None, :]
        if EVEN_F:
            xv = tl.load(x_ptrs, mask=e_ok[:, None], other=0.0)
        else:
            xv = tl.load(x_ptrs, mask=e_ok[:, None] & f_ok[None, :], other=0.0)
        acc += xv.to(tl.float32) * we[:, None]
    if MEAN:
        acc = acc / tl.maximum(deg, 1).to(tl.float32)[:, None]
    if IDX64:
        rows = rows.to(tl.int64)
    tl.store(out + rows[:, None] * F + offs_f[None, :], acc.to(out.dtype.element_ty),
             mask=row_ok[:, None] & f_ok[None, :])


@triton.jit
def _scatter_add_kernel(x, src, dst, w, buf, deg, E, F,
                        MEAN: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, IDX64: tl.constexpr):
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    e_ok = offs_e < E
    f_ok = offs_f < F
    s = tl.load(src + offs_e, mask=e_ok, other=0)
    d = tl.load(dst + offs_e, mask=e_ok, other=0)
    if IDX64:
        s = s.to(tl.int64)
        d = d.to(tl.int64)
    else:
        s = s.to(tl.int32)
        d = d.to(tl.int32)
    we = tl.load(w + offs_e, mask=e_ok, other=0.0).to(tl.float32)
    tile_ok = e_ok[:, None] & f_ok[None, :]
    xv = tl.load(x + s[:, None] * F + offs_f[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    tl.atomic_add(buf + d[:, None] * F + offs_f[None, :], xv * we[:, None], mask=tile_ok, sem="relaxed")
    if MEAN:
        if tl.program_id(1) == 0:
            tl.atomic_add(deg + d, tl.full([BLOCK_E], 1, tl.int32), mask=e_ok, sem="relaxed")


@triton.jit
def _finalize_kernel(buf, deg, out, N, F, MEAN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
                     IDX64: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    if IDX64:
        rows = rows.to(tl.int64)
    ok = (rows < N)[:, None] & (offs_f < F)[None, :]
    v = tl.load(buf + rows[:, None] * F + offs_f[None, :], mask=ok, other=0.0)
    if MEAN:
        dg = tl.load(deg + rows, mask=rows < N, other=1)
        v = v / tl.maximum(dg, 1).to(tl.float32)[:, None]
    tl.store(out + rows[:, None] * F + offs_f[None, :], v.to(out.dtype.element_ty), mask=ok)


@triton.jit
def _count_kernel(dst, counts, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < E
    d = tl.load(dst + offs, mask=ok, other=0)
    tl.atomic_add(counts + d, tl.full([BLOCK], 1, counts.dtype.element_ty), mask=ok, sem="relaxed")


@triton.jit
def _place_kernel(src, dst, w, cursor, src_out, w_out, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < E
    d = tl.load(dst + offs, mask=ok, other=0)
    slot = tl.atomic_add(cursor + d, tl.full([BLOCK], 1, cursor.dtype.element_ty), mask=ok, sem="relaxed")
    tl.store(src_out + slot, tl.load(src + offs, mask=ok, other=0).to(src_out.dtype.element_ty), mask=ok)
    tl.store(w_out + slot, tl.load(w + offs, mask=ok, other=0.0), mask=ok)


BUCKET_BLOCK = 1024


def bucket_by_destination(src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                          num_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Edges grouped by destination on the device: (src_bucketed, w_bucketed, rowptr of length num_nodes + 1), as
    `csr_from_edges` gives but in one counting pass and one placing pass (order within a bucket not kept). Indices are
    trusted (dst in [0, num_nodes)); int32 indices where every count fits, int64 otherwise."""
    _check_edges("bucket_by_destination", src, dst, w, num_nodes)
    E = src.shape[0]
    index = torch.int32 if max(E, num_nodes) < 2**31 - 1 else torch.int64
    counts = torch.zeros(num_nodes, dtype=index, device=dst.device)
    block = 32 if is_interpreted(_count_kernel) else BUCKET_BLOCK
    grid = (triton.cdiv(E, block),)
    if E > 0:
        _count_kernel[grid](dst, counts, E, BLOCK=block)
    rowptr = torch.zeros(num_nodes + 1, dtype=index, device=dst.device)
    torch.cumsum(counts, 0, dtype=index, out=rowptr[1:])
    cursor = rowptr[:-1].clone()
    src_out = torch.empty(E, dtype=index, device=src.device)
    w_out = torch.empty_like(w)
    if E > 0:
        _place_kernel[grid](src, dst, w, cursor, src_out, w_out, E, BLOCK=block)
    return src_out, w_out, rowptr


_segment_reduce = triton.heuristics({"EVEN_F": lambda a: a["F"] % a["BLOCK_F"] == 0})(_segment_reduce_kernel)


def _gpu_configs() -> list[triton.Config]:
    shapes = [(8, 2), (16, 4), (32, 4), (32, 8), (64, 4), (64, 8)]  # (ROWS, num_warps)
    return [triton.Config({"ROWS": rows}, num_warps=wp, num_stages=1) for rows, wp in shapes]


_segment_reduce_tuned = triton.autotune(_gpu_configs(), key=["N", "F"])(_segment_reduce)

INTERPRETER_CONFIG = {"ROWS": 16, "BLOCK_F": 32}
SCATTER_CONFIG = {"BLOCK_E": 32, "num_warps": 4}


def _check_inputs(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int,
                  aggr: str, rowptr: torch.Tensor | None) -> None:
    named = [("x", x), ("src", src), ("dst", dst), ("w", w)] + ([("rowptr", rowptr)] if rowptr is not None else [])
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"message_passing: {name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2:
        raise ValueError(f"message_passing: x must be (N, F), got shape {tuple(x.shape)}")
    if x.dtype not in X_DTYPES:
        raise ValueError(f"message_passing: x dtype must be float32, bfloat16 or float16, got {x.dtype}")
    if w.dtype not in X_DTYPES:
        raise ValueError(f"message_passing: w dtype must be float32, bfloat16 or float16, got {w.dtype}")
    for name, t in (("src", src), ("dst", dst)):
        if t.dtype not in IDX_DTYPES:
            raise ValueError(f"message_passing: {name} must be int32 or int64, got {t.dtype}")
    if src.dim() != 1 or dst.dim() != 1 or w.dim() != 1 or not (src.shape == dst.shape == w.shape):
        raise ValueError(f"message_passing: src, dst, w must be 1-D of one length E, got "
                         f"{tuple(src.shape)}, {tuple(dst.shape)}, {tuple(w.shape)}")
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 0:
        raise ValueError(f"message_passing: num_nodes must be an int >= 0, got {num_nodes!r}")
    if aggr not in AGGRS:
        raise ValueError(f"message_passing: aggr must be one of {AGGRS}, got {aggr!r}")
    if rowptr is not None:
        if rowptr.dtype not in IDX_DTYPES or rowptr.shape != (num_nodes + 1,):
            raise ValueError(f"message_passing: rowptr must be int32/int64 of shape ({num_nodes + 1},), got "
                             f"{rowptr.dtype} {tuple(rowptr.shape)}")


def _message_passing_impl(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int,
                          aggr: str = "sum", rowptr: torch.Tensor | None = None,
                          config: dict | None = None, unsorted: str = "bucket") -> torch.Tensor:
    """`message_passing` with an optional fixed config for the segment kernel (tests, benchmarks)."""
    _check_inputs(x, src, dst, w, num_nodes, aggr, rowptr)
    if unsorted not in UNSORTED:
        raise ValueError(f"message_passing: unsorted must be one of {UNSORTED}, got {unsorted!r}")
    extra = (rowptr,) if rowptr is not None else ()
    check_device(_segment_reduce_kernel, "message_passing", x, src, dst, w, *extra)
    x, src, dst, w = (t.contiguous() for t in (x, src, dst, w))
    F = x.shape[1]
    E = src.shape[0]
    out = torch.empty(num_nodes, F, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    mean = aggr == "mean"
    idx64 = max(x.numel(), out.numel(), E) >= 2**31
    interpreted = is_interpreted(_segment_reduce_kernel)
    if rowptr is None and unsorted == "bucket":
        src, w, rowptr = bucket_by_destination(src, dst, w, num_nodes)
    if rowptr is not None:
        rowptr = rowptr.contiguous()
        if interpreted and config is None:
            config = dict(INTERPRETER_CONFIG)
        block_f = min(triton.next_power_of_2(F), 256)
        if config is not None:
            cfg = dict(config)
            block_f = cfg.pop("BLOCK_F", block_f)
            launch = {key: cfg.pop(key) for key in ("num_warps", "num_stages") if key in cfg}
            grid = (triton.cdiv(num_nodes, cfg["ROWS"]), triton.cdiv(F, block_f))
            _segment_reduce[grid](x, src, w, rowptr, out, num_nodes, F, MEAN=mean, BLOCK_F=block_f, IDX64=idx64,
                                  **cfg, **({} if interpreted else launch))
        else:
            def grid(meta: dict) -> tuple[int, int]:
                return (triton.cdiv(num_nodes, meta["ROWS"]), triton.cdiv(F, block_f))

            _segment_reduce_tuned[grid](x, src, w, rowptr, out, num_nodes, F, MEAN=mean, BLOCK_F=block_f,
                                        IDX64=idx64)
        return out

    # Unsorted edges: atomics into an fp32 buffer, then divide (mean) and cast in a second kernel.
    buf = out if (x.dtype == torch.float32 and not mean) else torch.empty(num_nodes, F, dtype=torch.float32,
                                                                          device=x.device)
    buf.zero_()
    deg = torch.zeros(num_nodes if mean else 1, dtype=torch.int32, device=x.device)
    block_f = min(triton.next_power_of_2(F), 128)
    cfg = dict(SCATTER_CONFIG) if config is None else {**SCATTER_CONFIG, **config}
    num_warps = cfg.pop("num_warps", 4)
    cfg.pop("ROWS", None)
    block_f = cfg.pop("BLOCK_F", block_f)
    if E > 0:
        grid = (triton.cdiv(E, cfg["BLOCK_E"]), triton.cdiv(F, block_f))
        _scatter_add_kernel[grid](x, src, dst, w, buf, deg, E, F, MEAN=mean, BLOCK_F=block_f, IDX64=idx64,
                                  **cfg, **({} if interpreted else {"num_warps": num_warps}))
    if buf is not out:
        grid = (triton.cdiv(num_nodes, 32), triton.cdiv(F, block_f))
        _finalize_kernel[grid](buf, deg, out, num_nodes, F, MEAN=mean, BLOCK_R=32, BLOCK_F=block_f, IDX64=idx64)
    return out


def message_passing(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int,
                    aggr: str = "sum", rowptr: torch.Tensor | None = None, unsorted: str = "bucket") -> torch.Tensor:
    """out[d] = sum (or mean) over edges e into d of w[e] * x[src[e]]; returns (num_nodes, F) in x's dtype.

    x (N, F) float32/bfloat16/float16; src, dst (E,) int32/int64; w (E,) float. With `rowptr` (num_nodes + 1, CSR over
    edges sorted by dst, as from `csr_from_edges`; then dst is only shape-checked): segment reduce, no atomics,
    deterministic. Without it: the edges bucketed by destination on the device, then the same segment reduce
    (`unsorted="bucket"`), or fp32 atomic adds into a buffer, then a cast (`unsorted="atomic"`). fp32 accumulation
    every way.
    """
    return _message_passing_impl(x, src, dst, w, num_nodes, aggr, rowptr, unsorted=unsorted)


def _check_edges(caller: str, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (src, dst, w)):
        raise ValueError(f"{caller}: src, dst, w must be tensors")
    if src.dim() != 1 or not (src.shape == dst.shape == w.shape):
        raise ValueError(f"{caller}: src, dst, w must be 1-D of one length, got "
                         f"{tuple(src.shape)}, {tuple(dst.shape)}, {tuple(w.shape)}")
    if src.dtype not in IDX_DTYPES or dst.dtype not in IDX_DTYPES:
        raise ValueError(f"{caller}: src and dst must be int32 or int64, got {src.dtype}, {dst.dtype}")
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 0:
        raise ValueError(f"{caller}: num_nodes must be an int >= 0, got {num_nodes!r}")


def csr_from_edges(src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                   num_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort edges by destination (stable) into CSR: (src_sorted, w_sorted, rowptr int64 of length num_nodes + 1)."""
    _check_edges("csr_from_edges", src, dst, w, num_nodes)
    if dst.numel() and (int(dst.min()) < 0 or int(dst.max()) >= num_nodes):
        raise ValueError(f"csr_from_edges: dst must lie in [0, {num_nodes})")
    if src.numel() and int(src.min()) < 0:
        raise ValueError("csr_from_edges: src must be >= 0")
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst.long(), minlength=num_nodes)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=dst.device)
    rowptr[1:] = torch.cumsum(counts, 0)
    return src[order], w[order], rowptr


def _reference(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int,
               aggr: str = "sum") -> torch.Tensor:
    """Plain torch in float64: gather, scale, index_add_ (and divide by in-degree for mean). Returns float64."""
    msg = x.double()[src.long()] * w.double()[:, None]
    out = torch.zeros(num_nodes, x.shape[1], dtype=torch.float64, device=x.device)
    out.index_add_(0, dst.long(), msg)
    if aggr == "mean":
        deg = torch.bincount(dst.long(), minlength=num_nodes).clamp(min=1).double()
        out = out / deg[:, None]
    return out
