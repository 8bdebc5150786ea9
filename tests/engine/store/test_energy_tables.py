"""Energy in the tables: the Pareto front of latency and energy, joules formatted, bench's table with J/step columns
only when runs measured energy, and the LLM runs' energy points."""

from __future__ import annotations

import pandas as pd
import pytest

from engine.store.db import Metric, RunResult, Samples, Store
from engine.store.report import bench_table, energy_summary, fmt_joules, pareto_front


def test_pareto_front_keeps_what_nothing_beats_on_both():
    frame = pd.DataFrame({"mode": ["eager", "compile", "fx", "slow", "missing"],
                          "us": [100.0, 60.0, 95.0, 120.0, None], "j": [0.005, 0.008, 0.009, 0.005, 0.001]})
    front = pareto_front(frame, "us", "j")
    assert list(frame["mode"][front]) == ["eager", "compile"]  # fx: compile is faster and cheaper; slow: eager ties J
    ties = pd.DataFrame({"us": [1.0, 1.0], "j": [2.0, 2.0]})
    assert pareto_front(ties, "us", "j").tolist() == [True, True]  # equal points beat neither


def test_fmt_joules_picks_a_readable_unit():
    assert [fmt_joules(v) for v in (2500.0, 3.21, 0.0042, 7.5e-6, 0.0)] == ["2.5 kJ", "3.21 J", "4.2 mJ", "7.5 µJ",
                                                                         "0 J"]
    assert fmt_joules(None) == "—" and fmt_joules(float("nan")) == "—" and fmt_joules(-0.002) == "-2 mJ"


def bench_run(store: Store, mode: str, median: float, joules: float | None) -> int:
    run_id = store.create_run("bench", "house_price", mode, "cuda", {"mode": mode})
    store.start_run(run_id)
    stats = {"median": median, "p10": median * 0.9, "p90": median * 1.2, "iqr": median * 0.1,
             "first_call": median * 3, "max_abs_err": 0.0}
    metrics = [Metric(k, v, "us", "infer", 64) for k, v in stats.items()]
    if joules is not None:
        metrics += [Metric("energy_per_step", joules, "J/step", "infer", 64),
                    Metric("energy_above_idle_per_step", joules / 2, "J/step", "infer", 64),
                    Metric("avg_power_w", 350.0, "W", "infer", 64)]
    store.record_result(run_id, RunResult(metrics=metrics, samples=[
        Samples("infer", [median] * 20, batch_size=64)]))
    return run_id


def test_bench_table_gains_energy_columns_only_when_measured(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.init()
    plain = [bench_run(store, "eager", 100.0, None), bench_run(store, "compile", 60.0, None)]
    assert "J/step" not in bench_table(store, plain).columns and energy_summary(store, plain).empty
    measured = [bench_run(store, "eager", 100.0, 0.012), bench_run(store, "compile", 60.0, 0.0075)]
    table = bench_table(store, measured).set_index("mode")
    assert table.loc["eager", "J/step"] == "12 mJ" and table.loc["compile", "J/step"] == "7.5 mJ"
    assert table.loc["compile", "above_idle"] == "3.75 mJ" and table.loc["eager", "avg_W"] == "350"
    summary = energy_summary(store, measured).set_index("mode")
    assert summary.loc["eager", "j_per_step"] == pytest.approx(0.012)


def test_llm_energy_points_mark_the_front():
    from engine.llm.report import energy_points, same_setup

    runs = pd.DataFrame({"id": [1, 2, 3, 4], "mode": ["eager", "compile", "triton-fused", "eager"],
                         "preset": ["1B"] * 4, "checkpoint": [None] * 4, "device": ["cuda"] * 4,
                         "dtype": ["bfloat16"] * 4, "batch": [1, 1, 1, 8], "prompt_len": [512] * 4,
                         "new_tokens": [128] * 4, "tpot_median_us": [9000.0, 4000.0, 2500.0, 9500.0],
                         "j_per_token": [3.0, 1.2, 1.4, 0.5], "ttft_us": [20000.0] * 4,
                         "j_per_prefill": [None] * 4})
    setup = same_setup(runs, runs.iloc[0].to_dict())
    assert sorted(setup["id"]) == [1, 2, 3]  # B=8 is another setup
    points = energy_points(setup, "decode").set_index("mode")
    assert points["pareto"].to_dict() == {"triton-fused": True, "compile": True, "eager": False}
    assert points.loc["compile", "latency_us"] == 4000.0 and points.loc["compile", "joules"] == 1.2
    assert energy_points(setup, "prefill").empty  # no run measured the prefill's energy


def test_the_cli_tables_print_energy_beside_latency(tmp_path, capsys: pytest.CaptureFixture):
    from engine.cli.llm import _print_figures
    from engine.cli.main import print_bench_table
    from engine.runner.jobs import JobSpec

    store = Store(tmp_path / "r.duckdb")
    store.init()
    print_bench_table(store, [bench_run(store, "eager", 100.0, 0.012)])
    header, row = capsys.readouterr().out.strip().splitlines()[:2]
    assert "J/step" in header and "avg_W" in header and "12 mJ" in row

    spec = JobSpec("llm", "llama-1B", "eager", "cuda", {"batch": 1, "prompt_len": 512})
    run_id = store.create_run("llm", "llama-1B", "eager", "cuda", spec.params)
    store.start_run(run_id)
    store.record_result(run_id, RunResult(metrics=[
        Metric("tpot_median_us", 9000.0, "us", "decode", 1), Metric("energy_per_token", 2.5, "J/token", "decode", 1),
        Metric("tokens_per_j", 0.4, "tokens/J", "decode", 1), Metric("energy_per_prefill", 6.0, "J/prefill",
                                                                      "prefill", 1)]))
    _print_figures(store, [run_id], [spec], {run_id: "ok"})
    header, row = capsys.readouterr().out.strip().splitlines()[:2]
    assert header.split()[-3:] == ["J/token", "tok/J", "J/prefill"]
    assert row.split()[-5:] == ["2.5", "J", "0.4", "6", "J"]
