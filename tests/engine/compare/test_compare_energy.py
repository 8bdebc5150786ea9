"""`compare --metric energy`: the runs' energy figures (one per run and series) judged with a bootstrap over the runs;
unchanged / more energy (exit 1) / cannot tell (exit 3) on runs written through the Store API, the one line (exit 2)
where the runs carry no energy figure, flagged runs left out, and the interval's error rates over seeds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import numpy as np
import pytest

from engine.cli import main as cli
from engine.compare.verdict import ALPHA, CompareError, Options, compare, figure_ratio_ci, render, to_json, verdict
from engine.store.db import Metric, RunResult, Samples, Store

ENV = {"python": "3.11.0", "torch": "2.13.0", "device_name": "CPU: test", "git_commit": "aaaa1111",
       "hostname": "here", "threads": 2, "platform": "Linux"}
SEEDS = 200
FPR_BOUND = ALPHA + 2.5 * (ALPHA * (1 - ALPHA) / SEEDS) ** 0.5  # α plus 2.5 binomial standard errors: 17 of 200
NO_RAPL = "energy: not available here (no RAPL zones under /sys/class/powercap)"


def add_run(store: Store, mode: str, commit: str, *, joules: float | None = 0.5, above_idle: float | None = 0.2,
            time_scale: float = 1.0, points: Sequence[tuple[str, int]] = (("infer", 64), ("train", 64)),
            group: str | None = None, repeat: tuple[int, int] | None = None, conditions: dict | None = None,
            kind: str = "bench", workload: str = "house_price", per: str = "step", params: dict | None = None) -> int:
    """An ok run with raw time samples per (phase, batch) and, unless joules is None, the energy metrics the meter
    stores for each (energy_per_<per>, energy_above_idle_per_<per>, avg_power_w); without them, the meter's note."""
    params = dict(params or {"workload": workload, "device": "cpu", "phases": [p for p, _ in points], "iters": 40})
    if repeat is not None:
        params.update(repeat=repeat[0], repeats=repeat[1])
    run_id = store.create_run(kind, workload, mode, "cpu", params, group_id=group)
    store.start_run(run_id)
    rng = np.random.default_rng(run_id)
    result = RunResult(env={**ENV, "git_commit": commit}, conditions=conditions)
    for phase, batch in points:
        result.samples.append(Samples(phase, list(time_scale * 100 * np.exp(rng.normal(0, 0.01, 40))), "us", batch))
        result.metrics.append(Metric("max_abs_err", 1e-7, "", phase, batch))
        if joules is not None:
            result.metrics += [Metric(f"energy_per_{per}", joules, f"J/{per}", phase, batch),
                               Metric("avg_power_w", 40.0, "W", phase, batch)]
            if above_idle is not None:
                result.metrics.append(Metric(f"energy_above_idle_per_{per}", above_idle, f"J/{per}", phase, batch))
    if joules is None:
        result.notes.append(NO_RAPL)
    store.record_result(run_id, result)
    return run_id


def add_group(store: Store, mode: str, commit: str, joules: float, processes: int = 3, spread: float = 0.01,
              seed: int = 0, **kw) -> list[int]:
    """One `bench --repeat N` measurement: N processes, each with its own energy figure exp(N(0, spread)) apart."""
    rng = np.random.default_rng(seed + 31 * len(mode) + int(joules * 1000))
    group = uuid.uuid4().hex[:12]
    out = []
    for i in range(processes):
        scale = float(np.exp(rng.normal(0, spread)))
        out.append(add_run(store, mode, commit, joules=joules * scale, above_idle=0.4 * joules * scale, group=group,
                           repeat=(i, processes), **kw))
    return out


def energy(**kw) -> Options:
    return Options(metric="energy", **kw)


def test_more_energy_at_the_same_time_is_a_regression_of_energy_only(store: Store) -> None:
    for mode in ("eager", "fx"):
        add_group(store, mode, "aaaa", 0.5)
        add_group(store, mode, "bbbb", 0.5, seed=1)
    heavy = add_group(store, "fx", "cccc", 0.5 * 1.25, seed=2)  # 25 % more joules per step, the same time
    add_group(store, "eager", "cccc", 0.5, seed=2)

    same = compare(store, "commit:aaaa", "commit:bbbb", energy())
    assert same.metric == "energy" and {r.verdict for r in same.rows} == {"unchanged"} and same.exit_code == 0
    assert set(same.counts()) == {"more energy", "less energy", "unchanged", "cannot tell", "too few samples"}

    result = compare(store, "commit:aaaa", "commit:cccc", energy())
    assert result.regressed and result.exit_code == 1
    assert result.counts()["more energy"] == 2 and result.counts()["unchanged"] == 2
    worse = [r for r in result.rows if r.verdict == "more energy"]
    assert {r.mode for r in worse} == {"fx"} and {r.phase for r in worse} == {"infer", "train"}
    row = worse[0]
    assert row.unit == "J/step" and row.runs_head == heavy and row.procs_base == row.procs_head == 3
    assert 1.15 < row.ci_low < row.ratio < row.ci_high < 1.4 and row.ratio == pytest.approx(1.25, rel=0.05)
    assert row.above_idle_head == pytest.approx(0.4 * row.median_head, rel=1e-9)  # reported beside, not judged
    assert "between these runs' processes (3 + 3)" in row.process_noise
    text = render(result)
    assert "energy (whole board or CPU package; above idle beside it)" in text and "REGRESSION" in text
    assert "mJ/step" in text and "(40 %)" in text  # 500 mJ/step, 200 mJ/step (40 %) above idle
    data = json.loads(to_json(result))
    assert data["metric"] == "energy" and data["counts"]["more energy"] == 2 and data["exit_code"] == 1
    # The time of those runs did not change: the time verdict says so.
    assert compare(store, "commit:aaaa", "commit:cccc").exit_code == 0

    db = ["--db", str(store.path)]
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:cccc", "--metric", "energy", *db]) == 1
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:bbbb", "--metric", "energy", *db]) == 0
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:cccc", *db]) == 0


def test_one_run_a_side_cannot_tell_without_measured_energy_noise(store: Store,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = add_run(store, "eager", "aaaa", joules=0.5)
    head = add_run(store, "eager", "bbbb", joules=0.6)
    result = compare(store, str(base), str(head), energy())
    assert {r.verdict for r in result.rows} == {"cannot tell"} and result.exit_code == 3
    row = result.rows[0]
    assert row.ratio == pytest.approx(1.2) and row.ci_low != row.ci_low  # one figure a side: no interval
    assert row.repeats_needed and f"bench --repeat {row.repeats_needed}" in row.why
    assert "no process-to-process noise measured for this series' energy on this machine" in row.why
    assert cli.main(["compare", "--base", str(base), "--head", str(head), "--metric", "energy",
                     "--db", str(store.path)]) == 3
    out = capsys.readouterr().out
    assert "CANNOT TELL" in out and "1.200 [—]" in out


def test_one_run_a_side_is_judged_with_the_energy_spread_of_earlier_repeat_groups(store: Store) -> None:
    for seed in range(3):  # earlier repeat groups of eager on this machine: processes ±2 % apart in energy
        add_group(store, "eager", "0000", 0.5, spread=0.02, seed=seed)
    base = add_run(store, "eager", "aaaa", joules=0.5)
    more = add_run(store, "eager", "bbbb", joules=0.65)
    near = add_run(store, "eager", "cccc", joules=0.505)
    rows = compare(store, f"ids:{base}", f"ids:{more}", energy()).rows
    assert {r.verdict for r in rows} == {"more energy"}
    assert all("3 earlier repeat group(s)" in r.process_noise for r in rows)
    assert {r.verdict for r in compare(store, f"ids:{base}", f"ids:{near}", energy()).rows} == {"unchanged"}


def test_runs_without_energy_figures_get_one_line(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    base = add_run(store, "eager", "aaaa", joules=None)
    head = add_run(store, "eager", "bbbb", joules=None)
    with pytest.raises(CompareError, match=f"energy: not measured in runs {base}, {head}: NVML or RAPL not "
                                           "available there"):
        compare(store, "commit:aaaa", "commit:bbbb", energy())
    code = cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:bbbb", "--metric", "energy",
                     "--db", str(store.path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no RAPL zones under /sys/class/powercap" in err
    assert compare(store, "commit:aaaa", "commit:bbbb").metric == "time"  # the time is still there to compare
    with pytest.raises(CompareError, match="compare judges one of time, energy"):
        compare(store, "commit:aaaa", "commit:bbbb", Options(metric="power"))


def test_a_side_without_figures_cannot_tell_and_a_series_measured_nowhere_is_left_out(store: Store) -> None:
    add_group(store, "eager", "aaaa", 0.5)
    add_group(store, "fx", "aaaa", 0.5)
    for i in range(3):  # the head's eager measured energy, its fx did not
        add_run(store, "eager", "bbbb", joules=0.5 * (1 + 0.01 * i), group="g-eager", repeat=(i, 3))
        add_run(store, "fx", "bbbb", joules=None, group="g-fx", repeat=(i, 3))
    result = compare(store, "commit:aaaa", "commit:bbbb", energy())
    by_mode = {r.mode: r for r in result.rows if r.phase == "infer"}
    assert by_mode["eager"].verdict == "unchanged"
    assert by_mode["fx"].verdict == "cannot tell" and "no energy figure in the head runs" in by_mode["fx"].why
    # a series no run measured on either side is left out with a note
    add_run(store, "compile", "aaaa", joules=None)
    add_run(store, "compile", "bbbb", joules=None)
    notes = " ".join(compare(store, "commit:aaaa", "commit:bbbb", energy()).notes)
    assert "2 series with no energy figure in any run left out" in notes and "compile" in notes


def test_flagged_runs_are_left_out_of_the_energy_verdict_unless_asked(store: Store) -> None:
    flagged = {"state": "interfered", "flags": ["other processes took 1.6 of 2 cores"],
               "series": [{"phase": p, "batch_size": 64, "state": "interfered",
                           "flags": ["other processes took 1.6 of 2 cores"]} for p in ("infer", "train")]}
    add_group(store, "eager", "aaaa", 0.5)
    head = add_group(store, "eager", "bbbb", 0.7, conditions=flagged)
    result = compare(store, "commit:aaaa", "commit:bbbb", energy())
    assert {r.verdict for r in result.rows} == {"cannot tell"} and result.exit_code == 3
    assert all(r.flagged_left_out == head and "every head run of this series is flagged" in r.why
               for r in result.rows)
    counted = compare(store, "commit:aaaa", "commit:bbbb", energy(include_flagged=True))
    assert {r.verdict for r in counted.rows} == {"more energy"}


def test_llm_energy_per_token_and_per_prefill_are_judged_apart(store: Store) -> None:
    params = {"preset": "tiny", "prompt_len": 32, "new_tokens": 16, "batch": 1, "device": "cpu"}
    for commit, token_j in (("aaaa", 0.01), ("bbbb", 0.013)):  # decode 30 % more J/token, prefill the same
        group = uuid.uuid4().hex[:12]
        for i in range(3):
            wiggle = 1 + 0.005 * (i - 1)
            run_id = store.create_run("llm", "llama-tiny", "eager", "cpu", {**params, "repeat": i, "repeats": 3},
                                      group_id=group)
            store.start_run(run_id)
            rng = np.random.default_rng(run_id)
            store.record_result(run_id, RunResult(
                samples=[Samples("prefill", list(900 * np.exp(rng.normal(0, 0.01, 5))), "us", 1),
                         Samples("decode", list(300 * np.exp(rng.normal(0, 0.01, 32))), "us", 1)],
                metrics=[Metric("energy_per_token", token_j * wiggle, "J/token", "decode", 1),
                         Metric("energy_per_prefill", 0.2 * wiggle, "J/prefill", "prefill", 1)],
                env={**ENV, "git_commit": commit}))
    rows = {r.phase: r for r in compare(store, "commit:aaaa", "commit:bbbb", energy()).rows}
    assert rows["decode"].verdict == "more energy" and rows["decode"].unit == "J/token"
    assert rows["decode"].ratio == pytest.approx(1.3)
    assert rows["prefill"].verdict == "unchanged" and rows["prefill"].unit == "J/prefill"
    assert rows["decode"].above_idle_base != rows["decode"].above_idle_base  # no idle draw stored: none shown


def test_the_interval_over_run_figures_holds_its_error_rates() -> None:
    """Three runs a side, each figure off by its own ±3 %: the CI alone excludes 1 within α's bound for the same
    configuration (measured: 9 of 200), and 25 % more energy is called (measured: 200 of 200)."""
    false = hits = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        base, same, more = (list(s * np.exp(rng.normal(0, 0.03, 3))) for s in (1.0, 1.0, 1.25))
        false += verdict(*figure_ratio_ci(base, same, seed=seed), 3, 3, threshold=0.0, min_samples=1) != "unchanged"
        hits += verdict(*figure_ratio_ci(base, more, seed=seed), 3, 3, min_samples=1) == "slower"
    assert false / SEEDS <= FPR_BOUND and hits / SEEDS >= 0.95
