"""The IR Explorer page: extract, browse the graph / ops / nodes, search, download, verify, and past IRs."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.ir.runs import extract_run
from engine.runner import jobs
from engine.store.db import Store

PAGE = Path(__file__).resolve().parents[2] / "app/pages/3_IR_Explorer.py"


def open_page() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def frame_with(at: AppTest, column: str):
    """The dataframe that has this column (AppTest cannot look dataframes up by key)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_empty_store_points_to_extract(lab: Store) -> None:
    at = open_page().run()
    assert not at.exception
    assert "No IR extracted yet" in texts(at.info)
    assert at.button(key="extract").label == "Extract IR"
    assert at.selectbox(key="model").options[0] == "llama"


def test_extract_shows_graph_ops_nodes_and_download(lab: Store) -> None:
    at = open_page().run()
    at.selectbox(key="model").set_value("house_price").run()
    at.button(key="extract").click().run()
    assert not at.exception
    assert "Extracted house_price/batch64: 5 nodes" in texts(at.success)
    assert [m.value for m in at.metric][:2] == ["5", "2"]
    runs = lab.runs(kind="ir")
    assert len(runs) == 1 and runs["status"].iloc[0] == "ok"
    # 5 ops: the full graph, every op, is the default view for a small model
    assert at.radio(key="view").value == "ops"
    assert "7 boxes" in texts(at.caption)
    assert at.get("plotly_chart")
    table = frame_with(at, "op_type")
    assert list(table["op_type"]) == ["aten.linear.default", "aten.relu.default"] * 2 + ["aten.linear.default"]
    assert "fc1.weight" in table["inputs"].iloc[0]
    at.text_input(key="node-search").set_value("relu.default").run()
    assert len(frame_with(at, "op_type")) == 2
    assert not at.button(key="verify").disabled


def test_large_model_starts_collapsed_and_refuses_verification(lab: Store) -> None:
    at = open_page().run()
    at.selectbox(key="model").set_value("llama").run()
    at.selectbox(key="preset-llama").set_value("small").run()
    at.button(key="extract").click().run()
    assert not at.exception
    assert at.radio(key="view").value == "modules"
    depth = at.number_input(key="depth").value  # the deepest level that keeps the graph under 150 boxes
    assert f"modules at depth {depth}" in texts(at.caption)
    at.number_input(key="depth").set_value(1).run()
    assert "modules at depth 1" in texts(at.caption)
    at.multiselect(key="expand").set_value(["layers.0"]).run()
    assert not at.exception
    assert "opened: layers.0" in texts(at.caption)
    at.radio(key="view").set_value("ops").run()
    assert not at.exception
    assert "every op" in texts(at.caption)


def test_verify_submits_a_job_and_shows_the_report(lab: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = extract_run(lab, "multi_io", "tiny")
    submitted = []

    def fake_submit(store, specs, group_id=None):
        # run the job synchronously, as the detached supervisor would
        ids = jobs.create_runs(store, specs, group_id)
        submitted.extend(specs)
        jobs.run_jobs(store, ids)
        return ids

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = open_page().run()
    assert at.selectbox(key="ir-run").value == ex.run_id
    at.button(key="verify").click().run()
    assert not at.exception
    assert submitted and submitted[0].target == "engine.ir.verify:verify_job"
    assert submitted[0].params["ir_run_id"] == ex.run_id
    assert "the IR computes the model's outputs" in texts(at.success)
    report = frame_with(at, "max abs error")
    assert list(report["within tolerance"]) == ["yes", "yes"]


def test_oversized_preset_cannot_be_verified(lab: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.ir.zoo.MAX_VERIFY_BYTES", 1000)
    extract_run(lab, "attention", "tiny")
    at = open_page().run()
    assert at.button(key="verify").disabled
    assert "Verify a smaller preset" in texts(at.caption)


def test_past_irs_are_browsable_and_failures_listed(lab: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    first = extract_run(lab, "house_price", "batch64")
    second = extract_run(lab, "skip", "tiny")
    at = open_page().run()
    assert at.selectbox(key="ir-run").value == second.run_id
    at.selectbox(key="ir-run").set_value(first.run_id).run()
    assert not at.exception
    assert at.metric[0].value == "5"

    def broken(*args, **kwargs):
        from engine.ir import ExportError

        raise ExportError("parameter 'fc1.weight' is on cpu, not meta")

    monkeypatch.setattr("engine.ir.export.export_meta", broken)
    at.button(key="extract").click().run()
    assert not at.exception
    assert "failed: parameter 'fc1.weight' is on cpu" in texts(at.error)
