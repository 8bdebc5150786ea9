"""engine.runner.plan: one planner for bench, levels and LLM groups — who prepares side by side, in which order — and
real
bench groups supervised that way: no timing window overlaps another run's work (from the recorded timelines), and
their step medians match a serial group's within the noise of repeated serial groups."""

from __future__ import annotations

import math

import pytest

from engine.runner import plan
from engine.runner.jobs import JobSpec, create_runs
from engine.store.db import Store
from engine.store.report import group_timeline, hold_overlaps


@pytest.fixture
def store(tmp_path, monkeypatch) -> Store:
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    return Store(tmp_path / "results.duckdb")


@pytest.fixture
def group_starts(monkeypatch) -> list[tuple]:
    """A group's start would measure this machine's ceilings in a worker and start native builds: record the calls
    (engine.measure.ceilings.ensure_ceilings, engine.native.prebuild.start) instead."""
    from engine.measure import ceilings
    from engine.native import prebuild

    calls: list[tuple] = []
    monkeypatch.setattr(ceilings, "ensure_ceilings",
                        lambda store, device, timeout_s: calls.append(("ceilings", device)))
    monkeypatch.setattr(prebuild, "start", lambda modes, device: calls.append(("builds", list(modes), device)))
    return calls


def _bench(store: Store, modes: list[str], device: str = "cpu", **params) -> list[int]:
    return create_runs(store, [JobSpec("bench", "house_price", m, device, {"mode": m, "device": device, **params})
                               for m in modes])


def test_a_bench_group_prepares_its_slow_modes_first_side_by_side(store, group_starts, monkeypatch) -> None:
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 16)
    ids = _bench(store, ["eager", "fx", "compile", "aoti", "compile-max-autotune", "custom_op"], device="cuda")
    p = plan.plan_group(store, ids)
    assert p.slots == 6 and p.why == "6 at a time (16 cores)"  # two of the 14 cores a timing leaves, each
    assert p.order == [ids[3], ids[4], ids[5], ids[2], ids[0], ids[1]]  # builds and autotuning, compiles, the rest
    assert group_starts == []  # planning starts nothing
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 8)
    assert plan.plan_group(store, ids).slots == 3


@pytest.mark.parametrize("requested, serial, starts", [(3, False, True), ("auto", True, False)])
def test_a_group_side_by_side_measures_its_ceilings_then_starts_its_builds(store, group_starts, monkeypatch,
                                                                          requested, serial, starts) -> None:
    ids = _bench(store, ["eager", "aoti", "compile"], device="cuda")
    supervised: list[tuple[list[int], int]] = []
    monkeypatch.setattr(plan, "run_jobs", lambda store, order, on_progress, launcher, prepare_parallel, needs, budget:
                        supervised.append((order, prepare_parallel)) or {i: "ok" for i in order})
    assert plan.supervise(store, ids, requested=requested, serial=serial) == {i: "ok" for i in ids}
    assert supervised == [([ids[1], ids[2], ids[0]], 3 if starts else 1)]  # the slowest to prepare first
    # the bench kind's group_start hooks, in order, once for the whole group (engine/bench/kind.py)
    assert group_starts == ([("ceilings", "cuda"), ("builds", ["aoti", "compile", "eager"], "cuda")] if starts
                            else [])


def test_a_levels_group_puts_the_cuda_build_first(store, group_starts, monkeypatch) -> None:
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 2)
    levels = ["L1-naive", "L1-native", "L2-torchscript", "L3-compile", "L4-triton", "L5-cuda"]
    ids = create_runs(store, [JobSpec("levels", "causal_attention", lv, "cpu", {}) for lv in levels])
    p = plan.plan_group(store, ids)
    assert p.slots == 2 and p.order[0] == ids[5] and set(p.order[1:3]) == {ids[3], ids[4]}


@pytest.mark.parametrize("requested, serial, slots, why", [
    ("auto", True, 1, "one run at a time (--serial)"),
    (3, False, 3, "--prepare-parallel 3"),
    (9, False, 4, "--prepare-parallel 9"),  # never more than runs
])
def test_the_group_size_says_why(store, requested, serial, slots, why) -> None:
    ids = _bench(store, ["eager", "fx", "torchscript", "compile"])
    p = plan.plan_group(store, ids, requested, serial)
    assert (p.slots, p.why) == (slots, why)


def test_mixed_kinds_and_unphased_kinds_run_one_at_a_time_in_order(store) -> None:
    mixed = _bench(store, ["eager"]) + create_runs(store, [JobSpec("levels", "causal_attention", "L1-naive", "cpu")])
    assert plan.plan_group(store, mixed) == plan.GroupPlan(1, mixed, "one run at a time (not one kind of run on "
                                                                       "one device)")
    train = create_runs(store, [JobSpec("train", "house_price", "eager", "cpu", {}) for _ in range(2)])
    assert plan.plan_group(store, train).slots == 1


def _medians(store: Store, ids: list[int]) -> dict[tuple[str, str, int], float]:
    metrics = store.metrics(ids)
    runs = {i: store.run(i)["mode"] for i in ids}
    rows = metrics[metrics["name"] == "median"]
    return {(runs[int(r.run_id)], r.phase, int(r.batch_size)): float(r.value) for r in rows.itertuples()}


def _side_by_side_group(store: Store, modes: list[str], params: dict) -> dict[tuple[str, str, int], float]:
    ids = _bench(store, modes, **params)
    assert set(plan.supervise(store, ids, requested=3).values()) == {"ok"}, [store.run(i)["error"] for i in ids]
    timeline = group_timeline(store, ids)
    assert set(timeline["run_id"]) == set(ids)
    assert {"shared", "exclusive"} <= set(timeline["hold"])  # they did prepare side by side and time alone
    assert hold_overlaps(timeline).empty, hold_overlaps(timeline)
    return _medians(store, ids)


def _serial_group(store: Store, modes: list[str], params: dict) -> dict[tuple[str, str, int], float]:
    ids = _bench(store, modes, **params)
    assert set(plan.supervise(store, ids, serial=True).values()) == {"ok"}
    return _medians(store, ids)


def _timing_misses(serial: list[dict], side: list[dict]) -> list[tuple]:
    """Keys whose least side-by-side median is off the least serial median in log terms by more than max(3 × the
    serial groups' own spread, 25 %) on the slow side, or 2× on the fast side. The least median of a few groups
    estimates the undisturbed time on both sides. One-sided because a run preparing beside a timing can only slow
    it; a side-by-side group that came out faster met a faster machine (the 2-core CI machine's speed drifts: a
    side-by-side eager can run ~30 % faster than every serial group before it), and only a timing that skipped work
    would come out 2× faster."""
    out = []
    for key in serial[0]:
        serial_key = [g[key] for g in serial]
        best_serial, best_side = min(serial_key), min(g[key] for g in side)
        spread = 3 * math.log(max(serial_key) / best_serial)
        ratio = math.log(best_side / best_serial)
        if ratio > max(spread, math.log(1.25)) or -ratio > max(spread, math.log(2.0)):
            out.append((key, best_side, serial_key))
    return out


@pytest.mark.slow
def test_a_side_by_side_bench_group_times_alone_and_matches_serial_groups(store) -> None:
    """Two serial groups, then a side-by-side one; while a key misses (see _timing_misses), one more serial and one
    more side-by-side group run and the comparison is made again over all of them. On the 2-core CI machine the
    machine's own speed drifts between groups (a neighbour can slow one group's eager by ~1.4×, or a side-by-side
    group can meet a faster machine), and a run's median there is two-valued, ~115 or ~150–177 µs, in serial groups
    as often as side by side, as in a bare torch loop over the same MLP (docs/measurement.md). Both side-by-side
    groups can meet the slow value, so misses add groups until one side-by-side group of each key meets the fast
    value, four at most — a timing slowed by its neighbours is slow in all four, and the hold timelines show it
    anyway."""
    params = {"phases": ["infer"], "batch_sizes": [64], "warmup": 5, "iters": 60, "loop": False}
    modes = ["eager", "fx", "torchscript"]
    serial = [_serial_group(store, modes, params) for _ in range(2)]
    side = [_side_by_side_group(store, modes, params)]
    for _ in range(3):  # at most four side-by-side groups: see the docstring
        if not _timing_misses(serial, side):
            break
        serial.append(_serial_group(store, modes, params))
        side.append(_side_by_side_group(store, modes, params))
    assert not _timing_misses(serial, side), _timing_misses(serial, side)


def test_timing_misses_compares_the_least_medians_within_the_serial_spread() -> None:
    key = ("eager", "infer", 64)
    assert not _timing_misses([{key: 203.0}, {key: 218.0}], [{key: 160.0}])  # faster: not disturbed
    assert not _timing_misses([{key: 289.4}, {key: 262.4}, {key: 269.3}], [{key: 184.5}, {key: 228.5}])  # a clone
    assert not _timing_misses([{key: 203.0}, {key: 218.0}, {key: 161.0}], [{key: 160.0}, {key: 170.0}])
    assert _timing_misses([{key: 100.0}, {key: 102.0}, {key: 101.0}], [{key: 180.0}, {key: 175.0}])  # slow each time
    assert _timing_misses([{key: 100.0}, {key: 101.0}], [{key: 130.0}])  # 30 % slower: disturbed
    assert _timing_misses([{key: 203.0}, {key: 218.0}], [{key: 95.0}])  # over 2× faster: work skipped


def test_hold_overlaps_finds_a_timing_beside_another_runs_preparation() -> None:
    import pandas as pd

    rows = [(1, "eager", "timing", "exclusive", 0.0, 2.0), (2, "fx", "compiling", "shared", 1.5, 3.0),
            (2, "fx", "timing", "exclusive", 3.0, 4.0), (3, "aoti", "waiting", "none", 0.0, 4.0)]
    clash = hold_overlaps(pd.DataFrame(rows, columns=["run_id", "mode", "step", "hold", "start_s", "end_s"]))
    assert clash[["run_id", "run_id_other", "step_other"]].values.tolist() == [[1, 2, "compiling"]]


def test_runs_preparing_side_by_side_split_inductors_compile_threads(monkeypatch) -> None:
    import torch._inductor.config as inductor_config

    from engine.runner import worker

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 16)
    # Put back by hand: monkeypatch's undo deletes an attribute not in the module's __dict__, and Inductor's config
    # keeps its entries elsewhere — a later compile then failed on a missing compile_threads.
    before = inductor_config.compile_threads
    try:
        worker.share_compile_threads(4)
        assert worker.os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "4" and inductor_config.compile_threads == 4
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")  # the user's choice stands
        worker.share_compile_threads(8)
        assert worker.os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "3" and inductor_config.compile_threads == 4
    finally:
        inductor_config.compile_threads = before


def test_admission_keeps_the_runs_under_way_within_the_budget_and_runs_every_one(store, monkeypatch) -> None:
    """run_jobs with needs and a budget (an LLM group's device bytes): a run starts only while its need fits beside
    those under way, in the order given; one too big for the budget still runs, alone."""
    import threading
    import time

    from engine.runner import jobs

    ids = create_runs(store, [JobSpec("llm", "llama-7B", m, "cuda", {"mode": m, "_kind": {"phased": True}})
                              for m in ("a", "b", "c", "d", "e", "f")])
    needs = dict(zip(ids, (60, 30, 30, 30, 110, 20)))  # e alone exceeds the budget
    under_way: dict[int, int] = {}
    seen: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def fake_run_one(store, run_id, on_progress, launcher, group_size):
        with lock:
            under_way[run_id] = needs[run_id]
            seen.append(tuple(sorted(under_way)))
        time.sleep(0.05)
        with lock:
            del under_way[run_id]
        return "ok"

    class Launcher:
        why_not = None

        def open(self) -> None: ...

        def close(self) -> None: ...

    monkeypatch.setattr(jobs, "run_one", fake_run_one)
    statuses = jobs.run_jobs(store, ids, launcher=Launcher(), prepare_parallel=4, needs=needs, budget=100)
    assert statuses == {i: "ok" for i in ids}
    assert all(sum(needs[i] for i in held) <= 100 or held == (ids[4],) for held in seen)
    assert max(len(held) for held in seen) >= 2  # side by side where they fit (a 60 and a 30, or three 30s)
    assert any(held == (ids[4],) for held in seen)  # the one too big ran, alone
