"""The LLM page's operating-envelope section: a two-axis sweep in the store draws a heatmap per mode of MBU and TPOT
and the best mode per cell with its ratio to compile-cudagraph; a store without one shows no section."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.llm.run import LLMConfig, llm_run, params_of
from engine.store.db import Store

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "6_LLM.py"
CELLS = {("compile-cudagraph", 1, 8): 1.0, ("eager", 1, 8): 0.8, ("compile-cudagraph", 2, 8): 1.0,
         ("eager", 2, 8): 1.5, ("compile-cudagraph", 1, 16): 1.0, ("eager", 2, 16): 1.2}


@pytest.fixture(scope="module")
def real_result(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("llm-envelope")
    cfg = LLMConfig(preset="tiny", prompt_len=8, new_tokens=3, mode="eager", prefill_iters=1, decode_passes=1,
                    check_tokens=1, profile=False, ceilings="none", artifacts_dir=str(folder / "run"))
    return params_of(cfg), llm_run(cfg)


def add_sweep(store: Store, params: dict, result) -> None:
    """One real run's result stored as every cell of a two-axis sweep, its decode TPOT scaled per cell."""
    for (mode, batch, prompt), scale in CELLS.items():
        cell = {**params, "mode": mode, "batch": batch, "prompt_len": prompt, "sweep": "batch,prompt"}
        run_id = store.create_run("llm", "llama-tiny", mode, "cpu", cell, group_id="envelope")
        store.start_run(run_id)
        metrics = [dataclasses.replace(m, value=m.value * scale) if m.name == "tpot_median_us" and m.phase == "decode"
                   else m for m in result.metrics]
        store.record_result(run_id, dataclasses.replace(result, metrics=metrics))


def test_two_axis_sweep_draws_heatmaps_and_the_best_mode_per_cell(lab: Store, real_result) -> None:
    add_sweep(lab, *real_result)
    at = AppTest.from_file(str(PAGE), default_timeout=90).run()
    assert not at.exception, at.exception
    assert "Operating envelope (B × P)" in [s.value for s in at.subheader]
    best = next(df.value for df in at.dataframe if "best mode" in df.value.columns)
    assert len(best) == 4  # (1, 8), (1, 16), (2, 8), (2, 16)
    by_cell = {(int(r["B"]), int(r["P"])): r for r in best.to_dict("records")}
    assert by_cell[(1, 8)]["best mode"] == "eager" and by_cell[(1, 8)]["vs compile-cudagraph"] == "1.25×"
    assert by_cell[(2, 8)]["best mode"] == "compile-cudagraph" and by_cell[(2, 8)]["vs compile-cudagraph"] == "1.00×"
    assert by_cell[(2, 16)]["vs compile-cudagraph"] == "—"  # compile-cudagraph has no run in that cell
    heatmaps = {c.key: c.proto.spec for c in at.get("plotly_chart") if str(c.key).startswith("envelope-")}
    assert set(heatmaps) == {f"envelope-{m}-{k}" for m in ("compile-cudagraph", "eager")
                             for k in ("mbu_pct", "tpot_median_us")}  # MBU and TPOT for each mode
    assert all('"type":"heatmap"' in spec.replace(" ", "") for spec in heatmaps.values())


def test_no_two_axis_sweep_no_section(lab: Store, real_result) -> None:
    params, result = real_result
    run_id = lab.create_run("llm", "llama-tiny", "eager", "cpu", params)
    lab.start_run(run_id)
    lab.record_result(run_id, result)
    at = AppTest.from_file(str(PAGE), default_timeout=90).run()
    assert not at.exception
    assert "Operating envelope (B × P)" not in [s.value for s in at.subheader]
