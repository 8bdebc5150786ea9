"""The int4 GEMV on the tensor cores (csrc/quant/int4_gemv.cu): one row x times a symmetric int4 weight in
engine/kernels/int4_layout.py's order, with the decode step's fusions (RMSNorm, SwiGLU, residual), built on first use.

Opt-in: with MODELAB_INT4_GEMV=cuda, the triton-int4-wo mode loads it while it prepares (`ensure()`; nothing here
builds on a call's path) and engine/kernels/triton/quant_gemv.gemv_int4 sends its one-row bf16 calls here; by
default the Triton kernel runs. Why a second kernel: the Triton one multiplies on the CUDA cores after unpacking
(4.3–5.3 instructions per weight); this one unpacks with a PRMT, a shift and two LOP3s per 4 weights, lets mma.sync
do the products and streams the codes through a cp.async ring (csrc/quant/int4_gemv.cu says how the packed order is
already the fragment order). Why not the default: measured on an H100 (benchmarks/quant_gemv_bench.py --fused,
2026-11-27) it is faster than the Triton kernel's best tile only on 7B gate_up (22.9 against 23.3 µs) and 1B down;
over the five fused GEMVs, 7B 90.2 µs against the Triton tiles' 82.9 (docs/quantization.md has the table).

    load() -> path       build (cached, ~30 s the first time) and load; NativeBuildError with the reason
    available() -> None | reason   never raises
    int4_gemv(x, q, s, norm_weight, eps, residual, glu, kslices) -> y
"""

from __future__ import annotations

import os

import torch

from engine.kernels import cuda_levels
from engine.native import build as native

SOURCE_DIR = native.CSRC / "quant"
SOURCES = ("int4_gemv.cu", "bindings.cpp")
INCLUDE_DIRS = (cuda_levels.SOURCE_DIR,)  # common.cuh: CUDA_CHECK, Mma, allow_dynamic_smem
HEADERS = ("../levels/common.cuh",)  # part of the build key
IMPL_ENV = "MODELAB_INT4_GEMV"  # "cuda": this kernel for the decode step's int4 products; else (default) Triton's
KSLICES = (4, 8, 16)  # warps per block, each a slice of K (the kernel's instantiations)
RING_SLOTS = 4  # csrc/quant/int4_gemv.cu's DEPTH: batches of codes in flight per warp

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


def chosen() -> bool:
    """Whether $MODELAB_INT4_GEMV asks for this kernel."""
    return os.environ.get(IMPL_ENV, "triton") == "cuda"


def wanted() -> bool:
    """Whether one-row int4 products should take this kernel: asked for, and loaded in this process."""
    return _library.path is not None and chosen()


def ensure() -> str:
    """Load the kernel where it is asked for and can run; one line saying which int4 GEMV the decode step runs."""
    if not chosen():
        return (f"int4 GEMV: the Triton kernel (${IMPL_ENV}=cuda takes the tensor-core one, "
                "csrc/quant/int4_gemv.cu)")
    reason = available()
    if reason:
        return f"int4 GEMV: the Triton kernel (the tensor-core kernel csrc/quant/int4_gemv.cu: {reason})"
    return ("int4 GEMV: the tensor-core kernel (csrc/quant/int4_gemv.cu: mma.sync over codes unpacked in registers, "
            "fp32 accumulation)")


def kslices(k: int) -> int:
    """Warps per block (each a contiguous slice of K's groups of 64) for K inputs."""
    groups = -(-k // 64)
    return 16 if groups >= 128 else 8 if groups >= 48 else 4


def _check(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, norm_weight: torch.Tensor | None,
           residual: torch.Tensor | None, glu: bool) -> None:
    """ValueError before any launch for inputs the kernel does not take (the C++ side checks them again)."""
    k, n = x.numel(), q.shape[0] if q.dim() == 2 else -1
    groups = -(-k // 64)
    if x.dtype != torch.bfloat16 or not x.is_contiguous() or x.dim() != 1:
        raise ValueError(f"int4_gemv: x must be one contiguous bfloat16 row, got {x.dtype} {tuple(x.shape)}")
    if q.dtype != torch.int32 or q.dim() != 2 or q.shape[1] != groups * 8 or not q.is_contiguous():
        raise ValueError(f"int4_gemv: q must be contiguous int32 words (N, {groups * 8}) for {k} inputs, "
                         f"got {q.dtype} {tuple(q.shape)}")
    if s.dtype != torch.bfloat16 or tuple(s.shape) != (n, groups) or s.stride(1) != 1:
        raise ValueError(f"int4_gemv: s must be bfloat16 ({n}, {groups}), got {s.dtype} {tuple(s.shape)}")
    if norm_weight is not None and (norm_weight.numel() != k or norm_weight.dtype != torch.bfloat16):
        raise ValueError(f"int4_gemv: norm weight must be {k} bfloat16 values")
    if residual is not None and (residual.numel() != n or residual.dtype != torch.bfloat16 or norm_weight is not None
                                 or glu):
        raise ValueError(f"int4_gemv: the residual must be {n} bfloat16 values, and fuses alone")
    if glu and (norm_weight is None or n % 2):
        raise ValueError("int4_gemv: glu (the gate_up product) needs the norm and an even N")
    if len({x.device, q.device, s.device}) != 1 or x.device.type != "cuda":
        raise ValueError("int4_gemv: x, q and s must be on one CUDA device")


def int4_gemv(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, norm_weight: torch.Tensor | None = None,
              eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False,
              ks: int | None = None, pdl: bool = True) -> torch.Tensor:
    """y (N,) or (N/2,) with glu, bf16: x (K,) bf16 contiguous; q (N, groups·8) int32 words; s (N, groups) bf16.
    Inputs are checked here (`_check`, ValueError) before the library is loaded, and again in C++."""
    ks = kslices(x.numel()) if ks is None else ks
    if ks not in KSLICES:
        raise ValueError(f"kslices must be one of {KSLICES}, got {ks}")
    _check(x, q, s, norm_weight, residual, glu)
    load()
    return torch.ops.modelab_quant.int4_gemv(x, q, s, norm_weight, float(eps), residual, glu, ks, pdl)
