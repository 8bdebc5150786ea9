"""The IR Explorer's measured-time overlay: the toggle appears when the extraction's workload has a profile run, and
turning it on shows the attributed share, the per-module table with its command, and the eager/compiled view."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from engine.ir.overlay import aten_name
from engine.ir.runs import extract_run
from engine.store.db import Artifact, Metric, RunResult, Store

PAGE = Path(__file__).resolve().parents[2] / "app/pages/3_IR_Explorer.py"
H = {"pid": 1, "tid": 1}


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def add_profile(store: Store, ir, mode: str, folder: Path, fused: bool = False) -> int:
    """A profile run of house_price whose infer trace has one event per IR op (relu fused away when `fused`)."""
    shapes = {name: t.shape for name, t in ir.tensors().items()}
    ev, ts = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, **H}], 1.0
    if fused:
        ev.append({"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph x ##", "ts": ts, "dur": 900,
                   **H})
        ts += 1
    for node in ir.nodes:
        if fused and "relu" in node.op_type:
            continue
        ev.append({"ph": "X", "cat": "cpu_op", "name": aten_name(node.op_type), "ts": ts, "dur": 100,
                   "args": {"Input Dims": [shapes[t] for t in node.inputs]}, **H})
        ts += 101
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "trace-infer.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    params = {"workload": "house_price", "mode": mode, "device": "cpu", "phases": ["infer"], "batch_size": 64}
    run_id = store.create_run("profile", "house_price", mode, "cpu", params)
    store.start_run(run_id)
    store.record_result(run_id, RunResult(metrics=[Metric("steps", 1.0, "", "infer", 64)],
                                          artifacts=[Artifact("chrome_trace", trace.name, str(trace))]))
    return run_id


def test_overlay_toggle_shows_share_modules_and_two_modes(lab: Store, tmp_path: Path) -> None:
    ex = extract_run(lab, "house_price", "batch64")
    at = AppTest.from_file(str(PAGE), default_timeout=60).run()
    assert not at.exception
    assert "No profile run of house_price" in texts(at.caption)
    add_profile(lab, ex.ir, "eager", tmp_path / "eager")
    at = AppTest.from_file(str(PAGE), default_timeout=60).run()
    assert not at.exception
    assert at.toggle(key="overlay-on").label == "Colour by measured time"
    at.toggle(key="overlay-on").set_value(True).run()
    assert not at.exception
    assert "attributed 100 % of the profiled step's operator self CPU time" in texts(at.markdown)
    modules = next(d.value for d in at.dataframe if "share of the step" in d.value.columns)
    assert set(modules["module"]) == {"fc1", "fc2", "fc3", "relu1", "relu2"}
    assert modules["reproduce"].iloc[0] == ("python -m engine profile --workload house_price --mode eager --device cpu "
                                            "--phases infer --batch-size 64")
    add_profile(lab, ex.ir, "compile", tmp_path / "compile", fused=True)
    at = AppTest.from_file(str(PAGE), default_timeout=60).run()
    at.toggle(key="overlay-on").set_value(True).run()
    assert not at.exception
    assert "Eager (run #2) against compile (run #3)" in texts(at.markdown)
    status = next(d.value for d in at.dataframe if "status" in d.value.columns)
    assert list(status["status"]) == ["kept", "fused away", "kept", "fused away", "kept"]
