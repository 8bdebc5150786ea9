"""The progress panel (app/common.py watch_active_runs): one row per run in the order they run, the state in words,
a heading whose counts match the rows, and a Cancel button whose confirmation appears in the panel; app/tables.py's
cell formats."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from app.tables import MISSING, fmt_value, tidy
from engine.runner.jobs import JobSpec, create_runs
from engine.store.db import Store


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def queue(store: Store, *modes: str) -> list[int]:
    """Queued bench runs with no supervisor (this test process owns them, so they are not stale)."""
    return create_runs(store, [JobSpec("bench", "house_price", m, "cpu", {"mode": m}) for m in modes])


def test_runs_in_order_with_their_state_in_words_and_cancel(lab: Store, page) -> None:
    first, second, third = queue(lab, "eager", "fx", "compile")
    lab.start_run(third, "starting worker")
    lab.update_progress(third, 0.4, "timing infer B=64")
    at = page("benchmark").run()
    assert not at.exception
    heading = next(m.value for m in at.markdown if "in progress" in m.value)
    assert heading.startswith("**3 runs in progress** — 1 running, 2 waiting")
    bars = at.get("progress")
    assert len(bars) == 1 and bars[0].proto.text == f"#{third} · bench compile on cpu · running — timing infer B=64"
    waiting = [m.value for m in at.markdown if m.value.startswith(":material/schedule: #")]
    assert waiting == [f":material/schedule: #{first} · bench eager on cpu · waiting to start",
                       f":material/schedule: #{second} · bench fx on cpu · waiting to start"]
    assert "queued: queued" not in texts(at.markdown)
    at.button(key=f"cancel-{second}").click().run()
    assert not at.exception
    assert lab.run(second)["status"] == "cancelled" and lab.run(first)["status"] == "queued"
    assert f"Cancelled #{second} (bench fx on cpu) before it started." in texts(at.success)
    heading = next(m.value for m in at.markdown if "in progress" in m.value)
    assert heading.startswith("**2 runs in progress** — 1 running, 1 waiting")


@pytest.mark.parametrize("value, kind, text", [
    (None, "int", MISSING), (float("nan"), "us", MISSING), ("None", "text", MISSING), (5.0, "int", "5"),
    (1024.0, "int", "1,024"), (0.000123456, "num", "0.000123"), (123456.7, "num", "123,457"),
    (89.43, "us", "89.4 µs"), (12_345.0, "us", "12.35 ms"), (0.125, "share", "12.5 %"), (1.5, "ratio", "1.50×"),
    (1.5e9, "bytes", "1.5 GB"), (math.inf, "num", "∞"), (pd.NaT, "time", MISSING)])
def test_cells(value, kind: str, text: str) -> None:
    assert fmt_value(value, kind) == text


def test_tidy_labels_formats_and_drops_what_is_absent() -> None:
    frame = pd.DataFrame({"self_us_per_step": [12.345, None], "calls": [5.0, 2.0], "name": ["aten::mm", None]})
    shown = tidy(frame, {"name": "operator", "calls": ("calls per step", "int"),
                         "self_us_per_step": ("self time per step", "us"), "absent": ("never", "num")})
    assert list(shown.columns) == ["operator", "calls per step", "self time per step"]
    assert shown.to_dict("records") == [
        {"operator": "aten::mm", "calls per step": "5", "self time per step": "12.3 µs"},
        {"operator": MISSING, "calls per step": "2", "self time per step": MISSING}]
