"""Compare: did it get slower? Two sides (commits, torch versions, devices, merged stores, runs) compared series by
series with a bootstrap confidence interval (engine.compare.verdict), a forest plot of the ratios and the commands to
rerun; the time samples, or the runs' energy figures."""

from __future__ import annotations

import shlex

import plotly.graph_objects as go
import streamlit as st

from app.axes import ratio_axis
from app.common import get_store, page_header
from engine.compare.verdict import KINDS, METRICS, CompareError, Comparison, Options, compare, spec_choices, table

BY = {"commit": "git commit", "torch": "torch version", "device": "device", "merged": "merged store",
      "ids": "run ids", "latest": "latest run of each series"}
COLORS = {"slower": "crimson", "faster": "seagreen", "more energy": "crimson", "less energy": "seagreen",
          "unchanged": "grey", "cannot tell": "orange", "too few samples": "lightgrey"}
WHAT = {"time": "ratio of medians", "energy": "ratio of the runs' median energy per step, token or prefill"}

st.set_page_config(page_title="Compare · Mode Lab", layout="wide")
store = get_store()
page_header("Compare", "Did it get slower? Two sets of runs compared series by series on their raw samples: the "
            "ratio of medians (head / base) with a 95 % bootstrap confidence interval, and a verdict that needs both "
            "significance and a minimum effect size. The same test runs in CI: `python -m engine compare`.")


def side_picker(side: str, choices: dict[str, list[str]], default_by: str, default_index: int) -> str:
    """Pick a side by one key and one stored value; returns its SPEC."""
    st.subheader("Base" if side == "base" else "Head")
    keys = [k for k in BY if k == "latest" or choices.get(k)]
    by = st.selectbox("Pick by", keys, index=keys.index(default_by) if default_by in keys else 0,
                      key=f"{side}-by", format_func=BY.get)
    if by == "latest":
        return "latest"
    if by == "ids":
        picked = st.multiselect("Runs", choices["ids"], default=choices["ids"][:1], key=f"{side}-ids")
        return "ids:" + ",".join(p.split(" ")[0] for p in picked) if picked else ""
    values = choices[by]
    value = st.selectbox(BY[by].capitalize(), values, index=min(default_index, len(values) - 1),
                         key=f"{side}-value")
    return f'{by}:"{value}"' if any(c.isspace() or c in "'\"" for c in value) else f"{by}:{value}"


def forest(result: Comparison) -> go.Figure:
    """Each series' ratio with its CI, the no-change line at 1 and the threshold band around it."""
    rows = result.rows[::-1]
    fig = go.Figure()
    t = result.threshold
    fig.add_vrect(x0=1 / (1 + t), x1=1 + t, fillcolor="lightgrey", opacity=0.35, line_width=0,
                  annotation_text=f"±{100 * t:g} % threshold", annotation_position="top left")
    fig.add_vline(x=1, line_dash="dash", line_color="grey")
    for verdict, color in COLORS.items():
        chosen = [r for r in rows if r.verdict == verdict]
        if chosen:
            fig.add_trace(go.Scatter(
                x=[r.ratio for r in chosen], y=[r.series for r in chosen], mode="markers", name=verdict,
                marker=dict(color=color, size=10),
                error_x=dict(type="data", symmetric=False, array=[r.ci_high - r.ratio for r in chosen],
                             arrayminus=[r.ratio - r.ci_low for r in chosen]),
                hovertemplate="%{y}<br>ratio %{x:.3f}<extra>" + verdict + "</extra>"))
    worse = "slower" if result.metric == "time" else "more energy"
    fig.update_layout(title=f"Head / base {WHAT[result.metric]} with its 95 % CI (right of 1: {worse}; log scale)",
                      xaxis_title="head / base", yaxis_title=None, height=max(260, 34 * len(rows) + 120),
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.15))
    # log: a halving and a doubling lie equally far from 1
    return ratio_axis(fig, [v for r in rows for v in (r.ci_low, r.ci_high, r.ratio)] + [1 + t, 1 / (1 + t)])


choices = spec_choices(store)
if not choices["ids"]:
    st.info("No finished bench, levels or LLM runs in the store yet: run a benchmark (or merge another store with "
            "`python -m engine merge OTHER.duckdb`), then compare here.", icon=":material/info:")
    st.stop()

left, right = st.columns(2)
with left, st.container(border=True):
    base = side_picker("base", choices, "commit", 1)
with right, st.container(border=True):
    head = side_picker("head", choices, "latest", 0)
c0, c1, c2 = st.columns([1, 2, 2])
metric = c0.radio("Judge", METRICS, key="metric", horizontal=True,
                  help="time: the raw time samples; energy: each run's joules per step, token or prefill (whole "
                       "board or CPU package; the share above the idle draw beside it), where the runs measured it")
threshold = c1.number_input("Threshold (smallest change that counts, %)", min_value=0.0, max_value=99.0, value=5.0,
                            step=1.0, key="threshold")
kind = c2.selectbox("Kind", ["all", *KINDS], key="kind")
include_flagged = st.toggle("Count runs flagged noisy or interfered", key="include-flagged",
                            help="Left out by default: their timing shared the machine (engine.measure.noise).")
st.code(f"python -m engine compare --base {shlex.quote(base)} --head {shlex.quote(head)} --threshold {threshold:g}%"
        + ("" if kind == "all" else f" --kind {kind}") + (" --include-flagged" if include_flagged else "")
        + ("" if metric == "time" else f" --metric {metric}"),
        language="bash")

if not base or not head:
    st.info("Pick at least one run on each side.", icon=":material/info:")
    st.stop()
try:
    result = compare(store, base, head, Options(threshold=threshold / 100, include_flagged=include_flagged,
                                                kinds=KINDS if kind == "all" else (kind,), metric=metric))
except CompareError as exc:
    st.warning(f"Nothing to compare: {exc}.", icon=":material/warning:")
    st.stop()

counts = ", ".join(f"{n} {v}" for v, n in result.counts().items() if n)
(st.error if result.regressed else st.warning if result.undecided else st.success)(
    f"{len(result.rows)} series: {counts} (base: {len(result.base_runs)} runs, head: {len(result.head_runs)} runs)."
    + (f" A CI run of this comparison exits with code {result.exit_code}." if result.exit_code else ""))
st.dataframe(table(result), hide_index=True, key="verdicts")
for i, row in enumerate(result.rows, 1):  # why a series cannot be told, and where its process noise came from
    if row.why or row.process_noise:
        st.caption(f"[{i}] " + (f"cannot tell: {row.why}" if row.why else f"process noise: {row.process_noise}"))
    if row.unmeasured:
        st.caption(f"[{i}] no energy figure, left out: runs {', '.join(map(str, row.unmeasured))}")
st.plotly_chart(forest(result), key="forest")
with st.expander("Reproduce the head side", icon=":material/terminal:", expanded=result.regressed):
    st.code("\n".join(f"# [{i}] {r.series}\n{r.command}" for i, r in enumerate(result.rows, 1)), language="bash")
for title, names in (("Only in the base", result.only_base), ("Only in the head", result.only_head)):
    if names:
        st.caption(f"{title} ({len(names)}): " + "; ".join(names[:12]) + (" …" if len(names) > 12 else ""))
for note in result.notes:
    st.caption(f":material/info: {note}")
st.caption(("Slower" if metric == "time" else "More energy")
           + ": the whole 95 % CI of the ratio lies above 1 and the ratio is at least 1 + threshold; "
           + ("faster" if metric == "time" else "less energy") + ": the mirror image; "
           f"B = {result.resamples} bootstrap resamples (seed {result.seed}), the Mann–Whitney p for "
           "reference. docs/compare.md says more.")
