"""engine.llm.envelope on a store holding a two-axis sweep: the cells per mode, the heatmap grids and the best mode
per cell with its ratio to compile-cudagraph."""

from __future__ import annotations

import math

import pytest

from engine.llm.envelope import BASELINE, best_per_cell, envelope_cells, envelope_grid, envelope_groups
from engine.llm.report import llm_runs
from engine.store.db import Metric, RunResult, Store

# (mode, B, P) → median TPOT (µs); triton-fused wins at B=1, compile-cudagraph at B=8, and one cell has no
# compile-cudagraph run (skipped)
TPOT = {("compile-cudagraph", 1, 512): 200.0, ("triton-fused", 1, 512): 160.0,
        ("compile-cudagraph", 1, 8192): 400.0, ("triton-fused", 1, 8192): 500.0,
        ("compile-cudagraph", 8, 512): 250.0, ("triton-fused", 8, 512): 300.0,
        ("triton-fused", 8, 8192): 900.0}


def add_envelope(store: Store, group: str = "env1", tpot: dict | None = None, noisy: tuple = ()) -> dict[tuple, int]:
    """The cells of `tpot` as one sweep group; those in `noisy` with their timing judged noisy."""
    ids = {}
    for (mode, batch, prompt), us in (tpot or TPOT).items():
        params = {"preset": "tiny", "mode": mode, "batch": batch, "prompt_len": prompt, "new_tokens": 4,
                  "device": "cpu", "sweep": "batch,prompt"}
        run_id = store.create_run("llm", "llama-tiny", mode, "cpu", params, group_id=group)
        store.start_run(run_id)
        flagged = {"state": "noisy", "flags": [f"decode B={batch}: 3 of 16 samples far out"]}
        store.record_result(run_id, RunResult(env={}, metrics=[
            Metric("tpot_median_us", us, "us", "decode"), Metric("mbu_pct", 1e4 / us, "%", "decode")],
            conditions=flagged if (mode, batch, prompt) in noisy else None))
        ids[(mode, batch, prompt)] = run_id
    return ids


def test_cells_grids_and_the_best_mode_per_cell(lab_store: Store) -> None:
    ids = add_envelope(lab_store)
    # a one-axis sweep and a lone run are not envelopes
    other = lab_store.create_run("llm", "llama-tiny", "eager", "cpu", {"mode": "eager", "batch": 1, "prompt_len": 4,
                                                                       "sweep": "batch"}, group_id="one-axis")
    lab_store.start_run(other)
    lab_store.record_result(other, RunResult(env={}, metrics=[Metric("tpot_median_us", 1.0, "us", "decode")]))
    runs = llm_runs(lab_store)
    assert envelope_groups(runs) == ["env1"]
    cells = envelope_cells(runs, "env1")
    assert len(cells) == len(TPOT) and set(cells["id"]) == set(ids.values())

    grid = envelope_grid(cells, "triton-fused", "tpot_median_us")
    assert list(grid.index) == [1, 8] and list(grid.columns) == [512, 8192]
    assert grid.loc[8, 8192] == 900.0 and grid.loc[1, 512] == 160.0
    mbu = envelope_grid(cells, BASELINE, "mbu_pct")
    assert mbu.loc[1, 512] == pytest.approx(50.0) and math.isnan(mbu.loc[8, 8192])  # the cell it did not run
    with pytest.raises(ValueError, match="metric"):
        envelope_grid(cells, BASELINE, "ttft")

    best = best_per_cell(cells).set_index(["batch", "prompt_len"])
    assert best.loc[(1, 512), "best mode"] == "triton-fused"
    assert best.loc[(1, 512), f"vs {BASELINE}"] == pytest.approx(200 / 160)
    assert best.loc[(1, 8192), "best mode"] == BASELINE and best.loc[(1, 8192), f"vs {BASELINE}"] == 1.0
    assert best.loc[(8, 512), "best mode"] == BASELINE
    assert best.loc[(8, 8192), "best mode"] == "triton-fused"
    assert best.loc[(8, 8192), f"vs {BASELINE}"] is None or math.isnan(best.loc[(8, 8192), f"vs {BASELINE}"])


def test_a_rerun_cell_takes_the_newest_run(lab_store: Store) -> None:
    add_envelope(lab_store, tpot={("triton-fused", 1, 512): 100.0})
    newer = add_envelope(lab_store, tpot={("triton-fused", 1, 512): 120.0})
    cells = envelope_cells(llm_runs(lab_store), "env1")
    assert list(cells["id"]) == [newer[("triton-fused", 1, 512)]] and list(cells["tpot_median_us"]) == [120.0]


def test_a_flagged_run_is_no_cells_best_while_a_clean_one_ran_there(lab_store: Store) -> None:
    """triton-fused's faster run at (1, 512) was timed noisy: compile-cudagraph, slower but clean, is the best and
    the cell says the baseline is clean; where every run is flagged the fastest stands, with its flag; the printed
    lines carry both."""
    from engine.llm.envelope import envelope_lines

    ids = add_envelope(lab_store, noisy=(("triton-fused", 1, 512), ("triton-fused", 8, 8192)))
    cells = envelope_cells(llm_runs(lab_store), "env1")
    assert set(cells[cells["flag"] == "noisy"]["id"]) == {ids[("triton-fused", 1, 512)], ids[("triton-fused", 8, 8192)]}
    best = best_per_cell(cells).set_index(["batch", "prompt_len"])
    assert best.loc[(1, 512), "best mode"] == BASELINE and best.loc[(1, 512), "flag"] == ""
    assert best.loc[(8, 8192), "best mode"] == "triton-fused" and best.loc[(8, 8192), "flag"] == "best noisy"
    lines = envelope_lines(cells)
    assert len(lines) == 3 + 4 and lines[-1].rstrip().endswith("best noisy")
    assert "1.00×" in next(line for line in lines if line.split()[:2] == ["1", "512"])


@pytest.fixture
def lab_store(tmp_path) -> Store:
    store = Store(tmp_path / "results.duckdb")
    store.init()
    return store
