"""Inductor times kernels while it compiles: run exactly those parts with the device held alone.

A worker that prepares beside other runs of its group (engine.runner.plan) holds its device shared, and takes it alone
only to
time (engine.runner.device_lock.exclusive). torch.compile times candidate kernels inside a first call in two places:

    AlgorithmSelectorCache.benchmark        max-autotune's GEMM/template choices (after they are precompiled)
    CachingAutotuner.benchmark_all_configs  a generated Triton kernel with several configs, at its first launch


Coordinate-descent tuning (max-autotune's second pass over each generated kernel) and pad_mm's padded-or-not check
time single configs outside those two methods: they run with the device shared — beside other runs' preparations,
never their timings. Taken alone, each of coordinate descent's hundreds of timings would wait for every preparing
run of the group, which about doubles a training phase's compile in `bench --mode all` on a GPU.
`time_candidates_alone()` wraps them in `device_lock.exclusive()`, once per process, so tracing, lowering and
compiling the candidates stay shared with the group and only the timings wait for the device. Outside a phased
worker the wrapper passes straight through. Where a torch version lacks one of them, `installed()` says so and the
caller holds the device alone for the whole first call instead.

`compile_off_device()` does the converse for host-only work — Triton's compiler (Inductor's kernels, their
coordinate-descent variants, a level's @triton.jit kernels), Inductor's C++ builds (AOTInductor, CPU kernels) and
waiting for Inductor's compile pool: it runs in `device_lock.released()`, so on a GPU machine other runs of the group
time meanwhile, on cores the compile does not use.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from typing import Any

from engine.runner import device_lock

# (module, class, method) of each place Inductor times candidate kernels (torch 2.11–2.13).
TIMED = (("torch._inductor.select_algorithm", "AlgorithmSelectorCache", "benchmark"),
         ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner", "benchmark_all_configs"))
# Inductor's benchmarker, wherever a timing goes through it. Called inside a released block (below: e.g. epilogue-fusion
# benchmarks during code generation) it takes the device alone — a released block must launch nothing beside another
# run's timing; called with the device shared (coordinate descent, pad_mm) it stays shared.
BENCHMARKERS = tuple(("torch._inductor.runtime.benchmarking", cls, "benchmark_gpu")
                     for cls in ("Benchmarker", "TritonBenchmarker", "InductorBenchmarker", "TorchProfilerBenchmarker"))
# (module, class or None for a module-level function, name) of host-only work; missing ones are skipped.
# fx_codegen_and_compile is Inductor's lowering, code generation and kernel compiles of one graph (a cache miss): it
# times candidates only through the methods above, which take the device back alone.
HOST_ONLY = (("torch._inductor.compile_fx", None, "fx_codegen_and_compile"),
             ("triton", None, "compile"), ("triton.compiler", None, "compile"),
             ("torch._inductor.cpp_builder", "CppBuilder", "build"),
             ("torch._inductor.async_compile", "AsyncCompile", "wait"))
_MARK = "_modelab_times_alone"
_OFF_MARK = "_modelab_off_device"


def _within(function: Callable[..., Any], context: Callable[[], contextlib.AbstractContextManager],
            mark: str) -> Callable[..., Any]:
    """`function`, each call of it run inside a fresh `context()`; marked so it is wrapped only once."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with context():
            return function(*args, **kwargs)

    setattr(wrapper, mark, True)
    return wrapper


def _exclusive_if_released() -> contextlib.AbstractContextManager:
    hold = device_lock.current()
    return device_lock.exclusive() if hold is not None and hold.state is None else contextlib.nullcontext()


def time_candidates_alone() -> bool:
    """Wrap every TIMED method that exists in this torch; True when all of them are wrapped."""
    complete = True
    for module_name, class_name, method_name in TIMED:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
            method = getattr(cls, method_name)
        except (ImportError, AttributeError):
            complete = False
            continue
        if not getattr(method, _MARK, False):
            setattr(cls, method_name, _within(method, device_lock.exclusive, _MARK))
    for module_name, class_name, method_name in BENCHMARKERS:
        cls = getattr(importlib.import_module(module_name), class_name, None) if _importable(module_name) else None
        method = cls.__dict__.get(method_name) if cls is not None else None  # each class's own override
        if method is not None and not getattr(method, _MARK, False):
            setattr(cls, method_name, _within(method, _exclusive_if_released, _MARK))
    return complete


def _importable(module_name: str) -> bool:
    try:
        importlib.import_module(module_name)
        return True
    except ImportError:
        return False


def installed() -> bool:
    """Whether every TIMED method of this torch is wrapped."""
    for module_name, class_name, method_name in TIMED:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            return False
        if not getattr(getattr(cls, method_name, None), _MARK, False):
            return False
    return True


def compile_off_device() -> list[str]:
    """Wrap every HOST_ONLY function this environment has (once per process); returns the names wrapped."""
    wrapped = []
    for module_name, class_name, name in HOST_ONLY:
        try:
            owner = importlib.import_module(module_name)
            if class_name:
                owner = getattr(owner, class_name)
            function = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        if not getattr(function, _OFF_MARK, False):
            setattr(owner, name, _within(function, device_lock.released, _OFF_MARK))
        wrapped.append(f"{module_name}.{class_name + '.' if class_name else ''}{name}")
    return wrapped


def install() -> bool:
    """Both disciplines for a worker that compiles beside its group; True when every timing is singled out."""
    compile_off_device()
    return time_candidates_alone()


def begin_run(device: str) -> dict[str, Any]:
    """A bench or levels worker's start: its environment captured with the device given up (git, the device's
    properties, CUDA's start: host work, others may time meanwhile) and, beside a group, Inductor's and Triton's
    compiles moved off the device for the rest of the run. Returns the environment."""
    from engine.store.envinfo import capture_env

    with device_lock.released():
        env = capture_env(device)
        if device_lock.current() is not None:
            compile_off_device()
    return env
