"""Job targets for the job-runner tests: `(params, progress) -> RunResult`, run in a worker by engine.runner.jobs.

Each writes its pid to <artifacts_dir>/target.pid first, so a test can check the worker's fate.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

from engine.store.db import Artifact, Metric, RunResult, Samples


def _mark(params: dict) -> None:
    Path(params["artifacts_dir"], "target.pid").write_text(str(os.getpid()))


def ok(params: dict, progress) -> RunResult:
    _mark(params)
    print("hello from the ok target")  # stray output belongs in worker.log, not in the progress channel
    sys.stdout.flush()
    for frac in params.get("steps", (0.25, 0.5, 0.75)):
        progress(frac, f"step {frac}")
        time.sleep(params.get("step_s", 0.0))
    note = Path(params["artifacts_dir"]) / "note.txt"
    note.write_text("made by the ok target\n")
    return RunResult(
        metrics=[Metric("answer", 42.0, "", "infer", 1), Metric("echo", float(params.get("value", 0)), "")],
        samples=[Samples("infer", [1.0, 2.0, 3.0], "us", 1)],
        artifacts=[Artifact("text", "note.txt", str(note))],
        env={"python": "test", "threads": 1},
        notes=["ran ok"],
    )


def segfault(params: dict, progress) -> RunResult:
    _mark(params)
    progress(0.1, "about to crash")
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise AssertionError("unreachable")


def hang(params: dict, progress) -> RunResult:
    _mark(params)
    progress(0.1, "hanging")
    while True:
        time.sleep(3600)


def raise_value_error(params: dict, progress) -> RunResult:
    _mark(params)
    raise ValueError("bad parameter: learning rate -1")


def oom(params: dict, progress) -> RunResult:
    _mark(params)
    raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 15.78 GiB total capacity)")


def exit_3(params: dict, progress) -> RunResult:
    _mark(params)
    os._exit(3)


def not_a_result(params: dict, progress):
    _mark(params)
    return {"metrics": []}


def where_am_i(params: dict, progress) -> RunResult:
    """What the worker found at its start: was torch already imported (the fork server's preload), and can torch
    still use its thread pools (a fork with a pool's lock held would hang here)."""
    _mark(params)
    preloaded = "torch" in sys.modules
    import torch

    torch.set_num_threads(2)
    a = torch.ones(256, 256)
    total = float((a @ a).sum())
    return RunResult(metrics=[Metric("torch_preloaded", float(preloaded), ""), Metric("matmul_sum", total, "")],
                     env={"python": "test"})


def rendezvous(params: dict, progress) -> RunResult:
    """Leaves <meet_dir>/<me>.here, then waits (up to wait_s) for <meet_dir>/<other>.here: met = 1 only if a run of
    the other name was running while this one was — what two lanes side by side do, whatever their start-up skew."""
    _mark(params)
    meet = Path(params["meet_dir"])
    (meet / f"{params['me']}.here").write_text(str(os.getpid()))
    start = time.monotonic()
    other = meet / f"{params['other']}.here"
    while not other.exists() and time.monotonic() - start < float(params.get("wait_s", 60.0)):
        time.sleep(0.02)
    return RunResult(metrics=[Metric("met", float(other.exists()), ""),
                              Metric("waited_s", time.monotonic() - start, "s")], env={"python": "test"})


def recorded_start(store, runs: list[dict]) -> None:
    """Not a target: a group_start hook (engine.runner.kinds) that writes the group's run ids beside the store."""
    Path(store.path).parent.joinpath("started.json").write_text(json.dumps([int(r["id"]) for r in runs]))
