"""AOTInductor: the model compiled ahead of time into a .pt2 package, run from Python and from a C++ runner.

prepare: torch.export (batch dimension dynamic, so one package serves every batch size) →
aoti_compile_and_package → model.pt2 (cached; see engine/native/aoti.py) → engine.native.aoti.load. That loaded
package is what bench times and checks against eager. Its `extra_metrics` hook then runs the same .pt2 on the same
inputs in csrc/aoti_runner.cpp (libtorch's AOTIModelPackageLoader, no Python), checks that output against eager too, and
returns the runner's latency as `native_*` metrics, so a run shows what the Python call path costs.

Inference only: a package holds the forward graph, no autograd, so the mode declares phases=("infer",).

On CUDA the package is first loaded in a child process (set MODELAB_AOTI_CHECK_IN_CHILD=0 to skip, =1 to force on
CPU): on one image aoti_load_package segfaulted in `_load_aoti`, and a child's crash lets this run fail with that
reason (and whether the native runner loads the same file) instead of taking the worker down. A marker file beside
the cached package records a passed check, so a warm rerun skips it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.modes.base import Mode, Prepared
from engine.store import settings

if TYPE_CHECKING:
    from engine.native.aoti import Package

PHASES = ("infer",)
PROFILER_LABEL = "## Call AOTInductor package ##"  # engine.explain.why counts this range's own time as compute
CHECK_ENV = "MODELAB_AOTI_CHECK_IN_CHILD"


def _check_marker(pkg_path: str | os.PathLike[str], device: torch.device) -> Path:
    """A file beside the cached package saying it already loaded and ran in a child on this device: the check is
    about this package file on this machine (the package directory is keyed by device and torch), so once is enough."""
    return Path(pkg_path).parent / f"loaded-in-child-{str(device).replace(':', '-')}.ok"


class InferenceOnlyError(RuntimeError):
    pass


def availability(device: str) -> str | None:
    from engine.modes.compile import compiler_missing

    return compiler_missing(device)  # Inductor compiles C++ (and Triton on CUDA); the runner needs the same compiler


def _check_in_child(device: torch.device) -> bool:
    forced = settings.get(CHECK_ENV)
    return device.type == "cuda" if forced is None else forced


def _native_verdict(pkg_path, inputs, device) -> str:
    """After a crash in Python's loader: does the native runner load and run the same package?"""
    from engine.native.aoti import NativeRunError, run_native
    from engine.native.build import NativeBuildError, build_aoti_runner

    try:
        runner = build_aoti_runner()
        run_native(runner, pkg_path, inputs, device, warmup=1, iters=3)
    except (NativeBuildError, NativeRunError) as exc:
        return f"The native runner fails too: {exc}"
    return "The native runner (csrc/aoti_runner.cpp) loads and runs the same .pt2 without crashing."


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    if train:
        raise InferenceOnlyError("aoti: AOTInductor packages are inference-only (torch.export of the forward pass, "
                                 "no autograd graph), so there is no training step to run; benchmark phase 'infer'")
    from engine.measure.inductor_timing import install as keep_timings_alone
    from engine.native import aoti

    keep_timings_alone()  # beside a preparing group: the package's C++ build leaves the device to the timings
    device = example_inputs[0].device if example_inputs else torch.device("cpu")
    model = model.eval()
    pkg = aoti.compile_package(model, example_inputs)
    notes = _package_notes(pkg)
    _check_in_child_once(pkg, example_inputs, device, notes)
    compiled = _marked_in_profiles(aoti.load(pkg.path, device))
    with torch.no_grad():
        expected = model(*example_inputs).detach().clone()
    prepared = Prepared(fn=compiled, notes=notes, files={"model.pt2": str(pkg.path)})
    prepared.artifacts = {"aoti_exported_program.txt": pkg.exported_program, **aoti.generated_sources(pkg.path)}
    prepared.extra_metrics = _native_metrics(pkg, example_inputs, device, expected, prepared)
    return prepared


def _package_notes(pkg: Package) -> list[str]:
    """What the package is: the compiler's own notes, then how it was exported and compiled."""
    notes = list(pkg.notes)
    shape_note = "a dynamic batch dimension (one package for every batch size)" if pkg.dynamic_batch else \
        "the example's static shapes"
    options = f", Inductor options {pkg.options}" if pkg.options else ""
    notes.append(f"aoti: torch.export → aoti_compile_and_package with {shape_note}{options}; package {pkg.digest}")
    return notes


def _check_in_child_once(pkg: Package, example_inputs: tuple[torch.Tensor, ...], device: torch.device,
                         notes: list[str]) -> None:
    """Load and run the package in a child process first, unless switched off or already passed on this device (a
    crash there fails this run with its reason, and whether the native runner loads the file, not the worker)."""
    from engine.native import aoti

    marker = _check_marker(pkg.path, device)
    if not _check_in_child(device) or marker.is_file():
        return
    try:
        aoti.check_load_in_child(pkg.path, example_inputs, device)
    except aoti.NativeRunError as exc:
        raise aoti.NativeRunError(f"{exc}\n{_native_verdict(pkg.path, example_inputs, device)}") from None
    try:
        marker.write_text("engine.native.aoti.load loaded and ran this package in a child process\n")
    except OSError:  # a read-only cache: the check simply runs again next time
        pass
    notes.append("aoti: the package loaded and ran in a child process first (a crash there fails only this run)")


def _marked_in_profiles(loaded: Callable[..., Any]) -> Callable[..., Any]:
    def compiled(*args: torch.Tensor):
        # The package runs its kernels without the dispatcher, so a trace would show its time as Python between ops.
        # Like Inductor's own "## Call CompiledFxGraph ##", mark the call, but only while a profiler listens.
        if torch.autograd.profiler._is_profiler_enabled:
            with torch.profiler.record_function(PROFILER_LABEL):
                return loaded(*args)
        return loaded(*args)

    return compiled


def _native_metrics(pkg: Package, example_inputs: tuple[torch.Tensor, ...], device: torch.device,
                    expected: torch.Tensor, prepared: Prepared) -> Callable[..., list]:
    """Prepared.extra_metrics: export and compile times, then the same .pt2 on the same inputs in the C++ runner
    (csrc/aoti_runner.cpp), its output checked against eager and its latency as native_* metrics."""
    from engine.native import aoti

    def extra_metrics(warmup: int = 10, iters: int = 100, rtol: float = 1e-4, atol: float = 1e-4) -> list:
        from engine.measure.checks import compare
        from engine.measure.timing import summarize
        from engine.native.build import NativeBuildError, build_aoti_runner
        from engine.store.db import Metric

        metrics = [Metric("export_time", pkg.export_s, "s")]
        if not pkg.cache_hit:
            metrics.append(Metric("aoti_compile_time", pkg.compile_s, "s"))
        try:
            runner = build_aoti_runner()
            result = aoti.run_native(runner, pkg.path, example_inputs, device, warmup=warmup, iters=iters)
        except (NativeBuildError, aoti.NativeRunError) as exc:
            note = f"aoti: no native_* metrics: {exc}"
            if note not in prepared.notes:
                prepared.notes.append(note)
            return metrics
        outputs = result.get("outputs") or []
        if not outputs or "tensor" not in outputs[0]:
            raise aoti.NativeRunError("the native runner returned no output")
        max_abs, _ = compare(outputs[0]["tensor"], expected, rtol, atol,
                             f"aoti native runner at batch {example_inputs[0].shape[0] if example_inputs else '?'}")
        stats = summarize(result["samples_us"])
        metrics += [Metric(f"native_{name}", getattr(stats, name), "us")
                    for name in ("median", "p10", "p90", "p25", "p75", "mean", "min", "max")]
        metrics += [Metric("native_load", float(result["load_us"]), "us"),
                    Metric("native_max_abs_err", max_abs, ""),
                    Metric("native_max_rss", float(result["max_rss_bytes"]), "bytes")]
        if result.get("peak_device_bytes") is not None:
            metrics.append(Metric("native_peak_device_memory", float(result["peak_device_bytes"]), "bytes"))
        note = ("aoti: native_* metrics come from csrc/aoti_runner.cpp (libtorch AOTIModelPackageLoader, no Python) "
                "timing the same .pt2 on the same inputs")
        if note not in prepared.notes:
            prepared.notes.append(note)
        return metrics

    return extra_metrics


MODE = Mode(
    name="aoti",
    description="AOTInductor: torch.export → .pt2 package, loaded in Python; also timed by a C++ runner "
                "(native_* metrics: the cost of Python).",
    prepare=prepare, availability=availability, phases=PHASES)
