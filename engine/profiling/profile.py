"""Profile one mode of one workload with torch.profiler: a Chrome trace, op_stats rows and step-level figures.

For each phase (`train`: zero_grad → forward → loss → backward → Adam step, the very step engine.bench.run times;
`infer`: forward under no_grad): a fresh copy of the seeded model is prepared by the mode, called once (tracing and
compilation happen here, outside the profile), called `settle` more times, then run under torch.profiler with a
wait/warm-up/active schedule (CPU activity, plus CUDA on a GPU; input shapes recorded). Without a fixed `active`, the
schedule keeps as many steps as fit in `budget_s` (the fastest settle call, doubled for the profiler's cost), between
MIN_ACTIVE and `max_active`: enough steps at small shapes for a p10–p90 per step and per operator to mean something,
few when the step is slow. The trace of the active steps is written gzipped under the run's artifacts folder and
analysed by engine.measure.op_stats; each profiled step's wall time (and device busy time on a GPU) is kept as a
series of its own (samples `<phase>_profiled`, `<phase>_profiled_device_busy`) with its p10, median and p90 as
metrics (`step_wall_p10_us` …, `device_busy_p10_us` …). With `deep`, the top-k
kernels by device time are measured again by Nsight Compute (engine.profiling.ncu) in a subprocess. After the
profile, the same step is timed `unprofiled_iters` times without the profiler (metrics `step_median_us`, `step_p10_us`,
`step_p90_us`; its samples kept), so the explainer (engine.explain.why) can state what the profiler itself added. The
machine's conditions are recorded around the profiled and timed steps (engine.measure.conditions), and both series,
the profiled steps' wall times and the unprofiled timing, are judged with them (engine.measure.noise.judge; the
profiled steps also by how far a few slow steps pull their mean, which every per-step total in the profile is): a
disturbed profile says so in a note, and the record is stored with the run. For a compiled mode, a child process then
compiles the step once more under depyf (engine.profiling.compiled_code): the decompiled code, guards and kernels
become artifacts of kind `depyf`.

Every phase of the run sits in an NVTX range (first call, settle, each profiler step with its schedule state, and the
step's forward / backward / optimizer_step from engine.bench.run), so an Nsight Systems timeline reads the same way.
The worker never touches DuckDB: everything comes back in the RunResult (op_stats and kernel_metrics included).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.bench.run import _sync, build_step, user_model_job
from engine.measure import conditions, noise, nvtx_ranges
from engine.measure.conditions import Conditions
from engine.measure.op_stats import analyze, load_trace
from engine.measure.timing import time_fn
from engine.modes import Mode, get_mode
from engine.profiling import compiled_code, ncu
from engine.store.db import Artifact, Metric, RunResult, Samples
from engine.store.envinfo import capture_env
from engine.store.report import parse_conditions
from engine.workloads import Workload, get_workload

Progress = Callable[[float, str], None]
PHASES = ("train", "infer")
UNITS = {"steps": "", "op_calls": "", "kernel_launches": "", "launches_per_step": "", "kernels": "",
         "kernels_per_step": "", "idle_fraction": ""}
BUDGET_S = 2.0  # profiled time the adaptive schedule aims at
MIN_ACTIVE = 3  # fewest profiled steps, when the step is slow
MAX_ACTIVE = 30  # most: p10 and p90 are the 3rd and 27th of them; more only lengthens the trace
PROFILER_COST = 2.0  # a profiled step takes about this many plain ones at small shapes (record_shapes, Python events)
PROFILED = "_profiled"  # samples phase suffix of the profiled steps' wall times
DEVICE_BUSY = "_profiled_device_busy"  # ... and of their device busy times (GPU)
# The profile's per-step figures and op totals are means over the steps: a mean this far above the median means a
# few slow steps carry them (one preempted step made an eager train step read 91.5 ms).
MAX_MEAN_OVER_MEDIAN = 1.10


@dataclass
class ProfileConfig:
    workload: str = "house_price"
    mode: str = "eager"
    device: str = "cpu"
    phases: tuple[str, ...] = ("train",)
    batch_size: int | None = None  # None: the workload's training batch (64 for house_price), for every phase
    wait: int = 1  # profiler schedule: steps skipped, steps traced but discarded (warm-up), steps kept (active)
    warmup: int = 2
    active: int | None = None  # None: as many as fit in budget_s, MIN_ACTIVE to max_active
    budget_s: float = BUDGET_S
    max_active: int = MAX_ACTIVE
    settle: int = 2  # plain calls after the first call and before the profiler (CUDA graph trees record here)
    unprofiled_iters: int = 30  # then the step timed without the profiler (step_median_us, its p10 and p90)
    depyf: bool = True  # compiled modes: dump what torch.compile produced, in a child (engine.profiling.compiled_code)
    record_shapes: bool = True
    deep: bool = False  # Nsight Compute on the top-k kernels (CUDA, with ncu on PATH)
    top_k: int = 5
    ncu_steps: int = 1
    ncu_timeout_s: float = 900.0
    artifacts_dir: str | None = None
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        if not self.phases or any(p not in PHASES for p in self.phases):
            raise ValueError(f"phases must be a non-empty subset of {PHASES}, not {self.phases!r}")
        if self.wait < 0 or self.warmup < 0 or self.settle < 0 or self.unprofiled_iters < 1 or \
                (self.active is not None and self.active < 1):
            raise ValueError("the schedule needs wait ≥ 0, warmup ≥ 0, active ≥ 1 (or None) and settle ≥ 0")
        if not self.budget_s > 0 or self.max_active < MIN_ACTIVE:
            raise ValueError(f"budget_s must be above 0 and max_active at least {MIN_ACTIVE}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.top_k < 1 or self.ncu_steps < 1:
            raise ValueError("top_k and ncu_steps must be at least 1")


def supported_phases(mode: Mode, wanted: tuple[str, ...] | list[str]) -> list[str]:
    return [p for p in wanted if p in mode.phases]


def default_phases(mode: Mode) -> tuple[str, ...]:
    """The training step where the mode has one (the headline profile), else what it runs (aoti: inference)."""
    return ("train",) if "train" in mode.phases else mode.phases


def default_batch_size(workload: Workload, batch_size: int | None) -> int:
    return int(batch_size or workload.default_train_batch_sizes[0])


def adaptive_active(step_s: float, cfg: ProfileConfig) -> int:
    """Profiled steps for a step that takes `step_s` unprofiled: cfg.active when set, else as many as fit in
    cfg.budget_s at PROFILER_COST times the step, between MIN_ACTIVE and cfg.max_active."""
    if cfg.active is not None:
        return cfg.active
    fit = cfg.budget_s / (PROFILER_COST * step_s) if step_s > 0 else float(cfg.max_active)
    return int(min(cfg.max_active, max(MIN_ACTIVE, fit)))


def activities(device: str) -> list[torch.profiler.ProfilerActivity]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def profile_step(step: Callable[[], object], device: str, trace_path: Path, cfg: ProfileConfig,
                 on_step: Callable[[int, int], None] = lambda i, n: None) -> Path:
    """Run `step` wait + warmup + active times under torch.profiler; the active steps' trace lands at trace_path.
    cfg.active must be set (profile_phase sets it from adaptive_active)."""
    if cfg.active is None:
        raise ValueError("profile_step needs a fixed number of active steps (cfg.active)")
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    exported: list[Path] = []

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace_path))  # gzipped by torch when the name ends in .gz
        exported.append(trace_path)

    total = cfg.wait + cfg.warmup + cfg.active
    schedule = torch.profiler.schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1)
    with torch.profiler.profile(activities=activities(device), schedule=schedule, record_shapes=cfg.record_shapes,
                                on_trace_ready=ready) as prof:
        for i in range(total):
            state = "wait" if i < cfg.wait else ("warmup" if i < cfg.wait + cfg.warmup else "active")
            with nvtx_ranges.range(f"profiler step {i} ({state})"):
                step()
                if i == total - 1:
                    _sync(device)  # the last active step ends when its device work does, so the trace holds all of it
            prof.step()
            on_step(i, total)
    if not exported:
        raise RuntimeError("torch.profiler finished without producing a trace (schedule never reached 'active')")
    return trace_path


def profile_phase(workload: Workload, mode: Mode, base_model: torch.nn.Module, phase: str, cfg: ProfileConfig,
                  out_dir: Path, result: RunResult, progress: Progress, frac: tuple[float, float]) -> list[dict]:
    """Profile one phase into `result`; returns its op_stats rows (also appended to result.op_stats)."""
    device = cfg.device
    lo, hi = frac
    batch_size = default_batch_size(workload, cfg.batch_size)
    tag = dict(phase=phase, batch_size=batch_size)
    progress(lo, f"{mode.name} {phase} B={batch_size}: preparing")
    with torch.set_grad_enabled(phase == "train"), nvtx_ranges.range(f"profile {mode.name} {phase} B={batch_size}"):
        step, prepared = build_step(workload, mode, base_model, phase, batch_size, device)
        progress(lo + 0.05 * (hi - lo), f"{mode.name} {phase} B={batch_size}: first call"
                 + (": compiling (or loading from the cache)" if mode.compiles else ""))
        with nvtx_ranges.range("first_call"):
            t0 = time.perf_counter()
            step()
            _sync(device)
            first_s = time.perf_counter() - t0
        with nvtx_ranges.range("settle"):
            times = []
            for _ in range(cfg.settle):
                t0 = time.perf_counter()
                step()
                _sync(device)
                times.append(time.perf_counter() - t0)
            # The fastest settle call: one that another process slowed would shrink the schedule. No settle calls:
            # the first call (with any compilation), an overestimate.
            step_s = min(times, default=first_s)
        active = adaptive_active(step_s, cfg)
        if cfg.active is None and active < 10:
            result.notes.append(f"{phase}: {active} profiled steps (a step takes {step_s * 1e3:,.0f} ms, the budget "
                                f"is {cfg.budget_s:g} s): its p10–p90 rest on few steps; --active sets more")
        progress(lo + 0.3 * (hi - lo), f"{phase} B={batch_size}: profiling")
        with conditions.window(device, phase, batch_size):  # what else ran while it was profiled and timed
            trace_path = profile_step(
                step, device, out_dir / f"trace-{phase}.json.gz", dataclasses.replace(cfg, active=active),
                on_step=lambda i, n: progress(lo + (0.3 + 0.5 * (i + 1) / n) * (hi - lo),
                                              f"{phase} B={batch_size}: profiler step {i + 1}/{n}"))
            # The same step without the profiler, in the same process and minutes: what the profiler itself costs.
            progress(lo + 0.82 * (hi - lo), f"{phase} B={batch_size}: timing without the profiler")
            with nvtx_ranges.range("unprofiled timing"):
                plain = time_fn(step, device, warmup=0, iters=cfg.unprofiled_iters, first_call=False)
    progress(lo + 0.85 * (hi - lo), f"{phase} B={batch_size}: analysing the trace")
    analysis = analyze(load_trace(trace_path), phase)
    if device.startswith("cuda") and not analysis.has_device:
        result.notes.append(f"{phase}: the trace has no GPU events (is CUPTI available to torch.profiler?)")
    result.notes.extend(f"{phase}: {n}" for n in analysis.notes)
    for name, value in analysis.metrics.items():
        result.metrics.append(Metric(name, float(value), UNITS.get(name, "us"), **tag))
    stats = plain.stats
    result.metrics += [Metric(f"step_{name}_us", getattr(stats, name), "us", **tag)
                       for name in ("median", "p10", "p90")]
    result.samples.append(Samples(phase=phase + PROFILED, values=analysis.step_walls_us, unit="us",
                                  batch_size=batch_size))
    if analysis.device_busy_steps_us:
        result.samples.append(Samples(phase=phase + DEVICE_BUSY, values=analysis.device_busy_steps_us, unit="us",
                                      batch_size=batch_size))
    result.samples.append(Samples(phase=phase, values=plain.samples_us, unit="us", batch_size=batch_size))
    result.artifacts.append(Artifact(kind="chrome_trace", name=trace_path.name, path=str(trace_path)))
    result.op_stats.extend(analysis.op_stats)
    for note in prepared.notes:
        if note not in result.notes:
            result.notes.append(note)
    return analysis.op_stats


def deep_profile(cfg: ProfileConfig, phase: str, rows: list[dict], out_dir: Path, result: RunResult,
                 batch_size: int) -> None:
    """Nsight Compute on this phase's top-k kernels; a note (never a failure) when it cannot run."""
    kernels, reason = ncu.deep_targets(cfg.device, rows, phase)
    if reason:
        result.notes.append(reason)
        return
    deep = ncu.run_deep_profile(workload=cfg.workload, mode=cfg.mode, device=cfg.device, phase=phase,
                                batch_size=batch_size, kernels=kernels[: cfg.top_k], out_dir=out_dir,
                                settle=cfg.settle + cfg.wait + cfg.warmup, steps=cfg.ncu_steps,
                                timeout_s=cfg.ncu_timeout_s)
    deep.add_to(result, phase, batch_size)


def profile_mode(cfg: ProfileConfig, progress: Progress = lambda f, msg: None) -> RunResult:
    """Profile every requested phase of one mode; raises when the mode is unavailable on the device."""
    cfg.validate()
    workload = get_workload(cfg.workload)
    mode = get_mode(cfg.mode)
    ok, reason = mode.available(cfg.device)
    if not ok:
        raise RuntimeError(f"mode {mode.name} is not available on {cfg.device}: {reason}")
    phases = supported_phases(mode, cfg.phases)
    if not phases:
        raise ValueError(f"nothing to profile: mode {mode.name} runs only the {', '.join(mode.phases)} "
                         f"phase(s); asked for {', '.join(cfg.phases)}")
    out_dir = Path(cfg.artifacts_dir or tempfile.mkdtemp(prefix="modelab-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result = RunResult(env=capture_env(cfg.device))
    for phase in cfg.phases:
        if phase not in phases:
            result.notes.append(mode.skip_note(phase))
    nvtx_ranges.enable(cfg.device.startswith("cuda"))
    base_model = workload.make_model().to(cfg.device)
    conditions.reset()
    n = len(phases)
    for i, phase in enumerate(phases):
        span = (i / n, (i + 1) / n)
        rows = profile_phase(workload, mode, base_model, phase, cfg, out_dir, result, progress, span)
        if cfg.deep:
            progress(span[0] + 0.9 * (span[1] - span[0]), f"{phase}: Nsight Compute on the top-{cfg.top_k} kernels")
            deep_profile(cfg, phase, rows, out_dir, result, default_batch_size(workload, cfg.batch_size))
    if mode.compiles and cfg.depyf:  # after every timed and profiled call: depyf slows a process's compiled code
        for phase in phases:
            progress(0.97, f"{mode.name} {phase}: writing what torch.compile produced (depyf, in a child process)")
            files = compiled_code.dump_in_child(cfg.workload, mode.name, cfg.device, phase,
                                                default_batch_size(workload, cfg.batch_size),
                                                out_dir / f"depyf-{phase}", result.notes)
            result.artifacts += [Artifact(kind="depyf", name=f"depyf-{phase}/{f.name}", path=str(f)) for f in files]
    result.conditions = judge_profile(result.samples, conditions.take_windows())
    result.notes += disturbed_notes(result.conditions)
    progress(1.0, "done")
    return result


def mean_flags(walls: Sequence[float]) -> list[str]:
    """A phrase when a few slow steps pull the steps' mean (what per-step totals are) above their median."""
    if len(walls) < 2:
        return []
    ordered = sorted(walls)
    median = float(noise.spread(ordered).median)
    mean = sum(ordered) / len(ordered)
    if not median > 0 or mean < MAX_MEAN_OVER_MEDIAN * median:
        return []
    return [f"the mean step is {mean / median:.2f}× the median (the slowest {ordered[-1] / median:.1f}×): "
            "slow steps carry the per-step totals"]


def judge_profile(samples: Sequence[Samples], windows: Sequence[Conditions]) -> dict:
    """The run's noise record (runs.conditions): per phase, the profiled steps' wall times and the unprofiled
    timing, each judged with the conditions window around them (engine.measure.noise.record); an entry's `series`
    says which. A profiled series whose mean a few slow steps pull up is noisy too (mean_flags)."""
    entries, flags = [], []
    for s in samples:
        if s.unit != "us" or not s.values or s.phase.endswith(DEVICE_BUSY):
            continue
        profiled = s.phase.endswith(PROFILED)
        phase = s.phase.removesuffix(PROFILED)
        what = "profiled steps" if profiled else "unprofiled steps"
        record = noise.record([Samples(phase=phase, values=s.values, unit=s.unit, batch_size=s.batch_size)], windows)
        for entry in record["series"]:
            if profiled:
                extra = mean_flags(s.values)
                entry["flags"] = entry["flags"] + extra
                if extra and entry["state"] == "clean":
                    entry["state"] = "noisy"
            entry["series"] = what
            entries.append(entry)
            flags += [f"{phase} {what}: {f}" for f in entry["flags"]]
    return {"state": noise.worst([e["state"] for e in entries]), "flags": flags, "series": entries}


def disturbed_notes(record: dict) -> list[str]:
    """One note per flagged series of a profile's noise record: the profile's times are the machine's as much as
    the code's."""
    return [f"{e['phase']}: the profile is disturbed: its {e.get('series', 'steps')} are {e['state']} "
            f"({'; '.join(e['flags'])}); its times may not be the code's alone"
            for e in record.get("series", []) if e["state"] != "clean"]


def judgements(conditions: object, phase: str) -> list[tuple[str, str, list[str]]]:
    """(series, state, flags) of one phase in a profile's stored noise record (runs.conditions), its profiled steps
    first; a run judged before profiles kept their steps has one entry, series "steps"; never judged: []."""
    record = parse_conditions(conditions) or {}
    return [(str(e.get("series") or "steps"), str(e.get("state") or ""), [str(f) for f in e.get("flags") or []])
            for e in record.get("series") or [] if e.get("phase") == phase]


def config_from_params(params: dict) -> ProfileConfig:
    known = set(ProfileConfig.__dataclass_fields__)
    return ProfileConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items() if k in known})


def profile_job(params: dict, progress: Progress) -> RunResult:
    """Job-runner entry point (engine.runner.jobs calls this in a worker process for runs of kind 'profile'). With a
    `model`
    param, your own nn.Module (engine.workloads.user_model) is the workload."""
    if params.get("model"):
        return user_model_job(params, progress, _profile_params)
    return _profile_params(params, progress)


def _profile_params(params: dict, progress: Progress) -> RunResult:
    return profile_mode(config_from_params(params), progress)
