"""Plotly figures from store frames. Pure functions (frame in, figure out), so pages stay short and tests are easy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from app.axes import log_axis, spans_decades
from engine.compare.changepoints import Step

PALETTE = px.colors.qualitative.Plotly


def _order(frame: pd.DataFrame, modes: Sequence[str] | None) -> list[str]:
    """Modes in registry order (eager first), then any unknown ones, so colours and bars never shuffle."""
    present = list(dict.fromkeys(frame["mode"]))
    known = [m for m in (modes or []) if m in present]
    return known + sorted(m for m in present if m not in known)


def _colors(modes: Sequence[str] | None, order: list[str]) -> dict[str, str]:
    names = list(modes or []) + [m for m in order if m not in (modes or [])]
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(names)}


def _layout(fig: go.Figure, title: str, y_title: str) -> go.Figure:
    fig.update_layout(title=title, yaxis_title=y_title, xaxis_title=None, showlegend=False,
                      margin=dict(l=10, r=10, t=50, b=10), height=360)
    return fig


def _us_label(value: float) -> str:
    if value != value:
        return ""
    return f"{value / 1e3:,.2f} ms" if value >= 10_000 else f"{value:,.1f} µs"


def labels_at_base(fig: go.Figure) -> go.Figure:
    """Value labels inside each bar at its base, where no whisker (p10–p90) can cover them."""
    fig.update_traces(textposition="inside", insidetextanchor="start", textangle=0, cliponaxis=False,
                      selector=dict(type="bar"))
    return fig


def latency_bar(summary: pd.DataFrame, modes: Sequence[str] | None = None) -> go.Figure:
    """Median per mode with asymmetric p10–p90 error bars, each labelled at its base; a log axis labelled at each
    decade where the modes' times span decades (a compiled mode 100× faster than the slowest)."""
    order = _order(summary, modes)
    df = summary.assign(err_plus=summary["p90_us"] - summary["median_us"],
                        err_minus=summary["median_us"] - summary["p10_us"])
    fig = px.bar(df, x="mode", y="median_us", color="mode", error_y="err_plus", error_y_minus="err_minus",
                 category_orders={"mode": order}, color_discrete_map=_colors(modes, order),
                 text=df["median_us"].map(_us_label),
                 hover_data={"run_id": True, "p10_us": ":.1f", "p90_us": ":.1f", "median_us": ":.1f",
                             "err_plus": False, "err_minus": False})
    labels_at_base(fig)
    values = [*df["p10_us"], *df["median_us"], *df["p90_us"]]
    title = "Median latency by mode (whiskers: p10–p90)"
    if spans_decades(values):
        log_axis(fig, values)
        title += ", log scale"
    return _layout(fig, title, "time per call")


def energy_latency(points: pd.DataFrame, x: str, y: str, *, x_title: str, y_title: str, title: str,
                   modes: Sequence[str] | None = None) -> go.Figure:
    """Energy against latency, one point per row (a mode, or a run labelled by its mode), lower-left is better;
    the rows of `points["pareto"]` (no other row both faster and cheaper) are stars joined by the dotted front."""
    order = _order(points, modes)
    colors = _colors(modes, order)
    fig = go.Figure()
    front = points[points["pareto"]].sort_values(x)
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=front[x].tolist(), y=front[y].tolist(), mode="lines", name="Pareto front",
                                 hoverinfo="skip",
                                 line=dict(color="grey", dash="dot")))
    for mode in order:
        sel = points[points["mode"] == mode]
        fig.add_trace(go.Scatter(
            x=sel[x].tolist(), y=sel[y].tolist(), mode="markers+text", name=mode, text=[mode] * len(sel),
            textposition="top center",
            marker=dict(color=colors[mode], size=[14 if p else 10 for p in sel["pareto"]],
                        symbol=["star" if p else "circle" for p in sel["pareto"]]),
            customdata=np.array(["on the Pareto front" if p else "" for p in sel["pareto"]], dtype=object),
            hovertemplate=f"{mode}<br>%{{x:.4g}} µs · %{{y:.4g}} {y_title}<br>%{{customdata}}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, showlegend=False,
                      margin=dict(l=10, r=10, t=50, b=10), height=380)
    return fig


def sample_distribution(samples: pd.DataFrame, modes: Sequence[str] | None = None) -> go.Figure:
    """Every timed sample per mode as a box plot (outliers drawn as points)."""
    order = _order(samples, modes)
    # Log scale: a few scheduler hiccups (10–100× the median) would otherwise flatten every box to a line.
    fig = px.box(samples, x="mode", y="value", color="mode", category_orders={"mode": order},
                 color_discrete_map=_colors(modes, order), points="outliers")
    log_axis(fig, samples["value"], pad=1.2)
    return _layout(fig, "Distribution of timed samples (log scale)", "time per call")


FLAGGED_GREY = "#c7c7c7"


def speedup_bar(summary: pd.DataFrame, modes: Sequence[str] | None = None) -> go.Figure:
    """Eager median / mode median; above the dashed line at 1 the mode beats eager. A speedup that rests on a
    flagged series (`speedup_flag`, engine.store.report.with_speedup) is grey and in parentheses, its reason on
    hover."""
    df = summary.dropna(subset=["speedup_vs_eager"])
    flag = df["speedup_flag"].fillna("") if "speedup_flag" in df else pd.Series("", index=df.index, dtype=str)
    order = _order(df, modes) if not df.empty else []
    flagged = set(df.loc[flag != "", "mode"])
    colors = {m: FLAGGED_GREY if m in flagged else c for m, c in _colors(modes, order).items()}
    fig = px.bar(df.assign(flagged=flag.replace("", "no")), x="mode", y="speedup_vs_eager", color="mode",
                 category_orders={"mode": order}, color_discrete_map=colors, hover_data={"flagged": True},
                 text=[f"({v:.2f}×)" if f else f"{v:.2f}×" for v, f in zip(df["speedup_vs_eager"], flag)])
    fig.add_hline(y=1, line_dash="dash", line_color="gray", annotation_text="eager",
                  annotation_position="top left")
    return _layout(fig, "Speedup vs eager (higher is faster)", "× eager")


def first_call_bar(summary: pd.DataFrame, modes: Sequence[str] | None = None) -> go.Figure:
    """First-call time (tracing, scripting, compiling) on a log scale: modes differ by orders of magnitude."""
    order = _order(summary, modes)
    df = summary.dropna(subset=["first_call_us"])
    fig = px.bar(df, x="mode", y="first_call_us", color="mode", category_orders={"mode": order},
                 color_discrete_map=_colors(modes, order), text=df["first_call_us"].map(_us_label))
    fig.update_traces(textposition="outside", cliponaxis=False)
    log_axis(fig, [*df["first_call_us"], df["first_call_us"].min() / 3], pad=2.5)  # room below for the labels
    return _layout(fig, "First-call cost (trace / compile), log scale", "first call")


def python_vs_native(summary: pd.DataFrame) -> go.Figure:
    """For modes with a native-runner timing (aoti): the same package called from Python and from C++, side by side.

    The gap is what the Python call path costs per call (argument handling, the pybind layer, output wrapping).
    """
    rows = []
    for r in summary.dropna(subset=["native_median_us"]).itertuples():
        rows.append({"mode": r.mode, "caller": "Python (aoti_load_package)", "median_us": r.median_us,
                     "p10_us": r.p10_us, "p90_us": r.p90_us})
        rows.append({"mode": r.mode, "caller": "native runner (C++, no Python)", "median_us": r.native_median_us,
                     "p10_us": r.native_p10_us, "p90_us": r.native_p90_us})
    df = pd.DataFrame(rows)
    df = df.assign(err_plus=df["p90_us"] - df["median_us"], err_minus=df["median_us"] - df["p10_us"])
    fig = px.bar(df, x="mode", y="median_us", color="caller", barmode="group", error_y="err_plus",
                 error_y_minus="err_minus", text=df["median_us"].map(_us_label),
                 hover_data={"p10_us": ":.1f", "p90_us": ":.1f", "err_plus": False, "err_minus": False})
    labels_at_base(fig)
    fig = _layout(fig, "What Python costs: the same .pt2 from Python and from C++", "µs per call")
    fig.update_layout(showlegend=True, legend_title_text=None)
    return fig


def history_line(frame: pd.DataFrame, modes: Sequence[str] | None = None, steps: Sequence[Step] = (),
                 title: str = "History: median of earlier runs") -> go.Figure:
    """Median of every earlier run over time, one line per mode; detected change points (engine.compare.changepoints)
    marked at their first run, labelled with the size, commit and environment."""
    order = _order(frame, modes)
    fig = px.line(frame, x="finished_at", y="median_us", color="mode", markers=True,
                  category_orders={"mode": order}, color_discrete_map=_colors(modes, order),
                  hover_data={"run_id": True})
    if steps:
        at = frame.set_index("run_id")
        fig.add_trace(go.Scatter(x=[at.at[s.run_id, "finished_at"] for s in steps],
                                 y=[at.at[s.run_id, "median_us"] for s in steps], mode="markers+text",
                                 name="change point", text=[f"{100 * (s.ratio - 1):+.0f} % {s.commit or ''}"
                                                            for s in steps], textposition="top center",
                                 marker=dict(symbol="triangle-up", size=14, color="black"),
                                 hovertext=[f"{s.group}: {s.label}" for s in steps], hoverinfo="text"))
    fig = _layout(fig, title, "µs per call")
    fig.update_layout(showlegend=True, xaxis_title="finished")
    return fig


def price_curve(xs: np.ndarray, ys: np.ndarray, x_now: float, y_now: float | None, x_label: str) -> go.Figure:
    """Predicted price as one feature sweeps its training range, with the current input marked."""
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", name="prediction",
                               hovertemplate="%{x:,.1f} → $%{y:,.0f}<extra></extra>"))
    if y_now is not None:
        fig.add_trace(go.Scatter(x=[x_now], y=[y_now], mode="markers", name="your input",
                                 marker=dict(size=12, symbol="diamond", color="crimson"),
                                 hovertemplate="your input: %{x:,.1f} → $%{y:,.0f}<extra></extra>"))
    fig.update_layout(title=f"Predicted price vs {x_label}", xaxis_title=x_label, yaxis_title="price (USD)",
                      yaxis_tickprefix="$", yaxis_tickformat=",.0f", margin=dict(l=10, r=10, t=50, b=10),
                      height=360, showlegend=False)
    return fig


HOLD_COLORS = {"exclusive": "#d62728", "shared": "#1f77b4", "none": "#c7c7c7", "whole run": "#ff7f0e"}


def group_timeline_chart(timeline: pd.DataFrame) -> go.Figure:
    """One row per run, its steps as bars on one clock, coloured by how it held the device: shared while it
    prepared beside the others, exclusive while it timed alone, none while it waited
    (engine.store.report.group_timeline)."""
    df = timeline.assign(run=timeline["mode"] + " #" + timeline["run_id"].astype(str),
                         seconds=timeline["end_s"] - timeline["start_s"])
    fig = px.bar(df, x="seconds", y="run", base="start_s", color="hold", orientation="h",
                 color_discrete_map=HOLD_COLORS, hover_data={"step": True, "start_s": ":.1f", "seconds": ":.2f"})
    fig.update_layout(title="The group's runs side by side (s since the first started)", xaxis_title="s",
                      yaxis_title=None, legend_title_text="device hold", barmode="overlay",
                      height=max(220, 40 * df["run"].nunique() + 120), margin=dict(l=10, r=10, t=50, b=10))
    fig.update_yaxes(autorange="reversed")
    return fig


def training_curve(curve: pd.DataFrame, title: str = "Training curve: loss per epoch") -> go.Figure:
    """Training loss (the mean of each epoch's steps) and validation loss (after each epoch) against the epoch, on a
    decade-labelled log axis where the losses span decades (they usually fall by orders of magnitude)."""
    fig = go.Figure()
    for column, name, dash in (("train_loss", "training (mean of the epoch's steps)", None),
                               ("val_loss", "validation (after the epoch)", "dash")):
        fig.add_trace(go.Scatter(x=curve["epoch"], y=curve[column], mode="lines+markers", name=name,
                                 line=dict(dash=dash), marker=dict(size=5),
                                 hovertemplate="epoch %{x}: %{y:.4g}<extra>" + name.split(" ")[0] + "</extra>"))
    values = [*curve["train_loss"], *curve["val_loss"]]
    if spans_decades(values):
        log_axis(fig, values, label=lambda v: f"{v:g}", pad=1.3)
    fig.update_xaxes(tick0=1, dtick=max(1, round(len(curve) / 10)))  # whole epochs only
    fig.update_layout(title=title, xaxis_title="epoch", yaxis_title="loss (MSE, normalised price)", height=340,
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.25))
    return fig
