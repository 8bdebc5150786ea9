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
- unsorted edges (rowptr None), by default (`unsorted="linked"`): one linked list of in-edges per destination, built
  on the device in one pass — each edge swaps itself in as its destination's list head (one integer atomic exchange)
  and keeps the old head as its `next`, written beside its source index and weight in one 16-byte record — then a
  reduce that walks every row's list (ROWS rows in lock-step, one record load per step, then the source row's
  gather). No count, no scan, no placement: two kernels. The timed call includes the linking.
- unsorted edges, `unsorted="bucket"`: a CSR built on the device — a count per destination whose atomic also gives
  each edge its rank in its bucket, a scan into a row pointer, each edge's (source, weight) written packed at
  rowptr[dst] + rank — then the sorted kernel's walk over the packed records. Three kernels and a scan more than
  "linked"; kept beside it to show what the scan and the placement cost (benchmarks/triton_kernels_gpu.py --only mp).
- unsorted edges, `unsorted="atomic"`: one program per block of edges gathers x[src] * w and scatters it with fp32
  atomic adds into a zeroed fp32 buffer (and counts in-degrees for "mean"); a second small kernel divides by the
  degree and casts to x's dtype.
In all three unsorted ways the order of the additions into a row depends on which atomic lands first, so the fp32
rounding of the sums varies from run to run (not bit-reproducible). "linked" and "bucket" hold an edge's index, its
source and its next edge in 32 bits: with 2**31 or more edges or nodes they fall back to "atomic".

Indices are trusted, as in torch's index_add_ on CUDA: out-of-range src/dst or an inconsistent rowptr reads or
writes out of bounds (`csr_from_edges` checks its inputs' ranges). Accumulation is fp32 for every dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import LaunchCache, check_device, is_interpreted

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IDX_DTYPES = (torch.int32, torch.int64)
AGGRS = ("sum", "mean")
UNSORTED = ("linked", "bucket", "atomic")
UNSORTED_NOTE = ("unsorted edges: a linked list of in-edges per destination built on the device (one atomic exchange "
                 "per edge, in the timed call), then a reduce that walks each row's list")


@triton.jit
def _gather_rows(x, s, offs_f, ok, f_ok, F, EVEN_F: tl.constexpr):
    """x[s] for each row's current edge (rows not `ok` read nothing, give 0): (ROWS, BLOCK_F) in x's dtype."""
    x_ptrs = x + s[:, None] * F + offs_f[None, :]
    if EVEN_F:
        return tl.load(x_ptrs, mask=ok[:, None], other=0.0)
    return tl.load(x_ptrs, mask=ok[:, None] & f_ok[None, :], other=0.0)


@triton.jit
def _store_rows(out, acc, deg, rows, offs_f, row_ok, f_ok, F, MEAN: tl.constexpr, IDX64: tl.constexpr):
    """Each row's fp32 sum, divided by its in-degree for "mean" (an isolated row stays 0), in out's dtype."""
    if MEAN:
        acc = acc / tl.maximum(deg, 1).to(tl.float32)[:, None]
    if IDX64:
        rows = rows.to(tl.int64)
    tl.store(out + rows[:, None] * F + offs_f[None, :], acc.to(out.dtype.element_ty),
             mask=row_ok[:, None] & f_ok[None, :])


@triton.jit
def _segment_reduce_kernel(x, src, w, rowptr, out, N, F,
                           MEAN: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr,
                           EVEN_F: tl.constexpr, IDX64: tl.constexpr, PACKED: tl.constexpr = False):
    # PACKED: `src` holds one int64 record per edge (source in the low 32 bits, the weight's fp32 bits in the high),
    # as `bucket_by_destination` writes them; `w` is unused.
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
        if PACKED:
            rec = tl.load(src + e, mask=e_ok, other=0)
            s = rec & 0xFFFFFFFF
            we = (rec >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        else:
            s = tl.load(src + e, mask=e_ok, other=0)
            we = tl.load(w + e, mask=e_ok, other=0.0).to(tl.float32)
        if IDX64:
            s = s.to(tl.int64)
        else:
            s = s.to(tl.int32)
        xv = _gather_rows(x, s, offs_f, e_ok, f_ok, F, EVEN_F)
        acc += xv.to(tl.float32) * we[:, None]
    _store_rows(out, acc, deg, rows, offs_f, row_ok, f_ok, F, MEAN, IDX64)


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
def _link_kernel(src, dst, w, head, records, E, BLOCK: tl.constexpr):
    """Edge e becomes its destination's list head; the head it replaced is its `next`. records[e] = (src | next << 32,
    the weight's fp32 bits): the walk reads one 16-byte record per step."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < E
    d = tl.load(dst + offs, mask=ok, other=0)
    s = tl.load(src + offs, mask=ok, other=0).to(tl.int64)
    bits = tl.load(w + offs, mask=ok, other=0.0).to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
    old = tl.atomic_xchg(head + d, offs.to(tl.int32), mask=ok, sem="relaxed")
    lo = (old.to(tl.int64) << 32) | s
    rec = tl.join(lo, bits & 0xFFFFFFFF)  # (BLOCK, 2): each edge's two words side by side
    tl.store(records + 2 * offs.to(tl.int64)[:, None] + tl.arange(0, 2)[None, :], rec, mask=ok[:, None])


@triton.jit
def _linked_reduce_kernel(x, records, head, out, N, F, MEAN: tl.constexpr, ROWS: tl.constexpr,
                          BLOCK_F: tl.constexpr, EVEN_F: tl.constexpr, IDX64: tl.constexpr):
    """ROWS destination rows walk their in-edge lists in lock-step; a row whose list ended is masked out. The next
    record is loaded before this step's source row is used, so a step waits for one memory round trip, not two."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    row_ok = rows < N
    f_ok = offs_f < F
    pair = tl.arange(0, 2)[None, :]
    e = tl.load(head + rows, mask=row_ok, other=-1)
    active = e >= 0
    rec = tl.load(records + 2 * e.to(tl.int64)[:, None] + pair, mask=active[:, None], other=0)
    deg = tl.zeros([ROWS], dtype=tl.int32)
    acc = tl.zeros([ROWS, BLOCK_F], dtype=tl.float32)
    n_active = tl.sum(active.to(tl.int32), 0)
    while n_active > 0:
        lo, bits = tl.split(rec)
        s = lo & 0xFFFFFFFF
        if not IDX64:
            s = s.to(tl.int32)
        we = bits.to(tl.int32).to(tl.float32, bitcast=True)
        xv = _gather_rows(x, s, offs_f, active, f_ok, F, EVEN_F)
        e = tl.where(active, (lo >> 32).to(tl.int32), -1)
        nxt_active = e >= 0
        rec = tl.load(records + 2 * e.to(tl.int64)[:, None] + pair, mask=nxt_active[:, None], other=0)
        acc += xv.to(tl.float32) * we[:, None]
        deg += active.to(tl.int32)
        active = nxt_active
        n_active = tl.sum(active.to(tl.int32), 0)
    _store_rows(out, acc, deg, rows, offs_f, row_ok, f_ok, F, MEAN, IDX64)


@triton.jit
def _count_rank_kernel(dst, counts, rank, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < E
    d = tl.load(dst + offs, mask=ok, other=0)
    r = tl.atomic_add(counts + d, tl.full([BLOCK], 1, tl.int32), mask=ok, sem="relaxed")  # its rank in the bucket
    tl.store(rank + offs, r, mask=ok)


@triton.jit
def _place_kernel(src, dst, w, rank, rowptr, records, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < E
    d = tl.load(dst + offs, mask=ok, other=0)
    slot = tl.load(rowptr + d, mask=ok, other=0) + tl.load(rank + offs, mask=ok, other=0)
    s = tl.load(src + offs, mask=ok, other=0).to(tl.int64)
    bits = tl.load(w + offs, mask=ok, other=0.0).to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
    tl.store(records + slot, (bits << 32) | s, mask=ok)  # no atomic here: the count gave the rank


BUCKET_BLOCK = 1024
FITS_32 = 2**31 - 1  # an edge index, a node index and a list's next pointer are held in 32 bits


def _edge_block(kernel: object) -> int:
    return 32 if is_interpreted(kernel) else BUCKET_BLOCK


def link_by_destination(src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                        num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each destination's in-edges as a linked list, built on the device in one pass: (head int32 (num_nodes,), -1
    for no in-edge; records int64 (E, 2): [source | next << 32, the weight's fp32 bits], next -1 at a list's end).
    Indices are trusted (dst in [0, num_nodes)); E and num_nodes must be below 2**31."""
    _check_edges("link_by_destination", src, dst, w, num_nodes)
    if max(src.shape[0], num_nodes) > FITS_32:
        raise ValueError(f"link_by_destination: E and num_nodes must be < 2**31, got {src.shape[0]}, {num_nodes}")
    return _link(src.contiguous(), dst.contiguous(), w.contiguous(), num_nodes)


def _link(src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    E = src.shape[0]
    records = torch.empty(E, 2, dtype=torch.int64, device=src.device)
    head = torch.full((num_nodes,), -1, dtype=torch.int32, device=dst.device)
    if E > 0:
        block = _edge_block(_link_kernel)
        # E in the key: Triton specialises an int argument on divisibility by 16, so a kept launch must match it
        _launch(_LINK, (E, src.device.index, LaunchCache.aligned(src, dst, w, head, records), src.dtype, dst.dtype,
                        w.dtype, block), (triton.cdiv(E, block),), _link_kernel, (src, dst, w, head, records, E),
                {"BLOCK": block})
    return head, records


def unlink(head: torch.Tensor, records: torch.Tensor) -> list[list[tuple[int, float]]]:
    """The lists as Python lists of (source, weight), head first (for tests and for reading the layout)."""
    h, r = head.cpu().tolist(), records.cpu()
    lo, bits = r[:, 0], r[:, 1]
    srcs = (lo & 0xFFFFFFFF).tolist()
    nexts = (lo >> 32).to(torch.int32).tolist()
    weights = bits.to(torch.int32).view(torch.float32).tolist()
    lists = []
    for e in h:
        items = []
        while e >= 0:
            items.append((srcs[e], weights[e]))
            e = nexts[e]
        lists.append(items)
    return lists


def bucket_by_destination(src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                          num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges grouped by destination on the device: (records int64 (E,) — source | the weight's fp32 bits << 32 —,
    rowptr int32 (num_nodes + 1,)), the CSR `csr_from_edges` gives but from a count (whose atomic gives each edge
    its rank in its bucket), a scan and an atomic-free placement; order within a bucket not kept. Indices are
    trusted (dst in [0, num_nodes)); E and num_nodes must be below 2**31."""
    _check_edges("bucket_by_destination", src, dst, w, num_nodes)
    E = src.shape[0]
    if max(E, num_nodes) > FITS_32:
        raise ValueError(f"bucket_by_destination: E and num_nodes must be < 2**31, got {E}, {num_nodes}")
    counts_rowptr = torch.zeros(2 * num_nodes + 1, dtype=torch.int32, device=dst.device)
    counts, rowptr = counts_rowptr[:num_nodes], counts_rowptr[num_nodes:]
    records = torch.empty(E, dtype=torch.int64, device=src.device)
    if E > 0:
        rank = torch.empty(E, dtype=torch.int32, device=dst.device)
        block = _edge_block(_count_rank_kernel)
        grid = (triton.cdiv(E, block),)
        _count_rank_kernel[grid](dst, counts, rank, E, BLOCK=block)
        torch.cumsum(counts, 0, dtype=torch.int32, out=rowptr[1:])
        _place_kernel[grid](src, dst, w, rank, rowptr, records, E, BLOCK=block)
    return records, rowptr


def unpack_records(records: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`bucket_by_destination`'s records as (src int64, w float32)."""
    return records & 0xFFFFFFFF, (records >> 32).to(torch.int32).view(torch.float32)


def _launch(cache: LaunchCache, key: tuple, grid: tuple, kernel: object, args: tuple, meta: dict) -> None:
    """An untuned kernel launched through `cache` (Triton's per-call Python skipped after the first call per key)."""
    if is_interpreted(kernel):
        kernel[grid](*args, **meta)
    elif not cache.launch(key, grid, *args):
        if key in cache.entries:
            kernel[grid](*args, **meta)
        else:
            cache.first(key, lambda: kernel[grid](*args, **meta), len(args))


_even_f = triton.heuristics({"EVEN_F": lambda a: a["F"] % a["BLOCK_F"] == 0})
_segment_reduce = _even_f(_segment_reduce_kernel)
_linked_reduce = _even_f(_linked_reduce_kernel)


def _gpu_configs(shapes: list[tuple[int, int]]) -> list[triton.Config]:
    return [triton.Config({"ROWS": rows}, num_warps=wp, num_stages=1) for rows, wp in shapes]  # (ROWS, num_warps)


_segment_reduce_tuned = triton.autotune(_gpu_configs([(8, 2), (16, 4), (32, 4), (32, 8), (64, 4), (64, 8)]),
                                        key=["N", "F"])(_segment_reduce)
# the linked reduce's candidates: at the real shape (N=100k, E=1M, F=128) 4–32 rows per program are within a few per
# cent of each other (benchmarks/triton_kernels_gpu.py), 64 rows slower
_linked_reduce_tuned = triton.autotune(_gpu_configs([(4, 1), (8, 2), (16, 4), (32, 4), (32, 8)]),
                                       key=["N", "F"])(_linked_reduce)
_SEGMENT = LaunchCache(_segment_reduce_tuned)
_LINKED = LaunchCache(_linked_reduce_tuned)
_LINK = LaunchCache(_link_kernel)

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
                          config: dict | None = None, unsorted: str = "linked") -> torch.Tensor:
    """`message_passing` with an optional fixed config for the reduce kernel (tests, benchmarks)."""
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
    if rowptr is None and unsorted != "atomic" and max(E, num_nodes) > FITS_32:
        unsorted = "atomic"  # the lists and the packed records hold indices in 32 bits
    if rowptr is None and unsorted == "linked":
        head, records = _link(src, dst, w, num_nodes)
        _reduce(_linked_reduce, _linked_reduce_tuned, _LINKED, (x, records, head, out, num_nodes, F),
                dict(MEAN=mean, IDX64=idx64), config, ("linked", E, x.dtype))
        return out
    packed = rowptr is None and unsorted == "bucket"
    if packed:
        src, rowptr = bucket_by_destination(src, dst, w, num_nodes)
        w = src  # the weights travel inside the packed records
    if rowptr is not None:
        rowptr = rowptr.contiguous()
        _reduce(_segment_reduce, _segment_reduce_tuned, _SEGMENT, (x, src, w, rowptr, out, num_nodes, F),
                dict(MEAN=mean, IDX64=idx64, PACKED=packed), config,
                ("segment", E, x.dtype, src.dtype, w.dtype, rowptr.dtype))
        return out

    # Unsorted edges: atomics into an fp32 buffer, then divide (mean) and cast in a second kernel.
    interpreted = is_interpreted(_scatter_add_kernel)
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
                    aggr: str = "sum", rowptr: torch.Tensor | None = None, unsorted: str = "linked") -> torch.Tensor:
    """out[d] = sum (or mean) over edges e into d of w[e] * x[src[e]]; returns (num_nodes, F) in x's dtype.

    x (N, F) float32/bfloat16/float16; src, dst (E,) int32/int64; w (E,) float. With `rowptr` (num_nodes + 1, CSR over
    edges sorted by dst, as from `csr_from_edges`; then dst is only shape-checked): segment reduce, no atomics,
    deterministic. Without it (`unsorted`): "linked" — a linked list of in-edges per destination built on the device,
    then a reduce walking each list (the default); "bucket" — a CSR built on the device (count, scan, place), then the
    segment reduce; "atomic" — fp32 atomic adds into a buffer, then a cast. fp32 accumulation every way.
    """
    return _message_passing_impl(x, src, dst, w, num_nodes, aggr, rowptr, unsorted=unsorted)


def _reduce(plain: object, tuned: object, cache: LaunchCache, args: tuple, meta: dict, config: dict | None,
            key: tuple) -> None:
    """Launch a row-reduce kernel (ROWS rows × BLOCK_F features per program): with `config` (or the interpreter's)
    as given; else autotuned over ROWS and warps, later calls with the same key straight to the tuned kernel."""
    x, N, F = args[0], args[-2], args[-1]
    block_f = min(triton.next_power_of_2(F), 256)
    interpreted = is_interpreted(plain)
    if interpreted and config is None:
        config = dict(INTERPRETER_CONFIG)
    if config is not None:
        cfg = dict(config)
        block_f = cfg.pop("BLOCK_F", block_f)
        launch = {k: cfg.pop(k) for k in ("num_warps", "num_stages") if k in cfg}
        grid = (triton.cdiv(N, cfg["ROWS"]), triton.cdiv(F, block_f))
        plain[grid](*args, **meta, BLOCK_F=block_f, **cfg, **({} if interpreted else launch))  # type: ignore[index]
        return

    def grid(m: dict) -> tuple[int, int]:
        return (triton.cdiv(N, m["ROWS"]), triton.cdiv(F, block_f))

    full_key = (*key, N, F, x.device.index, tuple(sorted(meta.items())), LaunchCache.aligned(*args[:-2]))
    tuned_meta = cache.meta(full_key)
    if tuned_meta is not None and cache.launch(full_key, grid(tuned_meta), *args):
        return
    if full_key not in cache.entries:
        cache.first(full_key, lambda: tuned[grid](*args, **meta, BLOCK_F=block_f), len(args))  # type: ignore[index]
    else:
        tuned[grid](*args, **meta, BLOCK_F=block_f)  # type: ignore[index]


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
