"""torch.compile with Inductor, in its three user-facing modes.

Each prepare starts from a clean dynamo cache and compiles with dynamic=False: a benchmark at batch size B measures the
graph specialised for B, and its first call carries the whole compile cost for that shape. Without the reset, a new
module instance of the same class would hit the previous instance's guards and count as a recompile.
"""

from __future__ import annotations

import shutil
import sys

import torch
from torch import nn

from engine.measure.inductor_timing import install as keep_timings_alone
from engine.modes.base import Mode, Prepared, cuda_only
from engine.store import settings


def compiler_missing(device: str) -> str | None:
    if device.startswith("cuda"):
        reason = cuda_only(device)
        if reason:
            return reason
        major, _ = torch.cuda.get_device_capability(torch.device(device))
        if major < 7:
            return "Inductor's Triton backend needs compute capability 7.0 or newer"
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (Inductor generates Triton kernels on CUDA)"
        return None
    # Inductor's default compiler is $CXX, else g++ (config.cpp.cxx); read it from its config only where Inductor is
    # imported already: importing it costs the CLI ~2.5 s on a small CPU just to list the available modes.
    inductor_config = sys.modules.get("torch._inductor.config")
    cxx = getattr(getattr(inductor_config, "cpp", None), "cxx", None) or settings.get("CXX")
    cxx = cxx[-1] if isinstance(cxx, tuple) else cxx
    if not (cxx and shutil.which(cxx)) and not shutil.which("g++") and not shutil.which("clang++"):
        return "no C++ compiler on PATH (Inductor compiles C++ kernels on CPU)"
    return None


def _make(compile_mode: str | None):
    def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
        keep_timings_alone()  # beside a preparing group: kernel timings take the device alone, compiles leave it
        torch._dynamo.reset()
        compiled = torch.compile(model, mode=compile_mode, dynamic=False)
        before = None
        if compile_mode == "reduce-overhead":
            # CUDA graph trees reuse output memory between replays; marking each step keeps earlier outputs valid
            # for as long as one iteration needs them.
            before = torch.compiler.cudagraph_mark_step_begin
        return Prepared(fn=compiled, before_step=before)

    return prepare


def _reduce_overhead_availability(device: str) -> str | None:
    if not device.startswith("cuda"):
        return "reduce-overhead captures CUDA graphs; on CPU it would be the default mode again"
    return compiler_missing(device)


MODE = Mode(name="compile", description="torch.compile, Inductor default: fused Triton (GPU) or C++ (CPU) kernels.",
            prepare=_make(None), availability=compiler_missing, compiles=True)
REDUCE_OVERHEAD = Mode(
    name="compile-reduce-overhead",
    description="torch.compile mode='reduce-overhead': Inductor kernels replayed from CUDA graphs.",
    prepare=_make("reduce-overhead"), availability=_reduce_overhead_availability, compiles=True)
MAX_AUTOTUNE = Mode(
    name="compile-max-autotune",
    description="torch.compile mode='max-autotune': benchmarks GEMM templates and picks the fastest (slow compile).",
    prepare=_make("max-autotune"), availability=compiler_missing, compiles=True, autotunes=True)
