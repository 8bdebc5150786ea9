"""Axes and units that read well: log axes with a labelled tick at each decade (1 µs, 10 µs, 100 µs, 1 ms …, never
plotly's "2, 5" minor labels), only where the values span decades; rates in the unit the device's figures call for
(GFLOP/s and GB/s on a CPU, TFLOP/s and TB/s on a GPU). Pure functions on numbers and figures."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import plotly.graph_objects as go

PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))
# A log axis where the largest value is this many times the smallest: below it a linear axis reads better.
DECADES_FROM = 20.0


def finite(values: Iterable[float]) -> np.ndarray:
    array = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return array[np.isfinite(array) & (array > 0)]


def spans_decades(values: Iterable[float], factor: float = DECADES_FROM) -> bool:
    """Whether the positive values spread over `factor` or more (then a log axis shows them all)."""
    array = finite(values)
    return array.size > 1 and array.max() / array.min() >= factor


def rate_scale(values: Iterable[float], unit: str) -> tuple[float, str]:
    """(divisor, label) for rates: the largest prefix the biggest value reaches (2.1e9 FLOP/s → (1e9, 'GFLOP/s'))."""
    array = finite(values)
    top = float(array.max()) if array.size else 1.0
    for scale, prefix in PREFIXES:
        if top >= scale:
            return scale, f"{prefix}{unit}"
    return 1.0, unit


def fmt_rate(value: float | None, unit: str, digits: int = 3) -> str:
    """1.2e14 FLOP/s → '120 TFLOP/s'; 3.1e9 B/s → '3.1 GB/s'; '—' for none."""
    if value is None or not math.isfinite(value):
        return "—"
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def us_text(us: float) -> str:
    """A tick label for a time in µs: '1 µs', '10 µs', '100 µs', '1 ms', '10 ms', '1 s', '0.1 µs'."""
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "µs")):
        if us >= scale:
            return f"{us / scale:g} {unit}"
    return f"{us:g} µs"


def si_text(value: float, unit: str = "") -> str:
    """A tick label with an SI prefix: 1e9 → '1 G', 1e-3 → '0.001'."""
    for scale, prefix in PREFIXES:
        if value >= scale:
            return f"{value / scale:g} {prefix}{unit}".strip()
    return f"{value:g} {unit}".strip()


def decade_ticks(lo: float, hi: float, label=us_text) -> dict:
    """tickvals/ticktext for a log axis from lo to hi: every decade, plus 2 and 5 between them when the range is under
    two decades (so a short range still has three or more labels)."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1, 2, 5) if last - first <= 2 else (1,)
    values = [m * 10.0 ** e for e in range(first, last + 1) for m in steps]
    values = [v for v in values if lo / 1.5 <= v <= hi * 1.5] or [10.0 ** first]
    return {"tickvals": values, "ticktext": [label(v) for v in values]}


def log_axis(fig: go.Figure, values: Iterable[float], axis: str = "y", label=us_text, pad: float = 1.6) -> go.Figure:
    """Make `axis` a log axis over the values (padded), labelled at each decade by `label` (a µs time by default)."""
    array = finite(values)
    if not array.size:
        return fig
    lo, hi = float(array.min()) / pad, float(array.max()) * pad
    update = dict(type="log", range=[math.log10(lo), math.log10(hi)], **decade_ticks(lo, hi, label))
    (fig.update_yaxes if axis == "y" else fig.update_xaxes)(**update)
    return fig


def ratio_text(value: float) -> str:
    return f"{value:g}×"


RATIO_TICKS = (0.1, 0.2, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 5.0, 10.0)


def ratio_axis(fig: go.Figure, values: Iterable[float], axis: str = "x") -> go.Figure:
    """A log axis for ratios (head / base): symmetric about 1, so 0.5× and 2× lie equally far from it; ticks at
    the usual ratios inside the data's range."""
    array = finite([*values, 1.0])
    spread = max(float(array.max()), 1.0 / float(array.min()), 1.05) * 1.15
    lo, hi = 1.0 / spread, spread
    ticks = [t for t in RATIO_TICKS if lo <= t <= hi]
    update = dict(type="log", range=[math.log10(lo), math.log10(hi)], tickvals=ticks,
                  ticktext=[f"{t:g}×" for t in ticks])
    (fig.update_xaxes if axis == "x" else fig.update_yaxes)(**update)
    return fig
