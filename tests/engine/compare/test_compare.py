"""`compare`: the statistics (Mann-Whitney against published values, the O(B) bootstrap against brute force, detection
and false-positive rates over seeds, processes as the unit), the SPEC grammar and threshold, comparisons of real runs
written through the Store API (bench, levels, llm; commits, devices, merged stores, latest; repeat groups, one process
a side, flagged runs), and the CLI's exit codes 0/1/2/3."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main as cli
from engine.compare.verdict import (
    ALPHA,
    CompareError,
    Options,
    bootstrap_medians,
    compare,
    mann_whitney,
    parse_spec,
    parse_threshold,
    process_ratio_ci,
    ratio_ci,
    render,
    repeats_needed,
    reproduce_command,
    t_quantile,
    to_json,
    verdict,
    widening,
)
from engine.store.db import Metric, RunResult, Samples, Store
from engine.store.merge import merge_store

REPO_ROOT = Path(__file__).resolve().parents[3]
SEEDS = 200
# Binomial slack on a rate measured over SEEDS trials: α plus 2.5 standard errors (0.05 + 0.039 → 17 of 200).
FPR_BOUND = ALPHA + 2.5 * (ALPHA * (1 - ALPHA) / SEEDS) ** 0.5


def timings(rng: np.random.Generator, n: int, scale: float = 1.0, noise: float = 0.02) -> np.ndarray:
    """Latency-like samples: a lognormal body around 100 µs and an exponential right tail."""
    return scale * (100 * np.exp(rng.normal(0, noise, n)) + rng.exponential(3, n))


# -- Mann-Whitney U --------------------------------------------------------------------------------------------------
def test_mann_whitney_matches_published_values() -> None:
    # scipy.stats.mannwhitneyu docs: males vs females, U1 = 17, method="asymptotic" p = 0.11134688653314041.
    u, p = mann_whitney([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert u == 17.0 and p == pytest.approx(0.11134688653314041, abs=1e-12)
    # R: wilcox.test(c(1,2,3), c(4,5,6), exact=FALSE) → W = 0, p-value = 0.08086.
    u, p = mann_whitney([1, 2, 3], [4, 5, 6])
    assert u == 0.0 and p == pytest.approx(0.0808556, abs=1e-6)
    assert mann_whitney([4, 5, 6], [1, 2, 3])[1] == pytest.approx(p)  # two-sided: symmetric


def test_mann_whitney_corrects_for_ties() -> None:
    # By hand: [1,2,2] vs [2,3,4]; ranks 1, 3, 3 | 3, 5, 6 → U = 7 - 6 = 1; one tie group of 3:
    # var = 3·3/12 · (7 - (27 - 3)/(6·5)) = 0.75 · 6.2 = 4.65; z = (|1 - 4.5| - 0.5)/√4.65; p = erfc(z/√2).
    u, p = mann_whitney([1, 2, 2], [2, 3, 4])
    assert u == 1.0 and p == pytest.approx(0.1641597, abs=1e-6)
    assert mann_whitney([5, 5, 5], [5, 5]) == (3.0, 1.0)  # all tied: no evidence at all


# -- the bootstrap ---------------------------------------------------------------------------------------------------
def brute_force_medians(runs: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The textbook two-stage bootstrap, one resample at a time: draw the runs, then every sample from them."""
    n = sum(len(r) for r in runs)
    out = np.empty(resamples)
    for b in range(resamples):
        chosen = rng.integers(0, len(runs), len(runs))
        slots = chosen[rng.integers(0, len(runs), n)]
        out[b] = np.median([runs[s][rng.integers(0, len(runs[s]))] for s in slots])
    return out


@pytest.mark.parametrize("sizes", [(7,), (8,), (25,), (10, 12, 9)])
def test_bootstrap_medians_match_the_brute_force_bootstrap(sizes: tuple[int, ...]) -> None:
    rng = np.random.default_rng(4)
    runs = [timings(rng, n, scale=1 + 0.05 * i) for i, n in enumerate(sizes)]
    fast = bootstrap_medians(runs, 100_000, np.random.default_rng(1))
    slow = brute_force_medians(runs, 4000, np.random.default_rng(2))
    quantiles = [0.025, 0.25, 0.5, 0.75, 0.975]
    # Same distribution: quantiles agree to within the brute force's own sampling error (a fraction of the spread).
    spread = np.quantile(slow, 0.975) - np.quantile(slow, 0.025)
    assert np.abs(np.quantile(fast, quantiles) - np.quantile(slow, quantiles)).max() < 0.08 * spread


def test_the_bootstrap_is_seeded() -> None:
    rng = np.random.default_rng(0)
    base, head = [timings(rng, 50)], [timings(rng, 50)]
    assert ratio_ci(base, head, seed=3) == ratio_ci(base, head, seed=3)
    assert ratio_ci(base, head, seed=3)[1:] != ratio_ci(base, head, seed=4)[1:]


@pytest.mark.parametrize("shift, expected", [(0.10, "slower"), (-0.10, "faster")])
def test_a_ten_percent_shift_at_low_noise_is_detected(shift: float, expected: str) -> None:
    hits = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        base, head = timings(rng, 50), timings(rng, 50, scale=1 + shift)
        ratio, lo, hi = ratio_ci([base], [head], seed=seed)
        hits += verdict(ratio, lo, hi, 50, 50) == expected
    assert hits / SEEDS >= 0.98  # measured: 200 of 200 (docs/compare.md)


def test_no_shift_false_positive_rate_stays_within_alpha() -> None:
    significant = past_threshold = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        base, head = timings(rng, 50), timings(rng, 50)
        ratio, lo, hi = ratio_ci([base], [head], seed=seed)
        significant += verdict(ratio, lo, hi, 50, 50, threshold=0.0) != "unchanged"  # the CI alone
        past_threshold += verdict(ratio, lo, hi, 50, 50) != "unchanged"  # the default 5 % gate
    assert significant / SEEDS <= FPR_BOUND  # measured: 7 of 200 = 3.5 %
    assert past_threshold == 0


def test_resampling_runs_keeps_run_to_run_noise_from_looking_significant() -> None:
    """Three runs a side, each run shifted by its own ±3 %: pooling the samples as if independent calls most such
    pairs different; drawing runs first keeps that far lower."""
    cluster = pooled = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        base = [timings(rng, 100, scale=np.exp(rng.normal(0, 0.03))) for _ in range(3)]
        head = [timings(rng, 100, scale=np.exp(rng.normal(0, 0.03))) for _ in range(3)]
        ratio, lo, hi = ratio_ci(base, head, seed=seed)
        cluster += verdict(ratio, lo, hi, 300, 300, threshold=0.0) != "unchanged"
        ratio, lo, hi = ratio_ci([np.concatenate(base)], [np.concatenate(head)], seed=seed)
        pooled += verdict(ratio, lo, hi, 300, 300, threshold=0.0) != "unchanged"
    assert pooled / SEEDS > 0.5 and cluster / SEEDS < 0.25  # measured: 155 and 31 of 200


def test_verdict_needs_significance_and_size() -> None:
    assert verdict(1.10, 1.02, 1.18, 50, 50) == "slower"
    assert verdict(1.04, 1.02, 1.06, 50, 50) == "unchanged"  # significant but under 5 %
    assert verdict(1.20, 0.98, 1.40, 50, 50) == "unchanged"  # big but not significant
    assert verdict(0.90, 0.85, 0.95, 50, 50) == "faster"
    assert verdict(1 / 1.04, 0.94, 0.98, 50, 50) == "unchanged"
    assert verdict(1.5, 1.4, 1.6, 4, 50) == "too few samples"
    assert verdict(1.04, 1.02, 1.06, 50, 50, threshold=0.03) == "slower"


# -- the SPEC grammar and the threshold ------------------------------------------------------------------------------
def test_spec_grammar() -> None:
    spec = parse_spec('device:"NVIDIA H100 80GB HBM3" ids:3,5-7 mode:eager mode:fx,compile latest:2')
    assert spec.clauses == {"device": ["NVIDIA H100 80GB HBM3"], "ids": ["3", "5", "6", "7"],
                            "mode": ["eager", "fx", "compile"]}
    assert spec.latest == 2
    assert parse_spec("latest").latest == 1 and parse_spec("latest").clauses == {}
    assert parse_spec("torch:2.11.0+cu130").clauses == {"torch": ["2.11.0+cu130"]}
    for bad, words in (("colour:red", "KEY one of"), ("ids:1,x", "12,15,20-24"), ("latest:0", "at least 1"),
                       ("", "empty SPEC"), ('device:"open', "quotation")):
        with pytest.raises(CompareError, match=words):
            parse_spec(bad)


def test_threshold_accepts_a_percentage_or_a_fraction() -> None:
    assert parse_threshold("5%") == pytest.approx(0.05) == parse_threshold("0.05")
    assert parse_threshold("0%") == 0.0 and parse_threshold("12.5%") == pytest.approx(0.125)
    with pytest.raises(CompareError, match=r"ambiguous: write 5% for a percentage or 0.05"):
        parse_threshold("5")
    for bad in ("abc", "150%", "-1%"):
        with pytest.raises(CompareError):
            parse_threshold(bad)


# -- real runs in a store --------------------------------------------------------------------------------------------
ENV = {"python": "3.11.0", "torch": "2.13.0", "device_name": "CPU: test", "git_commit": "aaaa1111",
       "hostname": "here", "threads": 2, "platform": "Linux"}
PROCESSES = 3  # a measurement's worker processes (bench --repeat 3)


def add_run(store: Store, mode: str, *, kind: str = "bench", workload: str = "house_price", device: str = "cpu",
            params: dict | None = None, env: dict | None = None, points: Sequence[tuple[str, int | None]] = (
                ("infer", 64), ("train", 64)), scale: float = 1.0, n: int = 60, seed: int = 0,
            errors: dict[str, float] | None = None, group: str | None = None, repeat: tuple[int, int] | None = None,
            conditions: dict | None = None) -> int:
    """An ok run with raw samples per (phase, batch) and the correctness metrics its kind stores; `repeat` =
    (index, count) makes it one process of a repeat group `group`; `conditions` is its stored noise record."""
    if params is None:
        params = {"workload": workload, "device": device, "phases": ["infer", "train"], "iters": n, "warmup": 5}
    if repeat is not None:
        params = {**params, "repeat": repeat[0], "repeats": repeat[1]}
    run_id = store.create_run(kind, workload, mode, device, params, group_id=group)
    store.start_run(run_id)
    rng = np.random.default_rng(seed * 1000 + run_id)
    result = RunResult(env={**ENV, **(env or {})}, conditions=conditions)
    for phase, batch in points:
        result.samples.append(Samples(phase, list(timings(rng, n, scale * (1 + (batch or 0) / 64))), "us", batch))
        result.metrics += [Metric(name, value, "", phase, batch) for name, value in (errors or {}).items()]
    store.record_result(run_id, result)
    return run_id


def add_processes(store: Store, mode: str, processes: int = PROCESSES, spread: float = 0.0, **kw) -> list[int]:
    """One measurement of `processes` worker processes (a repeat group), each scaled by its own exp(N(0, spread))."""
    rng = np.random.default_rng(kw.get("seed", 0) + 7 * len(mode) + processes)
    group = uuid.uuid4().hex[:12]
    scale = kw.pop("scale", 1.0)
    return [add_run(store, mode, group=group, repeat=(i, processes) if processes > 1 else None,
                    scale=scale * float(np.exp(rng.normal(0, spread))), **kw) for i in range(processes)]


def bench_round(store: Store, commit: str, slower: dict[str, float] | None = None, env: dict | None = None,
                processes: int = PROCESSES, **kw) -> dict[str, list[int]]:
    """One measurement of eager, fx and compile on this commit, `processes` worker processes each (their run ids by
    mode); `slower` scales some modes' samples."""
    return {mode: add_processes(store, mode, processes, env={"git_commit": commit, **(env or {})},
                                scale=(slower or {}).get(mode, 1.0), errors={"max_abs_err": 1e-7, "max_rel_err": 1e-6},
                                **kw) for mode in ("eager", "fx", "compile")}


def test_compare_two_commits_finds_the_slower_mode(store: Store) -> None:
    bench_round(store, "aaaa1111")
    head = bench_round(store, "bbbb2222", slower={"fx": 1.12})
    result = compare(store, "commit:AAAA", "commit:bbbb")
    assert result.regressed and result.counts() == {"slower": 2, "faster": 0, "unchanged": 4, "cannot tell": 0,
                                                    "too few samples": 0}
    slow = [r for r in result.rows if r.verdict == "slower"]
    assert {r.mode for r in slow} == {"fx"} and {r.phase for r in slow} == {"infer", "train"}
    row = slow[0]
    assert 1.06 < row.ci_low < row.ratio < row.ci_high < 1.18 and row.p_value < 1e-6
    assert row.n_base == row.n_head == 3 * 60 and row.runs_head == head["fx"] and row.unit == "us"
    assert row.procs_base == row.procs_head == 3 and "between these runs' processes (3 + 3)" in row.process_noise
    assert row.series.startswith("bench house_price fx") and "CPU: test" in row.series
    assert row.correctness == "max_abs_err 1e-07→1e-07 · max_rel_err 1e-06→1e-06" and not row.correctness_worse
    assert row.command.startswith("python -m engine bench --workload house_price --mode fx --device cpu --phases")
    text = render(result)
    assert "REGRESSION" in text and f"[1] {result.rows[0].command}" in text
    data = json.loads(to_json(result))
    assert data["regressed"] is True and data["rows"][0]["verdict"] == "slower" and data["exit_code"] == 1


def test_correctness_changes_are_flagged(store: Store) -> None:
    add_run(store, "eager", env={"git_commit": "aaaa"}, errors={"max_abs_err": 1e-7, "max_rel_err": 1e-6})
    add_run(store, "eager", env={"git_commit": "bbbb"}, errors={"max_abs_err": 1e-7, "max_rel_err": 5e-5})
    rows = compare(store, "commit:aaaa", "commit:bbbb").rows
    assert all(r.correctness_worse and "max_rel_err 1e-06→5e-05" in r.correctness for r in rows)


def test_levels_and_llm_series_are_kept_apart_and_get_their_commands(store: Store) -> None:
    for commit, scale in (("aaaa", 1.0), ("bbbb", 0.85)):
        for shape in ("small", "tiny"):
            add_processes(store, "L4-triton", kind="levels", workload="causal_attention",
                          env={"git_commit": commit}, scale=scale, errors={"rel_l2_err": 1e-4, "tolerance": 2e-3},
                          params={"component": "causal_attention", "shape": shape, "level": "L4-triton",
                                  "device": "cpu", "iters": 30, "warmup": 5}, points=[("forward", None)])
        for prompt in (32, 64):
            add_processes(store, "eager", kind="llm", workload="llama-tiny", env={"git_commit": commit},
                          params={"preset": "tiny", "prompt_len": prompt, "new_tokens": 16, "batch": 2,
                                  "mode": "eager", "device": "cpu", "dtype": None, "fuse": True, "tp": 1,
                                  "prefill_iters": 10, "decode_passes": 2, "ceilings": "stored", "profile": False},
                          points=[("prefill", 2), ("decode", 2)])
    result = compare(store, "commit:aaaa", "commit:bbbb")
    levels = sorted((r for r in result.rows if r.kind == "levels"), key=lambda r: r.config)
    assert [r.config for r in levels] == ["shape=small", "shape=tiny"] and {r.verdict for r in levels} == {"faster"}
    assert levels[0].batch_size is None and "rel_l2_err 0.0001→0.0001 · tolerance 0.002→0.002" in levels[0].correctness
    assert levels[0].command == ("python -m engine levels --component causal_attention --level L4-triton --shape "
                                 "small --device cpu --iters 30 --warmup 5")
    llm = [r for r in result.rows if r.kind == "llm"]
    assert sorted({r.config for r in llm}) == ["P=32 N=16", "P=64 N=16"] and len(llm) == 4
    assert {r.verdict for r in llm} == {"unchanged"} and {r.batch_size for r in llm} == {2}
    command = next(r.command for r in llm if r.config == "P=64 N=16")
    assert command.startswith("python -m engine llm --preset tiny --mode eager --device cpu --prompt-len 64 "
                              "--new-tokens 16 --batch 2")
    assert "--no-profile" in command and "# not settable from the CLI: ceilings=stored" in command
    only_llm = compare(store, "commit:aaaa", "commit:bbbb", Options(kinds=("llm",))).rows
    assert [r.series for r in only_llm] == [r.series for r in result.rows if r.kind == "llm"]


def test_a_run_without_usable_params_says_so() -> None:
    assert reproduce_command("levels", {"component": "x"}, "L1-naive", "cpu", "forward", -1) == \
        "(no CLI command: the run's stored params lack shape)"
    assert reproduce_command("bench", {"model": "pkg:make", "inputs": "float32[B,16]", "seed": 0}, "eager", "cpu",
                             "train", 8) == ("python -m engine bench --model pkg:make --inputs 'float32[B,16]' --mode "
                                             "eager --device cpu --phases train --train-batch-sizes 8")


def test_devices_of_two_machines_are_matched_across(store: Store, tmp_path: Path) -> None:
    other = Store(tmp_path / "h200.duckdb")
    other.init()
    bench_round(store, "aaaa", device="cuda:0", env={"device_name": "NVIDIA H100 80GB HBM3"})
    bench_round(other, "aaaa", device="cuda:0", env={"device_name": "NVIDIA H200"},
                slower={"compile": 0.8})
    merge_store(store, other.path)
    for base, head in (('device:"h100 80GB"', "device:H200"), ("merged:none", "merged:h200.duckdb"),
                       ("merged:none", f"merged:{other.path}")):
        result = compare(store, base, head)
        assert result.across_devices and "matched across devices" in " ".join(result.notes)
        assert {r.mode for r in result.rows if r.verdict == "faster"} == {"compile"}
        assert result.rows[0].device == "NVIDIA H100 80GB HBM3 → NVIDIA H200"
    with pytest.raises(CompareError, match="matches no finished"):
        compare(store, "merged:elsewhere.duckdb", "latest")


def test_latest_picks_the_newest_measurement_per_series_and_overlap_stays_on_the_head(store: Store) -> None:
    old = bench_round(store, "aaaa")
    newer = bench_round(store, "aaaa", slower={"eager": 1.2})
    result = compare(store, "commit:aaaa", "latest")
    # each newest measurement (all the processes of its repeat group) on the head only
    assert result.base_runs == sorted(sum(old.values(), [])) and result.head_runs == sorted(sum(newer.values(), []))
    assert "kept on the head side only" in " ".join(result.notes)
    assert {r.mode for r in result.rows if r.verdict == "slower"} == {"eager"}
    assert compare(store, "latest:2 mode:fx", "ids:" + ",".join(map(str, newer["fx"]))).base_runs == old["fx"]
    with pytest.raises(CompareError, match="once the runs the head selects are taken out"):
        compare(store, "ids:" + str(old["eager"][0]), "ids:" + str(old["eager"][0]))


def test_too_few_samples_and_no_common_series(store: Store) -> None:
    add_run(store, "eager", env={"git_commit": "aaaa"}, n=4)
    add_run(store, "eager", env={"git_commit": "bbbb"}, n=4)
    assert {r.verdict for r in compare(store, "commit:aaaa", "commit:bbbb").rows} == {"too few samples"}
    add_run(store, "fx", env={"git_commit": "cccc"}, points=[("infer", 1)])
    with pytest.raises(CompareError, match="no series in common"):
        compare(store, "commit:aaaa", "commit:cccc")


# -- processes: the unit of a verdict ---------------------------------------------------------------------------------
def test_one_process_a_side_cannot_tell_and_says_how_many_repeats(store: Store) -> None:
    """Two runs of one configuration, one process each, no repeat group ever measured on this machine: the samples'
    own interval would call the process-to-process shift a change; the verdict is 'cannot tell', with the repeats
    a side needs."""
    base = add_run(store, "eager", env={"git_commit": "aaaa"}, n=200)
    head = add_run(store, "eager", env={"git_commit": "bbbb"}, n=200, scale=1.08)  # another process's state
    rows = compare(store, str(base), str(head)).rows  # bare run ids are ids:…
    assert {r.verdict for r in rows} == {"cannot tell"} and all(r.ci_low > 1 for r in rows)
    assert all(r.repeats_needed and r.repeats_needed >= 2 and f"bench --repeat {r.repeats_needed}" in r.why
               for r in rows)
    assert all("no process-to-process noise measured for this series on this machine" in r.why for r in rows)


def test_one_process_a_side_uses_the_machines_measured_process_noise(store: Store) -> None:
    """Once repeat groups of the series were measured on this machine, one process a side is judged with their
    spread: a 30 % slowdown is slower, a 2 % shift within the measured ±4 % is unchanged."""
    for seed in range(3):  # earlier repeat groups of eager: processes ±4 % apart
        add_processes(store, "eager", processes=3, spread=0.04, seed=seed, env={"git_commit": "0000"})
    base = add_run(store, "eager", env={"git_commit": "aaaa"})
    slow = add_run(store, "eager", env={"git_commit": "bbbb"}, scale=1.3)
    near = add_run(store, "eager", env={"git_commit": "cccc"}, scale=1.02)
    rows = compare(store, f"ids:{base}", f"ids:{slow}").rows
    assert {r.verdict for r in rows} == {"slower"}
    assert all("σ = " in r.process_noise and "3 earlier repeat group(s)" in r.process_noise for r in rows)
    assert {r.verdict for r in compare(store, f"ids:{base}", f"ids:{near}").rows} == {"unchanged"}


def test_flagged_runs_are_left_out_unless_asked(store: Store) -> None:
    flagged = {"state": "interfered", "flags": ["other processes took 1.6 of 2 cores"],
               "series": [{"phase": p, "batch_size": 64, "state": "interfered",
                           "flags": ["other processes took 1.6 of 2 cores"]} for p in ("infer", "train")]}
    bench_round(store, "aaaa")
    head = add_processes(store, "eager", env={"git_commit": "bbbb"}, scale=1.3, conditions=flagged)
    result = compare(store, "commit:aaaa", "commit:bbbb")
    assert {r.verdict for r in result.rows} == {"cannot tell"} and result.exit_code == 3
    assert all(r.flagged_left_out == head and "every head run of this series is flagged" in r.why
               for r in result.rows)
    assert "left out of the verdicts (--include-flagged counts them)" in render(result)
    counted = compare(store, "commit:aaaa", "commit:bbbb", Options(include_flagged=True))
    assert {r.verdict for r in counted.rows} == {"slower"} and "counted, as --include-flagged asks" in \
        " ".join(counted.notes)


def test_process_noise_does_not_pass_for_a_change() -> None:
    """Three processes a side, each shifted by its own ±3 % (the same configuration): the widened hierarchical
    interval keeps false 'slower/faster' at the CI alone near α, where the raw cluster bootstrap called far more."""
    called = raw = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        base = [timings(rng, 100, scale=np.exp(rng.normal(0, 0.03))) for _ in range(3)]
        head = [timings(rng, 100, scale=np.exp(rng.normal(0, 0.03))) for _ in range(3)]
        ratio, lo, hi = process_ratio_ci(base, head, seed=seed)
        called += verdict(ratio, lo, hi, 300, 300, threshold=0.0) != "unchanged"
        ratio, lo, hi = ratio_ci(base, head, seed=seed)
        raw += verdict(ratio, lo, hi, 300, 300, threshold=0.0) != "unchanged"
    assert called / SEEDS <= FPR_BOUND and raw / SEEDS > 2 * called / SEEDS  # measured: 7 and 31 of 200


def test_a_quarter_more_work_over_three_processes_is_slower() -> None:
    hits = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        base = [timings(rng, 100, scale=np.exp(rng.normal(0, 0.03))) for _ in range(3)]
        head = [timings(rng, 100, scale=1.25 * np.exp(rng.normal(0, 0.03))) for _ in range(3)]
        hits += verdict(*process_ratio_ci(base, head, seed=seed), 300, 300) == "slower"
    assert hits / SEEDS >= 0.95  # measured: 200 of 200


def test_repeats_needed_follow_the_process_noise() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    assert widening(2, 2) == pytest.approx(3.10, abs=0.01) and widening(1, 5) == 1.0
    assert repeats_needed(0.01, 0.05) < repeats_needed(0.02, 0.05) < repeats_needed(0.05, 0.05)
    assert repeats_needed(0.02, 0.05) == 4  # t(6)/z·sqrt(4/3)·z·0.02·sqrt(2/4) = 0.040 ≤ log(1.05); 3 gives 0.055
    assert repeats_needed(1.0, 0.01) == 50


# -- the CLI ---------------------------------------------------------------------------------------------------------
def test_cli_exit_codes(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    bench_round(store, "aaaa1111")
    bench_round(store, "bbbb2222", slower={"fx": 1.12})
    bench_round(store, "cccc3333")
    # one process each on a machine where no repeat group was measured
    lone = [add_run(store, "eager", env={"git_commit": c, "device_name": "CPU: other", "hostname": "other"})
            for c in ("dddd", "eeee")]
    db = ["--db", str(store.path)]
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:cccc", *db]) == 0
    assert "6 unchanged" in capsys.readouterr().out
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:bbbb", "--threshold", "0.05", *db]) == 1
    assert "REGRESSION" in capsys.readouterr().out
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:bbbb", "--threshold", "20%", *db]) == 0
    assert "6 unchanged" in capsys.readouterr().out  # 12 % slower is under a 20 % threshold
    assert cli.main(["compare", "--base", "commit:aaaa", "--head", "commit:bbbb", "--json", *db]) == 1
    assert json.loads(capsys.readouterr().out)["counts"]["slower"] == 2
    assert cli.main(["compare", "--base", str(lone[0]), "--head", str(lone[1]), *db]) == 3
    assert "CANNOT TELL" in capsys.readouterr().out
    for head, extra, words in (("commit:bbbb", ["--threshold", "5"], "write 5% for a percentage or 0.05"),
                               ("commit:ffff", [], "--head 'commit:ffff' matches no finished"),
                               ("branch:main", [], "KEY one of"), ("12x", [], "write run ids as 12,15,20-24")):
        code = cli.main(["compare", "--base", "commit:aaaa", "--head", head, *extra, *db])
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1


def test_the_command_exits_1_on_a_regression_as_a_process(store: Store, child_env: dict[str, str]) -> None:
    bench_round(store, "aaaa1111")
    bench_round(store, "bbbb2222", slower={"compile": 1.15})
    done = subprocess.run([sys.executable, "-m", "engine", "compare", "--base", "commit:aaaa", "--head",
                           "commit:bbbb", "--kind", "bench"], cwd=REPO_ROOT, env=child_env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "bench house_price compile" in done.stdout and "slower" in done.stdout
