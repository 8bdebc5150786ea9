"""The dashboard's detached supervisor (`python -m engine.runner.plan`, started by engine.runner.jobs.submit) ends its
group on SIGTERM, SIGINT or SIGHUP: its workers (and fork server) are gone, every unfinished run of the group is failed
"interrupted by SIG…", a result a worker had already written is recorded, and the supervisor exits."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from engine.runner.jobs import Interrupted, JobSpec, create_runs, interrupt_runs, submit
from engine.store.db import Metric, RunResult, Store, pid_alive
from tests.engine.waiting import wait_until

TARGETS = "tests.engine.runner.fault_targets"


def spec(target: str, timeout_s: float = 120.0, **params) -> JobSpec:
    """A run of a kind nobody registered: the planner runs such a group one at a time, in order."""
    return JobSpec("signal_test", "house_price", target, "cpu", params, target=f"{TARGETS}:{target}",
                   timeout_s=timeout_s)




def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def hanging(store: Store, rid: int) -> bool:
    run = store.run(rid)
    return run["status"] == "running" and run["message"] == "hanging"


def end(pids: list[int | None]) -> None:
    """Leave no process of the test behind when a check failed before they ended."""
    for pid in pids:
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_fails_the_running_and_the_queued_run_and_ends_worker_and_fork_server(store, lab_env):
    ids = submit(store, [spec("hang"), spec("ok", value=1)])
    supervisor = int(store.run(ids[0])["pid"])
    worker = server = None
    try:
        wait_until(lambda: hanging(store, ids[0]), 90, "the first run to be hanging in its worker")
        worker = int((Path(lab_env["ARTIFACTS_DIR"]) / f"run_{ids[0]}" / "target.pid").read_text())
        server = parent_of(worker)
        assert server != supervisor and parent_of(server) == supervisor  # forked by the group's fork server
        assert store.run(ids[1])["status"] == "queued"
        os.kill(supervisor, signal.SIGTERM)
        wait_until(lambda: not pid_alive(supervisor), 30, "the supervisor to exit")
    finally:
        end([supervisor, worker, server])
    assert not pid_alive(worker) and not pid_alive(server)
    for rid in ids:
        run = store.run(rid)
        assert (run["status"], run["error"]) == ("failed", "interrupted by SIGTERM")
    log = (Path(lab_env["ARTIFACTS_DIR"]) / f"supervisor-{ids[0]}.log").read_text()
    assert "interrupted by SIGTERM" in log


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_end_a_lone_run_by_their_name(store, lab_env, sig):
    [rid] = submit(store, [spec("hang")])
    supervisor = int(store.run(rid)["pid"])
    worker = None
    try:
        wait_until(lambda: hanging(store, rid), 60, "the run to be hanging in its worker")
        worker = int((Path(lab_env["ARTIFACTS_DIR"]) / f"run_{rid}" / "target.pid").read_text())
        assert parent_of(worker) == supervisor  # a lone run's worker starts afresh
        os.kill(supervisor, sig)
        wait_until(lambda: not pid_alive(supervisor), 30, "the supervisor to exit")
    finally:
        end([supervisor, worker])
    assert not pid_alive(worker)
    run = store.run(rid)
    assert (run["status"], run["error"]) == ("failed", f"interrupted by {sig.name}")


def test_a_result_the_worker_wrote_is_recorded_and_the_rest_fail(store, lab_env):
    done, unfinished, queued = create_runs(store, [spec("ok"), spec("hang"), spec("ok")])
    for rid in (done, unfinished):
        store.start_run(rid, "running")
    folder = Path(lab_env["ARTIFACTS_DIR"]) / f"run_{done}"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(f'{{"run_id": {done}}}')
    (folder / "worker.log").write_text("")
    (folder / "result.json").write_text(RunResult(metrics=[Metric("echo", 5.0, "")]).to_json())
    interrupt_runs(store, [done, unfinished, queued], Interrupted("SIGTERM"))
    assert store.run(done)["status"] == "ok"
    assert store.metrics([done]).set_index("name")["value"]["echo"] == 5.0
    for rid in (unfinished, queued):
        run = store.run(rid)
        assert (run["status"], run["error"]) == ("failed", "interrupted by SIGTERM")
