"""The Benchmark page: cards, charts from stored results, failures, settings validation, and queuing runs."""

from __future__ import annotations

import time

import pytest

from engine.runner import jobs
from engine.store.db import Store


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def test_empty_store_points_to_the_buttons(lab: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    assert at.button(key="run-eager").label == "Run benchmark"
    assert not at.get("plotly_chart")
    assert "No results" in texts(at.info)


def test_cards_and_charts_from_stored_results(filled: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    # One card (and button) per registered mode; reduce-overhead needs CUDA, so it is greyed out on the CPU.
    from engine.modes import MODES

    for name in MODES:
        assert at.button(key=f"run-{name}")
    assert at.button(key="run-compile-reduce-overhead").disabled
    assert not at.button(key="run-eager").disabled
    assert "needs" in texts(at.caption) or "CUDA" in texts(at.caption)
    charts = at.get("plotly_chart")
    assert len(charts) >= 4  # latency, samples, speedup, first call
    # The default batch is the middle default (64); medians appear on the cards with a speedup.
    labels = [m.label for m in at.metric]
    assert any("B=64" in label for label in labels)
    assert any("× eager" in str(m.delta) for m in at.metric if m.delta)
    # TorchScript's note is shown once on its card.
    assert texts(at.caption).count("torch.jit.script is deprecated") == 1


def test_a_flagged_eager_run_greys_every_speedup_and_says_why(filled: Store, page) -> None:
    """An interfered eager run (engine.measure.noise's record in runs.conditions): its card says so, and the other
    cards' speedups against it are marked flagged with the reason, in the chart too."""
    import json

    from tests.app.conftest import add_bench_run

    eager = add_bench_run(filled, "eager", 16000.0)
    record = {"state": "interfered", "flags": ["infer B=64: p90/p10 = 250×"], "series": [
        {"phase": "infer", "batch_size": 64, "state": "interfered",
         "flags": ["p90/p10 = 250×", "other processes took 1.6 of 2 cores"],
         "conditions": {"cores": 2, "other_cores": 1.6, "cpu_wait_frac": 0.41, "load_end": 3.2}}]}
    with filled.connect() as con:
        con.execute("UPDATE runs SET conditions = ? WHERE id = ?", [json.dumps(record), eager])
    at = page("benchmark").run()
    assert not at.exception
    assert "Timing: interfered — p90/p10 = 250×; other processes took 1.6 of 2 cores" in texts(at.caption)
    [expander] = [e for e in at.expander if e.label == f"Conditions of run #{eager}"]  # what its window saw
    shown = expander.dataframe[0].value.iloc[0]
    assert shown["series"] == "infer B=64" and shown["other processes (cores)"] == "1.6"
    assert shown["its threads waiting"] == "41.0 %" and shown["load"] == "3.2"
    deltas = [str(m.delta) for m in at.metric if m.delta and not m.label.startswith("Fastest")]  # the cards'
    assert deltas and all(d.startswith("(") and d.endswith(", flagged)") for d in deltas)
    summary = {m.label: m.delta for m in at.metric if m.label.startswith("Fastest")}
    assert summary["Fastest · inference · B=64"].endswith(", flagged)")  # eager's infer series is the flagged one
    speedup = next(c for c in at.get("plotly_chart") if "Speedup vs eager" in c.proto.spec)
    assert "\\u00d7)" in speedup.proto.spec and "#c7c7c7" in speedup.proto.spec


def test_repeats_queue_each_mode_in_several_processes_interleaved(lab: Store, page,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = []

    def fake_submit(store, specs, group_id=None):
        submitted.append((specs, group_id))
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = page("benchmark").run()
    at.number_input(key="repeats").set_value(2).run()
    at.button(key="run-all").click().run()
    assert not at.exception
    (specs, group), = submitted
    modes = list(dict.fromkeys(s.mode for s in specs))
    assert len(modes) > 1 and group is not None
    assert [(s.mode, s.params["repeat"], s.params["repeats"]) for s in specs] == \
        [(m, r, 2) for r in range(2) for m in modes]  # A B C … A B C …


def test_aoti_shows_what_python_costs(filled: Store, page) -> None:
    from tests.app.conftest import add_bench_run

    add_bench_run(filled, "aoti", 80.0, points=(("infer", 1), ("infer", 64), ("infer", 1024)), native_fraction=0.5)
    at = page("benchmark").run()
    assert not at.exception
    # B=64 median: 80 * (1 + 64/512) = 90 µs from Python, half of it natively.
    caption = next(c.value for c in at.caption if "Native runner" in c.value)
    assert "45.0 µs" in caption and "Python adds 45.0 µs" in caption
    figures = [c for c in at.get("plotly_chart") if "What Python costs" in c.proto.spec]
    assert len(figures) == 1
    # The cards of modes without a native runner say nothing of one.
    assert sum("Native runner" in c.value for c in at.caption) == 1


def test_history_and_filters(filled: Store, page) -> None:
    at = page("benchmark").run()
    n = len(at.get("plotly_chart"))
    at.toggle(key="history").set_value(True).run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == n + 1
    at.radio(key="phase").set_value("train").run()
    assert not at.exception
    assert at.get("plotly_chart")
    assert any("train" in m.label for m in at.metric)


def test_failed_run_shows_its_error(filled: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    assert "ToleranceError: compile-max-autotune inference at batch 64" in texts(at.error)
    assert "--- traceback ---" in texts(at.code)  # full text in the expander


def test_bad_batch_sizes_show_an_error_and_disable_runs(lab: Store, page) -> None:
    at = page("benchmark").run()
    at.text_input(key="batch_text").set_value("1, abc, 64").run()
    assert not at.exception
    assert "'abc' is not a whole number" in texts(at.error)
    assert at.button(key="run-eager").disabled and at.button(key="run-all").disabled
    at.text_input(key="batch_text").set_value("1 64").run()
    assert not at.error
    assert not at.button(key="run-eager").disabled


def test_run_benchmark_queues_a_run(lab: Store, page, monkeypatch: pytest.MonkeyPatch) -> None:
    # Queue for real, but do not spawn a supervisor: the run stays queued, owned by this (alive) process.
    submitted = []

    def fake_submit(store, specs, group_id=None):
        submitted.append((specs, group_id))
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = page("benchmark").run()
    at.number_input(key="iters").set_value(5).run()
    at.button(key="run-eager").click().run()
    assert not at.exception
    (specs, group), = submitted
    assert [s.mode for s in specs] == ["eager"] and group is None
    assert specs[0].params["iters"] == 5 and specs[0].params["batch_sizes"] == [1, 64, 1024]
    runs = lab.runs(kind="bench")
    assert list(runs["status"]) == ["queued"] and list(runs["mode"]) == ["eager"]
    assert "Queued #" in texts(at.success)
    assert any("1 run in progress" in m.value for m in at.markdown)  # the live progress panel shows the queued run

    at.button(key="run-all").click().run()
    specs, group = submitted[-1]
    assert group and {s.mode for s in specs} >= {"eager", "fx", "torchscript", "compile"}
    assert "compile-reduce-overhead" not in {s.mode for s in specs}


@pytest.mark.slow
def test_real_eager_run_ends_in_a_chart(lab: Store, page) -> None:
    """The end-to-end path without a browser: click, a real supervisor and worker, then the latency chart."""
    at = page("benchmark").run()
    at.number_input(key="iters").set_value(3).run()
    at.number_input(key="warmup").set_value(1).run()
    at.text_input(key="batch_text").set_value("1").run()
    at.text_input(key="train_batch_text").set_value("8").run()
    at.button(key="run-eager").click().run()
    assert not at.exception
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        status = lab.runs(kind="bench").iloc[0]
        if status["status"] in ("ok", "failed"):
            break
        time.sleep(0.5)
    assert status["status"] == "ok", status["error"]
    at.run()
    assert not at.exception
    assert at.get("plotly_chart")
    assert any("B=1" in m.label for m in at.metric)
    # The card says where the run's time went, step by step, from its progress timeline.
    run_id = int(lab.runs(kind="bench").iloc[0]["id"])
    timeline = next(e for e in at.expander if e.label == f"Timeline of run #{run_id}")
    steps = list(timeline.dataframe[0].value["step"])
    assert any("first call" in step for step in steps) and any("timing" in step for step in steps)


def test_run_of_a_dead_supervisor_is_shown_failed(lab: Store, page) -> None:
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_id = lab.create_run("bench", "house_price", "fx", "cpu", {}, pid=gone.pid)
    at = page("benchmark").run()
    assert not at.exception
    assert lab.run(run_id)["status"] == "failed"
    assert not at.get("progress")
    assert "interrupted" in texts(at.error)


def test_the_latest_groups_timeline_shows_who_prepared_and_who_timed_alone(lab: Store, page, tmp_path,
                                                                             monkeypatch) -> None:
    """A real side-by-side group (engine.runner.plan) on the CPU: its runs on one clock, coloured by device hold."""
    from engine.runner import plan
    from engine.runner.jobs import JobSpec, create_runs

    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    params = {"device": "cpu", "phases": ["infer"], "batch_sizes": [8], "warmup": 2, "iters": 10, "loop": False}
    ids = create_runs(lab, [JobSpec("bench", "house_price", m, "cpu", {**params, "mode": m}) for m in ("eager", "fx")],
                      group_id="g1")
    assert set(plan.supervise(lab, ids, requested=2).values()) == {"ok"}
    at = page("benchmark").run()
    assert not at.exception
    assert at.expander(key="group-timeline").label == f"Timeline of the latest group (runs #{ids[0]}–#{ids[1]})"
    chart = next(c for c in at.get("plotly_chart") if "side by side" in c.proto.spec)
    assert '"exclusive"' in chart.proto.spec and '"shared"' in chart.proto.spec
    assert "No run timed while another held the device." in texts(at.caption)
