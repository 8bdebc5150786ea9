"""Run one level of one component at one shape: check it against the naive module in fp32, then time it.

The reference is the L1 naive module run in fp32 on the same inputs (bf16 inputs upcast exactly). A level passes when
its relative L2 error ‖out − ref‖ / ‖ref‖ is within the component's tolerance for the shape's dtype, on two fresh
input sets; otherwise the run fails with the error. Timing then follows engine.measure.timing (CUDA events per call on
the
GPU), rotating over several input sets when one set would sit in L2, and the throughput figures divide the
component's analytic FLOPs and minimum bytes by the median, and by the device ceilings, naming which.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.levels import get_component, get_level, guards, yours
from engine.levels.base import Built, Level, use_triton_interpreter
from engine.measure import energy
from engine.measure import kernel_timers as timers
from engine.measure.ceilings import Ceilings, ceiling_metrics, ceilings_for, dtype_key
from engine.measure.checks import nonfinite
from engine.measure.inductor_timing import begin_run
from engine.measure.timing import Measurement, time_first_call, time_fn, time_in_graph
from engine.runner import device_lock
from engine.store.db import Metric, RunResult, Samples
from engine.workloads.component import Component, Shape, rel_l2_error, tensor_bytes

Progress = Callable[[float, str], None]
L2_ROTATE_BYTES = 120 << 20  # rotate input sets until the working set is well past an H100/H200's 50–60 MB L2
PROFILED_CALLS = 10  # calls under the profiler for kernel_median: a few rotations of the input sets


class LevelMismatchError(AssertionError):
    """A level's output is off the naive reference by more than the tolerance."""


@dataclass
class LevelsConfig:
    component: str = "causal_attention"
    shape: str = "small"
    level: str = "L1-naive"
    device: str = "cpu"
    warmup: int = 5
    iters: int = 30
    seed: int = 0
    db: str | None = None
    artifacts_dir: str | None = None
    quick_ceilings: bool = False
    impl_path: str | None = None  # the folder of a "yours:pkg.mod:fn" level's module (engine.levels.yours)
    component_path: str | None = None  # the folder of a user's component "pkg.mod:spec" (engine.levels.yours)
    deep: bool = False  # Nsight Compute on the level's kernels after timing (engine.levels.deep)
    extra: dict = field(default_factory=dict)


def _to(obj, device: str | None = None, dtype: torch.dtype | None = None):
    if isinstance(obj, torch.Tensor) and obj.is_floating_point() and dtype is not None:
        return obj.to(device=device or obj.device, dtype=dtype)
    return obj


def reference_output(component: Component, shape: Shape, naive: torch.nn.Module, inputs: tuple) -> torch.Tensor:
    """The naive module in fp32 on the (upcast) inputs: the ground truth every level is compared with."""
    ref_module = copy.deepcopy(naive).float()
    with torch.no_grad():
        return ref_module(*(_to(x, dtype=torch.float32) for x in inputs)).float()


def check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    if tuple(out.shape) != tuple(ref.shape):
        raise LevelMismatchError(f"{name}: output shape {tuple(out.shape)} differs from the reference "
                                 f"{tuple(ref.shape)}")
    for whose, values in (("output", out), ("naive fp32 reference", ref)):
        bad = nonfinite(values)
        if bad:
            raise LevelMismatchError(f"{name}: the {whose} has NaN or inf ({bad})")
    err = rel_l2_error(out.float(), ref)
    if not err <= tol:
        raise LevelMismatchError(f"{name}: relative L2 error {err:.3g} against the naive fp32 reference exceeds "
                                 f"the tolerance {tol:g}")
    return err


def _input_sets(component: Component, shape: Shape, device: str, seed: int) -> list[tuple]:
    first = component.make_inputs(shape, device, seed)
    if not device.startswith("cuda"):
        return [first]
    size = sum(tensor_bytes(x) for x in first if isinstance(x, torch.Tensor))
    count = max(2, min(4, math.ceil(L2_ROTATE_BYTES / max(size, 1))))
    return [first] + [component.make_inputs(shape, device, seed + i) for i in range(1, count)]


def throughput_metrics(flops: float, nbytes: float, median_us: float, ceilings: Ceilings | None, dtype: str,
                       phase: str) -> list[Metric]:
    seconds = median_us * 1e-6
    out = [Metric("flops", flops, "FLOP", phase=phase), Metric("min_bytes", nbytes, "B", phase=phase),
           Metric("flops_per_s", flops / seconds, "FLOP/s", phase=phase),
           Metric("bytes_per_s", nbytes / seconds, "B/s", phase=phase),
           Metric("intensity", flops / nbytes if nbytes else 0.0, "FLOP/B", phase=phase)]
    if ceilings is not None:
        key = dtype_key(dtype)
        matmul = ceilings.matmul(key)
        if matmul:
            out.append(Metric(f"pct_matmul_{key}", 100 * flops / seconds / matmul, "%", phase=phase))
        if ceilings.copy_bw:
            out.append(Metric("pct_copy_bw", 100 * nbytes / seconds / ceilings.copy_bw, "%", phase=phase))
    return out


@dataclass
class _Checked:
    """A level built for one component and shape, its output checked against the naive fp32 reference."""
    built: Built
    build_us: float
    first_us: float
    err: float  # relative L2 error, the worst over the checked input sets
    stage_errs: dict[str, float]


def run_level(cfg: LevelsConfig, progress: Progress = lambda f, m: None) -> RunResult:
    component, shape, level = _resolve(cfg)
    device = cfg.device
    if level.key == "L4-triton":
        # Off CUDA Triton runs interpreted, a switch read when Triton is first imported: set it before begin_run,
        # which beside a group wraps Inductor's compile functions and so imports dynamo, and Triton with it.
        use_triton_interpreter(device)
    result = RunResult(env=begin_run(device))
    from engine.measure import conditions, noise  # the timing's surroundings, judged with its samples

    conditions.reset()
    progress(0.02, "ceilings")
    with device_lock.exclusive():  # measures them if this device has none: a timing like any other
        ceilings = ceilings_for(device, cfg.db, quick=cfg.quick_ceilings) if cfg.db else None

    progress(0.05, f"inputs for {shape.label()}")
    sets = _input_sets(component, shape, device, cfg.seed)
    naive = _naive_module(component, shape, device, cfg.seed)
    tol = component.tolerance(shape)
    guard = guards.Guard(component, shape, naive, tol, device) if yours.is_yours(level.key) else None
    with torch.no_grad():
        if guard is not None:  # a user's kernel: guarded before it is checked and timed like the others
            progress(0.08, f"guarding {level.key}")
            guard.probe(level.build(component, shape, naive, device).fn)
        checked = _build_and_check(component, shape, level, naive, sets, tol, device, progress)
    # Beside other runs of its group (engine.runner.plan) this worker prepared holding the device shared; it times
    # alone, the machine's conditions recorded meanwhile (engine.measure.conditions), and then lets the device go.
    with device_lock.exclusive(final=True), conditions.window(device):
        with torch.no_grad():
            progress(0.4, f"timing {level.key}")
            saved = [[x.clone() if isinstance(x, torch.Tensor) else x for x in s] for s in sets] if guard else []
            if guard is not None:
                m = guard.time(checked.built.fn, sets, cfg.warmup, cfg.iters)
            else:
                m = _time_with_energy(result, checked.built.fn, sets, cfg)
            stage_measurements = {}
            for stage, stage_fn in checked.built.stages.items():
                progress(0.8, f"timing stage {stage}")
                stage_measurements[stage] = _time_rotating(stage_fn, sets, cfg)
        _record_forward(result, component, shape, checked, m, tol, len(sets), ceilings)
        if guard is not None:
            with torch.no_grad():
                _after_timing(guard, component, shape, sets, saved, m, ceilings, checked.built.fn)
            result.notes += guard.lines()
            result.metrics += guard.metrics()
        if device.startswith("cuda"):
            _time_in_cuda_graph(result, checked.built, sets, progress)
            _cross_timers(result, checked.built.fn, sets, m.stats.median, progress)
        if cfg.deep:  # ncu replays each kernel many times: it needs the device as much as a timing does
            progress(0.9, f"Nsight Compute on {level.key}")
            _deep_profile(result, cfg)
    _record_stages(result, component, shape, checked.stage_errs, stage_measurements, ceilings)
    result.metrics += ceiling_metrics(ceilings, ("copy_bw", f"matmul_{dtype_key(shape.dtype)}", "launch_us"))
    result.notes += [n for n in checked.built.notes if n not in result.notes]
    if checked.built.late_notes is not None:
        result.notes += [n for n in checked.built.late_notes() if n not in result.notes]
    if len(sets) > 1:
        result.notes.append(f"timed over {len(sets)} rotating input sets so repeated calls do not run from L2")
    result.conditions = noise.record(result.samples, conditions.take_windows())
    return result


# Nsight Compute's figures for `levels --deep`: time, DRAM and SM throughput (% of peak), achieved occupancy (% of
# the warps an SM can hold) and registers per thread — the first things that say what holds a kernel back.
DEEP_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread")
DEEP_CALLS = 2  # calls inside the measured range: every kernel of a call, twice (ncu replays each for its metrics)
# What the SM's time goes to, where the figures above leave it open (an SM busy at 52 % of its peak, not waiting on
# DRAM): the tensor pipe's activity, the XU pipe (MUFU: the softmax's exponentials), and warps stalled per issued
# instruction on memory (long scoreboard), a barrier, a fixed-latency wait and a busy math pipe. On Hopper (Nsight
# Compute of CUDA 13) the hmma pipe counter counts wgmma too, and the gmma one gives no value, so it is not asked for.
PIPE_METRICS = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
                "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio")


def deep_target_args(cfg: LevelsConfig, calls: int = DEEP_CALLS) -> list[str]:
    """`python -m engine.levels.deep` arguments that rebuild this run's level, inputs and check."""
    args = ["--component", cfg.component, "--shape", cfg.shape, "--level", cfg.level, "--device", cfg.device,
            "--seed", str(cfg.seed), "--calls", str(calls)]
    if cfg.impl_path:
        args += ["--impl-path", cfg.impl_path]
    if cfg.component_path:
        args += ["--component-path", cfg.component_path]
    return args


def _deep_profile(result: RunResult, cfg: LevelsConfig, ncu_exe: str | None = None) -> None:
    """Nsight Compute on every kernel of DEEP_CALLS calls of the level, in a subprocess (engine.levels.deep builds
    and checks the level again, warms it, then brackets the calls with cudaProfilerStart/Stop); one row per kernel
    in the run's kernel metrics. Why it could not run is a note, never a failure."""
    import sys
    import tempfile
    from pathlib import Path

    from engine.profiling import ncu

    exe = ncu_exe or ncu.ncu_path()
    reason = ncu.unavailable(cfg.device) if ncu_exe is None else None  # a given ncu (the tests' stand-in) runs anywhere
    if reason or exe is None:
        result.notes.append(f"deep profile skipped: {reason}")
        return
    csv_path = Path(cfg.artifacts_dir or tempfile.mkdtemp(prefix="modelab-levels-")) / "ncu-forward.csv"
    target = [sys.executable, "-m", "engine.levels.deep", *deep_target_args(cfg)]
    metrics = DEEP_METRICS + PIPE_METRICS
    deep = ncu.run_ncu([*ncu.ncu_options(None, ncu=exe, metrics=metrics, log_file=csv_path), *target], csv_path,
                       "forward", timeout_s=600)
    if not deep.rows and any("metric" in note.lower() for note in deep.notes):
        # an Nsight Compute that does not know a pipe metric (their names vary by version and GPU): the base figures
        why = deep.notes[-1]
        deep = ncu.run_ncu([*ncu.ncu_options(None, ncu=exe, metrics=DEEP_METRICS, log_file=csv_path), *target],
                           csv_path, "forward", timeout_s=600)
        deep.notes.append(f"Nsight Compute: pipe and stall figures left out, one of their metrics refused ({why})")
    deep.add_to(result, "forward")


def prepare_level(cfg: LevelsConfig) -> tuple[Callable[..., torch.Tensor], list[tuple]]:
    """The level's callable, built and checked against the reference exactly as run_level does, and its input
    sets (engine.levels.deep runs these under Nsight Compute)."""
    component, shape, level = _resolve(cfg)
    sets = _input_sets(component, shape, cfg.device, cfg.seed)
    naive = _naive_module(component, shape, cfg.device, cfg.seed)
    with torch.no_grad():
        checked = _build_and_check(component, shape, level, naive, sets, component.tolerance(shape), cfg.device,
                                   lambda fraction, message: None)
    return checked.built.fn, sets


def _after_timing(guard: guards.Guard, component: Component, shape: Shape, sets: list[tuple], saved: list[list],
                  m: Measurement, ceilings: Ceilings | None, fn: Callable[..., torch.Tensor]) -> None:
    """The guards that need the timed calls: their outputs, the roofline floor, other streams (CUDA)."""
    floor = None
    if ceilings is not None:
        floor = guards.roofline_floor_us(component.flops(shape), component.min_bytes(shape),
                                         ceilings.matmul(dtype_key(shape.dtype)),
                                         # CPU calls run from cache (no flush): only the compute floor holds there
                                         ceilings.copy_bw if shape.runs_on("cuda") and guard.device.startswith("cuda")
                                         else None)
    guard.after_timing(sets, saved, m.stats.median, floor, fn)


def _resolve(cfg: LevelsConfig) -> tuple[Component, Shape, Level]:
    """The component, shape and level of cfg; an error when the shape or the level cannot run on cfg.device."""
    component = get_component(cfg.component, cfg.component_path)
    shape = component.shape(cfg.shape)
    level = yours.yours_level(cfg.level, cfg.impl_path) if yours.is_yours(cfg.level) else get_level(cfg.level)
    device = cfg.device
    if yours.is_component_path(cfg.component):  # a user's component: L1-native, L4, L5 only where it provides them
        if level.key in component.kernels:
            level = dataclasses.replace(level, build=yours.kernel_build(component.kernels[level.key]))
        missing = yours.missing_level(cfg.component, level.key, component.make_native is not None,
                                      list(component.kernels))
        if missing:
            raise RuntimeError(f"level {level.key} is not available for {cfg.component}: {missing}")
    if not shape.runs_on(device):
        raise ValueError(f"shape {shape.name} of {component.name} is meant for {', '.join(shape.devices)}, not "
                         f"{device}")
    ok, reason = level.available(device)
    if not ok:
        raise RuntimeError(f"level {level.key} is not available on {device}: {reason}")
    return component, shape, level


def _naive_module(component: Component, shape: Shape, device: str, seed: int) -> torch.nn.Module:
    """The L1 naive module, seeded, in the shape's dtype, in eval mode: what levels build from and are checked with."""
    torch.manual_seed(seed)
    naive = component.make_naive(shape).to(device=device)
    naive = naive.to(dtype=shape.torch_dtype) if any(True for _ in naive.parameters()) else naive
    return naive.eval()


def _build_and_check(component: Component, shape: Shape, level: Level, naive: torch.nn.Module, sets: list[tuple],
                     tol: float, device: str, progress: Progress) -> _Checked:
    """Build the level (timed), call it once (timed), check it on two input sets and each stage on the first."""
    progress(0.1, f"building {level.key}")
    refs = [reference_output(component, shape, naive, sets[i]) for i in range(min(2, len(sets)))]
    built_holder: list[Built] = []
    build_us = time_first_call(lambda: built_holder.append(level.build(component, shape, naive, device)), device)
    built = built_holder[0]
    outputs: list[torch.Tensor] = []
    with _tuning(built):
        first_us = time_first_call(lambda: outputs.append(built.fn(*sets[0])), device)
    progress(0.3, f"checking {level.key} against the naive fp32 reference")
    what = f"{level.key} on {component.name} {shape.name}"
    err = check(what, outputs[0], refs[0], tol)
    if len(refs) > 1:
        err = max(err, check(what + " (second input set)", built.fn(*sets[1]), refs[1], tol))
    outputs.clear()
    stage_errs: dict[str, float] = {}
    for stage, stage_fn in built.stages.items():
        stage_ref = _stage_reference(component, naive, stage, sets[0])
        with _tuning(built):  # the stage's first call
            stage_out = stage_fn(*sets[0])
        stage_errs[stage] = check(f"{what} stage {stage}", stage_out, stage_ref, tol)
    return _Checked(built, build_us, first_us, err, stage_errs)


def _tuning(built: Built) -> contextlib.AbstractContextManager:
    """Around a first call: a level that autotunes times candidate kernels, so it takes the device alone."""
    return device_lock.exclusive() if built.autotunes else contextlib.nullcontext()


def _time_rotating(fn: Callable[..., torch.Tensor], sets: list[tuple], cfg: LevelsConfig) -> Measurement:
    """fn timed call by call (engine.measure.timing), each call on the next input set."""
    counter = [0]

    def call() -> torch.Tensor:
        counter[0] += 1
        return fn(*sets[counter[0] % len(sets)])

    return time_fn(call, cfg.device, warmup=cfg.warmup, iters=cfg.iters, first_call=False)


def _time_with_energy(result: RunResult, fn: Callable[..., torch.Tensor], sets: list[tuple], cfg: LevelsConfig
                      ) -> Measurement:
    """_time_rotating inside an energy window (engine.measure.energy): J per call beside the latency. A user's
    kernel (guarded) is timed with the L2 flushed between calls, so it gets no energy figure: the flushes would
    be in it."""
    meter = energy.open_for_run(cfg.device, cfg.db, result)
    m, window = energy.measure(meter, lambda: _time_rotating(fn, sets, cfg),
                               units=lambda m: cfg.warmup + len(m.samples_us),
                               again=lambda: cfg.warmup + len(_time_rotating(fn, sets, cfg).samples_us))
    result.metrics += energy.energy_metrics(window, "step", phase="forward")
    note = energy.window_note(window, "the timed calls")
    if note:
        result.notes.append(note)
    return m


def _record_forward(result: RunResult, component: Component, shape: Shape, checked: _Checked, m: Measurement,
                    tol: float, input_sets: int, ceilings: Ceilings | None) -> None:
    """The level's samples and metrics (phase "forward"): latency, build and first call, error, throughput."""
    phase = "forward"
    stats = m.stats
    result.samples.append(Samples(phase=phase, values=m.samples_us, unit="us"))
    for name in ("median", "p10", "p90", "p25", "p75", "iqr", "mean", "std", "min", "max"):
        result.metrics.append(Metric(name, getattr(stats, name), "us", phase=phase))
    result.metrics += [Metric("first_call", checked.first_us, "us", phase=phase),
                       Metric("build", checked.build_us, "us", phase=phase),
                       Metric("rel_l2_err", checked.err, "", phase=phase), Metric("tolerance", tol, "", phase=phase),
                       Metric("interpreted", float(checked.built.interpreted), "", phase=phase),
                       Metric("input_sets", input_sets, "", phase=phase)]
    result.metrics += throughput_metrics(component.flops(shape), component.min_bytes(shape), stats.median, ceilings,
                                         shape.dtype, phase)


def _time_in_cuda_graph(result: RunResult, built: Built, sets: list[tuple], progress: Progress) -> None:
    """graph_* metrics of the level and each stage (CUDA only)."""
    # Per-call events include the host's time to call the level (argument checks, an autotuner's dispatch,
    # pybind): a few-µs kernel can read as 100 µs. The same calls captured in a CUDA graph give the device time.
    progress(0.9, "timing in a CUDA graph (device time)")
    graphed = {"forward": built.fn, **built.stages}
    for phase_name, fn in graphed.items():
        try:
            with torch.no_grad():
                gm = time_in_graph([lambda fn=fn, args=args: fn(*args) for args in sets], replays=20)
        except Exception as exc:  # noqa: BLE001 - some levels cannot be captured (a host sync inside)
            torch.cuda.synchronize()
            result.notes.append(f"{phase_name}: not timed in a CUDA graph ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")
            continue
        for name in ("median", "p10", "p90"):
            result.metrics.append(Metric(f"graph_{name}", getattr(gm.stats, name), "us", phase=phase_name))
    result.notes.append("graph_median: the same calls (over the rotating input sets) captured back to back in "
                        "one CUDA graph and replayed: device time without the host's per-call cost")


def _cross_timers(result: RunResult, fn: Callable[..., torch.Tensor], sets: list[tuple], events_us: float,
                  progress: Progress) -> None:
    """kernel_median (the profiler's device busy time per call) and the cross-timer notes (CUDA only)."""
    progress(0.95, "profiler kernel time")
    kernel_us = _profiled_kernel_us(result, fn, sets)
    if kernel_us is None:
        return
    result.metrics.append(Metric("kernel_median", kernel_us, "us", phase="forward"))
    graph_us = next((g.value for g in result.metrics if g.name == "graph_median" and g.phase == "forward"), None)
    result.notes += timers.notes(timers.CrossTimers(events_us, graph_us, kernel_us))


def _profiled_kernel_us(result: RunResult, fn: Callable[..., torch.Tensor], sets: list[tuple]) -> float | None:
    """The profiler's kernel busy time per call over PROFILED_CALLS calls on the rotating input sets; None, with a
    note, where the profiler fails (no CUPTI, say): the panel is a cross-check, never a reason to fail the run."""
    counter = [0]

    def call() -> torch.Tensor:
        counter[0] += 1
        return fn(*sets[counter[0] % len(sets)])

    try:
        with torch.no_grad():
            return timers.profiler_kernel_us(call, PROFILED_CALLS)
    except Exception as exc:  # noqa: BLE001 - CUPTI missing or held by another profiler: the other figures stand
        torch.cuda.synchronize()
        result.notes.append(f"{timers.NOT_MEASURED} ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")
        return None


def _record_stages(result: RunResult, component: Component, shape: Shape, stage_errs: dict[str, float],
                   stage_measurements: dict[str, Measurement], ceilings: Ceilings | None) -> None:
    """Each stage's samples and metrics, under the stage's name as phase."""
    for stage, sm in stage_measurements.items():
        s_stats = sm.stats
        result.samples.append(Samples(phase=stage, values=sm.samples_us, unit="us"))
        for name in ("median", "p10", "p90"):
            result.metrics.append(Metric(name, getattr(s_stats, name), "us", phase=stage))
        result.metrics.append(Metric("rel_l2_err", stage_errs[stage], "", phase=stage))
        flops_fn, bytes_fn = _stage_counts(component, stage)
        if flops_fn:
            result.metrics += throughput_metrics(flops_fn(shape), bytes_fn(shape), s_stats.median, ceilings,
                                                 shape.dtype, stage)


def _stage_reference(component: Component, naive: torch.nn.Module, stage: str, inputs: tuple) -> torch.Tensor:
    ref_module = copy.deepcopy(naive).float()
    with torch.no_grad():
        return getattr(ref_module, {"patch_embed": "tokens"}[stage])(*(_to(x, dtype=torch.float32)
                                                                      for x in inputs)).float()


def _stage_counts(component: Component, stage: str):
    if component.name == "vit_patch_attention" and stage == "patch_embed":
        from engine.workloads import vit_patch_attention as vit

        return vit.patch_embed_flops, vit.patch_embed_bytes
    return None, None


def levels_job(params: dict, progress: Progress) -> RunResult:
    """Job-runner entry point (engine.runner.jobs runs this in a worker process)."""
    known = set(LevelsConfig.__dataclass_fields__)
    cfg = LevelsConfig(**{k: v for k, v in params.items() if k in known})
    return run_level(cfg, progress)
