"""A run waiting for its device behind another run is not blamed for that run's time: the supervisor's clock stops
while the worker says it is waiting for the device, and runs again once it has the device."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from engine.runner import jobs
from engine.runner.device_lock import HAS_DEVICE, WAITING_PREFIX


class FakeWorker:
    """Exits with 0 once `done` is set; killed on request."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.killed = False

    def poll(self) -> int | None:
        return 0 if self.done.is_set() else None

    def kill(self) -> None:
        self.killed = True
        self.done.set()

    def wait_killed(self) -> int:
        return -9


class FakeStore:
    def update_progress(self, run_id: int, frac: float, message: str) -> None:
        pass


def say(path: Path, message: str) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"progress": 0.5, "message": message}) + "\n")


def watch(tmp_path: Path, script, timeout_s: float) -> tuple[jobs._Exit, FakeWorker]:
    files = jobs._RunFiles(tmp_path)
    files.progress.touch()
    worker = FakeWorker()
    thread = threading.Thread(target=script, args=(files.progress, worker), daemon=True)
    thread.start()
    outcome = jobs._watch(FakeStore(), 1, worker, files, timeout_s, lambda f, m: None)
    thread.join(5)
    return outcome, worker


def test_time_spent_waiting_for_the_device_is_not_counted(tmp_path: Path) -> None:
    def script(progress: Path, worker: FakeWorker) -> None:
        say(progress, "compiling")
        say(progress, f"{WAITING_PREFIX}: another run is timing")
        time.sleep(1.5)  # well past the run's own 0.6 s
        say(progress, HAS_DEVICE)
        time.sleep(0.2)
        worker.done.set()

    outcome, worker = watch(tmp_path, script, timeout_s=0.6)
    assert not outcome.timed_out and not worker.killed and outcome.returncode == 0


def test_a_run_that_hangs_with_the_device_still_times_out(tmp_path: Path) -> None:
    def script(progress: Path, worker: FakeWorker) -> None:
        say(progress, f"{WAITING_PREFIX}: another run is timing")
        time.sleep(0.3)
        say(progress, HAS_DEVICE)  # from here the clock runs: it never finishes

    t0 = time.monotonic()
    outcome, worker = watch(tmp_path, script, timeout_s=0.6)
    assert outcome.timed_out and worker.killed
    assert 0.8 < time.monotonic() - t0 < 5.0  # the 0.3 s of waiting added to the 0.6 s limit
