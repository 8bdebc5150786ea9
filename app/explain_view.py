"""The "Why is X slower than Y?" section the Benchmark page shows: a thin view over engine.explain.why.

The engine reads the runs, splits each step into terms and writes the sentence; this module only picks the two modes,
draws the stacked bar and lays out the figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from app.common import ACTIVE, STATE_WORDS, first_line, fmt_us, get_store, submit
from app.tables import MISSING
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


PENDING = "explain-queued"  # session state: the profile runs *Profile … and explain* queued, and for which modes


def _queue_profiles(sides: list[ex.Side]) -> None:
    ids = submit(ex.profile_specs(sides))
    if ids:
        st.session_state[PENDING] = {"ids": [int(i) for i in ids], "modes": [s.mode for s in sides]}


@st.fragment(run_every=1.0)
def _wait_for_profiles(ids: tuple[int, ...]) -> None:
    """The queued profiles' progress beside the button; when none is queued or running any more the whole page
    reruns, so the explanation above picks them up in place (the chosen modes are kept: widget state)."""
    store = get_store()
    store.fail_stale_runs()  # a killed supervisor would otherwise leave this waiting forever
    rows = [store.run(i) for i in ids]
    if all(r is None or r["status"] not in ACTIVE for r in rows):
        st.rerun()
    for run_id, r in zip(ids, rows):
        if r is None:
            continue
        progress = float(r["progress"]) if r.get("progress") is not None and r["progress"] == r["progress"] else 0.0
        message = r["message"] if isinstance(r.get("message"), str) and r["message"] != r["status"] else ""
        st.progress(min(max(progress, 0.0), 1.0), text=f"#{run_id} profile {r['mode']}: "
                    + STATE_WORDS.get(r["status"], r["status"]) + (f" — {message}" if message else ""))


def _queued_panel(store: Store) -> bool:
    """Under the button: the profiles it queued, while they run (True), and how they ended once they have."""
    queued = st.session_state.get(PENDING)
    if not queued:
        return False
    ids = tuple(queued["ids"])
    rows = {i: store.run(i) for i in ids}
    if any(r is not None and r["status"] in ACTIVE for r in rows.values()):
        st.success("Queued " + ", ".join(f"#{i} profile {m}" for i, m in zip(ids, queued["modes"]))
                   + ": the explanation above updates when they finish.", icon=":material/schedule:")
        _wait_for_profiles(ids)
        return True
    failed = [(i, r) for i, r in rows.items() if r is not None and r["status"] != "ok"]
    for run_id, r in failed:
        st.error(f"Profile #{run_id} of {r['mode']} {r['status']}: {first_line(r.get('error')) or 'no message'}",
                 icon=":material/error:")
    if not failed:
        st.caption(f":material/check: Profiles {', '.join(f'#{i}' for i in ids)} finished; the explanation above "
                   "reads them.")
    return False


def _terms_table(e: ex.Explanation) -> pd.DataFrame:
    rows = []
    has_device = any(s.partition.has_device for s in (e.a, e.b) if s.partition)
    for term in ex.TERMS:
        rows.append({"per profiled step": ex.term_label(term, has_device),
                     f"A: {e.a.mode}": fmt_us(e.a.partition.terms[term]) if e.a.partition else MISSING,
                     f"B: {e.b.mode}": fmt_us(e.b.partition.terms[term]) if e.b.partition else MISSING})
    return pd.DataFrame(rows)


def _runs_table(e: ex.Explanation) -> pd.DataFrame:
    """The runs the explanation reads, with the bench medians the cards show beside the profiles' own steps."""
    rows = []
    for s in (e.a, e.b):
        profiled = s.partition.step_us if s.partition else None
        used = s.partition is not None
        rows.append({"": f"{s.label}: {s.mode}",
                     "bench run (its card)": f"#{s.bench_run}" if s.bench_run else MISSING,
                     "median (card)": fmt_us(s.bench_median_us),
                     "profile run": (f"#{s.profile_run}" + ("" if used else " (not used)")) if s.profile_run
                     else MISSING,
                     "profiled step": fmt_us(profiled),
                     "profile's step without the profiler": fmt_us(s.unprofiled_us) if used else MISSING})
    return pd.DataFrame(rows)


def section(store: Store, workload: str, device: str, phase: str, batch: int | None,
            mode_order: Sequence[str], runs: Mapping[str, int] | None = None) -> None:
    """Pick two modes benchmarked at these filters; show the sentence, the runs it reads, the stacked bar and the
    floor. `runs` (mode → bench run id) are the runs the page's cards show; without it, each mode's newest."""
    st.subheader("Why is one mode slower than another?")
    if runs is None:
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
    st.dataframe(_runs_table(e), hide_index=True, key="explain-runs")
    missing = [s for s in (e.a, e.b) if s.partition is None]
    for s in missing:
        if s.profile_problem:
            st.warning(f"{s.mode}: {s.profile_problem}. Profile it again: `{s.missing_profile}`",
                       icon=":material/warning:")
    unprofiled = [s for s in missing if not s.profile_problem]
    if unprofiled:
        st.warning("No profile of " + " and ".join(f"{s.mode}" for s in unprofiled) + f" at {phase} B={batch}: "
                   + "; ".join(f"`{s.missing_profile}`" for s in unprofiled), icon=":material/warning:")
    busy = _queued_panel(store)
    if missing and not busy:
        again = " again" if all(s.profile_problem for s in missing) else ""
        label = (f"Profile both{again} and explain" if len(missing) == 2
                 else f"Profile {missing[0].mode}{again} and explain")
        st.button(label, key="explain-profile", on_click=_queue_profiles, args=(missing,))
    if not e.frame().empty:
        st.plotly_chart(breakdown_bar(e), key="chart-explain")
        st.dataframe(_terms_table(e), hide_index=True, key="explain-table")
    for side in (e.a, e.b):
        bits = [f"**{side.mode}**"]
        if side.compile_once_us is not None:
            bits.append(f"paid once at the first call {fmt_us(side.compile_once_us)}")
        if side.cache_text:
            bits.append(side.cache_text)
        if e.distance(side):
            bits.append(f"{ex.times_text(e.distance(side)[0])} the floor")
        if len(bits) > 1:
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
