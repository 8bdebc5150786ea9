"""Plotly figures of the Kernel Levels page: latency per level, throughput, speedup and the roofline."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from app.axes import fmt_rate, log_axis, rate_scale, si_text, spans_decades
from app.charts import labels_at_base
from engine.measure.ceilings import Ceilings

PALETTE = px.colors.qualitative.Plotly


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
    """Median per level with p10–p90 whiskers, labelled at the base; a decade-labelled log axis where the levels'
    times span decades (a naive module against a fused kernel)."""
    order = [lv for lv in levels if lv in set(frame["mode"])]
    df = frame.assign(err_plus=frame["p90_us"] - frame["median_us"], err_minus=frame["median_us"] - frame["p10_us"])
    fig = px.bar(df, x="mode", y="median_us", color="mode", error_y="err_plus", error_y_minus="err_minus",
                 category_orders={"mode": order}, color_discrete_map=_colors(levels),
                 text=df["median_us"].map(lambda v: f"{v / 1e3:,.2f} ms" if v >= 10_000 else f"{v:,.1f} µs"),
                 hover_data={"id": True, "median_us": ":.1f", "p10_us": ":.1f", "p90_us": ":.1f"})
    labels_at_base(fig)
    graphed = _in_graph(frame)
    if not graphed.empty:  # where the host's per-call cost hides the kernel, the gap between bar and diamond shows it
        fig.add_trace(go.Scatter(x=graphed["mode"], y=graphed["graph_median_us"], mode="markers",
                                 marker=dict(symbol="diamond", size=11, color="black"),
                                 name="in a CUDA graph (device time)"))
    values = [*df["p10_us"], *df["p90_us"], *graphed.get("graph_median_us", [])]
    title = "Median latency per level (whiskers: p10–p90" + ("; ◆ in a CUDA graph)" if not graphed.empty else ")")
    if spans_decades(values):
        log_axis(fig, values)
        title += ", log scale"
    return _layout(fig, title, "time per call")


def value_bar(frame: pd.DataFrame, levels: Sequence[str], column: str, title: str, unit: str) -> go.Figure:
    """One value per level; a rate (unit ending in '/s') in the prefix its largest value calls for (GFLOP/s on a CPU,
    TFLOP/s on a GPU), named in the title and axis."""
    order = [lv for lv in levels if lv in set(frame["mode"])]
    scale, label = rate_scale(frame[column], unit) if unit.endswith("/s") else (1.0, unit)
    df = frame.assign(shown=frame[column] / scale)
    fig = px.bar(df, x="mode", y="shown", color="mode", category_orders={"mode": order},
                 color_discrete_map=_colors(levels), text_auto=".3g")
    fig.update_traces(textposition="outside", cliponaxis=False)
    return _layout(fig, title.replace("{unit}", label), label)


def roof_at(intensity: float, ceilings: Ceilings | None, matmul_key: str) -> float | None:
    """The measured roof over an arithmetic intensity: min(intensity × copy bandwidth, matmul rate)."""
    if ceilings is None or not ceilings.copy_bw or not ceilings.matmul(matmul_key):
        return None
    return min(intensity * ceilings.copy_bw, ceilings.matmul(matmul_key))


def above_roof(frame: pd.DataFrame, ceilings: Ceilings | None, matmul_key: str) -> pd.Series:
    """True for levels whose achieved FLOP/s lies above the measured roof at their intensity: they read less than the
    minimum bytes from memory, because their working set fits in a cache (the copy bandwidth is DRAM's)."""
    out = []
    for ai, rate in zip(frame["intensity"], frame["flops_per_s"]):
        roof = roof_at(ai, ceilings, matmul_key) if ai == ai and rate == rate else None
        out.append(bool(roof and rate > roof * 1.02))
    return pd.Series(out, index=frame.index, dtype=bool)


def over_ceiling_notes(row: dict) -> list[str]:
    """Why a level's figure exceeds its measured ceiling, one sentence per figure that does (a card's note)."""
    notes = []
    copy, matmul = row.get("pct_copy_bw"), row.get("pct_matmul")
    if copy is not None and copy == copy and copy > 100:
        notes.append(f"Above the copy ceiling ({copy:.0f} %): the ceiling is a large copy through DRAM, while this "
                     "level's working set fits in a cache, so it moves its minimum bytes faster than DRAM allows.")
    if matmul is not None and matmul == matmul and matmul > 100:
        notes.append(f"Above the matmul ceiling ({matmul:.0f} %): the ceiling's reference GEMM ran slower than this "
                     "level does (a shape or a clock this kernel favours); `python -m engine ceilings` measures again.")
    return notes


TEXT_POSITIONS = ("top center", "bottom center", "middle right", "middle left", "top right", "bottom left")


def roofline(frame: pd.DataFrame, ceilings: Ceilings | None, matmul_key: str, levels: Sequence[str]) -> go.Figure:
    """Arithmetic intensity (FLOP/B) vs achieved FLOP/s, log-log, under the measured roofs: the copy bandwidth
    slope and the matmul ceiling of the component's dtype, over a range bounded by the points and the ridge. Filled
    points: per-call medians; hollow ones (CUDA runs): the same calls replayed in a CUDA graph, i.e. the kernel's
    throughput without the host's per-call cost. A point above the roof is a star, named in the legend: its working
    set fits in a cache. Labels of neighbouring points take turns above, below and beside them."""
    fig = go.Figure()
    colors = _colors(levels)
    points = frame.dropna(subset=["intensity", "flops_per_s"])
    points = points[(points["intensity"] > 0) & (points["flops_per_s"] > 0)]
    graphed = _in_graph(points)
    has_roof = ceilings is not None and bool(ceilings.copy_bw) and bool(ceilings.matmul(matmul_key))
    ais = list(points["intensity"]) or [1.0]
    lo, hi = min(ais) / 4, max(ais) * 4
    rates = [*points["flops_per_s"], *graphed.get("graph_flops_per_s", [])]
    if has_roof:
        bw, peak = ceilings.copy_bw, ceilings.matmul(matmul_key)
        ridge = peak / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        rates += [peak, lo * bw]
    scale, unit = rate_scale(rates, "FLOP/s")
    x = np.logspace(np.log10(lo), np.log10(hi), 120)
    if has_roof:
        fig.add_trace(go.Scatter(x=x, y=np.minimum(x * bw, peak) / scale, mode="lines", line=dict(color="grey"),
                                 name=f"roof: {fmt_rate(bw, 'B/s')} copy, {fmt_rate(peak, 'FLOP/s')} {matmul_key} "
                                      "matmul (measured)", hoverinfo="skip"))
        sheet = ceilings.datasheet
        if sheet is not None:
            sheet_peak = {"bf16": sheet.bf16_flops, "fp16": sheet.bf16_flops, "tf32": sheet.tf32_flops,
                          "fp32": sheet.fp32_flops}[matmul_key]
            fig.add_trace(go.Scatter(x=x, y=np.minimum(x * sheet.mem_bw, sheet_peak) / scale, mode="lines",
                                     line=dict(color="lightgrey", dash="dot"), hoverinfo="skip",
                                     name=f"datasheet roof ({sheet.name})"))
    over = above_roof(points, ceilings, matmul_key)
    ranked = points.assign(_over=over).sort_values("intensity")
    for i, (_, r) in enumerate(ranked.iterrows()):
        star = bool(r["_over"])
        fig.add_trace(go.Scatter(
            x=[r["intensity"]], y=[r["flops_per_s"] / scale], mode="markers+text", text=[r["mode"]],
            textposition=TEXT_POSITIONS[i % len(TEXT_POSITIONS)],
            name=r["mode"],
            marker=dict(size=15 if star else 12, symbol="star" if star else "circle",
                        color=colors.get(r["mode"], "black")),
            hovertemplate=f"{r['mode']}<br>%{{x:.3g}} FLOP/B · {fmt_rate(r['flops_per_s'], 'FLOP/s')}<extra></extra>"))
    if over.any():  # the star explained once, in the legend
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="star", size=13, color="grey"),
                                 name="★ above the measured roof: its working set fits in a cache, so it moves its "
                                      "bytes faster than the DRAM copy the roof was measured with"))
    for _, r in graphed.iterrows():  # hollow: the kernel's own throughput, without the host's cost
        fig.add_trace(go.Scatter(x=[r["intensity"]], y=[r["graph_flops_per_s"] / scale], mode="markers",
                                 name=f"{r['mode']} in a CUDA graph",
                                 marker=dict(size=12, symbol="circle-open", line=dict(width=2),
                                             color=colors.get(r["mode"], "black"))))
    fig.update_layout(title="Roofline: achieved throughput against this device's measured ceilings",
                      height=460, margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.25))
    log_axis(fig, [lo, hi], axis="x", label=lambda v: si_text(v), pad=1.0)
    fig.update_xaxes(title="arithmetic intensity (FLOP per minimum byte)")
    log_axis(fig, [r / scale for r in rates], label=lambda v: si_text(v), pad=2.0)
    fig.update_yaxes(title=unit)
    return fig
