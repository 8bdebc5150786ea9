"""A store that another process keeps open (read-only, past the store's busy timeout) while runs finish delays their
record, it does not lose it: the supervisor keeps trying to record a finished run (RECORD_WAIT_S), and a result.json
that a supervisor could not record at all is recorded by the next command that opens the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import engine.runner.jobs as jobs
from engine.runner.jobs import JobSpec, create_runs, run_jobs
from engine.store.db import Store

REPO_ROOT = Path(__file__).resolve().parents[3]
TARGETS = "tests.engine.runner.fault_targets"


def _ok_run(store: Store, step_s: float) -> int:
    """An ok target that finishes step_s after it starts (it writes target.pid first: the holder's cue)."""
    [rid] = create_runs(store, [JobSpec("bench", "house_price", "ok", "cpu", {"steps": [0.5], "step_s": step_s},
                                        target=f"{TARGETS}:ok", timeout_s=120)])
    return rid


def _hold_once_started(store: Store, rid: int, lab_env: dict, child_env: dict, seconds: float,
                       tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A process that opens the store read-only once run rid's target has started, and keeps it for `seconds`."""
    go = Path(lab_env["ARTIFACTS_DIR"]) / f"run_{rid}" / "target.pid"
    done = tmp_path / "released.json"
    proc = subprocess.Popen([sys.executable, "-m", "tests.engine.store.store_procs", "hold", str(store.path), str(go),
                             str(seconds), str(done)], cwd=REPO_ROOT, env=child_env, stdout=subprocess.DEVNULL)
    return proc, done


def test_a_run_that_finishes_while_a_reader_holds_the_store_is_recorded_when_it_lets_go(lab_env, child_env, tmp_path):
    store = Store(lab_env["RESULTS_DB"], busy_timeout_s=1.0)  # each try gives up after 1 s; the reader holds 6 s
    store.init()
    rid = _ok_run(store, step_s=1.5)
    holder, done = _hold_once_started(store, rid, lab_env, child_env, 6.0, tmp_path)
    try:
        statuses = run_jobs(store, [rid])
        assert holder.wait(60) == 0
    finally:
        holder.kill()
    released = json.loads(done.read_text())["released_at"]
    result = Path(lab_env["ARTIFACTS_DIR"]) / f"run_{rid}" / "result.json"
    assert result.stat().st_mtime < released  # the worker was done while the reader still held the store
    assert statuses == {rid: "ok"}
    run = store.run(rid)
    assert run["status"] == "ok" and not run["error"]
    assert store.metrics([rid]).set_index("name").loc["answer", "value"] == 42.0


def test_a_result_its_supervisor_could_not_record_is_recorded_by_the_next_command(lab_env, child_env, tmp_path,
                                                                                   monkeypatch, capsys):
    monkeypatch.setattr(jobs, "RECORD_WAIT_S", 1.0)  # the supervisor gives up long before the reader lets go
    store = Store(lab_env["RESULTS_DB"], busy_timeout_s=0.5)
    store.init()
    rid = _ok_run(store, step_s=1.0)
    holder, _ = _hold_once_started(store, rid, lab_env, child_env, 8.0, tmp_path)
    try:
        assert run_jobs(store, [rid]) == {rid: "failed"}
        assert holder.wait(60) == 0
    finally:
        holder.kill()
    assert f"run {rid}: not recorded, the store stayed busy" in capsys.readouterr().err
    assert store.run(rid)["status"] == "running" and store.metrics([rid]).empty  # nothing was written
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store.set_owner([rid], gone.pid)  # its supervisor has ended (this test process stands in for it until now)

    listed = subprocess.run([sys.executable, "-m", "engine", "runs", "--db", str(store.path)], cwd=REPO_ROOT,
                            env=child_env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert f"recorded 1 finished run(s) their supervisor left unrecorded: [{rid}]" in listed.stderr
    run = store.run(rid)
    assert run["status"] == "ok" and any("recorded from its result.json" in n for n in run["notes"])
    assert store.metrics([rid]).set_index("name").loc["answer", "value"] == 42.0
    assert jobs.ingest_left_results(store) == []  # recorded once
