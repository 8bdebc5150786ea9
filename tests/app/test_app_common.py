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
