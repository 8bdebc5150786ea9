"""Sweeps over several devices: runs are spread round-robin, each device's lane runs in parallel with the others
(one timing run per device at a time), and every run lands exactly once. CPU lanes (cpu:0, cpu:1) stand in for GPUs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.cli.args import CliError, devices_arg, expand_devices
from engine.runner.jobs import JobSpec, create_runs, run_jobs_spread, spread
from engine.store.db import Store


def test_device_lists_parse_and_expand() -> None:
    assert devices_arg("cuda:0, cuda:1") == "cuda:0,cuda:1"
    assert devices_arg("cpu:0,cpu:1") == "cpu:0,cpu:1" and devices_arg("cuda:all") == "cuda:all"
    for bad in ("cuda:0,cuda:0", "tpu", "cuda:x", ""):
        with pytest.raises(Exception):
            devices_arg(bad)
    assert expand_devices("cpu:0,cpu:1") == ["cpu:0", "cpu:1"]
    with pytest.raises(CliError, match="no CUDA device"):
        expand_devices("cuda:all")  # this machine has none
    assert spread(["cuda:0", "cuda:1"], 5) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]


def test_bench_sweep_over_two_lanes_lands_every_run_once(child_env: dict[str, str], store: Store) -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "bench", "--mode", "eager,fx", "--repeat", "2",
                          "--device", "cpu:0,cpu:1", "--phases", "infer", "--batch-sizes", "8", "--iters", "20",
                          "--warmup", "2", "--db", str(store.path)],
                         capture_output=True, text=True, env=child_env, timeout=600)
    assert out.returncode != 2, out.stderr
    runs = store.runs(kind="bench", limit=50).sort_values("id")
    assert len(runs) == 4 and set(runs["status"]) == {"ok"}, runs[["mode", "status", "error"]]
    assert list(runs["device"]) == ["cpu:0", "cpu:1", "cpu:0", "cpu:1"]
    # Each run landed once with its full set of results, exactly like a single-device run.
    metrics = store.metrics(list(runs["id"]))
    assert (metrics[metrics["name"] == "median"].groupby("run_id").size() == 1).all()
    # That the lanes run side by side is the next test's: these runs last under a second, and a lane whose fork
    # server starts late on a loaded 2-core machine may begin after the other lane has finished.


def test_each_devices_lane_runs_beside_the_others(tmp_path, monkeypatch) -> None:
    """Two lanes of one sweep, each run waiting for the other lane's run to be running too: both meet only if the
    lanes run at once (one after the other, the first would wait out its 60 s alone)."""
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    store = Store(tmp_path / "results.duckdb")
    meet = tmp_path / "meet"
    meet.mkdir()
    specs = [JobSpec("bench", "house_price", "rendezvous", device, {"meet_dir": str(meet), "me": device,
                                                                      "other": other, "wait_s": 60.0},
                     target="tests.engine.runner.fault_targets:rendezvous", timeout_s=120.0)
             for device, other in (("cpu:0", "cpu:1"), ("cpu:1", "cpu:0"))]
    ids = create_runs(store, specs)
    assert run_jobs_spread(store, ids) == {rid: "ok" for rid in ids}
    metrics = store.metrics(ids)
    assert list(metrics[metrics["name"] == "met"]["value"]) == [1.0, 1.0], metrics
    assert store.run(ids[0])["device"] == "cpu:0" and store.run(ids[1])["device"] == "cpu:1"
