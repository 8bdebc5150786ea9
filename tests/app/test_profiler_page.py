"""The Profiler page: a real CPU profile, GPU-like profiles built from Kineto-style traces (cards, charts, the
two-mode comparison, Nsight Compute metrics, trace download), queuing a profile, and failures."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.common import fmt_us
from engine.measure.op_stats import analyze
from engine.profiling import ncu
from engine.profiling import profile as profiling
from engine.profiling.profile import ProfileConfig, judge_profile, profile_mode
from engine.runner import jobs
from engine.store.db import Artifact, Metric, RunResult, Samples, Store

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "4_Profiler.py"


def open_profiler() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.fixture(autouse=True)
def no_ncu(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on this machine: no Nsight Compute (the GPU machine has it; the page must not depend on which)."""
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)


def kineto_trace(kernels: list[str], steps: int = 2, graph: bool = False) -> dict:
    """A CUDA trace of `steps` steps: one op per kernel, each launched by its own call or all by one graph replay."""
    host, dev = {"pid": 1, "tid": 1}, {"pid": 0, "tid": 7}
    events, ext = [], 0
    for s in range(steps):
        t0 = s * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 3}", "ts": t0, "dur": 900,
                       **host, "args": {}})
        if graph:
            ext += 1
            events.append({"ph": "X", "cat": "cpu_op", "name": "CUDAGraphNode.replay", "ts": t0 + 5, "dur": 30,
                           **host, "args": {"External id": ext}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t0 + 10, "dur": 20,
                           **host, "args": {"External id": ext}})
        for i, name in enumerate(kernels):
            start = t0 + 40 + i * 60
            if not graph:
                ext += 1
                events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "ts": start, "dur": 50, **host,
                               "args": {"External id": ext, "Input Dims": [[64, 256]]}})
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": start + 10,
                               "dur": 10, **host, "args": {"External id": ext}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": start + 25, "dur": 15 + 5 * i, **dev,
                           "args": {"External id": ext}})
    return {"traceEvents": events}


def add_profile_run(store: Store, folder: Path, mode: str, kernels: list[str], *, graph: bool = False,
                    deep: list[dict] | None = None, phase: str = "train", trace: dict | None = None,
                    conditions: dict | None = None) -> int:
    run_id = store.create_run("profile", "house_price", mode, "cuda", {"mode": mode, "device": "cuda"})
    store.start_run(run_id)
    trace = trace or kineto_trace(kernels, graph=graph)
    path = folder / f"run_{run_id}" / f"trace-{phase}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    analysis = analyze(trace, phase)
    result = RunResult(
        metrics=[Metric(k, v, "", phase=phase, batch_size=64) for k, v in analysis.metrics.items()],
        artifacts=[Artifact("chrome_trace", path.name, str(path))], op_stats=analysis.op_stats,
        kernel_metrics=deep or [], notes=["a note from the run", *profiling.disturbed_notes(conditions or {})],
        conditions=conditions)
    store.record_result(run_id, result)
    return run_id


@pytest.fixture
def gpu_pair(lab: Store, tmp_path: Path) -> tuple[int, int]:
    """eager: three kernels, one launch each; compiled: the GEMM plus one fused Triton kernel from one graph replay."""
    eager = add_profile_run(lab, tmp_path, "eager", ["gemm_kernel", "relu_kernel", "add_kernel"])
    compiled = add_profile_run(
        lab, tmp_path, "compile-reduce-overhead", ["gemm_kernel", "triton_poi_fused_add_relu_0"], graph=True,
        deep=[{"phase": "train", "kernel": "gemm_kernel", "launches": 2, "duration_us": 15.0,
               "mem_throughput_pct": 12.0, "sm_throughput_pct": 40.0, "metrics": "{}"}])
    return eager, compiled


def test_empty_store_offers_a_profile(lab: Store) -> None:
    at = open_profiler().run()
    assert not at.exception
    assert "No profiles yet" in texts(at.info)
    assert at.button(key="profile-run").label == "Profile" and not at.button(key="profile-run").disabled
    assert "Nsight Compute (ncu) not found on PATH" in texts(at.caption)
    assert at.toggle(key="new-deep").disabled
    assert not at.get("plotly_chart")


def test_gpu_profile_cards_charts_trace_and_deep_metrics(gpu_pair: tuple[int, int]) -> None:
    eager, compiled = gpu_pair
    at = open_profiler().run()
    assert not at.exception
    assert at.selectbox(key="run-a").value == compiled  # newest first
    cards = {m.label: m.value for m in at.metric}
    assert cards["Kernel launches / step"] == "1.0"  # one graph replay per step
    assert cards["Device idle"].endswith("%") and cards["Device busy / step"].endswith("µs")
    assert len(at.get("plotly_chart")) >= 6  # top kernels, treemap, top ops, CPU vs device, compare, ncu
    (download,) = at.download_button
    assert "Download trace" in download.label and "gzipped JSON" in download.label
    assert "a note from the run" in texts(at.caption)
    ncu_table = next(d.value for d in at.dataframe if "SM throughput" in d.value.columns)
    assert list(ncu_table["kernel"]) == ["gemm_kernel"]

    at.selectbox(key="run-a").set_value(eager).run()
    assert not at.exception
    cards = {m.label: m.value for m in at.metric}
    assert cards["Kernel launches / step"] == "3.0"
    assert "not found on PATH" in texts(at.info)  # no ncu metrics for this run, and no ncu here


def test_per_step_spread_columns_and_a_disturbed_profile_warning(lab: Store, tmp_path: Path) -> None:
    trace = kineto_trace(["gemm_kernel", "relu_kernel"], steps=4)
    for e in trace["traceEvents"]:
        if e["name"] == "gemm_kernel" and e["ts"] >= 3000:  # the last step's GEMM takes 4× as long
            e["dur"] *= 4
    steady = [900.0 + i for i in range(11)]
    disturbed = judge_profile([Samples("train_profiled", steady + [40_000.0]), Samples("train", steady)], [])
    run_id = add_profile_run(lab, tmp_path, "eager", [], trace=trace, conditions=disturbed)
    at = open_profiler().run()
    assert not at.exception and at.selectbox(key="run-a").value == run_id
    (warning,) = at.warning
    assert warning.value.startswith("Disturbed profile: its profiled steps are **noisy** (the mean step is")
    captions = texts(at.caption)
    assert "the profile is disturbed" not in captions  # the warning says it once
    assert "a note from the run" in captions and "Per profiled step: host wall 900.0 µs median" in captions
    assert "device busy 35.0 µs median" in captions
    table = next(d.value for d in at.dataframe if "self p10 per step" in d.value.columns).set_index("name")
    gemm = [15.0, 15.0, 15.0, 60.0]  # its self time in each of the four steps
    p10, p90 = (fmt_us(v) for v in np.percentile(gemm, [10, 90]))
    assert (table.loc["gemm_kernel", "self p10 per step"], table.loc["gemm_kernel", "self p90 per step"]) == (p10, p90)
    assert table.loc["relu_kernel", "self p10 per step"] == table.loc["relu_kernel", "self p90 per step"] == "20.0 µs"


def test_a_profile_stored_before_the_spread_reads_with_dashes(lab: Store, tmp_path: Path) -> None:
    run_id = add_profile_run(lab, tmp_path, "eager", ["gemm_kernel"])
    with duckdb.connect(str(lab.path)) as con:  # what a store from before schema 6 holds after migrating
        con.execute("UPDATE op_stats SET self_p10_us = NULL, self_p90_us = NULL WHERE run_id = ?", [run_id])
        con.execute("DELETE FROM metrics WHERE run_id = ? AND regexp_matches(name, '_(p10|p90|median)_us$')",
                    [run_id])
    at = open_profiler().run()
    assert not at.exception and not at.warning
    assert "Per profiled step" not in texts(at.caption)
    table = next(d.value for d in at.dataframe if "self p10 per step" in d.value.columns)
    assert set(table["self p10 per step"]) == set(table["self p90 per step"]) == {"—"}


def test_comparison_lists_kernels_removed_and_added(gpu_pair: tuple[int, int]) -> None:
    eager, compiled = gpu_pair
    at = open_profiler().run()
    at.selectbox(key="run-a").set_value(eager).run()
    assert at.selectbox(key="run-b").value == compiled
    cards = {m.label: m.value for m in at.metric}
    assert (cards["Kernels only in A"], cards["Kernels only in B"], cards["Kernels in both"]) == ("2", "1", "1")
    frames = [d.value for d in at.dataframe]
    only_a = next(f for f in frames if "B − A per step" in f.columns and set(f["name"]) == {"relu_kernel",
                                                                                            "add_kernel"})
    assert (only_a["calls per step, B"] == "0").all() and (only_a["calls per step, A"] == "1").all()
    assert any(set(f.get("name", [])) == {"triton_poi_fused_add_relu_0"} for f in frames)
    figures = next(f for f in frames if "figure" in f.columns)
    launches = figures.set_index("figure").loc["kernel launches per step"]
    assert list(launches) == ["3.0", "1.0", "0.33×"]


def test_real_cpu_profile_says_device_figures_do_not_apply(lab: Store, tmp_path: Path) -> None:
    run_id = lab.create_run("profile", "house_price", "eager", "cpu", {})
    lab.start_run(run_id)
    lab.record_result(run_id, profile_mode(ProfileConfig(mode="eager", wait=0, warmup=1, active=2, settle=0,
                                                         artifacts_dir=str(tmp_path / "a"))))
    at = open_profiler().run()
    assert not at.exception
    cards = {m.label: m.value for m in at.metric}
    assert cards["Device idle"] == "n/a" and cards["Kernel launches / step"] == "n/a"
    assert cards["Host wall / step"] != "—"
    assert "not applicable on CPU" in texts(at.caption)
    assert len(at.get("plotly_chart")) >= 3  # top operators, treemap, CPU time
    assert any("aten::addmm" in set(d.value.get("name", [])) for d in at.dataframe)
    assert at.download_button and "Profile a second mode" in texts(at.info)


def test_profile_button_queues_a_profile_run(lab: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = []

    def fake_submit(store, specs, group_id=None):
        submitted.append(specs)
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = open_profiler().run()
    at.selectbox(key="new-mode").set_value("fx").run()
    at.multiselect(key="new-phases-fx").set_value(["train", "infer"]).run()
    at.number_input(key="new-active").set_value(3).run()
    at.button(key="profile-run").click().run()
    assert not at.exception
    (specs,) = submitted
    spec = specs[0]
    assert (spec.kind, spec.mode, spec.device) == ("profile", "fx", "cpu")
    assert spec.params["phases"] == ["train", "infer"] and spec.params["active"] == 3 and not spec.params["deep"]
    assert list(lab.runs(kind="profile")["status"]) == ["queued"]
    assert "Queued profile #" in texts(at.success)
    assert any("1 run in progress" in m.value for m in at.markdown)

    at.multiselect(key="new-phases-fx").set_value([]).run()
    assert at.button(key="profile-run").disabled
    at.multiselect(key="new-phases-fx").set_value(["train"]).run()
    at.selectbox(key="new-mode").set_value("aoti").run()  # inference only: offers (and defaults to) infer
    assert at.multiselect(key="new-phases-aoti").options == ["Inference (forward, no_grad)"]
    assert at.multiselect(key="new-phases-aoti").value == ["infer"]
    at.selectbox(key="new-mode").set_value("compile-reduce-overhead").run()
    assert at.button(key="profile-run").disabled
    assert "not available on cpu" in texts(at.caption)


def test_failed_profile_shows_its_error(lab: Store) -> None:
    run_id = lab.create_run("profile", "house_price", "compile", "cpu", {})
    lab.start_run(run_id)
    lab.fail_run(run_id, "RuntimeError: torch.profiler finished without producing a trace\n--- traceback ---\nx")
    at = open_profiler().run()
    assert not at.exception
    assert "torch.profiler finished without producing a trace" in texts(at.error)
    assert "--- traceback ---" in texts(at.code)


def test_a_new_profile_is_shown_and_b_defaults_to_one_of_the_same_phase(gpu_pair: tuple[int, int], lab: Store,
                                                                        tmp_path: Path) -> None:
    eager, compiled = gpu_pair
    at = open_profiler().run()
    at.selectbox(key="run-a").set_value(eager).run()
    infer_only = add_profile_run(lab, tmp_path, "fx", ["gemm_kernel"], phase="infer")  # newest, no train phase
    at.run()
    assert not at.exception
    assert at.selectbox(key="run-a").value == infer_only  # the profile that just finished is the one shown
    at.selectbox(key="run-a").set_value(eager).run()
    assert at.selectbox(key="run-b").value == compiled  # it profiled train too; the newer fx did not
    at.run()
    assert at.selectbox(key="run-a").value == eager  # a rerun without a new profile keeps the choice
