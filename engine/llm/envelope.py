"""The operating envelope of a two-axis sweep (`llm --sweep batch=… --sweep prompt=…`): per mode, MBU and TPOT over
the (B, P) cells, and per cell the best mode with its ratio to compile-cudagraph of the same cell. Frames in, frames
out (the LLM page draws them: app/envelope_section.py)."""

from __future__ import annotations

import pandas as pd

ENVELOPE_SWEEP = "batch,prompt"  # what a two-axis sweep's runs record as params "sweep" (engine/cli/llm.py)
BASELINE = "compile-cudagraph"  # the plain compiled mode every cell's best is measured against
METRICS = {"mbu_pct": "MBU (%)", "tpot_median_us": "TPOT median (µs)"}
CELL_COLUMNS = ["id", "mode", "batch", "prompt_len", "mbu_pct", "tpot_median_us"]


def envelope_groups(runs: pd.DataFrame) -> list[str]:
    """The groups of two-axis sweeps among `runs` (engine.llm.report.llm_runs), newest first."""
    if runs.empty or "sweep" not in runs or "group_id" not in runs:
        return []
    mine = runs[(runs["sweep"] == ENVELOPE_SWEEP) & runs["group_id"].notna()]
    return list(mine.sort_values("id", ascending=False)["group_id"].drop_duplicates())


def envelope_cells(runs: pd.DataFrame, group: str) -> pd.DataFrame:
    """One row per (mode, B, P) of the group: its run id, MBU and median TPOT (the newest run where a cell ran
    twice)."""
    mine = runs[(runs["group_id"] == group) & (runs["sweep"] == ENVELOPE_SWEEP)] if not runs.empty else runs
    if mine.empty:
        return pd.DataFrame(columns=CELL_COLUMNS)
    frame = mine.reindex(columns=CELL_COLUMNS).sort_values("id", ascending=False)
    frame = frame.drop_duplicates(["mode", "batch", "prompt_len"])
    frame[["batch", "prompt_len"]] = frame[["batch", "prompt_len"]].astype(int)
    return frame.sort_values(["mode", "batch", "prompt_len"]).reset_index(drop=True)


def envelope_grid(cells: pd.DataFrame, mode: str, metric: str) -> pd.DataFrame:
    """`metric` of one mode as a grid: rows B, columns P (NaN where the cell did not run)."""
    if metric not in METRICS:
        raise ValueError(f"unknown envelope metric {metric!r}; use one of {', '.join(METRICS)}")
    batches = sorted(cells["batch"].unique())
    prompts = sorted(cells["prompt_len"].unique())
    mine = cells[cells["mode"] == mode]
    grid = mine.pivot_table(index="batch", columns="prompt_len", values=metric, aggfunc="first")
    return grid.reindex(index=batches, columns=prompts).astype(float)


def best_per_cell(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (B, P): the mode with the lowest median TPOT, its TPOT and MBU, and compile-cudagraph's TPOT in the same
    cell over it ('vs compile-cudagraph': above 1, the best mode is that many times faster; None where
    compile-cudagraph did not run there)."""
    columns = ["batch", "prompt_len", "best mode", "tpot_median_us", "mbu_pct", f"{BASELINE} tpot_us",
               f"vs {BASELINE}"]
    timed = cells[cells["tpot_median_us"].notna() & (cells["tpot_median_us"] > 0)]
    rows = []
    for (batch, prompt), cell in timed.groupby(["batch", "prompt_len"], sort=True):
        best = cell.loc[cell["tpot_median_us"].idxmin()]
        base = cell[cell["mode"] == BASELINE]["tpot_median_us"]
        base_us = float(base.iloc[0]) if not base.empty else None
        rows.append([int(batch), int(prompt), best["mode"], float(best["tpot_median_us"]), best["mbu_pct"], base_us,
                     base_us / float(best["tpot_median_us"]) if base_us else None])
    return pd.DataFrame(rows, columns=columns)
