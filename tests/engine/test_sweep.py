"""Sweeps over several devices: runs are spread round-robin, each device's lane runs in parallel with the others
(one timing run per device at a time), and every run lands exactly once. CPU lanes (cpu:0, cpu:1) stand in for GPUs."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from engine.cli import CliError, _devices, expand_devices
from engine.jobs import spread
from engine.store import Store


def test_device_lists_parse_and_expand() -> None:
    assert _devices("cuda:0, cuda:1") == "cuda:0,cuda:1"
    assert _devices("cpu:0,cpu:1") == "cpu:0,cpu:1" and _devices("cuda:all") == "cuda:all"
    for bad in ("cuda:0,cuda:0", "tpu", "cuda:x", ""):
        with pytest.raises(Exception):
            _devices(bad)
    assert expand_devices("cpu:0,cpu:1") == ["cpu:0", "cpu:1"]
    with pytest.raises(CliError, match="no CUDA device"):
        expand_devices("cuda:all")  # this machine has none
    assert spread(["cuda:0", "cuda:1"], 5) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]


def test_bench_sweep_over_two_lanes_lands_every_run_once(child_env: dict[str, str], store: Store) -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "bench", "--mode", "eager,fx,torchscript,eager",
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
    # The two lanes ran side by side: some run of one lane was running while a run of the other was (run one after
    # another, no two runs' intervals would meet). Which pair overlaps depends on when each lane's worker started.
    spans = [(r.device, pd.Timestamp(r.started_at), pd.Timestamp(r.finished_at)) for r in runs.itertuples()]
    assert any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for a in spans for b in spans), spans
