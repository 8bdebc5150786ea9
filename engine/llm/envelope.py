"""The operating envelope of a two-axis sweep (`llm --sweep batch=… --sweep prompt=…`): per mode, MBU and TPOT over
the (B, P) cells, and per cell the best mode with its ratio to compile-cudagraph of the same cell. A run whose timing
was flagged (noisy, interfered: engine.measure.noise) is never a cell's best while an unflagged one ran there, and
where it is the best or the baseline the cell says so. Frames in, frames out (the LLM page draws them:
app/envelope_section.py; `llm --sweep … --sweep …` prints `envelope_lines`)."""

from __future__ import annotations

import pandas as pd

ENVELOPE_SWEEP = "batch,prompt"  # what a two-axis sweep's runs record as params "sweep" (engine/cli/llm.py)
BASELINE = "compile-cudagraph"  # the plain compiled mode every cell's best is measured against
METRICS = {"mbu_pct": "MBU (%)", "tpot_median_us": "TPOT median (µs)"}
CELL_COLUMNS = ["id", "mode", "batch", "prompt_len", "mbu_pct", "tpot_median_us", "flag"]


def envelope_groups(runs: pd.DataFrame) -> list[str]:
    """The groups of two-axis sweeps among `runs` (engine.llm.report.llm_runs), newest first."""
    if runs.empty or "sweep" not in runs or "group_id" not in runs:
        return []
    mine = runs[(runs["sweep"] == ENVELOPE_SWEEP) & runs["group_id"].notna()]
    return list(mine.sort_values("id", ascending=False)["group_id"].drop_duplicates())


def envelope_cells(runs: pd.DataFrame, group: str) -> pd.DataFrame:
    """One row per (mode, B, P) of the group: its run id, MBU, median TPOT and flag ("noisy", "interfered" or "":
    engine.store.report.run_state of its conditions) — the newest run where a cell ran twice."""
    from engine.store.report import FLAGGED_STATES, run_state

    mine = runs[(runs["group_id"] == group) & (runs["sweep"] == ENVELOPE_SWEEP)] if not runs.empty else runs
    if mine.empty:
        return pd.DataFrame(columns=CELL_COLUMNS)
    frame = mine.reindex(columns=[*CELL_COLUMNS[:-1], "conditions"]).sort_values("id", ascending=False)
    states = [run_state(c)[0] for c in frame.pop("conditions")]
    frame["flag"] = [state if state in FLAGGED_STATES else "" for state in states]
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
    """Per (B, P): the mode with the lowest median TPOT among the cell's unflagged runs (among all where every one
    was flagged), its TPOT and MBU, and compile-cudagraph's TPOT in the same cell over it ('vs compile-cudagraph':
    above 1, the best mode is that many times faster; None where compile-cudagraph did not run there). 'flag' names
    a flagged best or baseline ("best noisy", "compile-cudagraph interfered"): that cell is no headline."""
    columns = ["batch", "prompt_len", "best mode", "tpot_median_us", "mbu_pct", f"{BASELINE} tpot_us",
               f"vs {BASELINE}", "flag"]
    timed = cells[cells["tpot_median_us"].notna() & (cells["tpot_median_us"] > 0)]
    rows = []
    for (batch, prompt), cell in timed.groupby(["batch", "prompt_len"], sort=True):
        clean = cell[cell["flag"].fillna("") == ""]
        pool = clean if not clean.empty else cell
        best = pool.loc[pool["tpot_median_us"].idxmin()]
        base = cell[cell["mode"] == BASELINE]
        base_us = float(base["tpot_median_us"].iloc[0]) if not base.empty else None
        flags = ([f"best {best['flag']}"] if best["flag"] else []) + (
            [f"{BASELINE} {base['flag'].iloc[0]}"] if not base.empty and base["flag"].iloc[0] else [])
        rows.append([int(batch), int(prompt), best["mode"], float(best["tpot_median_us"]), best["mbu_pct"], base_us,
                     base_us / float(best["tpot_median_us"]) if base_us else None, ", ".join(flags)])
    return pd.DataFrame(rows, columns=columns)


def envelope_lines(cells: pd.DataFrame) -> list[str]:
    """best_per_cell as text: a heading and one line per cell (what `llm` prints after a two-axis sweep)."""
    from engine.llm.report import fmt_pct, fmt_time

    best = best_per_cell(cells)
    if best.empty:
        return []
    lines = ["", f"envelope: the best mode per (B, P), MBU = % of the copy bandwidth (the floor: weights + KV cache "
                 f"read once a step), and {BASELINE} of the same cell over it",
             f"{'B':>5} {'P':>6}  {'best mode':<24} {'TPOT':>10} {'MBU':>7} {BASELINE:>18} {'vs':>6}  flag"]
    for row in best.to_dict("records"):
        ratio = row[f"vs {BASELINE}"]
        base = row[f"{BASELINE} tpot_us"]
        lines.append(f"{row['batch']:>5} {row['prompt_len']:>6}  {row['best mode']:<24} "
                     f"{fmt_time(row['tpot_median_us']):>10} {fmt_pct(row['mbu_pct']):>7} "
                     f"{fmt_time(base) if base else '—':>18} {f'{ratio:.2f}×' if ratio else '—':>6}  {row['flag']}")
    return lines
