"""Why is mode X slower than mode Y? A step decomposed from what the store already holds, and the floor it could reach.

For two runs of one workload and phase (bench runs and/or profile runs), each mode's step is split into terms that
partition the profiled step time (its Chrome trace, swept instant by instant over the step window):

    compute      the device is busy (on a GPU: any kernel, copy or memset running; on a CPU, where the host is the
                 device: the own time of operators that do arithmetic, and of Inductor's or an aoti package's
                 generated code)
    launch       the device is idle while the host is inside a kernel-launch call (cudaLaunchKernel, cudaGraphLaunch…)
    guard        … while the host runs dynamo's guard checks or a recompile
    framework    … while the host runs Python and framework code (dispatch, autograd, optimizer, the glue between ops)
    idle         … while no traced host work explains it (gaps between steps, waits nothing recorded)

Each instant counts once, in the first of these that applies, so the terms add up to the profiled step time (within
ADD_UP_TOLERANCE, which only absorbs float rounding: a larger gap is a bug). Device idle time is everything but
compute. The profiler costs host time; its overhead is measured as the profiled step minus the same step timed without
the profiler (the profile's `step_median_us`, or the bench run's median) and shown, never hidden in a term.

Paid once rather than per step: the first-call compile cost (bench's first call minus its median, plus an aoti
package's export and compile when its cache missed), with what the caches held (engine.measure.caches), and recompiles.

The floor: the least time this device allows for the step, from the measured ceilings (engine.measure.ceilings) and the
workload's analytic FLOPs and bytes: max(FLOPs / matmul rate, bytes / copy bandwidth, kernels × per-kernel cost),
with kernels = 1 (one persistent kernel) and the per-kernel cost of a kernel inside a replayed CUDA graph on a GPU, of
one eager op call on a CPU. Every floor names the ceilings it divides by.

Why not Holistic Trace Analysis (holistictraceanalysis 0.5.0): it installs 106 packages
(~500 MB, jupyterlab and pytest among its runtime requirements) into a lab that otherwise stays small, and it analyses
GPU streams only — on this lab's CPU traces its idle-time breakdown and temporal breakdown raise and its launch
statistics are empty, while the explanation must work on both. Its idle-time split (host wait / kernel wait) is what
the launch, framework and idle terms above give. depyf, by contrast, is adopted (engine.profiling.compiled_code).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from engine.measure.op_stats import (
    LAUNCH_RE,
    Event,
    load_trace,
    step_spans,
    timed_events,
    union_length,
)
from engine.store.db import Store

TERMS = ("compute", "launch", "guard", "framework", "idle")
TERM_LABELS = {
    "compute": "device busy (compute)",
    "launch": "host launching kernels",
    "guard": "guards / recompiles",
    "framework": "Python / framework overhead",
    "idle": "device idle, nothing traced",
}
# On a CPU the host is the device: the same terms, named for what they are there.
CPU_LABELS = {**TERM_LABELS, "compute": "CPU busy in ops and kernels (compute)",
              "idle": "between steps, nothing traced"}


def term_label(term: str, has_device: bool = True) -> str:
    return (TERM_LABELS if has_device else CPU_LABELS)[term]
# Relative: the terms partition the profiled step by construction, so only rounding may separate their sum from it.
ADD_UP_TOLERANCE = 0.01
# Below this relative difference two steps count as equally fast (run-to-run noise on a shared machine is larger).
SAME_SPEED = 0.05
# A profile found for a bench run explains that run's step only while its own step timed without the profiler
# (step_median_us) is within this factor of the bench median: further apart, the profile ran under other load or on
# other code (a stale or disturbed profile), and its terms would explain a step the page does not show. Wide, because
# a handful of profiled steps on a shared machine is noisy; the disagreements it catches are 10-100x.
PROFILE_AGREES = 3.0

# Dynamo's guard evaluation on every call, and the compile stages a recompile would run inside a step.
GUARD_RE = r"TorchDynamo Cache Lookup|TorchDynamo compile|_compile\.compile_inner|compile_fx|aot_autograd|" \
           r"OutputGraph\.call_user_compiler|fx_codegen_and_compile"
GUARD = re.compile(GUARD_RE)
# CPU operators that move no data and do no arithmetic: their time is framework overhead, not compute.
METADATA_OPS = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::as_strided", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose", "aten::permute", "aten::expand",
    "aten::detach", "detach", "aten::alias", "aten::resolve_conj", "aten::resolve_neg", "aten::slice", "aten::select",
    "aten::unsqueeze", "aten::squeeze", "aten::lift_fresh", "aten::result_type", "aten::broadcast_tensors",
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::set_", "aten::resize_",
}
# CPU operators whose own time is only dispatch to other operators (the arithmetic happens in their children).
DISPATCH_OPS = {
    "aten::linear", "aten::matmul", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
    "aten::zeros_like", "aten::ones_like", "aten::zeros", "aten::ones", "aten::full", "aten::relu", "aten::dropout",
    "aten::flatten", "aten::layer_norm", "aten::softmax", "aten::conv2d", "aten::convolution",
}
# record_function ranges around generated code that runs without the dispatcher: Inductor's compiled graphs, and the
# aoti mode's package call (engine.modes.aoti.PROFILER_LABEL).
COMPILED_CALL_PREFIXES = ("## Call CompiledFxGraph", "## Call AOTInductor")


# Named parts of a term, where the trace says what the time was (µs per step, the part of the term they make up).
# They answer "why is a compiled small step slower than eager": the host waiting in synchronisations, Inductor's
# wrapper around a compiled graph (CUDA-graph tree bookkeeping, input checks), copies of the inputs into a graph's
# static buffers (their dispatch on the host, the copy kernels on the device).
DETAILS = {
    "sync": ("framework", "host waiting in CUDA synchronisations"),
    "graph_wrapper": ("framework", "Inductor's wrapper around the compiled graph (CUDA-graph bookkeeping, checks)"),
    "copy_ops": ("framework", "host dispatching copies (aten::copy_, e.g. inputs into static buffers)"),
    "memcpy": ("compute", "device copies and memsets (e.g. into a CUDA graph's static inputs)"),
}
SYNC_RE = re.compile(r"^cuda(StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy$|StreamWaitEvent)")


class ExplainError(ValueError):
    """Two runs that cannot be compared, or a run that is missing what the explanation needs (one-line message)."""


# -- the partition of one profiled step ------------------------------------------------------------------------------
@dataclass
class Partition:
    step_us: float  # the profiled step: the step window (first step's start → last step's end or its last device work)
    terms: dict[str, float]  # TERMS → µs per step; they add up to step_us
    steps: int
    has_device: bool
    host: dict[str, float] = field(default_factory=dict)  # host totals per step, overlapped or not
    details: dict[str, float] = field(default_factory=dict)  # DETAILS → µs per step, each inside its term

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def device_idle_us(self) -> float:
        return self.step_us - self.terms["compute"]


def _self_intervals(event: Event) -> list[tuple[float, float]]:
    """The parts of an event's span not covered by its direct children (what it did itself)."""
    out, cursor = [], event.ts
    for child in sorted(event.children, key=lambda c: c.ts):
        if child.ts > cursor:
            out.append((cursor, min(child.ts, event.end)))
        cursor = max(cursor, min(child.end, event.end))
    if cursor < event.end:
        out.append((cursor, event.end))
    return out


def is_cpu_compute(kind: str, name: str) -> bool:
    """Whether an event's own time is arithmetic on a CPU: an operator of a library namespace (aten::, modelab::…)
    that is neither metadata-only nor a pure dispatcher, or generated code (COMPILED_CALL_PREFIXES). Autograd nodes,
    dynamo's and AOTAutograd's wrappers, the optimizer's annotations and the Python between ops are framework time.
    A compute op's own dispatch overhead (about a microsecond a call) stays in compute: the trace cannot split it."""
    if kind == "annotation":
        return name.startswith(COMPILED_CALL_PREFIXES)
    return kind == "operator" and "::" in name and not name.startswith(("autograd::", "torch::autograd")) \
        and name not in METADATA_OPS and name not in DISPATCH_OPS


def _category(event: Event, has_device: bool) -> str:
    if event.kind == "runtime" and LAUNCH_RE.match(event.name):
        return "launch"
    if GUARD.search(event.name):
        return "guard"
    if not has_device and is_cpu_compute(event.kind, event.name):
        return "compute"
    return "framework"


def partition(trace: dict[str, Any] | list) -> Partition:
    """Split the profiled steps of one trace into TERMS (µs per step), each instant counted once.

    Priority at each instant: compute > launch > guard > framework > idle. On a GPU, compute is the union of device
    events; on a CPU, the own time of the operators and Inductor kernel calls that `is_cpu_compute` names.
    Host categories come from the innermost host event on every thread (a launch on the autograd thread while the
    main thread waits in backward() counts as launch).
    """
    events = timed_events(trace)
    host = [e for e in events if e.device == "cpu" and not e.merged]
    device = [e for e in events if e.device != "cpu"]
    has_device = bool(device)
    spans = step_spans(events)
    if not spans and host:
        spans = [(min(e.ts for e in host), max(e.end for e in host))]
    if not spans:
        raise ExplainError("the trace has no host events to explain")
    start, host_end = spans[0][0], spans[-1][1]
    end = max([host_end] + [e.end for e in device if e.ts < host_end])
    steps = len(spans)
    by_cat: dict[str, list[tuple[float, float]]] = {t: [] for t in TERMS}
    if has_device:
        by_cat["compute"] = [(e.ts, e.end) for e in device]
    for e in host:
        by_cat[_category(e, has_device)].extend(_self_intervals(e))
    terms: dict[str, float] = {}
    covered_before, acc = 0.0, []
    for term in TERMS[:-1]:
        acc.extend(by_cat[term])
        covered = union_length(acc, start, end)
        terms[term] = (covered - covered_before) / steps
        covered_before = covered
    window = end - start
    terms["idle"] = (window - covered_before) / steps
    details = _details(host, device, has_device, by_cat, start, end, steps)
    launches = [e for e in host if e.kind == "runtime" and LAUNCH_RE.match(e.name)]
    host_totals = {
        "launches_per_step": len(launches) / steps,
        "launch_host_us": sum(e.dur for e in launches) / steps,  # overlapped with device work or not
        "framework_host_us": sum(sum(b - a for a, b in _self_intervals(e)) for e in host
                                 if _category(e, has_device) == "framework") / steps,
        "kernels_per_step": sum(1 for e in device if e.kind == "kernel") / steps,
        "op_calls_per_step": sum(1 for e in host if e.kind == "operator") / steps,
    }
    return Partition(step_us=window / steps, terms=terms, steps=steps, has_device=has_device, host=host_totals,
                     details=details)


def _detail_events(name: str, host: list[Event], device: list[Event], has_device: bool) -> list[Event]:
    if name == "memcpy":
        return [e for e in device if e.kind in ("memcpy", "memset")]
    if not has_device:  # on a CPU these are compute or plain framework: nothing to single out
        return []
    if name == "sync":
        return [e for e in host if e.kind == "runtime" and SYNC_RE.match(e.name)]
    if name == "graph_wrapper":
        return [e for e in host if e.kind == "annotation" and e.name.startswith(COMPILED_CALL_PREFIXES)]
    return [e for e in host if e.kind == "operator" and e.name == "aten::copy_"]


def _details(host: list[Event], device: list[Event], has_device: bool, by_cat: dict[str, list[tuple[float, float]]],
             start: float, end: float, steps: int) -> dict[str, float]:
    """Each DETAILS part as the time its events add to its term: the union of the term's higher-priority terms and
    the part's own intervals (device spans; host self time), less that union without them."""
    out: dict[str, float] = {}
    for name, (term, _) in DETAILS.items():
        events = _detail_events(name, host, device, has_device)
        if not events:
            continue
        mine = [(e.ts, e.end) for e in events] if term == "compute" else \
            [iv for e in events for iv in _self_intervals(e)]
        before = [iv for t in TERMS[:TERMS.index(term)] for iv in by_cat[t]]
        added = union_length(before + mine, start, end) - union_length(before, start, end)
        if added > 0:
            out[name] = added / steps
    return out


def partition_from_stats(op_stats: pd.DataFrame, metrics: dict[str, float]) -> Partition:
    """An approximate partition from stored op_stats and step metrics, for a profile whose trace file is gone.

    GPU: compute = device busy; the idle rest is given to launches (at most the host's launch time), guards, then
    framework. CPU: compute = the own time of the operators `is_cpu_compute` names (one thread, no overlap: the same
    figure `partition` finds). On a GPU it cannot see overlap, so launch and guard are upper bounds there.
    """
    steps = max(1.0, float(metrics.get("steps", 1)))
    has_device = "device_busy_per_step_us" in metrics
    step_us = float(metrics.get("device_window_us", metrics.get("profiled_wall_us", 0.0))) / steps
    host = op_stats[op_stats["device"] == "cpu"] if not op_stats.empty else op_stats
    guard = float(host[host["name"].str.contains(GUARD_RE, regex=True)]["self_us"].sum()) / steps if len(host) else 0.0
    if has_device:
        compute = float(metrics["device_busy_per_step_us"])
        idle = max(0.0, step_us - compute)
        launch = min(idle, float(metrics.get("cpu_launch_per_step_us", 0.0)))
    else:
        mask = [is_cpu_compute(k, n) for k, n in zip(host["kind"], host["name"])] if len(host) else []
        compute = float(host[mask]["self_us"].sum()) / steps if len(host) else 0.0
        idle, launch = max(0.0, step_us - compute), 0.0
    guard = min(guard, idle - launch)
    terms = {"compute": compute, "launch": launch, "guard": guard, "framework": max(0.0, idle - launch - guard),
             "idle": 0.0}
    return Partition(step_us=step_us, terms=terms, steps=int(steps), has_device=has_device,
                     host={"launches_per_step": float(metrics.get("launches_per_step", 0.0)),
                           "launch_host_us": float(metrics.get("cpu_launch_per_step_us", 0.0)),
                           "kernels_per_step": float(metrics.get("kernels_per_step", 0.0))})


# -- finding the runs that describe a mode's step ---------------------------------------------------------------------
@dataclass
class Side:
    """One mode's step: the runs it is read from and everything measured about it."""
    label: str  # "A" or "B"
    mode: str
    device: str
    workload: str
    phase: str
    batch_size: int
    given_run: int
    profile_run: int | None = None
    bench_run: int | None = None
    device_name: str | None = None
    partition: Partition | None = None
    approximate: bool = False  # partition from op_stats (the trace file is gone)
    bench_median_us: float | None = None
    unprofiled_us: float | None = None  # the step timed without the profiler (profile run's own, else bench median)
    first_call_us: float | None = None
    compile_once_us: float | None = None  # paid once: first call − median (+ aoti export/compile)
    recompiles: float | None = None
    graph_breaks: float | None = None
    cache_text: str = ""
    missing_profile: str | None = None  # the command that would profile this step
    profile_problem: str | None = None  # why the newest profile found was not used (stale or disturbed), if so
    depyf_files: list[str] = field(default_factory=list)

    @property
    def step_us(self) -> float | None:
        """The step time this side is judged by: the profiled step where there is one, else the bench median."""
        if self.partition is not None:
            return self.partition.step_us
        return self.bench_median_us

    @property
    def profiler_overhead_us(self) -> float | None:
        if self.partition is None or self.unprofiled_us is None:
            return None
        return self.partition.step_us - self.unprofiled_us


def _metrics_at(store: Store, run_id: int, phase: str, batch_size: int) -> dict[str, float]:
    frame = store.query("SELECT name, value FROM metrics WHERE run_id = ? AND phase = ? AND batch_size = ?",
                        [run_id, phase, batch_size])
    return {str(n): float(v) for n, v in zip(frame.get("name", []), frame.get("value", []))}


def _points(store: Store, run_id: int, name: str) -> list[tuple[str, int]]:
    frame = store.query("SELECT DISTINCT phase, batch_size FROM metrics WHERE run_id = ? AND name = ? "
                        "AND phase IS NOT NULL AND batch_size IS NOT NULL ORDER BY phase, batch_size", [run_id, name])
    return [(str(p), int(b)) for p, b in zip(frame.get("phase", []), frame.get("batch_size", []))]


def _newest(store: Store, kind: str, workload: str, mode: str, device: str, phase: str, batch_size: int,
            metric: str) -> int | None:
    frame = store.query("""
        SELECT max(r.id) AS id FROM runs r JOIN metrics m ON m.run_id = r.id
        WHERE r.kind = ? AND r.status = 'ok' AND r.workload = ? AND r.mode = ? AND r.device = ?
              AND m.phase = ? AND m.batch_size = ? AND m.name = ?""",
                        [kind, workload, mode, device, phase, batch_size, metric])
    value = frame["id"].iloc[0] if not frame.empty else None
    return None if value is None or pd.isna(value) else int(value)


POINT_METRIC = {"bench": "median", "profile": "step_wall_us"}


def _run_or_fail(store: Store, run_id: int) -> dict[str, Any]:
    run = store.run(run_id)
    if run is None:
        raise ExplainError(f"no run {run_id} in {store.path}")
    if run["kind"] not in POINT_METRIC:
        raise ExplainError(f"run {run_id} is a {run['kind']} run; explain compares bench or profile runs")
    if run["status"] != "ok":
        raise ExplainError(f"run {run_id} ({run['mode']}) did not finish ok (status {run['status']})")
    return run


def choose_point(store: Store, run_a: int, run_b: int, phase: str | None = None, batch_size: int | None = None
                 ) -> tuple[str, int]:
    """The (phase, batch size) both runs measured: the one asked for, else train before infer, the batch nearest 64."""
    points = []
    for run_id in (run_a, run_b):
        run = _run_or_fail(store, run_id)
        points.append(set(_points(store, run_id, POINT_METRIC[run["kind"]])))
    common = points[0] & points[1]
    if phase is not None:
        common = {p for p in common if p[0] == phase}
    if batch_size is not None:
        common = {p for p in common if p[1] == batch_size}
    if not common:
        want = f" at {phase or 'any phase'}" + (f", batch {batch_size}" if batch_size else "")
        raise ExplainError(f"runs {run_a} and {run_b} measured no common phase and batch size{want} "
                           f"(A: {sorted(points[0]) or 'none'}; B: {sorted(points[1]) or 'none'})")
    return min(common, key=lambda p: (p[0] != "train", abs(p[1] - 64), p[1]))


def profile_command(side: Side) -> str:
    return (f"python -m engine profile --workload {side.workload} --mode {side.mode} --device {side.device} "
            f"--phases {side.phase} --batch-size {side.batch_size}")


def profile_specs(sides: Sequence[Side]) -> list:
    """The profile runs (engine.runner.jobs.JobSpec) that would give these sides their missing profiles: what the CLI's
    `explain --profile` and the page's *Profile both and explain* queue."""
    from engine.profiling.kind import KIND as PROFILE
    from engine.runner.jobs import JobSpec

    return [JobSpec(PROFILE.name, s.workload, s.mode, s.device,
                    {"workload": s.workload, "mode": s.mode, "device": s.device, "phases": [s.phase],
                     "batch_size": s.batch_size}) for s in sides]


def _trace_path(store: Store, run_id: int, phase: str) -> Path | None:
    artifacts = store.artifacts(run_id)
    if artifacts.empty:
        return None
    rows = artifacts[(artifacts["kind"] == "chrome_trace") & (artifacts["name"] == f"trace-{phase}.json.gz")]
    return Path(rows["path"].iloc[0]) if not rows.empty else None


def load_side(store: Store, run_id: int, phase: str, batch_size: int, label: str = "A") -> Side:
    """Everything stored about one mode's step at (phase, batch size), starting from a bench or profile run."""
    from engine.measure import caches

    run = _run_or_fail(store, run_id)
    side = Side(label=label, mode=str(run["mode"]), device=str(run["device"]), workload=str(run["workload"]),
                phase=phase, batch_size=batch_size, given_run=run_id)
    env = store.environment(run_id) or {}
    side.device_name = env.get("device_name")
    args = (side.workload, side.mode, side.device, phase, batch_size)
    side.profile_run = run_id if run["kind"] == "profile" else _newest(store, "profile", *args, "step_wall_us")
    side.bench_run = run_id if run["kind"] == "bench" else _newest(store, "bench", *args, "median")
    if side.bench_run is not None:
        m = _metrics_at(store, side.bench_run, phase, batch_size)
        side.bench_median_us = m.get("median")
        side.first_call_us = m.get("first_call")
        if side.first_call_us is not None and side.bench_median_us is not None:
            side.compile_once_us = max(0.0, side.first_call_us - side.bench_median_us)
            side.compile_once_us += 1e6 * (m.get("export_time", 0.0) + m.get("aoti_compile_time", 0.0))
        side.recompiles, side.graph_breaks = m.get("recompiles"), m.get("graph_breaks")
        side.cache_text = caches.describe(m)
    if side.profile_run is None:
        side.missing_profile = profile_command(side)
        side.unprofiled_us = side.bench_median_us
        return side
    pm = _metrics_at(store, side.profile_run, phase, batch_size)
    problem = _disagreement(side, pm.get("step_median_us"))
    if problem and run["kind"] == "bench":  # a profile found for the bench run, not one asked for: leave it out
        side.profile_problem = problem
        side.missing_profile = profile_command(side)
        side.unprofiled_us = side.bench_median_us
        return side
    side.profile_problem = problem  # a profile run asked for by id is used; the disagreement becomes a note
    trace = _trace_path(store, side.profile_run, phase)
    if trace is not None and trace.is_file():
        side.partition = partition(load_trace(trace))
    else:
        side.partition = partition_from_stats(store.op_stats([side.profile_run], phase=phase), pm)
        side.approximate = True
    side.unprofiled_us = pm.get("step_median_us", side.bench_median_us)
    arts = store.artifacts(side.profile_run)
    if not arts.empty:
        side.depyf_files = [str(p) for p in arts[(arts["kind"] == "depyf")
                                                  & arts["name"].str.startswith(f"depyf-{phase}/")]["path"]]
    return side


def _disagreement(side: Side, profile_step_us: float | None) -> str | None:
    """Why the side's profile does not describe its bench run's step, or None: the profile's step timed without the
    profiler is more than PROFILE_AGREES times off the bench median."""
    bench = side.bench_median_us
    if profile_step_us is None or bench is None or profile_step_us <= 0 or bench <= 0:
        return None
    ratio = max(profile_step_us, bench) / min(profile_step_us, bench)
    if ratio <= PROFILE_AGREES:
        return None
    return (f"profile run {side.profile_run} timed {fmt(profile_step_us)} per step without the profiler, "
            f"{times_text(ratio)} {'above' if profile_step_us > bench else 'below'} bench run {side.bench_run}'s "
            f"median {fmt(bench)}: one of them ran under other load or on other code, so the profile's terms would "
            "explain another step than the benchmark's")


# -- the floor --------------------------------------------------------------------------------------------------------
@dataclass
class FloorTerm:
    name: str  # compute | memory | launch
    us: float
    ceiling: str  # engine.measure.ceilings name
    ceiling_value: float
    label: str  # the ceiling's plain label, e.g. "measured fp32 matmul rate (no tf32) on NVIDIA H100"
    what: str  # e.g. "25.6 MFLOP / 51.2 TFLOP/s"


@dataclass
class Floor:
    flops: float
    bytes: float
    terms: list[FloorTerm]
    ceilings_run: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def us(self) -> float:
        return max(t.us for t in self.terms) if self.terms else float("nan")

    @property
    def bound(self) -> FloorTerm | None:
        return max(self.terms, key=lambda t: t.us) if self.terms else None


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def floor_for(store: Store, side: Side) -> Floor | None:
    """The least time this device allows for the step (None when the workload has no cost model).

    Ceilings are the newest measured for the run's device name; without them the floor has no terms and a note says
    which command measures them.
    """
    from engine.measure.ceilings import latest_ceilings
    from engine.workloads import house_price

    costs = {"house_price": house_price.step_cost}
    if side.workload not in costs:
        return None
    cost = costs[side.workload](side.batch_size, side.phase)
    ceilings = latest_ceilings(store, device_name=side.device_name, device=side.device)
    floor = Floor(flops=cost.flops, bytes=cost.bytes, terms=[], ceilings_run=None, notes=list(cost.notes))
    if ceilings is None:
        floor.notes.append(f"no ceilings measured for {side.device_name or side.device}: run `python -m engine "
                           f"ceilings --device {side.device}` first")
        return floor
    floor.ceilings_run = ceilings.run_id
    cuda = side.device.startswith("cuda")
    matmul = "matmul_fp32"  # the model is fp32 and torch leaves tf32 off for matmuls by default
    if ceilings.get(matmul):
        rate = ceilings.values[matmul]
        floor.terms.append(FloorTerm("compute", cost.flops / rate * 1e6, matmul, rate, ceilings.label(matmul),
                                     f"{_si(cost.flops, 'FLOP')} / {_si(rate, 'FLOP/s')}"))
    if ceilings.get("copy_bw"):
        bw = ceilings.values["copy_bw"]
        floor.terms.append(FloorTerm("memory", cost.bytes / bw * 1e6, "copy_bw", bw, ceilings.label("copy_bw"),
                                     f"{_si(cost.bytes, 'B')} / {_si(bw, 'B/s')}"))
    per_kernel = "graph_kernel_us" if cuda else "launch_us"
    if ceilings.get(per_kernel):
        value = ceilings.values[per_kernel]
        what = "1 kernel (the whole step fused) × " if cuda else "1 op call from Python × "
        floor.terms.append(FloorTerm("launch", value, per_kernel, value, ceilings.label(per_kernel),
                                     f"{what}{value:.2f} µs"))
    return floor


# -- the comparison ---------------------------------------------------------------------------------------------------
@dataclass
class Explanation:
    a: Side
    b: Side
    floor: Floor | None
    sentence: str
    notes: list[str] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        """Long frame for a stacked bar: one row per (mode, term) with µs per step."""
        rows = []
        for side in (self.a, self.b):
            if side.partition is None:
                continue
            for term in TERMS:
                rows.append({"run": f"{side.label}: {side.mode}", "mode": side.mode, "term": term,
                             "label": term_label(term, side.partition.has_device), "us": side.partition.terms[term]})
        return pd.DataFrame(rows)

    def distance(self, side: Side) -> tuple[float, float] | None:
        """(× the floor, µs above it) of a side's unprofiled step (else its profiled one)."""
        if self.floor is None or not self.floor.terms:
            return None
        step = side.unprofiled_us if side.unprofiled_us is not None else side.step_us
        if step is None:
            return None
        return step / self.floor.us, step - self.floor.us

    def to_dict(self) -> dict[str, Any]:
        def side_dict(s: Side) -> dict[str, Any]:
            return {"mode": s.mode, "profile_run": s.profile_run, "bench_run": s.bench_run, "step_us": s.step_us,
                    "unprofiled_us": s.unprofiled_us, "terms": s.partition.terms if s.partition else None,
                    "details": s.partition.details if s.partition else None,
                    "compile_once_us": s.compile_once_us, "cache": s.cache_text, "missing_profile": s.missing_profile}
        return {"sentence": self.sentence, "a": side_dict(self.a), "b": side_dict(self.b),
                "floor_us": self.floor.us if self.floor and self.floor.terms else None, "notes": self.notes}


def fmt(us: float | None) -> str:
    if us is None or us != us:
        return "—"
    if abs(us) >= 1e6:
        return f"{us / 1e6:.2f} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs" if abs(us) < 100 else f"{us:.0f} µs"


def times_text(times: float) -> str:
    """'1.4×', '21×': a ratio to the floor, with a decimal only where it carries information."""
    return f"{times:,.1f}×" if times < 10 else f"{times:,.0f}×"


# Modes whose step is already compiled, or already replayed from CUDA graphs: advice never recommends a mode what it
# already does.
COMPILED_MODES = ("compile", "compile-reduce-overhead", "compile-max-autotune", "aoti")
GRAPHED_MODES = ("compile-reduce-overhead", "cuda-graph")


def _remedy(term: str, slow: Side, fast: Side | None = None) -> str:
    """What removes the term's excess in the slow mode, never a remedy the slow mode already is (compiling a compiled
    step, capturing a graphed one); then the faster mode is named as what pays less of it."""
    cuda = slow.device.startswith("cuda")
    compiled, graphed = slow.mode in COMPILED_MODES, slow.mode in GRAPHED_MODES
    other = f"; {fast.mode} pays less of it" if fast is not None else ""
    if term == "launch":
        if cuda and not graphed:
            return "CUDA graphs (or fewer, fused kernels) remove that"
        return "fewer, fused kernels remove that" + other
    if term == "framework":
        if cuda and not graphed:
            return ("capturing the whole step (CUDA graphs) removes that" if compiled
                    else "capturing the whole step (CUDA graphs) or compiling it removes that")
        if compiled or graphed:
            return (f"{slow.mode} is {'compiled' if compiled else 'captured'} already, so this is the call path "
                    f"around its generated code (guards, wrappers, input checks and copies){other}")
        return "compiling the step into fewer calls removes that"
    if term == "guard":
        return "stable shapes and dtypes (fewer recompiles) or a whole-step capture remove that"
    if term == "compute":
        return "faster or fused kernels are the only way down"
    return "look for synchronisation or host gaps in the trace"


def _what(term: str, side: Side) -> str:
    p = side.partition
    assert p is not None
    if term == "launch":
        n = p.host.get("launches_per_step", 0.0)
        return f"the host takes {fmt(p.host.get('launch_host_us'))} launching {n:.0f} kernel{'s' if n != 1 else ''}"
    if term == "framework":
        return f"the host spends {fmt(p.terms['framework'])} in Python and framework code while the device waits"
    if term == "guard":
        return f"guard checks and recompiles cost {fmt(p.terms['guard'])}"
    if term == "compute":
        what = "kernels" if p.has_device else "CPU compute"
        return f"its {what} take {fmt(p.terms['compute'])}"
    return f"the device sits idle {fmt(p.terms['idle'])} with no host work traced"


def _named_parts(term: str, slow: Side, fast: Side, gap: float) -> str:
    """' — of it: host waiting in CUDA synchronisations 41 µs (eager 3 µs), …' for the DETAILS parts of `term` that
    make up at least a tenth of the gap, largest first; '' when the trace names none."""
    assert slow.partition is not None and fast.partition is not None
    parts = []
    for name, (of_term, label) in DETAILS.items():
        mine, theirs = slow.partition.details.get(name, 0.0), fast.partition.details.get(name, 0.0)
        if of_term == term and mine - theirs >= 0.1 * gap:
            parts.append((mine - theirs, f"{label} {fmt(mine)} ({fast.mode}: {fmt(theirs)})"))
    return " — of it: " + ", ".join(text for _, text in sorted(parts, reverse=True)) if parts else ""


def compared_steps(a: Side, b: Side) -> tuple[float | None, float | None]:
    """The two step times the sentence compares, measured the same way: the bench runs' medians (what a page's cards
    show) when both sides have one; else the profiled steps (which the terms add up to) when both have a profile;
    else both steps timed without the profiler."""
    if a.bench_median_us is not None and b.bench_median_us is not None:
        return a.bench_median_us, b.bench_median_us
    if a.partition is not None and b.partition is not None:
        return a.partition.step_us, b.partition.step_us
    return a.unprofiled_us, b.unprofiled_us


def _from_bench(a: Side, b: Side) -> bool:
    return a.bench_median_us is not None and b.bench_median_us is not None


def dominant_sentence(a: Side, b: Side) -> str:
    """One sentence naming the term that explains most of the gap between the two steps.

    The gap is the one between the bench medians where both sides have them (naming the runs), so the sentence
    agrees with the figures a page shows beside it; the terms come from the profiles, named with their own steps,
    and only explain when the profiles order the two steps the same way."""
    step_a, step_b = compared_steps(a, b)
    if step_a is None or step_b is None:
        return "Nothing to compare: a run has no step time at this phase and batch size."
    slow, fast = (a, b) if step_a >= step_b else (b, a)
    ta, tb = max(step_a, step_b), min(step_a, step_b)
    point = f"({slow.phase}, B={slow.batch_size}, {slow.device})"
    bench = _from_bench(a, b)
    runs = f" (bench runs #{slow.bench_run} and #{fast.bench_run})" if bench else ""
    if tb > 0 and (ta - tb) / tb < SAME_SPEED:
        return (f"{a.mode} and {b.mode} take about the same time {point}: {fmt(step_a)} vs {fmt(step_b)} per "
                f"step (within {SAME_SPEED:.0%}){'; ' + runs.strip(' ()') if bench else ''}.")
    head = f"{slow.mode} is slower than {fast.mode} {point}: {fmt(ta)} vs {fmt(tb)} per step{runs}"
    if slow.partition is None or fast.partition is None:
        missing = [s for s in (slow, fast) if s.partition is None]
        again = " again" if all(s.profile_problem for s in missing) else ""
        return (f"{head}; to see why, profile {' and '.join(s.mode for s in missing)}{again}: "
                + "; ".join(f"`{s.missing_profile}`" for s in missing) + ".")
    ps, pf = slow.partition.step_us, fast.partition.step_us
    if bench and ps <= pf:
        return (f"{head}; their profiles (runs #{slow.profile_run} and #{fast.profile_run}) time it the other way "
                f"round, {fmt(ps)} vs {fmt(pf)} per profiled step, so they cannot say why: profile both again.")
    profiled = (f"; in their profiles (runs #{slow.profile_run} and #{fast.profile_run}, {fmt(ps)} vs {fmt(pf)} per "
                "profiled step)" if bench else "")
    deltas = {t: slow.partition.terms[t] - fast.partition.terms[t] for t in TERMS}
    term = max(deltas, key=deltas.get)
    busy = "device busy" if slow.partition.has_device else "CPU compute"
    busy_text = f"{busy} {fmt(slow.partition.terms['compute'])} vs {fmt(fast.partition.terms['compute'])}"
    if term == "compute":
        kernels = ""
        if slow.partition.has_device:
            kernels = (f" ({slow.partition.host.get('kernels_per_step', 0):.0f} vs "
                       f"{fast.partition.host.get('kernels_per_step', 0):.0f} kernels)")
        return (f"{head}{profiled}: most of the gap is compute, {busy_text}{kernels}"
                f"{_named_parts(term, slow, fast, ps - pf)}; {_remedy(term, slow, fast)}.")
    share = deltas[term] / (ps - pf) if ps > pf else 1.0
    return (f"{head}{profiled}: {busy_text}, but {_what(term, slow)} per step ({fast.mode}: "
            f"{fmt(fast.partition.terms[term])}), {min(share, 9.99):.0%} of the gap"
            f"{_named_parts(term, slow, fast, ps - pf)}; {_remedy(term, slow, fast)}.")


def explain(store: Store, run_a: int, run_b: int, phase: str | None = None, batch_size: int | None = None
            ) -> Explanation:
    """Compare two runs' steps at a common (phase, batch size); raises ExplainError with a one-line reason."""
    phase, batch_size = choose_point(store, run_a, run_b, phase, batch_size)
    a = load_side(store, run_a, phase, batch_size, "A")
    b = load_side(store, run_b, phase, batch_size, "B")
    if a.workload != b.workload:
        raise ExplainError(f"run {run_a} is {a.workload} and run {run_b} is {b.workload}: compare one workload")
    notes = []
    if a.device != b.device:
        notes.append(f"the runs are on different devices ({a.device} vs {b.device}): the gap includes the hardware")
    for side in (a, b):
        if side.approximate:
            notes.append(f"{side.mode}: the trace of profile run {side.profile_run} is gone; its terms come from "
                         "op_stats and cannot see overlap (launch and guard are upper bounds)")
        if side.partition is not None:
            gap = abs(side.partition.total - side.partition.step_us)
            if gap > ADD_UP_TOLERANCE * side.partition.step_us + 1e-6:
                notes.append(f"{side.mode}: the terms add up to {fmt(side.partition.total)}, not "
                             f"{fmt(side.partition.step_us)} (more than {ADD_UP_TOLERANCE:.0%} apart)")
            overhead = side.profiler_overhead_us
            if overhead is not None and side.unprofiled_us:
                notes.append(f"{side.mode}: profiled step {fmt(side.partition.step_us)}, without the profiler "
                             f"{fmt(side.unprofiled_us)} ({overhead / side.unprofiled_us:+.0%}: the profiler's own "
                             "host cost, plus run-to-run noise); the terms split the profiled step")
            if side.profile_problem:  # a profile run asked for by id: used, but it is not the bench run's step
                notes.append(f"{side.mode}: {side.profile_problem}")
        elif side.profile_problem:
            notes.append(f"{side.mode}: {side.profile_problem}; profile again: `{side.missing_profile}`")
        elif side.missing_profile:
            notes.append(f"{side.mode}: no profile at {phase} B={batch_size}; run `{side.missing_profile}`")
    floor = floor_for(store, a)
    if floor is not None:
        notes.extend(floor.notes)
        for side in (a, b):
            step = side.unprofiled_us if side.unprofiled_us is not None else side.step_us
            if floor.terms and step is not None and step < floor.us:
                notes.append(f"{side.mode} measured {fmt(step)}, below the {fmt(floor.us)} floor: the ceilings "
                             f"(run {floor.ceilings_run}) were measured under heavier load or too briefly; "
                             f"re-measure with `python -m engine ceilings --device {side.device}`")
    return Explanation(a=a, b=b, floor=floor, sentence=dominant_sentence(a, b), notes=notes)


def render(e: Explanation) -> str:
    """Plain text for the CLI: the sentence, the terms table, one-off costs and the floor."""
    lines = [e.sentence, ""]
    head = f"{'per step':<38}{'A: ' + e.a.mode:>20}{'B: ' + e.b.mode:>20}"
    lines.append(head)
    has_device = any(s.partition.has_device for s in (e.a, e.b) if s.partition)
    for term in TERMS:
        va = e.a.partition.terms[term] if e.a.partition else None
        vb = e.b.partition.terms[term] if e.b.partition else None
        lines.append(f"{term_label(term, has_device):<38}{fmt(va):>20}{fmt(vb):>20}")
    for name, (term, label) in DETAILS.items():
        va = e.a.partition.details.get(name) if e.a.partition else None
        vb = e.b.partition.details.get(name) if e.b.partition else None
        if va or vb:
            lines.append(f"{'  of ' + term + ': ' + label[:28]:<38}{fmt(va):>20}{fmt(vb):>20}")
    lines.append(f"{'= profiled step':<38}{fmt(e.a.partition.total if e.a.partition else None):>20}"
                 f"{fmt(e.b.partition.total if e.b.partition else None):>20}")
    lines.append(f"{'step without the profiler':<38}{fmt(e.a.unprofiled_us):>20}{fmt(e.b.unprofiled_us):>20}")
    for key, label in (("launches_per_step", "kernel launches per step"), ("launch_host_us", "host time in launches"),
                       ("op_calls_per_step", "operator calls per step")):
        va = e.a.partition.host.get(key) if e.a.partition else None
        vb = e.b.partition.host.get(key) if e.b.partition else None
        if va or vb:
            show = (lambda v: f"{v:.0f}" if v is not None else "—") if "us" not in key else fmt
            lines.append(f"{label:<38}{show(va):>20}{show(vb):>20}")
    lines.append(f"{'first call beyond a step (once)':<38}{fmt(e.a.compile_once_us):>20}{fmt(e.b.compile_once_us):>20}")
    for side in (e.a, e.b):
        if side.cache_text:
            lines.append(f"  {side.label} {side.mode} first call: {side.cache_text}")
        if side.recompiles:
            lines.append(f"  {side.label} {side.mode}: {side.recompiles:.0f} recompile(s)")
    lines.append(f"runs: A profile {e.a.profile_run or '—'} / bench {e.a.bench_run or '—'}; "
                 f"B profile {e.b.profile_run or '—'} / bench {e.b.bench_run or '—'}")
    if e.floor is not None:
        lines.append("")
        lines.append(f"floor for {e.a.phase} B={e.a.batch_size}: {_si(e.floor.flops, 'FLOP')}, "
                     f"{_si(e.floor.bytes, 'B')} that must move")
        for t in e.floor.terms:
            lines.append(f"  {t.name:<8} {fmt(t.us):>10}  = {t.what}  ({t.label})")
        if e.floor.terms:
            lines.append(f"  floor = {fmt(e.floor.us)} ({e.floor.bound.name}-bound; ceilings run "
                         f"{e.floor.ceilings_run})")
            for side in (e.a, e.b):
                d = e.distance(side)
                if d:
                    lines.append(f"  {side.label} {side.mode}: {times_text(d[0])} the floor ({fmt(d[1])} above it)")
    if e.notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in e.notes)
    return "\n".join(lines)


def bench_run_ids(store: Store, workload: str, device: str, phase: str, batch_size: int) -> dict[str, int]:
    """mode → its newest ok bench run at this point (what the Benchmark page compares)."""
    frame = store.query("""
        SELECT r.mode, max(r.id) AS id FROM runs r JOIN metrics m ON m.run_id = r.id
        WHERE r.kind = 'bench' AND r.status = 'ok' AND r.workload = ? AND r.device = ? AND m.phase = ?
              AND m.batch_size = ? AND m.name = 'median'
        GROUP BY r.mode""", [workload, device, phase, batch_size])
    return {str(m): int(i) for m, i in zip(frame.get("mode", []), frame.get("id", []))}


def first_use(store: Store, run_ids: Iterable[int], phase: str, batch_size: int) -> dict[int, str]:
    """run id → what its first call found in the caches at this point ('' when nothing was looked up)."""
    from engine.measure import caches

    ids = [int(r) for r in run_ids]
    if not ids:
        return {}
    frame = store.query(f"SELECT run_id, name, value FROM metrics WHERE run_id IN ({','.join('?' * len(ids))}) "
                        "AND phase = ? AND batch_size = ? AND name LIKE 'cache_%'", [*ids, phase, batch_size])
    out: dict[int, dict[str, float]] = {i: {} for i in ids}
    for run_id, name, value in zip(frame.get("run_id", []), frame.get("name", []), frame.get("value", [])):
        out[int(run_id)][str(name)] = float(value)
    return {i: caches.describe(m) for i, m in out.items()}


def read_depyf(paths: Sequence[str], limit: int = 200_000) -> dict[str, str]:
    """name → text of the depyf dump files (decompiled bytecode, guards, graphs, kernels), largest files cut."""
    out = {}
    for path in paths:
        p = Path(path)
        if p.is_file():
            text = p.read_text(errors="replace")
            out[p.name] = text if len(text) <= limit else text[:limit] + "\n# … cut"
    return out


def to_json(e: Explanation) -> str:
    return json.dumps(e.to_dict(), indent=2, default=str)


__all__ = ["ADD_UP_TOLERANCE", "PROFILE_AGREES", "TERMS", "TERM_LABELS", "ExplainError", "Explanation", "Floor",
           "Partition", "Side",
           "bench_run_ids", "choose_point", "explain", "first_use", "floor_for", "load_side", "partition",
           "partition_from_stats", "render", "term_label", "times_text"]
