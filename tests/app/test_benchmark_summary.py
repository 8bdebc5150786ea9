"""The summary at the top of the Benchmark page (app/summary.py): per phase, the fastest mode at the headline batch
size with its speedup and its noise state; a faster mode whose timing is flagged is named, not made the headline."""

from __future__ import annotations

import json

from engine.store.db import Store


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def summary_metrics(at) -> dict:
    return {m.label: (m.value, m.delta) for m in at.metric if m.label.startswith("Fastest")}


def test_summary_names_the_fastest_mode_per_phase(filled: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    shown = summary_metrics(at)
    # filled: eager's newest median 99 µs × 1.125 at infer B=64, compile 60 × 1.125; train ×3 at B=64
    assert shown["Fastest · inference · B=64"] == ("compile · 67.5 µs", "1.65× eager")
    assert shown["Fastest · training step · B=64"] == ("compile · 202.5 µs", "1.65× eager")
    assert "Timing: not judged" in texts(at.caption)


def test_a_flagged_fastest_mode_is_named_but_not_the_headline(filled: Store, page) -> None:
    compile_run = int(filled.runs(kind="bench", status=["ok"]).query("mode == 'compile'")["id"].max())
    record = {"state": "noisy", "flags": ["infer B=64: p90/p10 = 3×"], "series": [
        {"phase": "infer", "batch_size": 64, "state": "noisy", "flags": ["p90/p10 = 3×"]}]}
    with filled.connect() as con:
        con.execute("UPDATE runs SET conditions = ? WHERE id = ?", [json.dumps(record), compile_run])
    at = page("benchmark").run()
    assert not at.exception
    value, delta = summary_metrics(at)["Fastest · inference · B=64"]
    assert value == "fx · 106.9 µs" and delta == "1.04× eager"
    assert "faster but flagged: compile (noisy)" in texts(at.caption)


def test_summary_on_an_empty_store_says_what_to_do(lab: Store, page) -> None:
    at = page("benchmark").run()
    assert not at.exception
    assert "nothing measured on cpu yet" in texts(at.markdown)
