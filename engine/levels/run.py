"""Run one level of one component at one shape: check it against the naive module in fp32, then time it.

The reference is the L1 naive module run in fp32 on the same inputs (bf16 inputs upcast exactly). A level passes when
its relative L2 error ‖out − ref‖ / ‖ref‖ is within the component's tolerance for the shape's dtype, on two fresh
input sets; otherwise the run fails with the error. Timing then follows engine.timing (CUDA events per call on the
GPU), rotating over several input sets when one set would sit in L2, and the throughput figures divide the
component's analytic FLOPs and minimum bytes by the median, and by the device ceilings, naming which.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.ceilings import Ceilings, ceiling_metrics, ceilings_for, dtype_key
from engine.envinfo import capture_env
from engine.levels import get_component, get_level
from engine.store import Metric, RunResult, Samples
from engine.timing import time_first_call, time_fn, time_in_graph
from engine.workloads.component import Component, Shape, rel_l2_error, tensor_bytes

Progress = Callable[[float, str], None]
L2_ROTATE_BYTES = 120 << 20  # rotate input sets until the working set is well past an H100/H200's 50–60 MB L2


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
    err = rel_l2_error(out.float(), ref)
    if not err <= tol:  # NaN/inf give inf and fail here
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


def run_level(cfg: LevelsConfig, progress: Progress = lambda f, m: None) -> RunResult:
    component = get_component(cfg.component)
    shape = component.shape(cfg.shape)
    level = get_level(cfg.level)
    device = cfg.device
    if not shape.runs_on(device):
        raise ValueError(f"shape {shape.name} of {component.name} is meant for {', '.join(shape.devices)}, not "
                         f"{device}")
    ok, reason = level.available(device)
    if not ok:
        raise RuntimeError(f"level {level.key} is not available on {device}: {reason}")
    result = RunResult(env=capture_env(device))
    progress(0.02, "ceilings")
    ceilings = ceilings_for(device, cfg.db, quick=cfg.quick_ceilings) if cfg.db else None

    progress(0.05, f"inputs for {shape.label()}")
    sets = _input_sets(component, shape, device, cfg.seed)
    torch.manual_seed(cfg.seed)
    naive = component.make_naive(shape).to(device=device)
    naive = naive.to(dtype=shape.torch_dtype) if any(True for _ in naive.parameters()) else naive
    naive.eval()
    tol = component.tolerance(shape)

    progress(0.1, f"building {level.key}")
    with torch.no_grad():
        refs = [reference_output(component, shape, naive, sets[i]) for i in range(min(2, len(sets)))]
        built_holder: list = []
        build_us = time_first_call(lambda: built_holder.append(level.build(component, shape, naive, device)),
                                   device)
        built = built_holder[0]
        outputs: list[torch.Tensor] = []
        first_us = time_first_call(lambda: outputs.append(built.fn(*sets[0])), device)
        progress(0.3, f"checking {level.key} against the naive fp32 reference")
        what = f"{level.key} on {component.name} {shape.name}"
        err = check(what, outputs[0], refs[0], tol)
        if len(refs) > 1:
            err = max(err, check(what + " (second input set)", built.fn(*sets[1]), refs[1], tol))
        del outputs
        stage_checks: dict[str, float] = {}
        for stage, stage_fn in built.stages.items():
            stage_ref = _stage_reference(component, naive, stage, sets[0])
            stage_checks[stage] = check(f"{what} stage {stage}", stage_fn(*sets[0]), stage_ref, tol)

        progress(0.4, f"timing {level.key}")
        counter = [0]

        def call() -> torch.Tensor:
            counter[0] += 1
            return built.fn(*sets[counter[0] % len(sets)])

        m = time_fn(call, device, warmup=cfg.warmup, iters=cfg.iters, first_call=False)
        stage_measurements = {}
        for i, (stage, stage_fn) in enumerate(built.stages.items()):
            progress(0.8, f"timing stage {stage}")
            stage_counter = [0]

            def stage_call(fn=stage_fn, c=stage_counter) -> torch.Tensor:
                c[0] += 1
                return fn(*sets[c[0] % len(sets)])

            stage_fn(*sets[0])  # compile/warm outside the timed loop
            stage_measurements[stage] = time_fn(stage_call, device, warmup=cfg.warmup, iters=cfg.iters,
                                                first_call=False)

    phase = "forward"
    stats = m.stats
    result.samples.append(Samples(phase=phase, values=m.samples_us, unit="us"))
    for name in ("median", "p10", "p90", "p25", "p75", "iqr", "mean", "std", "min", "max"):
        result.metrics.append(Metric(name, getattr(stats, name), "us", phase=phase))
    result.metrics += [Metric("first_call", first_us, "us", phase=phase),
                       Metric("build", build_us, "us", phase=phase),
                       Metric("rel_l2_err", err, "", phase=phase), Metric("tolerance", tol, "", phase=phase),
                       Metric("interpreted", float(built.interpreted), "", phase=phase),
                       Metric("input_sets", len(sets), "", phase=phase)]
    result.metrics += throughput_metrics(component.flops(shape), component.min_bytes(shape), stats.median, ceilings,
                                         shape.dtype, phase)
    if device.startswith("cuda"):
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
    for stage, sm in stage_measurements.items():
        s_stats = sm.stats
        result.samples.append(Samples(phase=stage, values=sm.samples_us, unit="us"))
        for name in ("median", "p10", "p90"):
            result.metrics.append(Metric(name, getattr(s_stats, name), "us", phase=stage))
        result.metrics.append(Metric("rel_l2_err", stage_checks[stage], "", phase=stage))
        flops_fn, bytes_fn = _stage_counts(component, stage)
        if flops_fn:
            result.metrics += throughput_metrics(flops_fn(shape), bytes_fn(shape), s_stats.median, ceilings,
                                                 shape.dtype, stage)
    result.metrics += ceiling_metrics(ceilings, ("copy_bw", f"matmul_{dtype_key(shape.dtype)}", "launch_us"))
    result.notes += [n for n in built.notes if n not in result.notes]
    if len(sets) > 1:
        result.notes.append(f"timed over {len(sets)} rotating input sets so repeated calls do not run from L2")
    return result


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
    """Job-runner entry point (engine.jobs runs this in a worker process)."""
    known = set(LevelsConfig.__dataclass_fields__)
    cfg = LevelsConfig(**{k: v for k, v in params.items() if k in known})
    return run_level(cfg, progress)
