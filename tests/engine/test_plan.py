"""engine.plan: one planner for bench, levels and LLM groups — who prepares side by side, in which order — and real
bench groups supervised that way: no timing window overlaps another run's work (from the recorded timelines), and
their step medians match a serial group's within the noise of repeated serial groups."""

from __future__ import annotations

import math

import pytest

from engine import plan
from engine.jobs import JobSpec, create_runs
from engine.report import group_timeline, hold_overlaps
from engine.store import Store


@pytest.fixture
def store(tmp_path, monkeypatch) -> Store:
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    return Store(tmp_path / "results.duckdb")


@pytest.fixture
def no_ceilings(monkeypatch) -> list[str]:
    """ensure_ceilings would measure this machine's ceilings in a worker first: record the call instead."""
    calls: list[str] = []
    monkeypatch.setattr(plan, "ensure_ceilings", lambda store, device, timeout_s: calls.append(device))
    return calls


def _bench(store: Store, modes: list[str], device: str = "cpu", **params) -> list[int]:
    return create_runs(store, [JobSpec("bench", "house_price", m, device, {"mode": m, "device": device, **params})
                               for m in modes])


def test_a_bench_group_prepares_its_slow_modes_first_side_by_side(store, no_ceilings, monkeypatch) -> None:
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 16)
    ids = _bench(store, ["eager", "fx", "compile", "aoti", "compile-max-autotune", "custom_op"], device="cuda")
    p = plan.plan_group(store, ids)
    assert p.slots == 6 and p.why == "6 at a time (16 cores)"  # two of the 14 cores a timing leaves, each
    assert p.order == [ids[3], ids[4], ids[5], ids[2], ids[0], ids[1]]  # builds and autotuning, compiles, the rest
    assert no_ceilings == ["cuda"]  # measured once, first, for the whole group
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 8)
    assert plan.plan_group(store, ids).slots == 3


def test_a_levels_group_puts_the_cuda_build_first(store, no_ceilings, monkeypatch) -> None:
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
def test_the_group_size_says_why(store, no_ceilings, requested, serial, slots, why) -> None:
    ids = _bench(store, ["eager", "fx", "torchscript", "compile"])
    p = plan.plan_group(store, ids, requested, serial)
    assert (p.slots, p.why) == (slots, why)
    assert no_ceilings == (["cpu"] if slots > 1 else [])


def test_mixed_kinds_and_unphased_kinds_run_one_at_a_time_in_order(store, no_ceilings) -> None:
    mixed = _bench(store, ["eager"]) + create_runs(store, [JobSpec("levels", "causal_attention", "L1-naive", "cpu")])
    assert plan.plan_group(store, mixed) == plan.GroupPlan(1, mixed, "one run at a time (not one kind of run on "
                                                                       "one device)")
    train = create_runs(store, [JobSpec("train", "house_price", "eager", "cpu", {}) for _ in range(2)])
    assert plan.plan_group(store, train).slots == 1
    assert no_ceilings == []


def _medians(store: Store, ids: list[int]) -> dict[tuple[str, str, int], float]:
    metrics = store.metrics(ids)
    runs = {i: store.run(i)["mode"] for i in ids}
    rows = metrics[metrics["name"] == "median"]
    return {(runs[int(r.run_id)], r.phase, int(r.batch_size)): float(r.value) for r in rows.itertuples()}


@pytest.mark.slow
def test_a_side_by_side_bench_group_times_alone_and_matches_serial_groups(store) -> None:
    """Tolerance: a side-by-side median may differ from the mean of two serial groups' medians by at most
    max(3 × the two serial groups' own difference, 25 %) in log terms, per (mode, phase, batch). Where one misses,
    a second side-by-side group runs and each key's lower median counts: on the 2-core CI machine a neighbour once
    slowed one group's eager by 1.43× (a full suite run, 2026-11-25; alone it passed every time), while a timing that
    ran beside another run's compile would be slow in both groups."""
    params = {"phases": ["infer"], "batch_sizes": [64], "warmup": 5, "iters": 60, "loop": False}
    modes = ["eager", "fx", "torchscript"]
    serial = []
    for _ in range(2):
        ids = _bench(store, modes, **params)
        assert set(plan.supervise(store, ids, serial=True).values()) == {"ok"}
        serial.append(_medians(store, ids))
    side = _bench(store, modes, **params)
    assert set(plan.supervise(store, side, requested=3).values()) == {"ok"}, [store.run(i)["error"] for i in side]

    timeline = group_timeline(store, side)
    assert set(timeline["run_id"]) == set(side)
    assert {"shared", "exclusive"} <= set(timeline["hold"])  # they did prepare side by side and time alone
    assert hold_overlaps(timeline).empty, hold_overlaps(timeline)

    def misses(medians: dict[tuple[str, str, int], float]) -> list[tuple]:
        out = []
        for key, median in medians.items():
            a, b = serial[0][key], serial[1][key]
            allowed = max(3 * abs(math.log(a / b)), math.log(1.25))
            if abs(math.log(median / math.sqrt(a * b))) > allowed:
                out.append((key, median, a, b))
        return out

    medians = _medians(store, side)
    if misses(medians):
        again = _bench(store, modes, **params)
        assert set(plan.supervise(store, again, requested=3).values()) == {"ok"}
        assert hold_overlaps(group_timeline(store, again)).empty
        second = _medians(store, again)
        medians = {key: min(m, second[key]) for key, m in medians.items()}
    assert not misses(medians), misses(medians)


def test_hold_overlaps_finds_a_timing_beside_another_runs_preparation() -> None:
    import pandas as pd

    rows = [(1, "eager", "timing", "exclusive", 0.0, 2.0), (2, "fx", "compiling", "shared", 1.5, 3.0),
            (2, "fx", "timing", "exclusive", 3.0, 4.0), (3, "aoti", "waiting", "none", 0.0, 4.0)]
    clash = hold_overlaps(pd.DataFrame(rows, columns=["run_id", "mode", "step", "hold", "start_s", "end_s"]))
    assert clash[["run_id", "run_id_other", "step_other"]].values.tolist() == [[1, 2, "compiling"]]


def test_runs_preparing_side_by_side_split_inductors_compile_threads(monkeypatch) -> None:
    import torch._inductor.config as inductor_config

    from engine import worker

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
