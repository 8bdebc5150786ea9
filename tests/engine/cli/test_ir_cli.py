"""Extractions and verifications as runs in the store, and `python -m engine ir`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.ir import load_ir
from engine.ir.errors import ExportError, WeightLoadError
from engine.ir.runs import extract_run, extractions, verifications, verify_spec
from engine.runner.jobs import create_runs, run_jobs
from engine.store.db import Store


def test_extraction_is_a_run_with_metrics_and_artifacts(store: Store) -> None:
    ex = extract_run(store, "attention", "tiny")
    run = store.run(ex.run_id)
    assert (run["kind"], run["workload"], run["mode"], run["device"], run["status"]) == \
        ("ir", "attention", "export", "meta", "ok")
    assert run["params"]["preset"] == "tiny"
    metrics = store.metrics([ex.run_id]).set_index("name")["value"]
    assert metrics["nodes"] == len(ex.ir.nodes) and metrics["json_bytes"] > 1000
    assert metrics["export_s"] > 0 and metrics["convert_s"] > 0
    arts = store.artifacts(ex.run_id).set_index("name")
    assert {"ir.json", "graph.mmd"} <= set(arts.index)
    assert load_ir(arts.loc["ir.json", "path"]) == ex.ir
    assert Path(arts.loc["graph.mmd", "path"]).read_text().startswith("flowchart")
    listed = extractions(store)
    assert listed["run_id"].tolist() == [ex.run_id] and listed["preset"].iloc[0] == "tiny"


def test_failed_extraction_is_a_failed_run(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.ir import zoo

    def broken(*a, **k):
        raise ExportError("parameter 'w' is on cpu, not meta")

    monkeypatch.setattr("engine.ir.export.export_meta", broken)
    with pytest.raises(ExportError):
        extract_run(store, "attention", "tiny")
    failed = extractions(store, status="failed")
    assert len(failed) == 1 and "is on cpu, not meta" in failed["error"].iloc[0]
    with pytest.raises(ValueError, match="no preset 'huge'"):
        extract_run(store, "attention", "huge")
    assert zoo.ZOO  # the zoo itself is untouched


def test_verification_job_in_a_worker(store: Store) -> None:
    ex = extract_run(store, "multi_io", "tiny")
    ids = create_runs(store, [verify_spec(store, ex.run_id)])
    assert run_jobs(store, ids) == {ids[0]: "ok"}
    row = verifications(store, ex.run_id).iloc[0]
    assert row["verify_ok"] == 1.0 and row["max_abs_err"] < 1e-4
    report = json.loads(Path(row["report_path"]).read_text())
    assert report["ok"] and len(report["outputs"]) == 2


def test_verify_refuses_large_presets(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = extract_run(store, "attention", "tiny")
    monkeypatch.setattr("engine.ir.zoo.MAX_VERIFY_BYTES", 1000)
    with pytest.raises(WeightLoadError, match="attention/tiny has .* limited to"):
        verify_spec(store, ex.run_id)


def test_cli_writes_ir_and_mermaid(store: Store, tmp_path: Path, capsys) -> None:
    out, mmd = tmp_path / "out" / "ir.json", tmp_path / "graph.mmd"
    rc = main(["ir", "--workload", "house_price", "--out", str(out), "--mermaid", str(mmd), "--db", str(store.path)])
    assert rc == 0
    assert load_ir(out).model_name == "house_price/batch64"
    assert mmd.read_text().startswith("flowchart TD")
    text = capsys.readouterr().out
    assert "5 nodes" in text and "stored in" in text


def test_cli_verify_and_errors(store: Store, capsys) -> None:
    assert main(["ir", "--workload", "skip", "--verify", "--db", str(store.path)]) == 0
    assert "OK: the IR computes the model's outputs" in capsys.readouterr().out
    assert main(["ir", "--workload", "llama", "--preset", "huge", "--db", str(store.path)]) == 2
    assert "no preset 'huge'" in capsys.readouterr().err
    assert main(["ir", "--list"]) == 0
    assert "7B" in capsys.readouterr().out
