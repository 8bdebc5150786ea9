"""The int4 GEMV on the tensor cores (csrc/quant/int4_gemv.cu): one row x times a symmetric int4 weight (packed in
engine/kernels/int4_layout.py's order, then re-ordered into 16-row tiles by `tile_major`), with the decode step's
fusions (RMSNorm, SwiGLU, residual), built on first use.

Which products take it: $MODELAB_INT4_GEMV (`impl`, `takes`): auto (the default) sends the products of K >= 4096
inputs on compute capability 9.0 here and the rest to the Triton kernel (engine/kernels/triton/quant_gemv.py): the
rule measured on an H100, where this kernel made the 7B step faster end to end (2.04 against 2.12 ms/token) and the
1B's K = 2048 products slower; cuda sends every product here, triton none. The triton-int4-wo mode loads the kernel
while it prepares (`ensure()`; nothing here builds on a call's path; where it cannot build, the Triton kernel runs
and the note says why), gives each int4 projection that takes it a copy of its codes in this kernel's tile order
(engine.llm.quant.attach_int4_tiles, `tile_major`: each 16-row tile's codes group by group, so a warp's batch is one
contiguous run that a single bulk copy brings in on sm_90), and the decode step's fused products
(engine.kernels.triton.gemv.FusedDecodeOps) send their one-row bf16 calls here.
Why a second kernel: the Triton one multiplies on the CUDA cores after unpacking (4.3–5.3 instructions per weight);
this one unpacks with a PRMT, a shift and two LOP3s per 4 weights and lets mma.sync do the products
(csrc/quant/int4_gemv.cu says how the packed order is already the fragment order). Per GEMV (benchmarks/
quant_gemv_bench.py --fused, H100, 2026-11-27) it is faster than the Triton kernel's tiles on 7B gate_up (21.2
against 23.1 µs) and 1B down (6.3 against 7.1), level on the LM heads, slower on qkv and o; in the decode step's
graph the 7B's products together ran faster with it (docs/quantization.md has the tables).

    load() -> path       build (cached, ~30 s the first time) and load; NativeBuildError with the reason
    available() -> None | reason   never raises
    tile_major(q, s, k, glu) -> TileWeight   the weight re-ordered for the kernel, once
    int4_gemv(x, w, norm_weight, eps, residual, ks) -> y
    tile_gemv(x, q, s, n, glu, norm_weight, eps, residual)   the same as a custom op (modelab::int4_tile_gemv)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.kernels import cuda_levels
from engine.native import build as native

SOURCE_DIR = native.CSRC / "quant"
SOURCES = ("int4_gemv.cu", "bindings.cpp")
INCLUDE_DIRS = (cuda_levels.SOURCE_DIR,)  # common.cuh: CUDA_CHECK, Mma, allow_dynamic_smem
HEADERS = ("../levels/common.cuh",)  # part of the build key
IMPL_ENV = "MODELAB_INT4_GEMV"  # which int4 GEMV the decode step runs: IMPLS' keys (default auto)
IMPLS = {
    "auto": "the tensor-core kernel on compute capability 9.0 for products of K >= 4096 inputs, the Triton one else",
    "cuda": "the tensor-core kernel for every product",
    "triton": "the Triton kernel for every product",
}
# auto's rule, measured on an H100 (2026-11-27, docs/quantization.md): end to end, 7B triton-int4-wo (K 4096 and
# 11008) 2.04 ms/token with this kernel against 2.12 with Triton's; 1B (K 2048, down 8192) 516.5 against 468.8 µs,
# where per GEMV this kernel won only the 1B's down (6.3 against 7.1 µs, K = 8192).
AUTO_MIN_K = 4096
KSLICES = (4, 8, 16)  # warps per block, each a slice of K (the kernel's instantiations)
RING_SLOTS = 2  # csrc/quant/int4_gemv.cu's DEPTH: batches of codes in flight per warp
BATCH_GROUPS = 4  # its BATCH: groups of 64 per batch (one bulk copy of 4 × 16 rows × 32 bytes)

_library = cuda_levels.CudaLibrary("cuda_quant", SOURCE_DIR, SOURCES, HEADERS, INCLUDE_DIRS)


def load(verbose: bool = False) -> str:
    """Build (cached) and load the library; its path. Raises NativeBuildError with the reason."""
    return _library.load(verbose)


def available() -> str | None:
    """None when the kernel can run here (building it, cached, where a GPU and nvcc exist), else why not."""
    try:
        load()
        return None
    except native.NativeBuildError as exc:
        return str(exc).strip().splitlines()[0]
    except Exception as exc:  # noqa: BLE001 — the contract is a reason string, never an exception
        return f"build failed: {type(exc).__name__}: {exc}"[:300]


def impl() -> str:
    """$MODELAB_INT4_GEMV: auto (default), cuda or triton. ValueError naming the choices for anything else."""
    value = os.environ.get(IMPL_ENV, "auto").strip().lower() or "auto"
    if value not in IMPLS:
        raise ValueError(f"${IMPL_ENV}={value!r}: choose one of {', '.join(IMPLS)}")
    return value


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
    """Warps per block (each a contiguous slice of K's groups of 64) for K inputs. From K = 4096 16 (one block per
    SM): on the H100 with the 2 × 4-group ring, 16 against 8 warps on the fused 7B products (K 4096) qkv 11.3 / 11.5,
    o 5.8 / 5.8, gate_up 19.7 / 19.7 µs, down (K 11008) 12.0 / 12.5; the 1B's down (K 8192) 6.0 / 7.4 (2026-11-27)."""
    groups = -(-k // 64)
    return 16 if groups >= 64 else 8 if groups >= 48 else 4


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
    if len({x.device, w.q.device, w.s.device}) != 1 or x.device.type != "cuda":
        raise ValueError("int4_gemv: x and the weight must be on one CUDA device")


def int4_gemv(x: torch.Tensor, w: TileWeight, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
              residual: torch.Tensor | None = None, ks: int | None = None, pdl: bool = True) -> torch.Tensor:
    """y (N,) or (N/2,) with the weight's glu, bf16: x (K,) bf16 contiguous times the int4 weight w (`tile_major`).
    Inputs are checked here (`_check`, ValueError) before the library is loaded, and again in C++."""
    ks = kslices(x.numel()) if ks is None else ks
    if ks not in KSLICES:
        raise ValueError(f"kslices must be one of {KSLICES}, got {ks}")
    _check(x, w, norm_weight, residual)
    load()
    return torch.ops.modelab_quant.int4_gemv(x, w.q, w.s, w.n, norm_weight, float(eps), residual, w.glu, ks, pdl)


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
