"""The Benchmark page's "Why is one mode slower than another?" section and its first-call cache line, on stored runs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from engine.runner import jobs
from engine.store.db import Artifact, Metric, RunResult, Store

ENV = {"python": "3.11.0", "torch": "2.13.0", "device_name": "CPU: test", "cpu_model": "test", "threads": 4,
       "git_commit": "abc123", "hostname": "test", "platform": "Linux"}


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def cpu_trace(compute_us: float, framework_us: float, steps: int = 2) -> dict:
    """A CPU trace: each step one aten::addmm (compute) inside the step's Python (framework)."""
    ev, t = [], 0.0
    for i in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": t,
                   "dur": compute_us + framework_us, "pid": 1, "tid": 1})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": t + framework_us / 2, "dur": compute_us,
                   "pid": 1, "tid": 1})
        t += compute_us + framework_us
    return {"traceEvents": ev}


def add_profile(store: Store, folder: Path, mode: str, compute_us: float, framework_us: float,
                phase: str = "infer", batch: int = 64) -> int:
    run_id = store.create_run("profile", "house_price", mode, "cpu", {"mode": mode})
    store.start_run(run_id)
    path = folder / f"trace-{mode}-{phase}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(cpu_trace(compute_us, framework_us), f)
    step = compute_us + framework_us
    tag = dict(phase=phase, batch_size=batch)
    result = RunResult(env=dict(ENV), metrics=[
        Metric("steps", 2, "", **tag), Metric("profiled_wall_us", 2 * step, "us", **tag),
        Metric("step_wall_us", step, "us", **tag), Metric("step_median_us", step * 0.9, "us", **tag)],
        artifacts=[Artifact("chrome_trace", f"trace-{phase}.json.gz", str(path))])
    store.record_result(run_id, result)
    return run_id


def add_ceilings(store: Store) -> int:
    run_id = store.create_run("ceilings", "ceilings", "measure", "cpu", {})
    store.start_run(run_id)
    store.record_result(run_id, RunResult(env=dict(ENV), metrics=[
        Metric("copy_bw", 1e10, "B/s"), Metric("matmul_fp32", 1e11, "FLOP/s"), Metric("launch_us", 3.0, "us")]))
    return run_id


@pytest.fixture
def explained(filled: Store, tmp_path: Path) -> Store:
    add_profile(filled, tmp_path, "eager", compute_us=100, framework_us=900)
    add_profile(filled, tmp_path, "compile", compute_us=80, framework_us=120)
    add_ceilings(filled)
    return filled


def test_section_explains_two_profiled_modes(explained: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    assert at.selectbox(key="explain-a").value == "eager"
    at.selectbox(key="explain-b").set_value("compile").run()
    assert not at.exception
    sentence = next(i.value for i in at.info if "slower than" in i.value)
    assert sentence.startswith("eager is slower than compile (infer, B=64, cpu): 1.00 ms vs 200 µs per step")
    assert "Python and framework code" in sentence
    bars = [c for c in at.get("plotly_chart") if "Where each step" in c.proto.spec]
    assert len(bars) == 1 and "floor" in bars[0].proto.spec
    table = next(d.value for d in at.dataframe if "µs per step" in d.value.columns)
    rows = table.set_index("µs per step")
    assert rows.loc["Python / framework overhead", "eager"] == pytest.approx(900)
    assert rows.loc["CPU busy in ops and kernels (compute)", "compile"] == pytest.approx(80)
    captions = texts(at.caption)
    assert "Floor for this step" in captions and "measured fp32 matmul rate" in captions
    assert "× the floor" in captions and "step without the profiler 900.0 µs" in captions


def test_section_offers_the_missing_profile(explained: Store, page, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = []

    def fake_submit(store, specs, group_id=None):
        submitted.append(specs)
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = page("benchmark").run()
    at.selectbox(key="explain-b").set_value("fx").run()
    assert not at.exception
    warning = texts(at.warning)
    assert ("python -m engine profile --workload house_price --mode fx --device cpu --phases infer --batch-size 64"
            in warning)
    at.button(key="explain-profile").click().run()
    assert not at.exception
    (specs,) = submitted
    assert [(s.kind, s.mode) for s in specs] == [("profile", "fx")]
    assert specs[0].params["phases"] == ["infer"] and specs[0].params["batch_size"] == 64
    assert "Queued #" in texts(at.success)


def test_section_needs_two_benchmarked_modes(lab: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    assert "Benchmark at least two modes" in texts(at.caption)


def test_cards_show_what_the_first_call_found_cached(filled: Store, page) -> None:
    compile_run = int(filled.runs(kind="bench", status=["ok"]).query("mode == 'compile'")["id"].max())
    with filled.transaction() as con:
        for name, value in (("cache_fxgraph_hit", 2.0), ("cache_fxgraph_miss", 0.0), ("cache_aotautograd_hit", 1.0)):
            con.execute("INSERT INTO metrics (run_id, phase, batch_size, name, value, unit) VALUES (?, ?, ?, ?, ?, ?)",
                        [compile_run, "infer", 64, name, value, ""])
    at = page("benchmark").run()
    assert not at.exception
    line = next(c.value for c in at.caption if c.value.startswith("First call:"))
    assert "Inductor FX graph cache: 2 hits, 0 misses" in line and "AOTAutograd cache: 1 hit, 0 misses" in line
    assert sum(c.value.startswith("First call:") for c in at.caption) == 1
