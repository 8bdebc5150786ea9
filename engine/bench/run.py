"""Benchmark one mode of one workload: check it against eager, then time inference and training steps.

For every (phase, batch size): a fresh copy of the same seeded model, the mode's prepare, one timed first call
(trace/compile cost), a comparison with eager (the run fails if it is off tolerance), warm-up, then N timed calls.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.bench import ahead as bench_ahead
from engine.measure import conditions, energy, noise, nvtx_ranges
from engine.measure.caches import cache_metrics, counter_snapshot
from engine.measure.checks import compare
from engine.measure.inductor_timing import begin_run
from engine.measure.timing import ADAPT_MAX_ROUNDS, Measurement, time_adaptive, time_blocks, time_first_call, time_fn
from engine.modes import Mode, Prepared, get_mode
from engine.modes.base import TRAIN_LR
from engine.native.build import take_build_events
from engine.runner import device_lock
from engine.store.db import Artifact, Metric, RunResult, Samples
from engine.workloads import Workload, get_workload

Progress = Callable[[float, str], None]
PHASES = ("infer", "train")


@dataclass
class BenchConfig:
    workload: str = "house_price"
    mode: str = "eager"
    device: str = "cpu"
    phases: tuple[str, ...] = PHASES
    batch_sizes: tuple[int, ...] | None = None  # inference; None: the workload's defaults
    train_batch_sizes: tuple[int, ...] | None = None
    warmup: int = 10
    iters: int = 100
    # While the spread stays wide, more rounds of `iters` calls within a time budget (engine.measure.timing
    # .time_adaptive); False: exactly `iters`.
    adaptive: bool = True
    # Also time blocks of back-to-back calls (engine.measure.timing.time_blocks: metrics loop_*); None: on CUDA only,
    # where
    # per-call events add the host's event cost to every launch-bound sample.
    loop: bool | None = None
    loop_block: int = 20
    loop_reps: int = 25
    artifacts_dir: str | None = None
    db: str | None = None  # the store: where the device's idle draw is kept (engine.measure.energy)
    extra: dict = field(default_factory=dict)


def _dynamo_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _train_step_fn(fn: Callable, model: torch.nn.Module, workload: Workload, inputs: tuple, target: torch.Tensor,
                   before_step: Callable | None) -> tuple[Callable[[], torch.Tensor], torch.optim.Optimizer]:
    optimizer = torch.optim.Adam(model.parameters(), lr=TRAIN_LR)

    def step() -> torch.Tensor:
        if before_step:
            before_step()
        optimizer.zero_grad(set_to_none=True)
        with nvtx_ranges.range("forward"):
            loss = workload.loss_fn(fn(*inputs), target)
        with nvtx_ranges.range("backward"):
            loss.backward()
        with nvtx_ranges.range("optimizer_step"):
            optimizer.step()
        return loss

    return step, optimizer


def mode_train_step(prepared: Prepared, model: torch.nn.Module, workload: Workload, inputs: tuple,
                    target: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One training step of a prepared mode: its own whole step where it has one, else bench's Adam step around fn."""
    if prepared.train_step is None:
        return _train_step_fn(prepared.fn, model, workload, inputs, target, prepared.before_step)[0]
    owned = prepared.train_step
    if workload.loss_fn is not F.mse_loss:  # the owned steps compute MSE in their own kernels
        raise ValueError(f"this mode's training step computes an MSE loss; workload {workload.name} uses "
                         f"{getattr(workload.loss_fn, '__name__', workload.loss_fn)}")

    def step() -> torch.Tensor:
        if prepared.before_step:
            prepared.before_step()
        with nvtx_ranges.range("train_step"):
            return owned(inputs, target)

    return step


def build_step(workload: Workload, mode: Mode, base_model: torch.nn.Module, phase: str, batch_size: int,
               device: str) -> tuple[Callable[[], torch.Tensor], Prepared]:
    """One step of `mode` as a callable, on a fresh copy of the model prepared by the mode: what the profiler,
    Nsight Compute and the compiled-code dump run (engine.profiling).

    `train` is the training step bench times. `infer` must be called (and is prepared) under torch.no_grad(); the
    caller sets the grad mode for the whole loop.
    """
    inputs, target = workload.make_batch(batch_size, device)
    if phase == "train":
        model = copy.deepcopy(base_model).train()
        prepared = mode.prepare(model, inputs, True)
        return mode_train_step(prepared, model, workload, inputs, target), prepared
    if phase != "infer":
        raise ValueError(f"unknown phase {phase!r}; use one of {PHASES}")
    model = copy.deepcopy(base_model).eval()
    with torch.no_grad():
        prepared = mode.prepare(model, inputs, False)

    def call() -> torch.Tensor:
        if prepared.before_step:
            prepared.before_step()
        with nvtx_ranges.range("forward"):
            return prepared.fn(*inputs)

    return call, prepared


def _first_call_message(mode: Mode, phase: str, batch_size: int) -> str:
    what = "first call: compiling (or loading from the cache)" if mode.compiles else "first call"
    return f"{mode.name} {phase} B={batch_size}: {what}"


@dataclass
class _Counters:
    """Process-wide counters at the start of a phase: what the phase compiled is the difference at its end."""
    graphs: int
    breaks: int
    caches: dict[str, int]

    @classmethod
    def snapshot(cls) -> _Counters:
        graphs, breaks = _dynamo_counts()
        return cls(graphs, breaks, counter_snapshot())


@dataclass
class _Checked:
    """A phase's step, checked against eager and timed."""
    step: Callable[[], torch.Tensor]  # one call (infer, run under no_grad) or one training step
    prepared: Prepared
    first_us: float
    max_abs: float
    max_rel: float
    timed: Measurement | None = None  # set by _time_step
    energy_window: energy.EnergyWindow | None = None  # the energy window around the timed calls (None: no meter here)


def bench_phase(workload: Workload, mode: Mode, base_model: torch.nn.Module, phase: str, batch_size: int,
                cfg: BenchConfig, result: RunResult, progress: Progress, frac: tuple[float, float],
                ahead: bench_ahead.Ahead | None = None, meter: energy.Meter | None = None, last: bool = False
                ) -> None:
    """Prepare, check and time one (phase, batch size) of the mode; `last`: the run's last phase, after whose timing
    the worker lets the device go (device_lock.exclusive's `final`)."""
    device = cfg.device
    inputs, target = workload.make_batch(batch_size, device)
    lo, hi = frac
    ahead_us, ahead_failed = None, None
    if ahead is not None and (phase, batch_size) in ahead.helpers:
        progress(lo, f"{mode.name} {phase} B={batch_size}: waiting for its compile ahead")
        ahead_us, ahead_failed = ahead.wait(phase, batch_size)
        if ahead_failed:
            result.notes.append(f"{phase} B={batch_size}: compiling ahead failed ({ahead_failed}); compiled here")
    progress(lo, f"{mode.name} {phase} B={batch_size}: preparing" + (" (export + compile unless cached)"
                                                                      if mode.name == "aoti" else ""))
    before = _Counters.snapshot()
    take_build_events()  # start this phase with an empty record of native builds
    if phase == "infer":
        checked = _check_infer(workload, mode, base_model, inputs, batch_size, cfg, progress, frac)
    else:
        checked = _check_train(workload, mode, base_model, inputs, target, batch_size, cfg, progress, frac)
    # Beside other runs of its group (engine.runner.plan) the worker prepared holding the device shared; it times alone.
    with device_lock.exclusive(final=last):
        progress(lo + 0.2 * (hi - lo), f"{phase} B={batch_size}: timing")
        checked.timed, checked.energy_window = _time_step(checked.step, phase, batch_size, cfg, meter)
        extra = _extra_metrics(checked, workload, phase, batch_size, cfg, progress, frac)
    if ahead_us is not None:  # the cold compile was the helper's; this process loaded it from Inductor's caches
        extra.append(Metric("first_call_here", checked.first_us, "us"))
        checked.first_us = ahead_us
    _record_phase(result, checked, extra, mode, phase, batch_size, before)
    _keep_artifacts(result, checked.prepared, cfg)
    for note in checked.prepared.notes:
        if note not in result.notes:
            result.notes.append(note)


def _check_infer(workload: Workload, mode: Mode, base_model: torch.nn.Module, inputs: tuple, batch_size: int,
                 cfg: BenchConfig, progress: Progress, frac: tuple[float, float]) -> _Checked:
    """Prepare the mode on a fresh copy, time its first call and compare that output with eager's."""
    phase, device = "infer", cfg.device
    lo, hi = frac
    reference_model = copy.deepcopy(base_model).eval()
    model = copy.deepcopy(base_model).eval()
    with torch.no_grad():
        expected = reference_model(*inputs)
        prepared = mode.prepare(model, inputs, False)

        def call() -> torch.Tensor:
            if prepared.before_step:
                prepared.before_step()
            return prepared.fn(*inputs)

        progress(lo + 0.05 * (hi - lo), _first_call_message(mode, phase, batch_size))
        with _tuning(mode), nvtx_ranges.range(f"first_call {phase} B={batch_size}"):
            first_out: list[torch.Tensor] = []
            first_us = time_first_call(lambda: first_out.append(call().clone()), device)
        max_abs, max_rel = compare(first_out[0], expected, workload.rtol, workload.atol,
                                   f"{mode.name} inference at batch {batch_size}")
    return _Checked(call, prepared, first_us, max_abs, max_rel)


def _check_train(workload: Workload, mode: Mode, base_model: torch.nn.Module, inputs: tuple, target: torch.Tensor,
                 batch_size: int, cfg: BenchConfig, progress: Progress, frac: tuple[float, float]) -> _Checked:
    """The mode's training step on a fresh copy: its first step (timed) against eager's, loss and every weight."""
    phase, device = "train", cfg.device
    lo, hi = frac
    # Correctness: one step from identical weights, in eager and in the mode, must give the same loss and weights.
    reference_model = copy.deepcopy(base_model).train()
    model = copy.deepcopy(base_model).train()
    ref_step, _ = _train_step_fn(reference_model, reference_model, workload, inputs, target, None)
    expected_loss = ref_step().detach()
    prepared = mode.prepare(model, inputs, True)
    step = mode_train_step(prepared, model, workload, inputs, target)
    progress(lo + 0.05 * (hi - lo), _first_call_message(mode, phase, batch_size))
    with _tuning(mode), nvtx_ranges.range(f"first_call {phase} B={batch_size}"):
        losses: list[torch.Tensor] = []
        first_us = time_first_call(lambda: losses.append(step().detach().clone()), device)
    what = f"{mode.name} training step at batch {batch_size}"
    max_abs, max_rel = compare(losses[0], expected_loss, workload.rtol, workload.atol, what + " (loss)")
    for (name, p), (_, p_ref) in zip(model.named_parameters(), reference_model.named_parameters()):
        a, r = compare(p, p_ref, workload.rtol, workload.atol, f"{what} (weight {name} after the step)")
        max_abs, max_rel = max(max_abs, a), max(max_rel, r)
    return _Checked(step, prepared, first_us, max_abs, max_rel)


def _tuning(mode: Mode) -> contextlib.AbstractContextManager:
    """Around a first call beside other runs of its group. Where Inductor's own timings of candidate kernels are
    singled out (engine.measure.inductor_timing, installed by the compile modes), only they take the device alone;
    otherwise a mode that autotunes holds it alone for the whole first call."""
    from engine.measure.inductor_timing import installed

    return device_lock.exclusive() if mode.autotunes and not installed() else contextlib.nullcontext()


def _time_step(step: Callable[[], torch.Tensor], phase: str, batch_size: int, cfg: BenchConfig,
               meter: energy.Meter | None = None) -> tuple[Measurement, energy.EnergyWindow | None]:
    """warm-up, then cfg.iters timed calls of the checked step (inference under no_grad), more rounds while the
    spread is wide (cfg.adaptive); the machine's conditions recorded around them (engine.measure.conditions), and
    the energy counter read just outside them (engine.measure.energy; a short loop runs again, untimed, until the
    window is long enough for the counter)."""
    def timed() -> Measurement:
        return time_adaptive(step, cfg.device, warmup=cfg.warmup, iters=cfg.iters,
                             max_rounds=ADAPT_MAX_ROUNDS if cfg.adaptive else 1)

    def again() -> float:
        return cfg.warmup + len(time_fn(step, cfg.device, warmup=cfg.warmup, iters=cfg.iters,
                                        first_call=False).samples_us)

    with torch.set_grad_enabled(phase == "train"), nvtx_ranges.range(f"timed {phase} B={batch_size}"), \
            conditions.window(cfg.device, phase, batch_size):
        return energy.measure(meter, timed, units=lambda m: cfg.warmup + len(m.samples_us), again=again)


def _extra_metrics(checked: _Checked, workload: Workload, phase: str, batch_size: int, cfg: BenchConfig,
                   progress: Progress, frac: tuple[float, float]) -> list[Metric]:
    """Blocks of back-to-back calls (loop_*, when cfg.loop says so), then the mode's own extra metrics."""
    device = cfg.device
    lo, hi = frac
    loop = cfg.loop if cfg.loop is not None else device.startswith("cuda")
    if loop:
        with torch.set_grad_enabled(phase == "train"), nvtx_ranges.range(f"timed blocks {phase} B={batch_size}"):
            blocks = time_blocks(checked.step, device, block=cfg.loop_block, reps=cfg.loop_reps)
    _sync(device)
    extra: list[Metric] = []
    if loop:
        bstats = blocks.stats
        for name in ("median", "p10", "p90"):
            extra.append(Metric(f"loop_{name}", getattr(bstats, name), "us"))
        extra.append(Metric("loop_block", float(cfg.loop_block), "calls"))
    prepared = checked.prepared
    if prepared.extra_metrics:  # e.g. aoti's native runner: timed after, so the two never share the machine
        progress(lo + 0.8 * (hi - lo), f"{phase} B={batch_size}: extra metrics")
        extra += prepared.extra_metrics(warmup=cfg.warmup, iters=cfg.iters, rtol=workload.rtol, atol=workload.atol)
    return extra


def _record_phase(result: RunResult, checked: _Checked, extra: list[Metric], mode: Mode, phase: str,
                  batch_size: int, before: _Counters) -> None:
    """The phase's samples and metrics (timing, first call, errors, throughput, extra, caches, recompiles)."""
    tag = dict(phase=phase, batch_size=batch_size)
    m = checked.timed
    stats = m.stats
    result.samples.append(Samples(phase=phase, batch_size=batch_size, values=m.samples_us, unit="us"))
    if m.rounds > 1:
        result.notes.append(f"{phase} B={batch_size}: the spread was wide, so {m.rounds} rounds of timed calls "
                            f"({len(m.samples_us)} samples)" + ("" if m.settled else "; it never settled"))
    for name in ("median", "p10", "p90", "p25", "p75", "iqr", "mean", "std", "min", "max"):
        result.metrics.append(Metric(name, getattr(stats, name), "us", **tag))
    result.metrics.append(Metric("first_call", checked.first_us, "us", **tag))
    result.metrics.append(Metric("max_abs_err", checked.max_abs, "", **tag))
    result.metrics.append(Metric("max_rel_err", checked.max_rel, "", **tag))
    result.metrics.append(Metric("throughput", batch_size / (stats.median * 1e-6), "samples/s", **tag))
    for metric in extra:
        result.metrics.append(Metric(metric.name, metric.value, metric.unit, **tag))
    result.metrics += energy.energy_metrics(checked.energy_window, "step", **tag)
    note = energy.window_note(checked.energy_window, f"{phase} B={batch_size}")
    if note:
        result.notes.append(note)
    for metric in cache_metrics(before.caches, counter_snapshot(), take_build_events(), mode.autotunes):
        result.metrics.append(Metric(metric.name, metric.value, metric.unit, **tag))
    if mode.compiles:
        graphs_after, breaks_after = _dynamo_counts()
        graphs = graphs_after - before.graphs
        # One graph per phase is expected (backward is compiled with the forward); more means dynamo recompiled.
        result.metrics.append(Metric("graphs_compiled", graphs, "", **tag))
        result.metrics.append(Metric("recompiles", max(0, graphs - 1), "", **tag))
        result.metrics.append(Metric("graph_breaks", breaks_after - before.breaks, "", **tag))


def _keep_artifacts(result: RunResult, prepared: Prepared, cfg: BenchConfig) -> None:
    """The mode's text artifacts and files, copied under cfg.artifacts_dir once per run."""
    for name, text in prepared.artifacts.items():
        if cfg.artifacts_dir and not any(a.name == name for a in result.artifacts):
            path = Path(cfg.artifacts_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            result.artifacts.append(Artifact(kind="text", name=name, path=str(path)))
    for name, src in prepared.files.items():
        if cfg.artifacts_dir and not any(a.name == name for a in result.artifacts):
            path = Path(cfg.artifacts_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, path)
            result.artifacts.append(Artifact(kind="file", name=name, path=str(path)))


def bench_mode(cfg: BenchConfig, progress: Progress = lambda f, msg: None) -> RunResult:
    """Run the whole benchmark of one mode; raises on unavailability or a correctness failure."""
    workload = get_workload(cfg.workload)
    mode = get_mode(cfg.mode)
    ok, reason = mode.available(cfg.device)
    if not ok:
        raise RuntimeError(f"mode {mode.name} is not available on {cfg.device}: {reason}")
    result = RunResult(env=begin_run(cfg.device))
    conditions.reset()
    meter = energy.open_for_run(cfg.device, cfg.db, result)  # the idle draw: stored, else measured once here
    # Ranges name every phase in Nsight timelines; on CPU nothing reads them, so they stay out of the timed loop.
    nvtx_ranges.enable(cfg.device.startswith("cuda"))
    base_model = workload.make_model().to(cfg.device)
    plan = []
    for phase in cfg.phases:
        if phase in PHASES and phase not in mode.phases:
            result.notes.append(mode.skip_note(phase))
    if "infer" in cfg.phases and "infer" in mode.phases:
        plan += [("infer", b) for b in (cfg.batch_sizes or workload.default_batch_sizes)]
    if "train" in cfg.phases and "train" in mode.phases:
        plan += [("train", b) for b in (cfg.train_batch_sizes or workload.default_train_batch_sizes)]
    if not plan:
        raise ValueError(f"nothing to benchmark: no phases or batch sizes (mode {mode.name} supports "
                         f"{', '.join(mode.phases)}; asked for {', '.join(cfg.phases) or 'none'})")
    ahead = _compile_ahead(mode, cfg, plan, result)
    try:
        for i, (phase, batch_size) in enumerate(plan):
            with nvtx_ranges.range(f"{mode.name} {phase} B={batch_size}"):
                bench_phase(workload, mode, base_model, phase, batch_size, cfg, result, progress,
                            (i / len(plan), (i + 1) / len(plan)), ahead, meter, last=i == len(plan) - 1)
    finally:
        if ahead is not None:
            ahead.stop()
    result.conditions = noise.record(result.samples, conditions.take_windows())
    progress(1.0, "done")
    return result


def _compile_ahead(mode: Mode, cfg: BenchConfig, plan: list[tuple[str, int]], result: RunResult
                   ) -> bench_ahead.Ahead | None:
    """Where engine.bench.ahead applies, start its helpers (the plan reordered: training first, done here)."""
    if not bench_ahead.wanted(mode.autotunes, cfg.device, len(plan)):
        return None
    # This process does the longest compile (training: forward and backward) itself, already imported; the helpers,
    # which first import torch, take the rest.
    plan.sort(key=lambda phase_batch: phase_batch[0] != "train")
    ahead = bench_ahead.start(dataclasses.asdict(cfg), plan)
    if ahead.helpers:
        result.notes.append(f"{mode.name}: phases after the first compiled ahead in parallel helper processes "
                            "(engine/bench/ahead.py); their first_call is the helper's cold compile, first_call_here "
                            "this run's load of it from Inductor's caches")
    return ahead


def first_call_ahead(spec: dict) -> float:
    """A compile-ahead helper's work (engine.bench.ahead): one phase of a run up to its checked first call; its µs."""
    cfg = _config(spec["params"])
    workload, mode = get_workload(cfg.workload), get_mode(cfg.mode)
    base_model = workload.make_model().to(cfg.device)
    phase, batch_size = spec["phase"], int(spec["batch_size"])
    inputs, target = workload.make_batch(batch_size, cfg.device)
    frac = (0.0, 1.0)

    def quiet(frac: float, message: str) -> None:
        pass

    if phase == "infer":
        checked = _check_infer(workload, mode, base_model, inputs, batch_size, cfg, quiet, frac)
    else:
        checked = _check_train(workload, mode, base_model, inputs, target, batch_size, cfg, quiet, frac)
    return checked.first_us


def _first_call_main(spec_json: str) -> int:
    """`python -m engine.bench.run --first-call SPEC`: a compile-ahead helper, a member of its group's device
    discipline."""
    from engine.measure.inductor_timing import compile_off_device
    from engine.native.build import configure_compile_caches

    spec = json.loads(spec_json)
    configure_compile_caches()
    device = spec["params"]["device"]
    device_lock.begin_phases(device, group_size=int(spec.get("group_size", 2)))
    try:
        compile_off_device()
        first_us = first_call_ahead(spec)
        device_lock.end_phases()
        done = bench_ahead.marker(spec["params"], spec["phase"], int(spec["batch_size"]))
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps({"first_us": first_us}))
        bench_ahead.write_result(spec["out"], first_us=first_us)
        return 0
    except Exception as exc:  # noqa: BLE001 - the run compiles this phase itself; the reason goes in its notes
        bench_ahead.write_result(spec["out"], error=f"{type(exc).__name__}: {exc}")
        return 1


def bench_job(params: dict, progress: Progress) -> RunResult:
    """Job-runner entry point (engine.runner.jobs calls this in a worker process). With a `model` param, your own
    nn.Module
    (engine.workloads.user_model) is the workload."""
    if params.get("model"):
        return user_model_job(params, progress, _bench_params)
    return _bench_params(params, progress)


def _config(params: dict) -> BenchConfig:
    known = set(BenchConfig.__dataclass_fields__)
    return BenchConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items() if k in known})


def _bench_params(params: dict, progress: Progress) -> RunResult:
    return bench_mode(_config(params), progress)


def user_model_job(params: dict, progress: Progress, run: Callable[[dict, Progress], RunResult]) -> RunResult:
    """A bench or profile job (`run`) on the user model of params["model"]: registered in this worker and exported to
    its child processes (Nsight Compute, depyf) first. A failure is one line naming the model; the model's notes (which
    output is timed, say) join the result's."""
    from engine.workloads import register_user_model
    from engine.workloads.user_model import ModelSpec, UserModelError, export_to_children, one_line

    spec = ModelSpec.from_params(params)
    if spec is None:
        raise UserModelError("the job has no 'model' parameter")
    export_to_children(spec)
    progress(0.0, f"importing {spec.model}")
    prepared = register_user_model(spec)
    mode = params.get("mode", "?")
    try:
        result = run({**params, "workload": prepared.workload.name}, progress)
    except Exception as exc:  # noqa: BLE001 - the mode's own reason, as one readable line (the log keeps the rest)
        raise RuntimeError(f"{mode} failed on {spec.model}: {one_line(exc)}") from exc
    for note in prepared.notes:
        if note not in result.notes:
            result.notes.append(note)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--first-call":
        sys.exit(_first_call_main(sys.argv[2]))
    sys.exit("usage: python -m engine.bench.run --first-call SPEC_JSON (internal: engine/bench/ahead.py's helpers); "
             "to benchmark, run python -m engine bench --help")
