"""Inductor times kernels while it compiles: run exactly those parts with the device held alone.

A worker that prepares beside other runs of its group (engine.plan) holds its device shared, and takes it alone only to
time (engine.device_lock.exclusive). torch.compile times candidate kernels inside a first call in two places:

    AlgorithmSelectorCache.benchmark        max-autotune's GEMM/template choices (after they are precompiled)
    CachingAutotuner.benchmark_all_configs  a generated Triton kernel with several configs, at its first launch

`time_candidates_alone()` wraps both in `device_lock.exclusive()`, once per process, so tracing, lowering and
compiling the candidates stay shared with the group and only the timings wait for the device. Outside a phased
worker the wrapper passes straight through. Where a torch version lacks either method, `installed()` says so and the
caller holds the device alone for the whole first call instead.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from engine import device_lock

# (module, class, method) of each place Inductor times candidate kernels (torch 2.11–2.13).
TIMED = (("torch._inductor.select_algorithm", "AlgorithmSelectorCache", "benchmark"),
         ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner", "benchmark_all_configs"))
_MARK = "_modelab_times_alone"


def _alone(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with device_lock.exclusive():
            return method(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


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
            setattr(cls, method_name, _alone(method))
    return complete


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
