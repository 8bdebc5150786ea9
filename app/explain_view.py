"""The "Why is X slower than Y?" section the Benchmark page shows: a thin view over engine.explain.why.

The engine reads the runs, splits each step into terms and writes the sentence; this module only picks the two modes,
draws the stacked bar and lays out the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from app.common import flash, fmt_us, submit
from engine.explain import why as ex
from engine.store.db import Store

TERM_COLORS = {"compute": "#2ca02c", "launch": "#d62728", "guard": "#9467bd", "framework": "#ff7f0e",
               "idle": "#c7c7c7"}


def breakdown_bar(e: ex.Explanation) -> go.Figure:
    """One horizontal stacked bar per mode: the step's terms (µs per step), with the floor as a dashed line."""
    frame = e.frame()
    labels = dict(zip(frame["term"], frame["label"]))  # CPU runs name compute and idle for what they are there
    fig = px.bar(frame, x="us", y="run", color="label", orientation="h",
                 category_orders={"label": [labels[t] for t in ex.TERMS if t in labels],
                                  "run": [f"A: {e.a.mode}", f"B: {e.b.mode}"]},
                 color_discrete_map={labels[t]: c for t, c in TERM_COLORS.items() if t in labels},
                 hover_data={"us": ":,.1f", "run": False})
    if e.floor is not None and e.floor.terms:
        fig.add_vline(x=e.floor.us, line_dash="dash", line_color="black",
                      annotation_text=f"floor {fmt_us(e.floor.us)}", annotation_position="top")
    fig.update_layout(title="Where each step's time goes (profiled, µs per step)", xaxis_title="µs per step",
                      yaxis_title=None, legend_title_text=None, barmode="stack", height=300,
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.3))
    return fig


def _queue_profiles(sides: list[ex.Side]) -> None:
    ids = submit(ex.profile_specs(sides))
    if ids:
        flash("success", "Queued " + ", ".join(f"#{i} profile {s.mode}" for i, s in zip(ids, sides))
              + ". Progress shows on the Profiler page; the explanation below updates when they land.")


def _terms_table(e: ex.Explanation) -> pd.DataFrame:
    rows = []
    has_device = any(s.partition.has_device for s in (e.a, e.b) if s.partition)
    for term in ex.TERMS:
        rows.append({"µs per step": ex.term_label(term, has_device),
                     e.a.mode: e.a.partition.terms[term] if e.a.partition else None,
                     e.b.mode if e.b.mode != e.a.mode else f"{e.b.mode} (B)":
                         e.b.partition.terms[term] if e.b.partition else None})
    return pd.DataFrame(rows)


def section(store: Store, workload: str, device: str, phase: str, batch: int | None,
            mode_order: Sequence[str]) -> None:
    """Pick two modes benchmarked at these filters; show the sentence, the stacked bar and the floor."""
    st.subheader("Why is one mode slower than another?")
    runs = ex.bench_run_ids(store, workload, device, phase, batch) if batch is not None else {}
    if len(runs) < 2:
        st.caption("Benchmark at least two modes at these filters to compare where their steps spend time.")
        return
    order = [m for m in mode_order if m in runs] + sorted(m for m in runs if m not in mode_order)
    left, right = st.columns(2)
    mode_a = left.selectbox("Mode X", order, index=0, key="explain-a")
    others = [m for m in order if m != mode_a]
    mode_b = right.selectbox("Mode Y", others, index=0, key="explain-b")
    try:
        e = ex.explain(store, runs[mode_a], runs[mode_b], phase, batch)
    except ex.ExplainError as exc:
        st.error(str(exc), icon=":material/error:")
        return
    st.info(e.sentence, icon=":material/lightbulb:")
    missing = [s for s in (e.a, e.b) if s.partition is None]
    if missing:
        st.warning("No profile of " + " and ".join(f"{s.mode}" for s in missing) + f" at {phase} B={batch}: "
                   + "; ".join(f"`{s.missing_profile}`" for s in missing), icon=":material/warning:")
        label = "Profile both and explain" if len(missing) == 2 else f"Profile {missing[0].mode} and explain"
        st.button(label, key="explain-profile", on_click=_queue_profiles, args=(missing,))
    if not e.frame().empty:
        st.plotly_chart(breakdown_bar(e), key="chart-explain")
        st.dataframe(_terms_table(e), hide_index=True, key="explain-table",
                     column_config={c: st.column_config.NumberColumn(format="%.1f") for c in (mode_a, mode_b)})
    for side in (e.a, e.b):
        bits = [f"**{side.mode}**"]
        if side.unprofiled_us is not None:
            bits.append(f"step without the profiler {fmt_us(side.unprofiled_us)}")
        if side.compile_once_us is not None:
            bits.append(f"paid once at the first call {fmt_us(side.compile_once_us)}")
        if side.cache_text:
            bits.append(side.cache_text)
        if e.distance(side):
            bits.append(f"{ex.times_text(e.distance(side)[0])} the floor")
        st.caption(" · ".join(bits))
    if e.floor is not None and e.floor.terms:
        bound = e.floor.bound
        st.caption(f"Floor for this step: {fmt_us(e.floor.us)}, {bound.name}-bound — "
                   + "; ".join(f"{t.name} {fmt_us(t.us)} = {t.what} ({t.label})" for t in e.floor.terms)
                   + f". Ceilings run #{e.floor.ceilings_run}.")
    for note in e.notes:
        if not any(s.missing_profile and s.missing_profile in note for s in missing):  # the warning above says it
            st.caption(f":material/info: {note}")
    for side in (e.a, e.b):
        if side.depyf_files:
            with st.expander(f"What torch.compile produced for {side.mode} (depyf: decompiled code, guards, "
                             "kernels)", key=f"explain-depyf-{side.label}"):
                files = ex.read_depyf(side.depyf_files)
                name = st.selectbox("File", list(files), key=f"explain-depyf-file-{side.label}")
                if name:
                    st.code(files[name], language="python")
