"""The Compare page: an empty store says what to do; two commits give the verdict table, the forest plot and the
commands; a side with nothing left to compare is a message, not an exception."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from engine.store.db import Metric, RunResult, Samples, Store

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "7_Compare.py"


def open_compare() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def add_run(store: Store, mode: str, commit: str, scale: float = 1.0, processes: int = 3,
            joules: float | None = None) -> int:
    """One measurement in `processes` worker processes (a `bench --repeat` group); the last process's run id.
    `joules`: each process also stores the energy figures the meter writes (J/step ±1 %, 40 % of it above idle)."""
    group = f"{mode}-{commit}-{scale}"
    for repeat in range(processes):
        run_id = store.create_run("bench", "house_price", mode, "cpu",
                                  {"workload": "house_price", "device": "cpu", "phases": ["infer"], "iters": 60,
                                   "warmup": 5, "batch_sizes": [64], "repeat": repeat, "repeats": processes},
                                  group_id=group)
        store.start_run(run_id)
        rng = np.random.default_rng(run_id)
        figure = None if joules is None else joules * (1 + 0.01 * (repeat - 1))
        energy = [] if figure is None else [Metric("energy_per_step", figure, "J/step", "infer", 64),
                                            Metric("energy_above_idle_per_step", 0.4 * figure, "J/step", "infer", 64)]
        store.record_result(run_id, RunResult(
            samples=[Samples("infer", list(scale * 100 * np.exp(rng.normal(0, 0.02, 60))), "us", 64)],
            metrics=[Metric("max_abs_err", 1e-7, "", "infer", 64), *energy],
            env={"git_commit": commit, "torch": "2.13.0", "device_name": "CPU: test", "hostname": "here"}))
    return run_id


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def test_empty_store_says_what_to_do(lab: Store) -> None:
    at = open_compare().run()
    assert not at.exception
    assert "No finished bench, levels or LLM runs" in texts(at.info)
    assert not at.dataframe and not at.get("plotly_chart")


def test_two_commits_give_the_verdict_table_and_the_forest_plot(lab: Store) -> None:
    for mode in ("eager", "fx"):
        add_run(lab, mode, "aaaa1111")
    slow = add_run(lab, "fx", "bbbb2222", scale=1.15)
    add_run(lab, "eager", "bbbb2222")
    at = open_compare().run()
    assert not at.exception
    # Defaults: the base is the second-newest commit, the head the latest run of each series.
    assert at.selectbox(key="base-by").value == "commit" and at.selectbox(key="base-value").value == "aaaa1111"
    assert at.selectbox(key="head-by").value == "latest"
    at.selectbox(key="head-by").set_value("commit").run()
    at.selectbox(key="head-value").set_value("bbbb2222").run()
    assert not at.exception
    frame = at.dataframe[0].value
    assert list(frame["verdict"]) == ["slower", "unchanged"]
    assert frame["series"].iloc[0].startswith("bench house_price fx infer B=64")
    assert "2 series: 1 slower, 1 unchanged" in texts(at.error) and "exits with code 1" in texts(at.error)
    (chart,) = at.get("plotly_chart")
    assert "ratio of medians" in chart.proto.spec and "threshold" in chart.proto.spec
    code = texts(at.code)
    assert "python -m engine compare --base commit:aaaa1111 --head commit:bbbb2222 --threshold 5%" in code
    assert "python -m engine bench --workload house_price --mode fx --device cpu --phases infer" in code
    # A 20 % threshold: the 15 % slowdown no longer counts.
    at.number_input(key="threshold").set_value(20.0).run()
    assert list(at.dataframe[0].value["verdict"]) == ["unchanged", "unchanged"]
    assert "2 series: 2 unchanged" in texts(at.success)
    # By run ids.
    at.selectbox(key="head-by").set_value("ids").run()
    at.multiselect(key="head-ids").set_value([o for o in at.multiselect(key="head-ids").options
                                              if o.startswith(f"{slow} ")]).run()
    assert not at.exception and len(at.dataframe[0].value) == 1
    # By device: a name with spaces is quoted in the SPEC; every run is on the head, so the base has none left.
    at.selectbox(key="head-by").set_value("device").run()
    assert not at.exception and "--head 'device:\"CPU: test\"'" in texts(at.code)
    assert "no samples left" in texts(at.warning)


def test_the_energy_choice_judges_the_runs_energy_figures(lab: Store) -> None:
    add_run(lab, "eager", "aaaa1111", joules=0.5)
    add_run(lab, "eager", "bbbb2222", joules=0.65)  # 30 % more joules per step, the same time
    add_run(lab, "fx", "aaaa1111")  # no energy figures: left out of the energy verdict, with a note
    add_run(lab, "fx", "bbbb2222")
    at = open_compare().run()
    at.selectbox(key="head-by").set_value("commit").run()
    at.selectbox(key="head-value").set_value("bbbb2222").run()
    assert at.radio(key="metric").value == "time"
    assert list(at.dataframe[0].value["verdict"]) == ["unchanged", "unchanged"]
    at.radio(key="metric").set_value("energy").run()
    assert not at.exception
    frame = at.dataframe[0].value
    assert list(frame["verdict"]) == ["more energy"] and frame["series"].iloc[0].startswith("bench house_price eager")
    assert frame["energy base → head"].iloc[0] == "500 mJ/step → 650 mJ/step"
    assert frame["above idle base → head"].iloc[0] == "200 mJ/step (40 %) → 260 mJ/step (40 %)"
    assert "1 series: 1 more energy" in texts(at.error) and "exits with code 1" in texts(at.error)
    assert "--metric energy" in texts(at.code) and "no energy figure in any run left out" in texts(at.caption)
    (chart,) = at.get("plotly_chart")
    assert "median energy" in chart.proto.spec and "more energy" in chart.proto.spec
    # Only the runs without energy: the one line, as a message.
    at.selectbox(key="base-by").set_value("ids").run()
    at.multiselect(key="base-ids").set_value([o for o in at.multiselect(key="base-ids").options
                                              if " fx " in o][-1:]).run()
    at.selectbox(key="head-by").set_value("ids").run()
    at.multiselect(key="head-ids").set_value([o for o in at.multiselect(key="head-ids").options
                                              if " fx " in o][:1]).run()
    assert not at.exception and "energy: not measured in runs" in texts(at.warning)
    assert "NVML or RAPL not available there" in texts(at.warning) and not at.dataframe


def test_a_side_with_nothing_left_is_a_message(lab: Store) -> None:
    add_run(lab, "eager", "aaaa1111")
    at = open_compare().run()  # one commit: base commit:aaaa1111, head latest — the same single run
    assert not at.exception
    assert "Nothing to compare" in texts(at.warning) and "no samples left" in texts(at.warning)
    assert not at.dataframe


# -- change points on the history charts of the Benchmark and Kernel Levels pages -----------------------------------
def stepped(n: int = 12, at: int = 8, ratio: float = 1.3) -> list[float]:
    rng = np.random.default_rng(0)
    return [100 * (ratio if i >= at else 1.0) * float(np.exp(rng.normal(0, 0.01))) for i in range(n)]


def add_timed_run(store: Store, kind: str, workload: str, mode: str, median: float, commit: str,
                  params: dict, phase: str, batch: int | None) -> int:
    """An ok run with raw samples around `median` and the statistics the pages' cards and charts read."""
    run_id = store.create_run(kind, workload, mode, "cpu", params)
    store.start_run(run_id)
    rng = np.random.default_rng(run_id)
    stats = {"median": median, "p10": median * 0.97, "p90": median * 1.05, "first_call": median * 3,
             "rel_l2_err": 1e-5, "tolerance": 2e-3, "interpreted": 0.0, "flops_per_s": 1e9, "bytes_per_s": 1e9,
             "intensity": 1.0}
    store.record_result(run_id, RunResult(
        samples=[Samples(phase, list(median * np.exp(rng.normal(0, 0.005, 30))), "us", batch)],
        metrics=[Metric(name, value, "", phase, batch) for name, value in stats.items()],
        env={"git_commit": commit, "torch": "2.13.0", "device_name": "CPU: test", "hostname": "here"}))
    return run_id


def test_the_benchmark_history_marks_the_change_point(lab: Store, page) -> None:
    for i, median in enumerate(stepped()):
        add_timed_run(lab, "bench", "house_price", "eager", median, f"c{i:02d}",
                      {"workload": "house_price", "device": "cpu"}, "infer", 64)
    at = page("benchmark").run()
    at.toggle(key="history").set_value(True).run()
    assert not at.exception
    history = next(c for c in at.get("plotly_chart") if "History: median" in c.proto.spec)
    assert '"name":"change point"' in history.proto.spec and '"text":["+29 % c08"]' in history.proto.spec
    assert "change point in eager: +28." in texts(at.caption) and "commit c08 (after c07)" in texts(at.caption)


def test_the_levels_history_marks_the_change_point(lab: Store) -> None:
    params = {"component": "causal_attention", "shape": "small", "level": "L1-naive", "device": "cpu"}
    for i, median in enumerate(stepped(ratio=1 / 1.3)):
        add_timed_run(lab, "levels", "causal_attention", "L1-naive", median, f"c{i:02d}", params, "forward", None)
    at = AppTest.from_file(str(PAGE.parent / "5_Kernel_Levels.py"), default_timeout=60).run()
    charts = len(at.get("plotly_chart"))
    at.toggle(key="history").set_value(True).run()
    assert not at.exception and len(at.get("plotly_chart")) == charts + 1
    history = next(c for c in at.get("plotly_chart") if "History: median" in c.proto.spec)
    assert '"name":"change point"' in history.proto.spec and " % c08\"]" in history.proto.spec


def test_the_llm_history_marks_the_change_point_of_its_configuration(lab: Store) -> None:
    rng = np.random.default_rng(0)
    for i, median in enumerate(stepped(ratio=1.25)):
        for mode, step in (("eager", 1.0), ("compile", median / 100)):
            params = {"preset": "tiny", "prompt_len": 32, "new_tokens": 16, "batch": 1, "mode": mode, "device": "cpu"}
            run_id = lab.create_run("llm", "llama-tiny", mode, "cpu", params)
            lab.start_run(run_id)
            lab.record_result(run_id, RunResult(
                samples=[Samples("prefill", list(900 * np.exp(rng.normal(0, 0.01, 5))), "us", 1),
                         Samples("decode", list(300 * step * np.exp(rng.normal(0, 0.01, 32))), "us", 1)],
                env={"git_commit": f"c{i:02d}", "torch": "2.13.0", "device_name": "CPU: test"}))
    at = AppTest.from_file(str(PAGE.parent / "6_LLM.py"), default_timeout=90).run()
    at.toggle(key="history").set_value(True).run()
    assert not at.exception
    (history,) = [c for c in at.get("plotly_chart") if "History: median decode step" in c.proto.spec]
    assert '"name":"change point"' in history.proto.spec and "compile: +2" in history.proto.spec
    assert "eager: " not in history.proto.spec  # the flat mode has no change point
