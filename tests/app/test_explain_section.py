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
                phase: str = "infer", batch: int = 64, run_id: int | None = None) -> int:
    """A profile run with its trace (the step timed without the profiler: 0.9 × the profiled step); `run_id`: record
    it into that queued run (one the page queued) instead of a new one."""
    if run_id is None:
        run_id = store.create_run("profile", "house_price", mode, "cpu", {"mode": mode})
    store.start_run(run_id)
    path = folder / f"trace-{mode}-{phase}-{run_id}.json.gz"
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
    """filled's bench runs (the cards: eager 111 µs, compile 67.5 µs at infer B=64), profiles that agree with them."""
    add_profile(filled, tmp_path, "eager", compute_us=20, framework_us=100)
    add_profile(filled, tmp_path, "compile", compute_us=16, framework_us=56)
    add_ceilings(filled)
    return filled


def card_run(store: Store, mode: str) -> int:
    return int(store.runs(kind="bench", status=["ok"]).query("mode == @mode")["id"].max())


def test_section_explains_two_profiled_modes(explained: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    assert at.selectbox(key="explain-a").value == "eager"
    at.selectbox(key="explain-b").set_value("compile").run()
    assert not at.exception
    sentence = next(i.value for i in at.info if "slower than" in i.value)
    # The gap is the cards' (the bench runs shown), the runs named; the terms come from the profiles, named too.
    eager, compiled = card_run(explained, "eager"), card_run(explained, "compile")
    assert sentence.startswith(f"eager is slower than compile (infer, B=64, cpu): 111 µs vs 67.5 µs per step (bench "
                               f"runs #{eager} and #{compiled}); in their profiles (runs #")
    assert "120 µs vs 72.0 µs per profiled step" in sentence and "Python and framework code" in sentence
    metrics = texts(at.metric)
    assert "111.4 µs" in metrics and "67.5 µs" in metrics  # the cards say the same
    runs = next(d.value for d in at.dataframe if "median (card)" in d.value.columns).set_index("bench run (its card)")
    assert runs.loc[f"#{eager}", "median (card)"] == "111.4 µs"
    assert runs.loc[f"#{compiled}", "profiled step"] == "72.0 µs"
    bars = [c for c in at.get("plotly_chart") if "Where each step" in c.proto.spec]
    assert len(bars) == 1 and "floor" in bars[0].proto.spec
    table = next(d.value for d in at.dataframe if "per profiled step" in d.value.columns)
    rows = table.set_index("per profiled step")
    assert rows.loc["Python / framework overhead", "A: eager"] == "100.0 µs"
    assert rows.loc["CPU busy in ops and kernels (compute)", "B: compile"] == "16.0 µs"
    captions = texts(at.caption)
    assert "Floor for this step" in captions and "measured fp32 matmul rate" in captions
    assert "× the floor" in captions


def test_a_disturbed_profile_is_not_used_and_can_be_redone(explained: Store, page, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer eager profile timed under other load (8 ms a step against the card's 111 µs) explains nothing: the
    sentence keeps to the cards, the profile is named as not used, and the button profiles eager again."""
    disturbed = add_profile(explained, tmp_path, "eager", compute_us=800, framework_us=8000)
    monkeypatch.setattr(jobs, "submit", lambda store, specs, group_id=None: jobs.create_runs(store, specs, group_id))
    at = page("benchmark").run()
    at.selectbox(key="explain-b").set_value("compile").run()
    assert not at.exception
    sentence = next(i.value for i in at.info if "slower than" in i.value)
    assert sentence.startswith("eager is slower than compile (infer, B=64, cpu): 111 µs vs 67.5 µs per step")
    assert "to see why, profile eager again" in sentence and "8." not in sentence
    warning = texts(at.warning)
    assert f"profile run {disturbed} timed 7.92 ms per step without the profiler" in warning
    runs = next(d.value for d in at.dataframe if "median (card)" in d.value.columns)
    assert f"#{disturbed} (not used)" in set(runs["profile run"])
    assert at.button(key="explain-profile").label == "Profile eager again and explain"


def test_section_offers_the_missing_profile_and_explains_when_it_lands(explained: Store, page, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = []

    def fake_submit(store, specs, group_id=None):  # queued, no supervisor: the test lands the profile itself
        submitted.append(specs)
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = page("benchmark").run()
    at.selectbox(key="explain-b").set_value("torchscript").run()
    assert not at.exception
    warning = texts(at.warning)
    assert ("python -m engine profile --workload house_price --mode torchscript --device cpu --phases infer "
            "--batch-size 64" in warning)
    at.button(key="explain-profile").click().run()
    assert not at.exception
    (specs,) = submitted
    assert [(s.kind, s.mode) for s in specs] == [("profile", "torchscript")]
    assert specs[0].params["phases"] == ["infer"] and specs[0].params["batch_size"] == 64
    # The confirmation stands where the button was, with the queued run's progress; no button while it runs.
    queued = int(explained.runs(kind="profile", status=["queued"])["id"].iloc[0])
    assert f"Queued #{queued} profile torchscript" in texts(at.success)
    assert not [b for b in at.button if b.key == "explain-profile"]
    # The profile lands (as its supervisor would record it); the next refresh explains with it, the pair kept.
    add_profile(explained, tmp_path, "torchscript", compute_us=20, framework_us=120, run_id=queued)
    at.run()
    assert not at.exception
    assert (at.selectbox(key="explain-a").value, at.selectbox(key="explain-b").value) == ("eager", "torchscript")
    sentence = next(i.value for i in at.info if "slower than" in i.value)
    assert sentence.startswith("torchscript is slower than eager") and f"runs #{queued} and #" in sentence
    assert "to see why" not in sentence
    assert f"Profiles #{queued} finished" in texts(at.caption)


def test_advice_never_recommends_a_mode_to_itself() -> None:
    from engine.explain.why import Partition, Side, dominant_sentence

    def side(mode: str, framework: float, device: str = "cpu") -> Side:
        s = Side(label="A", mode=mode, device=device, workload="house_price", phase="infer", batch_size=64,
                 given_run=1)
        s.partition = Partition(step_us=20 + framework, terms={"compute": 20.0, "launch": 0.0, "guard": 0.0,
                                                               "framework": framework, "idle": 0.0},
                                steps=2, has_device=device != "cpu")
        return s

    for slow in ("compile", "compile-max-autotune", "aoti"):
        text = dominant_sentence(side(slow, 300), side("eager", 50))
        assert "compiling" not in text and f"{slow} is compiled already" in text and "eager pays less" in text
    assert "compiling the step" in dominant_sentence(side("eager", 300), side("compile", 50))
    graphed = dominant_sentence(side("compile-reduce-overhead", 300, "cuda"), side("eager", 50, "cuda"))
    assert "CUDA graphs" not in graphed and "captured already" not in graphed and "compiled already" in graphed


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
