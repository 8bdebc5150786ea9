"""`merge`: every finished run of another store is copied with remapped ids and all its rows; a second merge copies
nothing; the other file is not changed; bad files give a clear message."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from engine.store.db import Artifact, Metric, RunResult, Samples, Store, StoreError
from engine.store.merge import merge_store


def _fill(store: Store, device: str, name: str, runs: int) -> list[int]:
    store.init()
    ids = []
    for i in range(runs):
        run_id = store.create_run("bench", "house_price", f"mode{i}", device, {"i": i})
        store.start_run(run_id)
        store.record_result(run_id, RunResult(
            metrics=[Metric("median", 100.0 + i, "us", "infer", 64)],
            samples=[Samples("infer", [1.0, 2.0, 3.0 + i], "us", 64)],
            artifacts=[Artifact("text", "note.txt", f"/nowhere/{name}-{i}.txt")],
            env={"device_name": name, "python": "3.12", "threads": 8},
            op_stats=[{"phase": "train", "kind": "kernel", "device": "cuda", "name": f"k{i}", "calls": 3}]))
        ids.append(run_id)
    running = store.create_run("bench", "house_price", "eager", device, {})
    store.start_run(running)  # a live run elsewhere: never merged
    return ids


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_copies_every_row_with_new_ids_and_only_once(tmp_path: Path) -> None:
    ours, theirs = Store(tmp_path / "ours.duckdb"), Store(tmp_path / "h100.duckdb")
    mine = _fill(ours, "cpu", "CPU: here", 2)
    _fill(theirs, "cuda", "NVIDIA H100 80GB HBM3", 3)
    before = _digest(theirs.path)

    report = merge_store(ours, theirs.path)
    assert report.runs_copied == 3 and report.runs_skipped_active == 1
    assert sorted(report.id_map) == [1, 2, 3]
    new_ids = sorted(report.id_map.values())
    assert set(new_ids).isdisjoint(mine) and min(new_ids) > max(mine)
    assert report.rows == {"runs": 3, "metrics": 3, "samples": 9, "environments": 3, "artifacts": 3, "op_stats": 3,
                           "ncu_kernel_metrics": 0}
    env = ours.environment(report.id_map[2])
    assert env["device_name"] == "NVIDIA H100 80GB HBM3"
    metrics = ours.metrics([report.id_map[3]])
    assert metrics["value"].tolist() == [102.0]
    assert ours.samples([report.id_map[3]])["value"].tolist() == [1.0, 2.0, 5.0]
    assert ours.run(report.id_map[1])["params"] == {"i": 0} and ours.run(report.id_map[1])["device"] == "cuda"
    assert _digest(theirs.path) == before  # read-only: the other store is untouched

    again = merge_store(ours, theirs.path)
    assert again.runs_copied == 0 and again.runs_already_there == 3
    assert len(ours.runs(kind="bench", limit=100)) == 2 + 1 + 3


def test_merge_refuses_bad_files_with_a_message(tmp_path: Path) -> None:
    ours = Store(tmp_path / "ours.duckdb")
    _fill(ours, "cpu", "CPU", 1)
    with pytest.raises(StoreError, match="no such file"):
        merge_store(ours, tmp_path / "missing.duckdb")
    with pytest.raises(StoreError, match="the store itself"):
        merge_store(ours, ours.path)
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="nothing was changed"):
        merge_store(ours, junk)
    assert junk.read_bytes() == b"not a database at all" * 100


def test_merge_cli(tmp_path: Path, child_env: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    other = Store(tmp_path / "other.duckdb")
    _fill(other, "cuda", "NVIDIA H200", 2)
    db = tmp_path / "results.duckdb"
    out = subprocess.run([sys.executable, "-m", "engine", "merge", str(other.path), "--db", str(db)],
                         capture_output=True, text=True, env=child_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "merged 2 run(s)" in out.stdout and "1 queued/running skipped" in out.stdout
    from engine.cli.main import main  # the refusal through main() in this process: no second interpreter start

    assert main(["merge", str(tmp_path / "nope.duckdb"), "--db", str(db)]) == 2
    assert "no such file" in capsys.readouterr().err
