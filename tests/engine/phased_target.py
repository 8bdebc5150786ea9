"""Job target for the phased-supervision tests: prepares (shared hold) for PREPARE_S, then times (inside
engine.device_lock.exclusive) for TIMED_S; reports both intervals as time.time() metrics, comparable across workers."""

from __future__ import annotations

import time

from engine.device_lock import current, exclusive
from engine.store import Metric, RunResult


def run(params: dict, progress) -> RunResult:
    hold = current()
    t0 = time.time()
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
