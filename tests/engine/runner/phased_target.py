"""Job target for the phased-supervision tests: prepares (shared hold) until every run of its group has started
preparing (a file per run in barrier_dir; 60 s at most, then it fails: runs that never prepare side by side never
meet) and prepare_s more, then times (inside engine.runner.device_lock.exclusive) for timed_s; reports both intervals as
time.time() metrics, comparable across workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.runner.device_lock import current, exclusive
from engine.store.db import Metric, RunResult


def run(params: dict, progress) -> RunResult:
    hold = current()
    t0 = time.time()
    barrier = Path(params["barrier_dir"])
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < int(params["group"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the other runs of the group never started preparing beside this one")
        time.sleep(0.01)
    time.sleep(float(params["prepare_s"]))
    t1 = time.time()
    with exclusive():
        t2 = time.time()
        time.sleep(float(params["timed_s"]))
        t3 = time.time()
    state_after = hold.state if hold else "none"
    return RunResult(metrics=[Metric("prepare_start", t0, "s"), Metric("prepare_end", t1, "s"),
                              Metric("timed_start", t2, "s"), Metric("timed_end", t3, "s"),
                              Metric("group_size", float(hold.group_size if hold else 0), ""),
                              Metric("shared_after", float(state_after == "shared"), "")])
