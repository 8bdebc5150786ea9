"""The LLM page's operating-envelope section: for a two-axis sweep (B × P), a heatmap per mode of MBU and TPOT and
the best mode per cell with its ratio to compile-cudagraph. The data: engine.llm.envelope."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from engine.llm.envelope import BASELINE, METRICS, best_per_cell, envelope_cells, envelope_grid, envelope_groups
from engine.llm.report import fmt_pct, fmt_time


def heatmap(grid: pd.DataFrame, title: str, metric: str) -> go.Figure:
    """One mode's `metric` over (B rows, P columns), each cell labelled with its value."""
    label = (lambda v: fmt_pct(v)) if metric == "mbu_pct" else (lambda v: fmt_time(v))
    text = [[label(v) if v == v else "—" for v in row] for row in grid.to_numpy()]
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=[f"P={p}" for p in grid.columns],
                               y=[f"B={b}" for b in grid.index], text=text, texttemplate="%{text}",
                               colorscale="Viridis" if metric == "mbu_pct" else "Viridis_r",
                               colorbar={"title": METRICS[metric]}))
    fig.update_layout(title=title, height=120 + 60 * len(grid.index), margin={"t": 40, "b": 30})
    return fig


def best_table(best: pd.DataFrame) -> pd.DataFrame:
    """best_per_cell as the page shows it."""
    return pd.DataFrame({
        "B": best["batch"], "P": best["prompt_len"], "best mode": best["best mode"],
        "TPOT": [fmt_time(v) for v in best["tpot_median_us"]], "MBU": [fmt_pct(v) for v in best["mbu_pct"]],
        f"vs {BASELINE}": [f"{v:.2f}×" if v == v and v is not None else "—" for v in best[f"vs {BASELINE}"]],
        "flag": best["flag"]})


def render(runs: pd.DataFrame) -> None:
    """The section, where the store holds a two-axis sweep; nothing otherwise."""
    groups = envelope_groups(runs)
    if not groups:
        return
    st.subheader("Operating envelope (B × P)")
    group = st.selectbox("Two-axis sweep", groups, key="envelope-group",
                         help="python -m engine llm --sweep batch=1,8,32 --sweep prompt=512,8192 --mode …")
    cells = envelope_cells(runs, group)
    st.dataframe(best_table(best_per_cell(cells)), hide_index=True)
    st.caption(f"Best mode per cell: the lowest median TPOT among the cell's unflagged runs; vs {BASELINE}: its "
               "TPOT over the best's in the same cell. A flag (noisy, interfered) marks a cell whose best or baseline "
               "was timed under disturbance: no headline. Cells that did not fit the device were skipped when the "
               "sweep was queued.")
    for mode in sorted(cells["mode"].unique()):
        cols = st.columns(2)
        for col, metric in zip(cols, METRICS):
            col.plotly_chart(heatmap(envelope_grid(cells, mode, metric), f"{mode}: {METRICS[metric]}", metric),
                             key=f"envelope-{mode}-{metric}")
