"""Plotly figures of the Kernel Levels page: latency per level, throughput, speedup and the roofline."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from engine.measure.ceilings import Ceilings

PALETTE = px.colors.qualitative.Plotly


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:,.3g} {prefix}{unit}"
    return f"{value:,.3g} {unit}"


def _colors(levels: Sequence[str]) -> dict[str, str]:
    return {lv: PALETTE[i % len(PALETTE)] for i, lv in enumerate(levels)}


def _layout(fig: go.Figure, title: str, y_title: str, height: int = 340) -> go.Figure:
    fig.update_layout(title=title, yaxis_title=y_title, xaxis_title=None, showlegend=False,
                      margin=dict(l=10, r=10, t=50, b=10), height=height)
    return fig


def _in_graph(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows timed in a CUDA graph too (graph_median_us; NaN on CPU), with the device-time throughput: the same
    FLOPs over the in-graph time instead of the per-call median."""
    if "graph_median_us" not in frame.columns:
        return frame.iloc[0:0]
    rows = frame.dropna(subset=["graph_median_us"])
    rows = rows[rows["graph_median_us"] > 0]
    return rows.assign(graph_flops_per_s=rows["flops_per_s"] * rows["median_us"] / rows["graph_median_us"])


def latency_bar(frame: pd.DataFrame, levels: Sequence[str]) -> go.Figure:
    order = [lv for lv in levels if lv in set(frame["mode"])]
    df = frame.assign(err_plus=frame["p90_us"] - frame["median_us"], err_minus=frame["median_us"] - frame["p10_us"])
    fig = px.bar(df, x="mode", y="median_us", color="mode", error_y="err_plus", error_y_minus="err_minus",
                 category_orders={"mode": order}, color_discrete_map=_colors(levels),
                 hover_data={"id": True, "median_us": ":.1f", "p10_us": ":.1f", "p90_us": ":.1f"})
    graphed = _in_graph(frame)
    if not graphed.empty:  # where the host's per-call cost hides the kernel, the gap between bar and diamond shows it
        fig.add_trace(go.Scatter(x=graphed["mode"], y=graphed["graph_median_us"], mode="markers",
                                 marker=dict(symbol="diamond", size=11, color="black"),
                                 name="in a CUDA graph (device time)"))
    return _layout(fig, "Median latency per level (p10–p90 bars; ◆ in a CUDA graph)", "µs")


def value_bar(frame: pd.DataFrame, levels: Sequence[str], column: str, title: str, y_title: str,
              scale: float = 1.0) -> go.Figure:
    order = [lv for lv in levels if lv in set(frame["mode"])]
    df = frame.assign(shown=frame[column] / scale)
    fig = px.bar(df, x="mode", y="shown", color="mode", category_orders={"mode": order},
                 color_discrete_map=_colors(levels), text_auto=".3g")
    return _layout(fig, title, y_title)


def roofline(frame: pd.DataFrame, ceilings: Ceilings | None, matmul_key: str, levels: Sequence[str]) -> go.Figure:
    """Arithmetic intensity (FLOP/B) vs achieved FLOP/s, log-log, under the measured roofs: the copy bandwidth
    slope and the matmul ceiling of the component's dtype. Filled points: per-call medians; hollow ones (CUDA runs):
    the same calls replayed in a CUDA graph, i.e. the kernel's throughput without the host's per-call cost."""
    fig = go.Figure()
    colors = _colors(levels)
    points = frame.dropna(subset=["intensity", "flops_per_s"])
    lo = float(points["intensity"].min()) if not points.empty else 1.0
    hi = float(points["intensity"].max()) if not points.empty else 100.0
    x = np.logspace(np.log10(max(lo / 10, 1e-3)), np.log10(max(hi * 10, 10)), 100)
    if ceilings is not None and ceilings.copy_bw and ceilings.matmul(matmul_key):
        bw, peak = ceilings.copy_bw, ceilings.matmul(matmul_key)
        fig.add_trace(go.Scatter(x=x, y=np.minimum(x * bw, peak) / 1e12, mode="lines", line=dict(color="grey"),
                                 name=f"roof: {_rate(bw, 'B/s')} copy, {_rate(peak, 'FLOP/s')} {matmul_key} "
                                      "matmul (measured)"))
        sheet = ceilings.datasheet
        if sheet is not None:
            sheet_peak = {"bf16": sheet.bf16_flops, "fp16": sheet.bf16_flops, "tf32": sheet.tf32_flops,
                          "fp32": sheet.fp32_flops}[matmul_key]
            fig.add_trace(go.Scatter(x=x, y=np.minimum(x * sheet.mem_bw, sheet_peak) / 1e12, mode="lines",
                                     line=dict(color="lightgrey", dash="dot"),
                                     name=f"datasheet roof ({sheet.name})"))
    for _, r in points.iterrows():
        fig.add_trace(go.Scatter(x=[r["intensity"]], y=[r["flops_per_s"] / 1e12], mode="markers+text",
                                 text=[r["mode"]], textposition="top center", name=r["mode"],
                                 marker=dict(size=12, color=colors.get(r["mode"], "black"))))
    for _, r in _in_graph(points).iterrows():  # hollow: the kernel's own throughput, without the host's cost
        fig.add_trace(go.Scatter(x=[r["intensity"]], y=[r["graph_flops_per_s"] / 1e12], mode="markers",
                                 name=f"{r['mode']} in a CUDA graph",
                                 marker=dict(size=12, symbol="circle-open", line=dict(width=2),
                                             color=colors.get(r["mode"], "black"))))
    fig.update_layout(title="Roofline: achieved throughput against this device's measured ceilings",
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per minimum byte)"),
                      yaxis=dict(type="log", title="TFLOP/s"), height=420, margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.25))
    return fig
