"""The int4 GEMV on the tensor cores (csrc/quant/int4_gemv.cu): one row x times a symmetric int4 weight (packed in
engine/kernels/int4_layout.py's order, then re-ordered into 16-row tiles by `tile_major`), with the decode step's
fusions (RMSNorm, SwiGLU, residual), built on first use.

Which products take it: $MODELAB_INT4_GEMV (`impl`, `takes`): auto (the default) sends the products of K >= 2048 inputs
on compute capability 9.0 here and the rest to the Triton kernel (engine/kernels/triton/quant_gemv.py): on an H100, with
its blocks tuned per product (`tune`), this kernel makes both the 1B and the 7B decode step faster end to end; other
GPUs are not measured, so they keep the Triton kernel. cuda sends every product here, triton none. Each product runs the
block (warps × groups per bulk copy) that `tune` timed fastest for it on this device while the mode prepared
(benchmarks/quant_gemv_bench.py times every block by passing `ks` and `batch`). The triton-int4-wo mode loads the kernel
while it prepares (`ensure()`; nothing here builds on a call's path; where it cannot build, the Triton kernel runs and
the note says why), gives each int4 projection that takes it a copy of its codes in this kernel's tile order
(engine.llm.quant.attach_int4_tiles, `tile_major`: each 16-row tile's codes group by group, so a warp's batch is one
contiguous run that a single bulk copy brings in on sm_90), and the decode step's fused products
(engine.kernels.triton.gemv.FusedDecodeOps) send their one-row bf16 calls here.
Why a second kernel: the Triton one multiplies on the CUDA cores after unpacking (4.3–5.3 instructions per weight); this
one unpacks with a PRMT, a shift and two LOP3s per 4 weights and lets mma.sync do the products (csrc/quant/int4_gemv.cu
says how the packed order is already the fragment order). docs/quantization.md describes both kernels; docs/figures.md
has their times.

    load() -> path       build (cached, ~30 s the first time) and load; NativeBuildError with the reason
    available() -> None | reason   never raises
    tile_major(q, s, k, glu) -> TileWeight   the weight re-ordered for the kernel, once
    tune(weights) -> lines   time the 6 blocks per distinct product, keep the fastest (`block` reads it)
    int4_gemv(x, w, norm_weight, eps, residual, ks, pdl, batch) -> y
    tile_gemv(x, q, s, n, glu, norm_weight, eps, residual)   the same as a custom op (modelab::int4_tile_gemv)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.kernels import cuda_levels
from engine.native import build as native
from engine.store import settings

SOURCE_DIR = native.CSRC / "quant"
SOURCES = ("int4_gemv.cu", "bindings.cpp")
INCLUDE_DIRS = (cuda_levels.SOURCE_DIR,)  # common.cuh: CUDA_CHECK, Mma, allow_dynamic_smem
HEADERS = ("../levels/common.cuh",)  # part of the build key
IMPL_ENV = "MODELAB_INT4_GEMV"  # which int4 GEMV the decode step runs: IMPLS' keys (engine.store.settings)
IMPLS = {
    "auto": "the tensor-core kernel on compute capability 9.0 for products of K >= 2048 inputs, the Triton one else",
    "cuda": "the tensor-core kernel for every product",
    "triton": "the Triton kernel for every product",
}
# auto's rule: from K = 2048 (the 1B's smallest) the tensor-core kernel, with 8 warps a block there, makes the
# decode step faster end to end on an H100 than the Triton kernel (docs/quantization.md).
AUTO_MIN_K = 2048
KSLICES = (4, 8, 16)  # warps per block, each a slice of K (the kernel's instantiations)
RING_SLOTS = 2  # csrc/quant/int4_gemv.cu's DEPTH: batches of codes in flight per warp
RING_BATCHES = (4, 8)  # its BATCH instantiations: groups of 64 per batch (one bulk copy of BATCH × 16 rows × 32 bytes)

_library = cuda_levels.CudaLibrary("cuda_quant", SOURCE_DIR, SOURCES, HEADERS, INCLUDE_DIRS)


def load(verbose: bool = False) -> str:
    """Build (cached) and load the library; its path. Raises NativeBuildError with the reason."""
    return _library.load(verbose)


def available() -> str | None:
    """None when the kernel can run here (building it, cached, where a GPU and nvcc exist), else why not."""
    return _library.reason()


def impl() -> str:
    """$MODELAB_INT4_GEMV: auto (default), cuda or triton. ValueError naming the choices for anything else."""
    return settings.get(IMPL_ENV)


def chosen() -> bool:
    """Whether $MODELAB_INT4_GEMV lets any product take this kernel (auto or cuda)."""
    return impl() != "triton"


def takes(k: int, device: torch.device | str | None = None) -> bool:
    """Whether a one-row int4 product of K inputs on this CUDA device should take this kernel, by $MODELAB_INT4_GEMV
    (auto: compute capability 9.0 and K >= AUTO_MIN_K, the shapes it was measured faster on)."""
    choice = impl()
    if choice != "auto":
        return choice == "cuda"
    return k >= AUTO_MIN_K and torch.cuda.is_available() and torch.cuda.get_device_capability(device) == (9, 0)


def wanted() -> bool:
    """Whether this kernel is asked for and loaded in this process."""
    return _library.path is not None and chosen()


def ensure(ks: Iterable[int] | None = None, device: torch.device | str | None = None) -> str:
    """Load the kernel where it is asked for and can run; one line saying which int4 GEMV the decode step runs. `ks`:
    the K of the model's int4 products — where none of them would take this kernel on `device` (auto on another GPU,
    or every K below AUTO_MIN_K), nothing is built."""
    choice = impl()
    if choice == "triton":
        return f"int4 GEMV: the Triton kernel (${IMPL_ENV}=triton; auto or cuda take the tensor-core one)"
    if ks is not None and not any(takes(k, device) for k in set(ks)):
        return (f"int4 GEMV: the Triton kernel (${IMPL_ENV}={choice}: {IMPLS[choice]}; none of this model's products "
                "here)")
    reason = available()
    if reason:
        return f"int4 GEMV: the Triton kernel (the tensor-core kernel csrc/quant/int4_gemv.cu: {reason})"
    return (f"int4 GEMV (${IMPL_ENV}={choice}): {IMPLS[choice]} (csrc/quant/int4_gemv.cu: mma.sync over codes "
            "unpacked in registers, fp32 accumulation)")


def kslices(k: int) -> int:
    """Warps per block (each a contiguous slice of K's groups of 64) for K inputs: 16 from K = 4096 (one block per
    SM), 8 from K = 2048, else 4 — on the H100 the fastest or level of the three for every 1B and 7B product
    (benchmarks/quant_gemv_bench.py). The untuned default: the decode step runs what `tune` measured fastest."""
    groups = -(-k // 64)
    return 16 if groups >= 64 else 8 if groups >= 32 else 4


# A block replaces the untuned one only where it is at least this much faster alone: gains of a percent or two on a
# product alone do not show end to end (the step's time varies more than that between runs), while a product 5 %
# faster alone does.
MIN_GAIN = 0.03
# (n, k, glu, device index) → the (warps, batch) `tune` measured fastest for that product on that device
_TUNED: dict[tuple[int, int, bool, int], tuple[int, int]] = {}
_TIMES: dict[tuple[int, int, bool, int], dict[tuple[int, int], float]] = {}


def block(n: int, k: int, glu: bool, device: torch.device) -> tuple[int, int]:
    """The (warps, batch) a product of n rows and k inputs runs with: what `tune` measured fastest here, else
    `kslices(k)` warps and batches of 4 groups (the untuned default)."""
    return _TUNED.get((n, k, glu, torch.device(device).index or 0), (kslices(k), 4))


def tune(weights: Iterable[TileWeight], l2_multiple: float = 3.0, replays: int = 10) -> list[str]:
    """Time every (warps, batch) block on each distinct product (n, k, glu) of `weights` and keep the fastest for
    `block` where it beats the untuned block by MIN_GAIN: calls on rotating copies of the codes (more bytes than L2
    holds, as in a decode step) captured in one CUDA graph, with the device to this run alone
    (engine.runner.device_lock.exclusive); each candidate's output checked against the untuned block's first. Returns
    one line per product tuned. Why measure rather than rule: the fastest block differs by product and by GPU
    (docs/figures.md lists the H100's)."""
    lines = []
    seen: set[tuple[int, int, bool, int]] = set()
    for w in weights:
        key = (w.n, w.k, w.glu, w.q.device.index or 0)
        if key in seen or key in _TUNED:
            continue
        seen.add(key)
        name = f"{w.n}×{w.k}{' glu' if w.glu else ''}"
        rotating, why_not = _rotating_copies(w, l2_multiple)
        if rotating is None:
            lines.append(f"{name}: not tuned, {why_not}")
            continue
        times = _time_blocks(w, rotating, replays)
        del rotating
        untuned = (kslices(w.k), 4)
        best = min(times, key=times.get)
        if times[best] > (1 - MIN_GAIN) * times[untuned]:
            best = untuned  # a smaller gain alone does not show end to end (MIN_GAIN)
        _TUNED[key], _TIMES[key] = best, times
        lines.append(f"{name}: {best[0]} warps × {best[1]}-group batches {times[best]:.1f} µs (untuned "
                     f"{untuned[0]} × {untuned[1]}: {times[untuned]:.1f} µs)")
    return lines


def _rotating_copies(w: TileWeight, l2_multiple: float) -> tuple[list[TileWeight] | None, str]:
    """`w` and enough copies of it that the calls read more bytes than L2 holds, as in a decode step; (None, why)
    where the device has no memory for them (a model that fills the device keeps the untuned block)."""
    l2 = torch.cuda.get_device_properties(w.q.device).L2_cache_size or (50 << 20)
    nbytes = w.q.nbytes + w.s.nbytes
    copies = max(2, min(64, int(l2_multiple * l2 // nbytes) + 1))
    try:
        return [w] + [TileWeight(w.q.clone(), w.s.clone(), w.n, w.k, w.glu) for _ in range(copies - 1)], ""
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, (f"no memory for {copies - 1} copies of {nbytes / 1e6:.1f} MB (the untuned {kslices(w.k)} "
                      "warps × 4-group batches)")


def _time_blocks(w: TileWeight, rotating: list[TileWeight], replays: int) -> dict[tuple[int, int], float]:
    """{(warps, batch): median µs} of every block over the rotating copies, each block's output checked against the
    untuned block's first, with the device to this run alone."""
    from engine.measure.timing import time_in_graph
    from engine.runner.device_lock import exclusive

    gen = torch.Generator(device=w.q.device).manual_seed(w.n * 31 + w.k)
    x = torch.randn(w.k, device=w.q.device, generator=gen).bfloat16()
    norm = torch.ones(w.k, device=w.q.device, dtype=torch.bfloat16) if w.glu else None
    reference = int4_gemv(x, w, norm, 1e-5, ks=kslices(w.k), batch=4).float()
    times: dict[tuple[int, int], float] = {}
    with exclusive():
        for ks in KSLICES:
            for batch in RING_BATCHES:
                # the blocks add the same fp32 products in other orders: equal within bf16 rounding, so only a gross
                # difference is a fault (each block is held to float64 by tests/engine/kernels)
                got = int4_gemv(x, w, norm, 1e-5, ks=ks, batch=batch).float()
                rel = float((got - reference).norm() / reference.norm().clamp_min(1e-30))
                if not rel <= 1e-2:
                    raise RuntimeError(f"int4 GEMV {w.n}×{w.k}: block {ks}×{batch} differs from the untuned block "
                                       f"by {rel:.1e} (relative L2)")
                calls = [lambda t=t, ks=ks, batch=batch: int4_gemv(x, t, norm, 1e-5, ks=ks, batch=batch)
                         for t in rotating]
                times[(ks, batch)] = time_in_graph(calls, replays=replays).stats.median
    return times


@dataclass(frozen=True)
class TileWeight:
    """An int4 weight in the kernel's tile order (`tile_major`): q (tiles, groups, 16, 8) int32 words and s (tiles,
    groups, 8, 2) bf16, for n output rows (n / 2 outputs with glu) of k inputs."""

    q: torch.Tensor
    s: torch.Tensor
    n: int
    k: int
    glu: bool


def tile_rows(n: int, glu: bool) -> torch.Tensor:
    """The weight row behind each of the kernel's tile rows (tiles · 16 of them), n where a tile runs past the weight:
    rows 16t … 16t + 15, or with glu the gate rows 8t … 8t + 7 then the matching up rows n / 2 + 8t … (SwiGLU pairs
    them in the epilogue)."""
    if glu:
        half = n // 2
        tiles = -(-half // 8)
        j = torch.arange(tiles * 8).view(tiles, 1, 8)
        rows = torch.cat([j, j + half], dim=1)  # (tiles, 2, 8)
        rows = torch.where(j < half, rows, torch.full_like(rows, n))
        return rows.reshape(-1)
    tiles = -(-n // 16)
    rows = torch.arange(tiles * 16)
    return torch.where(rows < n, rows, torch.full_like(rows, n))


def tile_major(q: torch.Tensor, s: torch.Tensor, k: int, glu: bool = False) -> TileWeight:
    """Re-order a packed int4 weight (q (N, ceil(K/64)·32) uint8 or (N, ceil(K/64)·8) int32 in int4_layout's order,
    s (N, ceil(K/64)) bf16) into the kernel's tile order: each tile's 16 rows group by group, so that a warp's batch
    of codes is one contiguous run (csrc/quant/int4_gemv.cu, Args). Rows past N are zeros (scale 0). Runs once per
    weight, on the weight's device."""
    groups = -(-k // 64)
    words = q.contiguous().view(torch.int32) if q.dtype == torch.uint8 else q
    n = words.shape[0]
    if words.dtype != torch.int32 or words.dim() != 2 or words.shape[1] != groups * 8:
        raise ValueError(f"tile_major: q must be the packed int4 codes of ({n}, {k}), got {q.dtype} {tuple(q.shape)}")
    if s.dtype != torch.bfloat16 or tuple(s.shape) != (n, groups):
        raise ValueError(f"tile_major: s must be bfloat16 ({n}, {groups}), got {s.dtype} {tuple(s.shape)}")
    if glu and n % 2:
        raise ValueError("tile_major: glu (the gate_up product) needs an even N")
    rows = tile_rows(n, glu).to(words.device)
    tiles = rows.numel() // 16
    qp = torch.cat([words, words.new_zeros(1, words.shape[1])])[rows]  # (tiles·16, groups·8)
    sp = torch.cat([s, s.new_zeros(1, groups)])[rows]  # (tiles·16, groups)
    qt = qp.view(tiles, 16, groups, 8).transpose(1, 2).contiguous()
    # scales of rows quad and quad + 8 side by side: [tile][group][quad][2]
    st = sp.view(tiles, 2, 8, groups).permute(0, 3, 2, 1).contiguous()
    return TileWeight(qt, st, n, k, glu)


def _check(x: torch.Tensor, w: TileWeight, norm_weight: torch.Tensor | None, residual: torch.Tensor | None) -> None:
    """ValueError before any launch for inputs the kernel does not take (the C++ side checks them again)."""
    k, n = x.numel(), w.n
    if x.dtype != torch.bfloat16 or not x.is_contiguous() or x.dim() != 1:
        raise ValueError(f"int4_gemv: x must be one contiguous bfloat16 row, got {x.dtype} {tuple(x.shape)}")
    if k != w.k:
        raise ValueError(f"int4_gemv: x has {k} features, the weight {w.k}")
    if norm_weight is not None and (norm_weight.numel() != k or norm_weight.dtype != torch.bfloat16):
        raise ValueError(f"int4_gemv: norm weight must be {k} bfloat16 values")
    if residual is not None and (residual.numel() != n or residual.dtype != torch.bfloat16 or norm_weight is not None
                                 or w.glu):
        raise ValueError(f"int4_gemv: the residual must be {n} bfloat16 values, and fuses alone")
    if w.glu and norm_weight is None:
        raise ValueError("int4_gemv: glu (the gate_up product) comes with the norm")
    # the layout the C++ side checks too, refused here first as a ValueError, before the library is loaded (a throw
    # there once killed the process: csrc/quant/bindings.cpp)
    tiles, groups = (w.n // 2 + 7) // 8 if w.glu else (w.n + 15) // 16, (k + 63) // 64
    if (w.glu and w.n % 2) or w.q.dtype != torch.int32 or tuple(w.q.shape) != (tiles, groups, 16, 8) \
            or w.s.dtype != torch.bfloat16 or tuple(w.s.shape) != (tiles, groups, 8, 2):
        raise ValueError(f"int4_gemv: the weight must be tile_major's int32 codes ({tiles}, {groups}, 16, 8) and "
                         f"bfloat16 scales ({tiles}, {groups}, 8, 2) for N = {w.n}{' with glu' if w.glu else ''} and "
                         f"K = {k}, got {w.q.dtype} {tuple(w.q.shape)} and {w.s.dtype} {tuple(w.s.shape)}")
    if not (w.q.is_contiguous() and w.s.is_contiguous()) or w.q.data_ptr() % 16 or w.s.data_ptr() % 4:
        raise ValueError("int4_gemv: the weight's codes must be contiguous and 16-byte aligned, its scales "
                         "contiguous and 4-byte aligned")
    if len({x.device, w.q.device, w.s.device}) != 1 or x.device.type != "cuda":
        raise ValueError("int4_gemv: x and the weight must be on one CUDA device")


def int4_gemv(x: torch.Tensor, w: TileWeight, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
              residual: torch.Tensor | None = None, ks: int | None = None, pdl: bool = True,
              batch: int | None = None) -> torch.Tensor:
    """y (N,) or (N/2,) with the weight's glu, bf16: x (K,) bf16 contiguous times the int4 weight w (`tile_major`).
    ks: warps per block, batch: groups per bulk copy (both by default `block`: tuned, or the untuned default).
    Inputs are checked here (`_check`, ValueError) before the library is loaded, and again in C++."""
    if ks is None or batch is None:
        default_ks, default_batch = block(w.n, w.k, w.glu, x.device)
        ks = default_ks if ks is None else ks
        batch = default_batch if batch is None else batch
    if ks not in KSLICES:
        raise ValueError(f"kslices must be one of {KSLICES}, got {ks}")
    if batch not in RING_BATCHES:
        raise ValueError(f"batch must be one of {RING_BATCHES}, got {batch}")
    _check(x, w, norm_weight, residual)
    load()
    return torch.ops.modelab_quant.int4_gemv(x, w.q, w.s, w.n, norm_weight, float(eps), residual, w.glu, ks, batch,
                                             pdl)


@torch.library.custom_op("modelab::int4_tile_gemv", mutates_args=())
def tile_gemv(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, n: int, glu: bool,
              norm_weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None) -> torch.Tensor:
    """int4_gemv as a torch custom op over the tile-order buffers (engine.llm.quant.attach_int4_tiles puts them on a
    projection): opaque to torch.compile, captured by CUDA graphs. x (1, K) or (K,) bf16, one row."""
    row = x.reshape(-1)
    y = int4_gemv(row, TileWeight(q, s, n, row.numel(), glu), norm_weight, eps,
                  None if residual is None else residual.reshape(-1))
    return y.reshape(*x.shape[:-1], y.numel())


@tile_gemv.register_fake
def _(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, n: int, glu: bool, norm_weight: torch.Tensor | None,
      eps: float, residual: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n // 2 if glu else n))
