"""`bench --repeat N`: each mode in N worker processes, timed in turn across modes (A B C A B C …, read from the runs'
recorded timelines), every process its own run with its repeat index, pooled in the table; `runs` and
`runs --json` name each process's repeat and timing state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.store.db import Store
from engine.store.report import group_timeline, pooled_summary

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_repeat_runs_each_mode_in_processes_timed_in_turn(child_env: dict[str, str], lab_env: dict[str, str],
                                                         capsys: pytest.CaptureFixture) -> None:
    done = subprocess.run([sys.executable, "-m", "engine", "bench", "--mode", "eager,fx", "--repeat", "2",
                           "--phases", "infer", "--batch-sizes", "4", "--iters", "5", "--warmup", "1"],
                          cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "one run at a time (2 repeats, interleaved across modes)" in done.stdout + done.stderr
    store = Store(lab_env["RESULTS_DB"])
    runs = store.runs(kind="bench").sort_values("id")
    ids = [int(i) for i in runs["id"]]
    params = [json.loads(p) for p in runs["params"]]
    assert [(m, p["repeat"], p["repeats"]) for m, p in zip(runs["mode"], params)] == \
        [("eager", 0, 2), ("fx", 0, 2), ("eager", 1, 2), ("fx", 1, 2)]
    assert runs["group_id"].nunique() == 1
    # The order the processes timed in, from their timelines: eager, fx, eager, fx.
    timeline = group_timeline(store, ids)
    timing = timeline[timeline["step"].str.endswith(": timing")].sort_values("start_s")
    assert list(timing["run_id"]) == ids and timing["start_s"].is_monotonic_increasing
    # Every process keeps its own samples; the table pools them per mode.
    samples = store.samples(ids)
    assert samples.groupby("run_id").size().to_dict() == {i: 5 for i in ids}
    pooled = pooled_summary(store, ids).set_index("mode")
    assert pooled.loc["eager", "procs"] == pooled.loc["fx", "procs"] == 2
    header = next(line for line in done.stdout.splitlines() if line.split()[:4] == ["mode", "phase", "batch", "procs"])
    assert "proc_spread" in header and "state" in header
    from engine.cli.main import main  # `runs --json` through main() in this process: no second interpreter start

    assert main(["runs", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((r["id"], r["repeat"]) for r in rows) == [(ids[0], "1/2"), (ids[1], "1/2"), (ids[2], "2/2"),
                                                           (ids[3], "2/2")]
    assert all(r["state"] in ("clean", "noisy", "interfered") and isinstance(r["flags"], list) for r in rows)
