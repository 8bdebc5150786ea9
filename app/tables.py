"""Tables as a reader wants them: human column names with units, numbers at their precision, "—" where a value is
missing (never "None" or "nan"), whole numbers for counts and times in local time. Pages pass a frame and, per column
they show, a label and a kind; `tidy` formats, `show` draws.

Kinds: text · int (a count: 5, 1,024) · num (3 significant figures) · num1 (one decimal) · us (89.4 µs, 1.23 ms) ·
s (seconds, two decimals) · pct (a percentage already ×100: 12.5 %) · share (a fraction: 0.125 → 12.5 %) · ratio
(1.25×) · sci (1.2e-07) · time (a stored UTC timestamp, shown in local time) · bytes (1.5 MB).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from app.common import fmt_time, fmt_us

MISSING = "—"


def missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # lists and arrays are values, not missing
        return False


def sig(value: float, digits: int = 3) -> str:
    """A number to `digits` significant figures, thousands separated, no exponent for everyday sizes."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= 15 or magnitude <= -5:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - magnitude)
    text = f"{round(value, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if decimals else text  # 1.00 → 1, 12.50 → 12.5: no digits it lacks


def fmt_bytes(value: float) -> str:
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def fmt_value(value: Any, kind: str = "text") -> str:
    """One cell as text; MISSING for None, NaN and NaT whatever the kind."""
    if missing(value):
        return MISSING
    if kind == "text":
        text = str(value)
        return text if text.strip() and text not in ("None", "nan") else MISSING
    if kind == "time":
        return fmt_time(value)
    number = float(value)
    if not math.isfinite(number):
        return MISSING if math.isnan(number) else ("∞" if number > 0 else "−∞")
    if kind == "int":
        return f"{round(number):,}"
    if kind == "num":
        return sig(number)
    if kind == "num1":
        return f"{number:,.1f}"
    if kind == "us":
        return fmt_us(number)
    if kind == "s":
        return f"{number:,.2f} s"
    if kind == "pct":
        return f"{number:,.1f} %"
    if kind == "share":
        return f"{100 * number:,.1f} %"
    if kind == "ratio":
        return f"{number:,.2f}×"
    if kind == "sci":
        return f"{number:.1e}"
    if kind == "bytes":
        return fmt_bytes(number)
    raise ValueError(f"unknown column kind {kind!r}")


Columns = Mapping[str, "tuple[str, str] | str"]


def tidy(frame: pd.DataFrame, columns: Columns) -> pd.DataFrame:
    """The columns named (source name → (label, kind), or → label for text), in that order, formatted; a source
    column the frame lacks is left out."""
    out = {}
    for source, spec in columns.items():
        if source not in frame.columns:
            continue
        label, kind = (spec, "text") if isinstance(spec, str) else spec
        out[label] = [fmt_value(v, kind) for v in frame[source]]
    return pd.DataFrame(out, index=range(len(frame)))


def text_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell of an already labelled frame as text (floats to 3 significant figures), missing ones as MISSING."""
    out = frame.reset_index(drop=True).copy()
    for column in out.columns:
        out[column] = [MISSING if missing(v) else sig(float(v)) if isinstance(v, float) else fmt_value(v)
                       for v in out[column]]
    return out


def show(frame: pd.DataFrame, columns: Columns | None = None, where: Any = None, **kwargs: Any) -> None:
    """Draw `frame` tidied (`columns`), or every column as text when None, without the index."""
    shown = tidy(frame, columns) if columns is not None else text_frame(frame)
    (where or st).dataframe(shown, hide_index=True, **kwargs)
