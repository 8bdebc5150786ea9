"""engine.runner.cancel: a queued run cancelled never starts; a running one has its worker stopped and ends
'cancelled'; a run waiting for its device can be cancelled too; the other runs of the group go on; the device lock
names who holds it, with its command line and for how long."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from engine.runner import cancel
from engine.runner.device_lock import device_lock, held_text, holder
from engine.runner.jobs import JobSpec, create_runs, run_jobs
from engine.store.db import Store, pid_alive
from tests.engine.waiting import wait_until

TARGETS = "tests.engine.runner.fault_targets"


def spec(target: str, **params) -> JobSpec:
    return JobSpec("bench", "house_price", target, "cpu", params, target=f"{TARGETS}:{target}", timeout_s=120.0)




@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("MODELAB_FORKSERVER", "0")  # one worker at a time, started afresh: the simplest path
    store = Store(tmp_path / "results.duckdb")
    store.init()
    return store


def run_dir(run_id: int) -> Path:
    return Path(os.environ["ARTIFACTS_DIR"]) / f"run_{run_id}"


def started(store: Store, run_id: int) -> bool:
    return (run_dir(run_id) / "target.pid").exists()


def in_thread(store: Store, ids: list[int]) -> tuple[threading.Thread, dict]:
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(run_jobs(store, ids)), daemon=True)
    thread.start()
    return thread, out


def test_a_queued_run_is_cancelled_and_never_starts(store: Store) -> None:
    first, second = create_runs(store, [spec("ok", value=1), spec("ok", value=2)], group_id="g")
    assert cancel.cancel(store, second, run_dir(second)) == cancel.CANCELLED
    assert run_jobs(store, [first, second]) == {first: "ok", second: cancel.CANCELLED}
    run = store.run(second)
    assert run["status"] == cancel.CANCELLED and run["error"] == cancel.QUEUED_REASON and run["finished_at"]
    assert not started(store, second) and started(store, first)
    assert store.run(first)["status"] == "ok"  # the rest of the group is untouched
    assert cancel.cancel(store, first, run_dir(first)) == "ok"  # an ended run stays as it was
    assert store.run(first)["status"] == "ok"


def test_a_running_run_is_stopped_and_ends_cancelled(store: Store) -> None:
    hang, after = create_runs(store, [spec("hang"), spec("ok", value=3)], group_id="g")
    thread, statuses = in_thread(store, [hang, after])
    wait_until(lambda: started(store, hang), 60, "the hanging worker to start")
    pid = int((run_dir(hang) / "target.pid").read_text())
    assert cancel.cancel(store, hang, run_dir(hang)) == "requested"
    thread.join(120)
    assert statuses == {hang: cancel.CANCELLED, after: "ok"}
    run = store.run(hang)
    assert run["status"] == cancel.CANCELLED and run["error"] == cancel.RUNNING_REASON
    wait_until(lambda: not pid_alive(pid), 10, "the worker to be gone")
    assert not store.metrics([hang]).shape[0]  # nothing recorded for it; the next run's result is
    assert store.run(after)["status"] == "ok"


def own_arguments() -> str:
    """This process's arguments after the interpreter, from /proc (pytest's, or an xdist worker's)."""
    return " ".join(Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")[1:]).strip()


def test_a_run_waiting_for_its_device_can_be_cancelled_and_the_lock_names_its_holder(store: Store) -> None:
    (run_id,) = create_runs(store, [spec("ok", value=4)])
    with device_lock("cpu"):
        found = holder("cpu")
        assert found is not None and found.pid == os.getpid() and own_arguments()[:30] in found.command
        assert found.describe().startswith(f"pid {os.getpid()} (") and found.describe().endswith(" s")
        thread, statuses = in_thread(store, [run_id])
        message = wait_until(lambda: (store.run(run_id)["message"] or "").startswith("waiting for cpu")
                             and store.run(run_id)["message"], 30, "the run to wait for the device")
        assert f"held by pid {os.getpid()} (" in message and own_arguments()[:30] in message
        assert cancel.cancel(store, run_id, run_dir(run_id)) == cancel.CANCELLED
    thread.join(60)
    assert statuses == {run_id: cancel.CANCELLED} and not started(store, run_id)
    assert holder("cpu") is None  # released: nobody holds it


def test_held_text() -> None:
    assert [held_text(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 5 s", "1 h 2 min"]
