"""Pure helpers of app/common.py and app/charts.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app import charts
from app.common import first_line, fmt_us, parse_batch_sizes


@pytest.mark.parametrize("text, expected", [("1, 64, 1024", [1, 64, 1024]), ("8 8  16;32", [8, 16, 32]), ("+4", [4])])
def test_parse_batch_sizes(text: str, expected: list[int]) -> None:
    assert parse_batch_sizes(text) == expected


@pytest.mark.parametrize("text, message", [("", "at least one"), ("1, x", "'x' is not a whole number"),
                                           ("1.5", "not a whole number"), ("0", "out of range"),
                                           ("-3", "not a whole number")])
def test_parse_batch_sizes_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_batch_sizes(text)


def test_small_formatters() -> None:
    assert first_line("\n  boom: bad\nmore") == "boom: bad"
    assert first_line(None) == ""
    assert fmt_us(12.34) == "12.3 µs" and fmt_us(25_000) == "25.00 ms" and fmt_us(float("nan")) == "—"


def test_charts_build_from_frames() -> None:
    summary = pd.DataFrame({"run_id": [1, 2], "mode": ["fx", "eager"], "median_us": [50.0, 100.0],
                            "p10_us": [45.0, 90.0], "p90_us": [60.0, 120.0], "first_call_us": [3e4, 100.0],
                            "speedup_vs_eager": [2.0, 1.0]})
    modes = ["eager", "fx"]
    fig = charts.latency_bar(summary, modes)
    assert [t.name for t in fig.data] == ["eager", "fx"]  # registry order, whatever the frame's order
    assert list(fig.data[0].error_y.array) == [20.0] and list(fig.data[0].error_y.arrayminus) == [10.0]
    assert charts.speedup_bar(summary, modes).layout.shapes  # the reference line at 1
    assert charts.first_call_bar(summary, modes).layout.yaxis.type == "log"
    samples = pd.DataFrame({"mode": ["eager"] * 3 + ["fx"] * 3, "value": [1.0, 2, 3, 4, 5, 6]})
    assert len(charts.sample_distribution(samples, modes).data) == 2
    hist = pd.DataFrame({"run_id": [1, 2], "mode": ["eager", "eager"], "median_us": [1.0, 2.0],
                         "finished_at": pd.to_datetime(["2026-01-01", "2026-01-02"])})
    assert charts.history_line(hist, modes).data[0].mode == "lines+markers"
    curve = charts.price_curve(np.array([1.0, 2.0]), np.array([10.0, 20.0]), 1.5, 15.0, "x")
    assert len(curve.data) == 2


def test_the_dashboard_settings_close_what_a_localhost_tool_should() -> None:
    """Read through Streamlit's own loader, so a misspelt option name fails here rather than being ignored."""
    import os

    from streamlit import config

    here = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])
    try:
        config.get_config_options(force_reparse=True)
        assert config.get_option("server.address") == "127.0.0.1"
        assert sorted(config.get_option("server.allowedHosts")) == ["127.0.0.1", "localhost"]
        assert config.get_option("client.showErrorDetails") == "type"
        assert config.get_option("server.enableXsrfProtection") is True
    finally:
        os.chdir(here)
        config.get_config_options(force_reparse=True)


def test_axes_read_well() -> None:
    """Decade ticks with units where values span decades, rates in the device's unit, a symmetric ratio axis,
    a roofline bounded by its points and ridge, labels at the bars' base (no whisker over them)."""
    from app import axes, level_charts
    from engine.measure.ceilings import Ceilings

    summary = pd.DataFrame({"run_id": [1, 2], "mode": ["eager", "cuda"], "median_us": [5000.0, 8.0],
                            "p10_us": [4000.0, 6.0], "p90_us": [9000.0, 12.0], "first_call_us": [3e4, 1e6],
                            "speedup_vs_eager": [1.0, 625.0]})
    fig = charts.latency_bar(summary, ["eager", "cuda"])
    assert fig.layout.yaxis.type == "log" and "log scale" in fig.layout.title.text
    assert {"10 µs", "100 µs", "1 ms"} <= set(fig.layout.yaxis.ticktext)
    assert all(t.textposition == "inside" and t.insidetextanchor == "start" for t in fig.data)
    near = charts.latency_bar(summary.assign(median_us=[100.0, 90.0], p10_us=[95.0, 80], p90_us=[110.0, 99]))
    assert near.layout.yaxis.type != "log"  # within a decade: linear
    assert axes.rate_scale([2e9, 5e8], "FLOP/s") == (1e9, "GFLOP/s")
    assert axes.fmt_rate(3.1e9, "B/s") == "3.1 GB/s" and axes.fmt_rate(2.98e12, "B/s") == "2.98 TB/s"
    ticks = axes.decade_ticks(0.8, 2000)
    assert ticks["ticktext"] == ["1 µs", "10 µs", "100 µs", "1 ms"]
    frame = pd.DataFrame({"mode": ["L1-naive", "L1-native"], "flops_per_s": [3e9, 2e10], "bytes_per_s": [1e9, 4e10],
                          "intensity": [2.0, 0.5], "id": [1, 2], "median_us": [10.0, 2.0], "p10_us": [9.0, 1.8],
                          "p90_us": [12.0, 2.5]})
    bar = level_charts.value_bar(frame, ["L1-naive", "L1-native"], "flops_per_s", "Achieved {unit}", "FLOP/s")
    assert bar.layout.title.text == "Achieved GFLOP/s" and max(bar.data[0].y[0], bar.data[1].y[0]) < 100
    ceil = Ceilings(run_id=1, device_name="CPU: test", values={"copy_bw": 1e10, "matmul_fp32": 1e11})
    roof = level_charts.roofline(frame, ceil, "fp32", ["L1-naive", "L1-native"])
    lo, hi = (10 ** v for v in roof.layout.xaxis.range)
    assert lo >= 0.5 / 10 and hi <= 10 * 4.01  # the points (0.5, 2 FLOP/B) and the ridge (10), not 10^21
    assert roof.layout.yaxis.title.text == "GFLOP/s"
    assert any(t.name.startswith("★ above the measured roof") for t in roof.data)  # 4e10 B/s > the 1e10 copy roof
    assert level_charts.over_ceiling_notes({"pct_copy_bw": 123.0, "pct_matmul": 20.0})[0].startswith(
        "Above the copy ceiling (123 %)")
    import plotly.graph_objects as go
    ratio = axes.ratio_axis(go.Figure(), [0.5, 1.3, 1.1])
    assert ratio.layout.xaxis.type == "log" and "0.5×" in ratio.layout.xaxis.ticktext
    assert abs(ratio.layout.xaxis.range[0] + ratio.layout.xaxis.range[1]) < 1e-9  # symmetric about 1
