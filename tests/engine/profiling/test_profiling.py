"""Profiling: real CPU profiles (trace, op_stats, the sum check), trace analysis on a synthetic GPU trace, the
two-profile comparison, the Nsight Compute command and CSV parser, persistence, and the CLI through the job runner.

The CUDA tests at the end run only where torch sees a GPU (the lead's H100 check); everything else runs on the CPU.
"""

from __future__ import annotations

import gzip
import json
import stat
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from engine.cli import main as cli
from engine.measure.op_stats import (
    SUM_TOLERANCE,
    analyze,
    base_name,
    comparable_kinds,
    compare,
    compare_metrics,
    kernel_label,
    load_trace,
    short_name,
    union_length,
)
from engine.profiling import ncu
from engine.profiling import profile as profiling
from engine.profiling.profile import ProfileConfig, adaptive_active, judge_profile, profile_mode
from engine.store import settings
from engine.store.db import RunResult, Samples, Store

CUDA = torch.cuda.is_available()


def by_phase(result: RunResult, phase: str) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics if m.phase == phase}


# -- real CPU profiles ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    """eager (train + infer) and fx (train), profiled once for the module: a few seconds in all."""
    out = {}
    for mode, phases in (("eager", ("train", "infer")), ("fx", ("train",))):
        folder = tmp_path_factory.mktemp(f"profile-{mode}")
        out[mode] = profile_mode(ProfileConfig(mode=mode, device="cpu", phases=phases, wait=1, warmup=1, active=3,
                                               settle=1, artifacts_dir=str(folder)))
    return out


def test_trace_artifact_is_valid_json_with_cpu_events(cpu_profiles):
    result = cpu_profiles["eager"]
    traces = {a.name: Path(a.path) for a in result.artifacts if a.kind == "chrome_trace"}
    assert set(traces) == {"trace-train.json.gz", "trace-infer.json.gz"}
    for path in traces.values():
        with gzip.open(path, "rt") as f:
            trace = json.load(f)  # plain JSON inside the gzip: what Perfetto and chrome://tracing load
        events = trace["traceEvents"]
        steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
        assert len(steps) == 3  # the active steps only (wait and warm-up are discarded)
        ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
        assert any(e["name"] == "aten::addmm" for e in ops)
        assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in ops)
        assert any("Input Dims" in e.get("args", {}) for e in ops)  # shapes recorded


def test_op_stats_add_up_to_the_profiled_time(cpu_profiles):
    """Self times of the host rows sum to the active steps' wall time (CPU: one thread) within SUM_TOLERANCE."""
    for mode, result in cpu_profiles.items():
        rows = pd.DataFrame(result.op_stats)
        for phase in rows["phase"].unique():
            m = by_phase(result, phase)
            host = rows[(rows["phase"] == phase) & (rows["device"] == "cpu")]
            total = host["self_us"].sum()
            assert abs(total - m["profiled_wall_us"]) <= SUM_TOLERANCE * m["profiled_wall_us"], (mode, phase)
            assert abs(total - m["cpu_time_us"]) < 1e-6 * max(total, 1.0)
            ops = host[host["kind"] == "operator"]["self_us"].sum()
            assert 0 < ops <= m["profiled_wall_us"] * (1 + 1e-9)
            assert m["steps"] == 3
            assert (host["total_us"] >= host["self_us"] - 1e-6).all()


def test_cpu_profile_rows_and_figures(cpu_profiles):
    result = cpu_profiles["eager"]
    rows = pd.DataFrame(result.op_stats)
    assert set(rows["device"]) == {"cpu"} and "kernel" not in set(rows["kind"])
    train = rows[rows["phase"] == "train"].set_index("name")
    assert train.loc["aten::addmm", "calls"] == 3 * 3  # three Linear layers, three active steps
    assert "[64,5]" in train.loc["aten::addmm", "input_shapes"]
    assert "ProfilerStep*" in train.index  # untracked host time has its own row, as in key_averages
    m = by_phase(result, "train")
    for device_only in ("device_busy_us", "idle_fraction", "kernel_launches", "cpu_launch_us"):
        assert device_only not in m  # not applicable on CPU: absent, not zero
    assert m["step_wall_us"] == pytest.approx(m["profiled_wall_us"] / 3)
    assert by_phase(result, "infer")["op_calls"] < m["op_calls"]  # no backward, no optimizer
    assert result.env.get("torch") and not result.kernel_metrics


def test_profiled_steps_are_kept_and_judged(cpu_profiles):
    result = cpu_profiles["eager"]
    series = {s.phase: s.values for s in result.samples}
    assert set(series) == {"train_profiled", "train", "infer_profiled", "infer"}
    for phase in ("train", "infer"):
        m, walls = by_phase(result, phase), series[f"{phase}_profiled"]
        assert len(walls) == m["steps"] == 3
        assert sum(walls) == pytest.approx(m["profiled_wall_us"])
        assert [m[f"step_wall_{q}_us"] for q in ("p10", "median", "p90")] == pytest.approx(
            np.percentile(walls, [10, 50, 90]))
    rows = pd.DataFrame(result.op_stats)
    assert (rows["self_p10_us"] <= rows["self_p90_us"] + 1e-9).all()
    assert (rows["self_p90_us"] <= rows["self_us"] + 1e-9).all()  # a step's share is at most the total
    entries = [(e["phase"], e["series"]) for e in result.conditions["series"]]
    assert entries == [("train", "profiled steps"), ("train", "unprofiled steps"), ("infer", "profiled steps"),
                       ("infer", "unprofiled steps")]
    assert all(e["conditions"] is not None for e in result.conditions["series"])  # the window around them


def test_default_schedule_profiles_at_least_ten_small_steps(tmp_path):
    result = profile_mode(ProfileConfig(mode="eager", phases=("infer",), settle=3, unprofiled_iters=5,
                                        artifacts_dir=str(tmp_path)))
    steps = by_phase(result, "infer")["steps"]
    assert 10 <= steps <= profiling.MAX_ACTIVE  # a house-price forward takes about a millisecond


def test_one_slow_profiled_step_flags_the_profile(tmp_path, monkeypatch):
    """A step that sleeps 80 ms once among twelve profiled ones: the profile says it is disturbed and why."""
    import time

    real = profiling.build_step
    calls = [0]

    def with_a_slow_step(*args, **kwargs):
        step, prepared = real(*args, **kwargs)

        def maybe_slow():
            calls[0] += 1
            if calls[0] == 8:  # first call 1, settle 2, warm-up 3, active 4-15
                time.sleep(0.08)
            return step()
        return maybe_slow, prepared

    monkeypatch.setattr(profiling, "build_step", with_a_slow_step)
    result = profile_mode(ProfileConfig(mode="eager", phases=("infer",), wait=0, warmup=1, active=12, settle=1,
                                        unprofiled_iters=5, artifacts_dir=str(tmp_path)))
    walls = next(s.values for s in result.samples if s.phase == "infer_profiled")
    assert len(walls) == 12 and max(walls) >= 80_000
    profiled = next(e for e in result.conditions["series"] if e["series"] == "profiled steps")
    assert any(f.startswith("the mean step is") for f in profiled["flags"])
    blamed = any("other processes" in f or "waited for a CPU" in f for f in profiled["flags"])
    assert profiled["state"] == ("interfered" if blamed else "noisy")
    assert any(n.startswith(f"infer: the profile is disturbed: its profiled steps are {profiled['state']}")
               and "the mean step is" in n for n in result.notes)


def test_nvtx_ranges_label_every_phase(tmp_path, monkeypatch):
    """First call, settle, each profiler step with its schedule state, and forward/backward/optimizer inside."""
    import contextlib

    from engine.measure import nvtx_ranges

    names: list[str] = []

    @contextlib.contextmanager
    def record(name):
        names.append(name)
        yield

    monkeypatch.setattr(nvtx_ranges, "range", record)
    profile_mode(ProfileConfig(mode="eager", phases=("train", "infer"), wait=1, warmup=1, active=1, settle=1,
                               unprofiled_iters=2, artifacts_dir=str(tmp_path)))
    assert names[:2] == ["profile eager train B=64", "first_call"]
    for expected in ("settle", "profiler step 0 (wait)", "profiler step 1 (warmup)", "profiler step 2 (active)",
                     "unprofiled timing", "forward", "backward", "optimizer_step", "profile eager infer B=64"):
        assert expected in names, expected
    # train only: first call, settle, three scheduled steps, two timed without the profiler
    assert names.count("backward") == 1 + 1 + 3 + 2
    assert names.count("forward") == 2 * 7


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_self_times_match_torch_key_averages(tmp_path):
    """The trace-derived self time per operator agrees with torch.profiler's own key_averages()."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    x = torch.randn(32, 5)
    path = tmp_path / "t.json.gz"
    averages = []

    def ready(prof: torch.profiler.profile) -> None:  # the profiler clears its events after the cycle
        prof.export_chrome_trace(str(path))
        averages.extend(prof.key_averages())

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                                on_trace_ready=ready) as prof:
        for _ in range(4):
            model(x).sum().backward()
            prof.step()
    ours = {r["name"]: r for r in analyze(load_trace(path)).op_stats if r["kind"] == "operator"}
    theirs: dict[str, list[float]] = {}  # key_averages may split one name by overload: add those up
    for e in averages:
        if e.key in ours:
            calls, self_us = theirs.get(e.key, [0, 0.0])
            theirs[e.key] = [calls + e.count, self_us + e.self_cpu_time_total]
    assert {"aten::addmm", "aten::relu", "aten::sum"} <= set(theirs)
    for name, (calls, self_us) in theirs.items():
        assert ours[name]["calls"] == calls, name
        assert ours[name]["self_us"] == pytest.approx(self_us, rel=0.1, abs=5.0), name


# -- a GPU trace, by hand -------------------------------------------------------------------------------------------
def gpu_trace() -> dict:
    """Two steps of a Kineto-style CUDA trace: ops launch kernels (External id links them), one CUDA graph replay."""
    H, D = {"pid": 100, "tid": 100}, {"pid": 0, "tid": 7}
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 100, **H, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 10, "dur": 30, **H,
         "args": {"External id": 1, "Input Dims": [[256], [64, 5], [5, 256]]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 8, **H,
         "args": {"External id": 1, "correlation": 11}},
        {"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float, 128>(float*, int)", "ts": 30, "dur": 20, **D,
         "args": {"External id": 1, "correlation": 11}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 50, "dur": 20, **H, "args": {"External id": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 55, "dur": 5, **H,
         "args": {"External id": 2, "correlation": 12}},
        {"ph": "X", "cat": "kernel", "name": "void at::native::relu_kernel<4>(int)", "ts": 60, "dur": 10, **D,
         "args": {"External id": 2, "correlation": 12}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 65, "dur": 10, **D,
         "args": {"External id": 2}},  # overlaps relu_kernel by 5 µs: the union counts it once
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": 100, "dur": 100, **H, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 110, "dur": 12, **H,
         "args": {"External id": 3, "correlation": 13}},
        {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_relu_0", "ts": 130, "dur": 30, **D,
         "args": {"correlation": 13}},
        {"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float, 128>(float*, int)", "ts": 170, "dur": 40, **D,
         "args": {"correlation": 13}},  # ends after the last step: the window stretches to 210
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#4", "ts": 100, "dur": 110, **D, "args": {}},
        {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 20, **H, "id": 11},
        {"ph": "M", "name": "process_name", **H, "args": {"name": "python"}},
    ]
    return {"schemaVersion": 1, "traceEvents": ev}


def test_gpu_trace_busy_idle_launches_and_kernels():
    a = analyze(gpu_trace(), "train")
    m = a.metrics
    assert a.has_device
    assert m["steps"] == 2 and m["profiled_wall_us"] == 200
    # Busy: [30,50] ∪ [60,75] ∪ [130,160] ∪ [170,210] = 20 + 15 + 30 + 40 = 105 over a 0–210 window.
    assert m["device_window_us"] == 210 and m["device_busy_us"] == 105 and m["device_idle_us"] == 105
    assert m["idle_fraction"] == pytest.approx(0.5)
    assert m["kernels"] == 4 and m["kernels_per_step"] == 2
    assert m["kernel_launches"] == 3 and m["launches_per_step"] == 1.5  # the graph replay is one launch
    assert m["cpu_launch_us"] == 8 + 5 + 12
    assert m["kernel_us"] == 100 and m["memcpy_us"] == 10
    rows = {(r["kind"], r["name"]): r for r in a.op_stats}
    gemm = rows[("kernel", "void gemm_kernel<float, 128>(float*, int)")]
    assert gemm["calls"] == 2 and gemm["self_us"] == 60 and gemm["device"] == "cuda" and gemm["parent"] == "aten::addmm"
    assert rows[("operator", "aten::addmm")]["self_us"] == 30 - 8  # the launch call is its child
    assert rows[("operator", "aten::addmm")]["device_us"] == 20
    assert rows[("operator", "aten::relu")]["device_us"] == 20  # its kernel and its copy
    assert rows[("annotation", "ProfilerStep*")]["calls"] == 2
    assert rows[("memcpy", "Memcpy DtoD (Device -> Device)")]["device"] == "cuda"
    # Device rows' self times add up to the device's busy time (the copy's 5 µs under relu_kernel counted once),
    # their total times to the work's whole durations; host rows to the host's time.
    assert rows[("memcpy", "Memcpy DtoD (Device -> Device)")]["self_us"] == 5
    assert rows[("memcpy", "Memcpy DtoD (Device -> Device)")]["total_us"] == 10
    assert sum(r["self_us"] for r in a.op_stats if r["device"] == "cuda") == m["device_busy_us"]
    assert sum(r["total_us"] for r in a.op_stats if r["device"] == "cuda") == m["kernel_us"] + m["memcpy_us"]
    assert m["device_overlap_us"] == 5 and any("overlap" in n for n in a.notes)
    assert sum(r["self_us"] for r in a.op_stats if r["device"] == "cpu") == pytest.approx(m["profiled_wall_us"])


def test_kernels_started_early_count_only_the_time_they_add():
    """Programmatic dependent launch: each GEMV starts while the one before drains and waits inside for it, so its
    duration includes that wait. Self time is the critical path (what the kernel adds after the one before ends);
    the real 1B step showed it: the gate_up GEMV's durations averaged 30.6 µs, its added time 24.0. Two GPUs (pids)
    are separate paths."""
    D = {"pid": 0, "tid": 7}

    def kernel(name: str, ts: float, dur: float, pid: int = 0) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, **{**D, "pid": pid}, "args": {}}

    trace = [kernel("qkv", 0, 6), kernel("attention", 2, 7), kernel("o_proj", 7, 5), kernel("gate_up", 9, 30),
             kernel("down", 10, 25),  # wholly inside gate_up: adds nothing
             kernel("qkv", 3, 6, pid=1)]  # another GPU: its own path, nothing covers it
    a = analyze(trace)
    rows = {r["name"]: r for r in a.op_stats}
    assert {n: rows[n]["self_us"] for n in ("attention", "o_proj", "gate_up", "down")} == {
        "attention": 3, "o_proj": 3, "gate_up": 27, "down": 0}
    assert rows["qkv"]["self_us"] == 6 + 6 and rows["qkv"]["total_us"] == 12
    assert rows["gate_up"]["total_us"] == 30
    gpu0 = [r for r in a.op_stats if r["device"] == "cuda"]
    assert sum(r["self_us"] for r in gpu0) == 39 + 6  # busy [0, 39] on GPU 0, [3, 9] on GPU 1
    no_overlap = analyze([kernel("a", 0, 4), kernel("b", 4, 5), kernel("c", 12, 1)])
    assert [r["self_us"] for r in no_overlap.op_stats] == [5, 4, 1] and not no_overlap.notes


def test_interval_union_and_overhanging_children():
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_length([(0, 10), (5, 15), (20, 30)], lo=8, hi=25) == 12
    assert union_length([]) == 0
    # A child whose end overhangs its parent's by rounding is clipped, so self time never goes negative.
    trace = [{"ph": "X", "cat": "cpu_op", "name": "outer", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
             {"ph": "X", "cat": "cpu_op", "name": "inner", "ts": 4, "dur": 6.001, "pid": 1, "tid": 1}]
    rows = {r["name"]: r for r in analyze(trace).op_stats}
    assert rows["outer"]["self_us"] == pytest.approx(4) and rows["inner"]["self_us"] == pytest.approx(6.001)
    # An op whose only child is the same op (another overload) counts once, as in key_averages.
    trace = [{"ph": "X", "cat": "cpu_op", "name": "aten::sum", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
             {"ph": "X", "cat": "cpu_op", "name": "aten::sum", "ts": 1, "dur": 8, "pid": 1, "tid": 1},
             {"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "ts": 2, "dur": 3, "pid": 1, "tid": 1}]
    rows = {r["name"]: r for r in analyze(trace).op_stats}
    assert rows["aten::sum"]["calls"] == 1 and rows["aten::sum"]["self_us"] == pytest.approx(7)
    assert rows["aten::sum"]["total_us"] == 10


def host_steps(per_step: list[dict[str, float]], gap: float = 0.0) -> dict:
    """A CPU trace of one ProfilerStep#N per entry of `per_step` (op name → its self time in that step), the ops
    back to back inside each step, `gap` µs of Python after them."""
    H = {"pid": 1, "tid": 1}
    events, t = [], 0.0
    for i, ops in enumerate(per_step):
        wall = sum(ops.values()) + gap
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 2}", "ts": t, "dur": wall,
                       **H, "args": {}})
        at = t
        for name, dur in ops.items():
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": at, "dur": dur, **H, "args": {}})
            at += dur
        t += wall + 1.0  # the profiler's own gap between steps
    return {"traceEvents": events}


def test_per_step_and_per_op_spread_from_a_synthetic_trace():
    mm = [10.0, 20.0, 30.0, 40.0, 100.0]
    steps = [{"aten::mm": v, **({"aten::relu": 5.0} if i < 2 else {})} for i, v in enumerate(mm)]
    a = analyze(host_steps(steps, gap=2.0), "train")
    walls = [v + (5.0 if i < 2 else 0.0) + 2.0 for i, v in enumerate(mm)]
    assert a.step_walls_us == walls and not a.device_busy_steps_us
    p10, p50, p90 = np.percentile(walls, [10, 50, 90])
    m = a.metrics
    assert (m["step_wall_p10_us"], m["step_wall_median_us"], m["step_wall_p90_us"]) == (p10, p50, p90)
    assert "device_busy_p10_us" not in m  # no device: absent, not zero
    rows = {r["name"]: r for r in a.op_stats}
    assert (rows["aten::mm"]["self_p10_us"], rows["aten::mm"]["self_p90_us"]) == tuple(np.percentile(mm, [10, 90]))
    relu = [5.0, 5.0, 0.0, 0.0, 0.0]  # a step without the op counts 0 for it
    assert (rows["aten::relu"]["self_p10_us"], rows["aten::relu"]["self_p90_us"]) == tuple(
        np.percentile(relu, [10, 90]))
    assert rows["ProfilerStep*"]["self_p10_us"] == rows["ProfilerStep*"]["self_p90_us"] == 2.0
    assert rows["aten::mm"]["self_p10_us"] <= rows["aten::mm"]["self_us"] / 5 <= rows["aten::mm"]["self_p90_us"]


def test_device_busy_per_step_follows_the_launching_step():
    a = analyze(gpu_trace(), "train")
    # Step 1 launched gemm [30,50] and relu [60,70] ∪ memcpy [65,75]: 35 µs; step 2's graph replay ran [130,160] and
    # [170,210] (the last one after the step's host end still counts in its step): 70 µs.
    assert a.device_busy_steps_us == [35.0, 70.0]
    assert a.metrics["device_busy_p10_us"] == pytest.approx(35 + 0.1 * 35)
    assert a.metrics["device_busy_p90_us"] == pytest.approx(35 + 0.9 * 35)
    gemm = next(r for r in a.op_stats if r["name"].startswith("void gemm_kernel"))
    assert (gemm["self_p10_us"], gemm["self_p90_us"]) == pytest.approx((20 + 0.1 * 20, 20 + 0.9 * 20))


def test_a_profile_with_one_slow_step_is_noisy_and_says_why():
    steady = [1000.0 + 5 * i for i in range(12)]
    slow = steady[:6] + [50_000.0] + steady[7:]
    quiet = judge_profile([Samples("train_profiled", steady), Samples("train", steady)], [])
    assert quiet["state"] == "clean" and quiet["flags"] == []
    assert [e["series"] for e in quiet["series"]] == ["profiled steps", "unprofiled steps"]
    record = judge_profile([Samples("train_profiled", slow), Samples("train", steady)], [])
    assert record["state"] == "noisy"
    profiled, unprofiled = record["series"]
    assert profiled["state"] == "noisy" and unprofiled["state"] == "clean"
    (flag,) = record["flags"]  # p90/p10 and the IQR do not see one step in 12; the mean does
    assert flag.startswith(f"train profiled steps: the mean step is {np.mean(slow) / np.median(slow):.2f}× the "
                           f"median (the slowest {50_000 / np.median(slow):.1f}×)")
    (note,) = profiling.disturbed_notes(record)
    assert note.startswith("train: the profile is disturbed: its profiled steps are noisy (the mean step is")


def test_adaptive_schedule_takes_more_steps_when_the_step_is_fast():
    cfg = ProfileConfig()
    assert cfg.active is None
    assert adaptive_active(0.0005, cfg) == profiling.MAX_ACTIVE
    assert adaptive_active(0.1, cfg) == int(profiling.BUDGET_S / (profiling.PROFILER_COST * 0.1))
    assert adaptive_active(3.0, cfg) == profiling.MIN_ACTIVE
    assert adaptive_active(3.0, ProfileConfig(active=7)) == 7
    assert adaptive_active(0.1, ProfileConfig(budget_s=20.0, max_active=12)) == 12
    with pytest.raises(ValueError, match="max_active"):
        ProfileConfig(max_active=2).validate()


def test_kernel_names():
    assert base_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                     "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
                     ) == "vectorized_elementwise_kernel"
    assert base_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)") == \
        "cunn_SoftMaxForward"
    assert base_name("triton_poi_fused_addmm_relu_0") == "triton_poi_fused_addmm_relu_0"
    assert kernel_label("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>)") == \
        "vectorized_elementwise_kernel<CUDAFunctor_add>(…)"
    assert kernel_label("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::"
                        "func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::"
                        "TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(int)") == \
        "reduce_kernel<sum_functor>(…)"
    long = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_" + "x" * 200 + ">(Params)"
    assert len(short_name(long, 40)) <= 40 and short_name("aten::mm") == "aten::mm"


# -- comparison -----------------------------------------------------------------------------------------------------
def test_comparison_lists_kernels_fused_away_and_new():
    eager = pd.DataFrame([
        {"kind": "kernel", "device": "cuda", "name": "gemm", "calls": 10, "self_us": 100.0},
        {"kind": "kernel", "device": "cuda", "name": "relu_kernel", "calls": 10, "self_us": 40.0},
        {"kind": "kernel", "device": "cuda", "name": "add_bias", "calls": 5, "self_us": 10.0},
        {"kind": "operator", "device": "cpu", "name": "aten::relu", "calls": 10, "self_us": 90.0},
    ])
    compiled = pd.DataFrame([
        {"kind": "kernel", "device": "cuda", "name": "gemm", "calls": 20, "self_us": 180.0},
        {"kind": "kernel", "device": "cuda", "name": "triton_poi_fused_addmm_relu_0", "calls": 10, "self_us": 30.0},
    ])
    kinds = comparable_kinds(["cuda", "cuda:0"])
    assert "kernel" in kinds and comparable_kinds(["cpu", "cuda"]) == ("operator",)
    table = compare(eager, compiled, kinds, steps_a=5, steps_b=10)
    where = dict(zip(table["name"], table["where"]))
    assert where == {"relu_kernel": "only in A", "add_bias": "only in A",
                     "triton_poi_fused_addmm_relu_0": "only in B", "gemm": "both"}
    assert list(table["where"]) == ["only in A", "only in A", "only in B", "both"]  # removed first, largest first
    gemm = table.set_index("name").loc["gemm"]
    assert (gemm["calls_a"], gemm["calls_b"]) == (2, 2)  # per step
    assert gemm["self_us_a"] == 20 and gemm["self_us_b"] == 18 and gemm["delta_us"] == -2
    figures = compare_metrics({"launches_per_step": 30, "idle_fraction": 0.9, "steps": 5},
                              {"launches_per_step": 3, "idle_fraction": 0.4, "steps": 5}).set_index("key")
    assert figures.loc["launches_per_step", "ratio_b_over_a"] == pytest.approx(0.1)
    assert "device_busy_per_step_us" not in figures.index


def test_comparison_of_real_cpu_profiles_lists_operators(cpu_profiles):
    a, b = (pd.DataFrame(cpu_profiles[m].op_stats) for m in ("eager", "fx"))
    table = compare(a[a["phase"] == "train"], b, comparable_kinds(["cpu", "cpu"]), 3, 3)
    both = table[table["where"] == "both"]
    assert {"aten::addmm", "aten::mm"} <= set(both["name"])  # FX re-emits the same ATen calls
    assert (both.set_index("name").loc["aten::addmm", ["calls_a", "calls_b"]] == 3).all()


# -- Nsight Compute -------------------------------------------------------------------------------------------------
NCU_DETAILS = """==PROF== Connected to process 4242 (/usr/bin/python3.11)
==PROF== Profiling "ampere_sgemm_32x32_sliced1x4_tn" - 0: 0%....50%....100% - 1 pass
==PROF== Profiling "vectorized_elementwise_kernel" - 1: 0%....50%....100% - 1 pass
==PROF== Profiling "ampere_sgemm_32x32_sliced1x4_tn" - 2: 0%....50%....100% - 1 pass
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.11","127.0.0.1","ampere_sgemm_32x32_sliced1x4_tn","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","1.52"
"0","4242","python3.11","127.0.0.1","ampere_sgemm_32x32_sliced1x4_tn","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","5.12"
"0","4242","python3.11","127.0.0.1","ampere_sgemm_32x32_sliced1x4_tn","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","10.20"
"1","4242","python3.11","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char *, 3>>(int, T2, T3)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","0.81"
"1","4242","python3.11","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char *, 3>>(int, T2, T3)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2,080"
"1","4242","python3.11","127.0.0.1","void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char *, 3>>(int, T2, T3)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","0.95"
"2","4242","python3.11","127.0.0.1","ampere_sgemm_32x32_sliced1x4_tn","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","1.48"
"2","4242","python3.11","127.0.0.1","ampere_sgemm_32x32_sliced1x4_tn","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","4,880"
"2","4242","python3.11","127.0.0.1","ampere_sgemm_32x32_sliced1x4_tn","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","n/a"
"""

NCU_RAW = """"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__throughput.avg.pct_of_peak_sustained_elapsed"
"","","","msecond","%","%"
"0","7","triton_poi_fused_relu_0","0.003","12.5","30.0"
"""


def test_ncu_csv_parser_details_page():
    raw = ncu.parse_csv(NCU_DETAILS)
    assert len(raw) == 9 and {r["metric"] for r in raw} == set(ncu.METRICS)
    rows = {r["kernel"]: r for r in ncu.summarize(raw, "train")}
    gemm = rows["ampere_sgemm_32x32_sliced1x4_tn"]
    assert gemm["launches"] == 2 and gemm["phase"] == "train"
    assert gemm["duration_us"] == pytest.approx((5.12 + 4.88) / 2)  # usecond and nsecond (with a comma) → µs
    assert gemm["mem_throughput_pct"] == pytest.approx(1.5)
    assert gemm["sm_throughput_pct"] == pytest.approx(10.2)  # the n/a launch is left out of the mean
    add = next(r for k, r in rows.items() if "vectorized_elementwise_kernel" in k)
    assert add["duration_us"] == pytest.approx(2.08) and add["launches"] == 1
    assert json.loads(add["metrics"])["gpu__time_duration.sum"]["unit"] == "us"
    assert list(rows) == list(rows)[:2] and ncu.summarize(raw)[0]["kernel"] == gemm["kernel"]  # longest first


def test_ncu_csv_parser_raw_page_and_garbage():
    rows = ncu.summarize(ncu.parse_csv(NCU_RAW))
    assert rows == [{"phase": None, "kernel": "triton_poi_fused_relu_0", "launches": 1, "duration_us": 3.0,
                     "mem_throughput_pct": 12.5, "sm_throughput_pct": 30.0, "metrics": rows[0]["metrics"]}]
    assert ncu.parse_csv("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n") == []
    assert ncu.parse_csv("") == []


def test_ncu_command():
    kernels = ["void at::native::vectorized_elementwise_kernel<4, X>(int, X)", "triton_poi_fused_relu_0",
               "void at::native::vectorized_elementwise_kernel<2, Y>(int, Y)"]
    args = ncu.target_args("house_price", "eager", "cuda", "train", 64, settle=4, steps=1)
    cmd = ncu.build_command(kernels, args, ncu="/opt/ncu", python="/venv/python", log_file="/tmp/n.csv")
    assert cmd[0] == "/opt/ncu"
    flags = " ".join(cmd)
    for part in ("--clock-control none", "--target-processes all", "--profile-from-start off", "--csv",
                 "--log-file /tmp/n.csv", "--metrics " + ",".join(ncu.METRICS),
                 "-k regex:triton_poi_fused_relu_0|vectorized_elementwise_kernel",
                 "/venv/python -m engine.profiling.ncu --workload house_price --mode eager --device cuda --phase train "
                 "--batch-size 64 --settle 4 --steps 1"):
        assert part in flags, part
    assert set(ncu.METRICS) == {"gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                "sm__throughput.avg.pct_of_peak_sustained_elapsed"}
    with pytest.raises(ValueError):
        ncu.kernel_regex([])


def test_ncu_availability(monkeypatch):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    assert ncu.unavailable("cuda") == ncu.NOT_FOUND == "Nsight Compute (ncu) not found on PATH"
    assert ncu.run_deep_profile(workload="house_price", mode="eager", device="cuda", phase="train", batch_size=64,
                                kernels=["k"], out_dir=Path("/nonexistent")).notes == [ncu.NOT_FOUND]
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/local/cuda/bin/ncu")
    assert ncu.unavailable("cuda:0") is None
    assert "CUDA" in ncu.unavailable("cpu")


def test_deep_targets_pick_kernels_longest_first_or_say_why_not(monkeypatch):
    rows = [{"kind": "kernel", "name": "short", "self_us": 1.0}, {"kind": "op", "name": "aten::mm", "self_us": 9.0},
            {"kind": "kernel", "name": "long", "self_us": 5.0}]
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/local/cuda/bin/ncu")
    assert ncu.deep_targets("cuda", rows, "train") == (["long", "short"], None)
    assert ncu.deep_targets("cuda", rows[1:2], "decode") == (
        [], "deep profile of decode skipped: the profile recorded no kernels")
    kernels, reason = ncu.deep_targets("cpu", rows, "train")
    assert kernels == [] and reason.startswith("deep profile skipped: ") and "CUDA" in reason
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    assert ncu.deep_targets("cuda", rows, "train") == ([], f"deep profile skipped: {ncu.NOT_FOUND}")


def test_deep_profile_runs_ncu_and_parses_its_log(tmp_path):
    """The subprocess plumbing, with a stand-in `ncu` that writes the sample CSV to --log-file."""
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
                    f"open(args[args.index('--log-file') + 1], 'w').write({NCU_DETAILS!r})\n"
                    "print('target args:', args[args.index('-m') + 1:])\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    deep = ncu.run_deep_profile(workload="house_price", mode="eager", device="cuda", phase="train", batch_size=64,
                                kernels=["ampere_sgemm_32x32_sliced1x4_tn"], out_dir=tmp_path / "out", ncu=str(fake))
    assert not deep.notes, deep.notes
    assert [r["kernel"] for r in deep.rows][0] == "ampere_sgemm_32x32_sliced1x4_tn"
    assert {p.name for p in deep.files} == {"ncu-train.csv", "ncu-train.log"}
    assert "engine.profiling.ncu" in (tmp_path / "out" / "ncu-train.log").read_text()
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('==ERROR== ERR_NVGPUCTRPERM - no permission')\n"
                    "sys.exit(1)\n")
    deep = ncu.run_deep_profile(workload="house_price", mode="eager", device="cuda", phase="train", batch_size=64,
                                kernels=["k"], out_dir=tmp_path / "out2", ncu=str(fake))
    assert not deep.rows and "ERR_NVGPUCTRPERM" in deep.notes[0]


# -- persistence, job runner and CLI --------------------------------------------------------------------------------
def test_op_stats_and_kernel_metrics_round_trip_through_the_store(store: Store):
    result = RunResult(op_stats=analyze(gpu_trace(), "train").op_stats,
                       kernel_metrics=ncu.summarize(ncu.parse_csv(NCU_DETAILS), "train"))
    result = RunResult.from_json(result.to_json())
    run_id = store.create_run("profile", "house_price", "eager", "cuda")
    store.record_result(run_id, result)
    stats = store.op_stats([run_id])
    assert len(stats) == len(result.op_stats) and stats["self_us"].is_monotonic_decreasing
    assert set(stats.columns) >= {"run_id", "phase", "kind", "device", "name", "calls", "self_us", "total_us"}
    assert store.op_stats([run_id], "infer").empty and store.op_stats([]).empty
    kernels = store.kernel_metrics([run_id])
    assert len(kernels) == 2 and kernels["duration_us"].iloc[0] == pytest.approx(5.0)
    assert store.run(run_id)["status"] == "ok"


def test_profile_is_a_registered_job_and_command():
    from engine.runner import kinds

    assert kinds.get("profile").target == "engine.profiling.profile:profile_job"
    assert "engine.cli.profile" in cli.COMMAND_MODULES


def test_cli_profile_runs_in_a_worker_and_lands_in_the_store(lab_env, capsys):
    assert cli.main(["profile", "--mode", "eager", "--device", "cpu", "--active", "2", "--warmup", "1",
                     "--db", lab_env["RESULTS_DB"]]) == 0
    out = capsys.readouterr().out
    assert "not applicable on CPU" in out and "aten::addmm" in out and "trace-train.json.gz" in out
    store = Store(lab_env["RESULTS_DB"])
    run = store.runs(kind="profile").iloc[0]
    assert run["status"] == "ok" and run["mode"] == "eager"
    run_id = int(run["id"])
    assert not store.op_stats([run_id]).empty
    artifacts = store.artifacts(run_id)
    trace = Path(artifacts.query("kind == 'chrome_trace'")["path"].iloc[0])
    assert trace.is_relative_to(lab_env["ARTIFACTS_DIR"]) and load_trace(trace)["traceEvents"]
    metrics = store.metrics([run_id]).set_index("name")["value"]
    assert metrics["steps"] == 2 and metrics["profiled_wall_us"] > 0
    # The stored run reads back through profile-show and profile-compare.
    assert cli.main(["profile-show", str(run_id), "--db", lab_env["RESULTS_DB"]]) == 0
    out = capsys.readouterr().out
    assert "mean; " in out and "median, p10–p90" in out and "p10–p90/step" in out
    state = store.run(run_id)["conditions"]["series"][0]["state"]
    assert ("profiled steps" in out) and (("warning: profiled steps" in out) == (state != "clean"))
    assert cli.main(["profile-compare", str(run_id), str(run_id), "--db", lab_env["RESULTS_DB"]]) == 0
    out = capsys.readouterr().out
    assert "operators both" in out and "only in A (0): none" in out


@pytest.mark.parametrize("args, message", [
    (["profile", "--mode", "compile-reduce-overhead"], "mode compile-reduce-overhead is not available on cpu"),
    (["profile", "--mode", "nope"], "unknown mode 'nope'"),
    (["profile", "--phases", "train,decode"], "phases are a comma list of train, infer"),
    (["profile", "--active", "0"], "'0' must be at least 1"),
    (["profile", "--budget", "0"], "'0' must be greater than 0"),
    (["profile-show", "999"], "no run 999"),
])
def test_cli_profile_errors(lab_env, capsys, args, message):
    try:
        code = cli.main([*args, "--db", lab_env["RESULTS_DB"]])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_inference_only_modes_profile_their_phase(lab_env, capsys, monkeypatch, tmp_path):
    import dataclasses

    from engine.modes import MODES

    monkeypatch.setitem(MODES, "infer-only", dataclasses.replace(MODES["eager"], name="infer-only",
                                                                 phases=("infer",)))
    with pytest.raises(ValueError, match="runs only the infer phase"):
        profile_mode(ProfileConfig(mode="infer-only", phases=("train",)))
    assert cli.main(["profile", "--mode", "infer-only", "--phases", "train", "--db", lab_env["RESULTS_DB"]]) == 2
    assert "use --phases infer" in capsys.readouterr().err
    result = profile_mode(ProfileConfig(mode="infer-only", phases=("train", "infer"), wait=0, warmup=1, active=1,
                                        settle=0, artifacts_dir=str(tmp_path)))
    assert {m.phase for m in result.metrics} == {"infer"}
    assert "infer-only runs only the infer phase(s): train skipped" in result.notes


# -- CUDA (the GPU machine) -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_profile_has_device_events_and_figures(tmp_path):
    result = profile_mode(ProfileConfig(mode="eager", device="cuda", phases=("train",), active=3,
                                        artifacts_dir=str(tmp_path)))
    trace = load_trace(tmp_path / "trace-train.json.gz")
    cats = {e.get("cat") for e in trace["traceEvents"]}
    assert {"cpu_op", "kernel"} <= cats and ({"cuda_runtime", "cuda_driver"} & cats)
    m = by_phase(result, "train")
    assert m["kernels_per_step"] > 5 and m["launches_per_step"] >= 5
    assert 0 <= m["idle_fraction"] < 1 and m["device_busy_us"] <= m["device_window_us"]
    rows = pd.DataFrame(result.op_stats)
    device = rows[rows["device"] == "cuda"]
    assert device["self_us"].sum() == pytest.approx(m["kernel_us"] + m["memcpy_us"] + device[
        device["kind"] == "memset"]["self_us"].sum())
    assert device[device["kind"] == "kernel"]["parent"].notna().any()
    busy = next(s.values for s in result.samples if s.phase == "train_profiled_device_busy")
    assert len(busy) == 3 and sum(busy) == pytest.approx(m["device_busy_us"], rel=0.01)  # each step's share
    assert m["device_busy_p10_us"] <= m["device_busy_median_us"] <= m["device_busy_p90_us"]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_graphs_cut_launches(tmp_path):
    eager = by_phase(profile_mode(ProfileConfig(mode="eager", device="cuda", active=3,
                                                artifacts_dir=str(tmp_path / "e"))), "train")
    graphs = by_phase(profile_mode(ProfileConfig(mode="compile-reduce-overhead", device="cuda", active=3,
                                                 artifacts_dir=str(tmp_path / "g"))), "train")
    # Forward and backward replay as CUDA graphs (one launch each); the loss and Adam still launch eagerly.
    assert graphs["launches_per_step"] < eager["launches_per_step"]
    assert 0 <= graphs["idle_fraction"] < 1 and 0 <= eager["idle_fraction"] < 1


@pytest.mark.gpu
@pytest.mark.skipif(not (CUDA and settings.get("MODELAB_TEST_NCU") and ncu.ncu_path()),
                    reason="needs CUDA, ncu on PATH and MODELAB_TEST_NCU=1")
def test_cuda_deep_profile(tmp_path):
    result = profile_mode(ProfileConfig(mode="eager", device="cuda", active=2, deep=True, top_k=3,
                                        artifacts_dir=str(tmp_path)))
    assert result.kernel_metrics, result.notes
    assert all(r["duration_us"] and r["duration_us"] > 0 for r in result.kernel_metrics)
