"""engine.runner.kinds: the registry of run kinds, what a run stores of its kind, the supervisor working from that
alone (an old or unknown run runs alone), and the table that keeps old stored targets starting."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.runner import kinds, plan
from engine.runner.jobs import JobSpec, create_runs, run_jobs
from engine.store.db import Store

FAULTS = "tests.engine.runner.fault_targets"
REPO = Path(__file__).resolve().parents[3]
recorded_start = importlib.import_module(FAULTS).recorded_start  # a group_start hook a supervisor can import


@pytest.fixture
def store(lab_env) -> Store:
    return Store(lab_env["RESULTS_DB"])


def test_the_lab_registers_each_kind_where_its_feature_lives_without_torch() -> None:
    code = ("import sys; import engine.cli.main; from engine.runner import kinds; "
            "print(' '.join(sorted(k.name for k in kinds.all())), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.split() == ["bench", "ceilings", "levels", "llm", "profile", "train", "False"]


def test_every_kinds_target_and_hooks_name_functions_that_exist() -> None:
    importlib.import_module("engine.ir.runs")  # the IR's kind registers where IR runs are created
    for kind in kinds.all():
        hooks = [kind.target] if kind.target else []
        hooks += [kind.planner] if kind.planner else []
        for hook in (*hooks, *kind.group_start):
            assert callable(kinds.resolve(hook)), (kind.name, hook)
    assert kinds.get("ir").target is None  # each IR run names its own: an extraction or a verification


def test_registering_checks_names_and_hooks(monkeypatch) -> None:
    monkeypatch.setattr(kinds, "_KINDS", {})
    kind = kinds.register(kinds.RunKind("demo", f"{FAULTS}:ok", phased=True, group_start=(recorded_start,)))
    assert kinds.register(kinds.RunKind("demo", f"{FAULTS}:ok", phased=True, group_start=(recorded_start,))) == kind
    assert kinds.get("demo") is kind and kinds.all() == [kind] and kinds.get("nope") is None
    with pytest.raises(ValueError, match="registered already"):
        kinds.register(kinds.RunKind("demo", f"{FAULTS}:hang"))
    with pytest.raises(ValueError, match="top-level function"):
        kinds.register(kinds.RunKind("other", None, group_start=(lambda store, runs: None,)))
    with pytest.raises(ValueError, match="'module:function'"):
        kinds.register(kinds.RunKind("other", None, planner="no_colon"))
    assert kind.stored("m", "cpu").group_start == (f"{FAULTS}:recorded_start",)


def test_a_run_stores_what_the_runner_needs_of_its_kind(store) -> None:
    bench, level = create_runs(store, [JobSpec("bench", "house_price", "aoti", "cuda", {}),
                                       JobSpec("levels", "causal_attention", "L4-triton", "cpu", {})])
    stored = kinds.StoredKind.of(store.run(bench))
    assert store.run(bench)["params"]["_target"] == "engine.bench.run:bench_job"
    assert stored.phased and stored.prepare_cost == 3 and stored.preload is None and stored.planner is None
    assert stored.group_start == ("engine.measure.ceilings:ensure_for_group", "engine.native.prebuild:start_for_group")
    # Triton's interpreter off CUDA: switched on right after torch, before dynamo imports Triton
    assert kinds.StoredKind.of(store.run(level)).preload[:3] == ("torch", "engine.levels.interpreter", "torch._dynamo")
    llm = create_runs(store, [JobSpec("llm", "llama-tiny", "eager", "cpu", {})])[0]
    assert kinds.StoredKind.of(store.run(llm)).planner == "engine.llm.group:plan_group"
    assert kinds.StoredKind.of(store.run(llm)).plural == "LLM runs"


def test_an_unknown_kind_needs_a_target_and_then_runs_alone(store) -> None:
    store.init()
    with pytest.raises(ValueError, match="run kind 'mystery' names no target"):
        create_runs(store, [JobSpec("bench", "house_price", "eager", "cpu", {}),
                            JobSpec("mystery", "w", "m", "cpu", {})])
    assert store.runs().empty  # nothing stored: every spec is checked first
    ids = create_runs(store, [JobSpec("mystery", "w", f"m{i}", "cpu", {}, target=f"{FAULTS}:ok") for i in range(2)])
    assert "_kind" not in store.run(ids[0])["params"]
    assert plan.plan_group(store, ids, requested=2) == plan.GroupPlan(
        1, ids, "one run at a time (mystery runs hold the device from start to end)")


def test_a_run_stored_without_its_kind_runs_alone(store) -> None:
    """Runs queued before kinds were stored carry only their target (some under a module's old name)."""
    store.init()
    params = {"_target": "engine.bench:bench_job", "_timeout_s": 60}
    ids = [store.create_run("bench", "house_price", m, "cpu", dict(params)) for m in ("eager", "fx")]
    assert plan.plan_group(store, ids, requested=2).slots == 1
    with pytest.raises(ValueError, match="prepare side by side"):
        run_jobs(store, ids, prepare_parallel=2)
    assert kinds.current_target("engine.bench:bench_job") == "engine.bench.run:bench_job"


@pytest.mark.parametrize("old, new", sorted(kinds.MOVED_TARGETS.items()))
def test_old_stored_targets_resolve_to_functions_that_exist(old, new) -> None:
    assert kinds.current_target(old) == new and kinds.current_target(new) == new
    assert callable(kinds.resolve(new))


def test_a_worker_runs_the_current_target_of_an_old_name_without_the_kind_in_its_params(store, monkeypatch) -> None:
    monkeypatch.setitem(kinds.MOVED_TARGETS, f"{FAULTS}:moved_away", f"{FAULTS}:ok")
    run_id = create_runs(store, [JobSpec("bench", "house_price", "x", "cpu", {"value": 5},
                                         target=f"{FAULTS}:moved_away")])[0]
    assert "_kind" in store.run(run_id)["params"]
    assert run_jobs(store, [run_id]) == {run_id: "ok"}, store.run(run_id)["error"]
    job = json.loads((Path(store.path).parent / "artifacts" / f"run_{run_id}" / "job.json").read_text())
    assert job["target"] == f"{FAULTS}:ok" and not any(k.startswith("_") for k in job["params"])


def test_the_dashboards_supervisor_runs_a_groups_start_hooks_from_the_stored_runs(store, monkeypatch) -> None:
    """The kind is registered in this process only: the plan's start comes from what the runs stored."""
    monkeypatch.setattr(kinds, "_KINDS", {})
    kinds.register(kinds.RunKind("demo", f"{FAULTS}:ok", phased=True, group_start=(recorded_start,),
                                 plural="demo runs"))
    ids = create_runs(store, [JobSpec("demo", "w", f"m{i}", "cpu", {"steps": []}) for i in range(2)])
    monkeypatch.setattr(kinds, "_KINDS", {})  # as in a fresh supervisor process that registered nothing
    out = subprocess.run([sys.executable, "-m", "engine.runner.plan", "--db", str(store.path), *map(str, ids)],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("2 demo runs; preparing 2 at a time")
    assert json.loads((store.path.parent / "started.json").read_text()) == ids
