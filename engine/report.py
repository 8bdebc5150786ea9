"""Tables built from the store, shared by the CLI and the dashboard (one definition of 'speedup')."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from engine.store import Store


def with_speedup(summary: pd.DataFrame) -> pd.DataFrame:
    """Add `speedup_vs_eager` = eager median / mode median, per device, phase and batch size.

    Eager's median comes from the eager row of the same frame (the same group of runs, or the latest eager run);
    without an eager row the speedup is left empty rather than guessed.
    """
    if summary.empty:
        return summary.assign(speedup_vs_eager=pd.Series(dtype=float))
    keys = ["device", "phase", "batch_size"]
    eager = (summary[summary["mode"] == "eager"].sort_values("run_id").groupby(keys, as_index=False).last()
             [keys + ["median_us"]].rename(columns={"median_us": "eager_median_us"}))
    out = summary.merge(eager, on=keys, how="left")
    out["speedup_vs_eager"] = out["eager_median_us"] / out["median_us"]
    return out.drop(columns=["eager_median_us"])


def bench_table(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """Readable per-(mode, phase, batch) table for the given runs."""
    frame = store.latency_summary(latest_only=False)
    if frame.empty:
        return frame
    frame = with_speedup(frame[frame["run_id"].isin([int(r) for r in run_ids])])
    if frame.empty:
        return frame
    table = pd.DataFrame({
        "mode": frame["mode"],
        "phase": frame["phase"],
        "batch": frame["batch_size"].astype(int),
        "median_us": frame["median_us"].round(1),
        "p10_us": frame["p10_us"].round(1),
        "p90_us": frame["p90_us"].round(1),
        "first_call_ms": (frame["first_call_us"] / 1e3).round(1),
        "speedup": frame["speedup_vs_eager"].round(2),
        "max_abs_err": frame["max_abs_err"].map(lambda v: f"{v:.1e}"),
    })
    return table.sort_values(["phase", "batch", "mode"]).reset_index(drop=True)


def run_timeline(store: Store, run_id: int) -> pd.DataFrame:
    """The phases a run went through, from its progress.jsonl artifact (engine.worker stamps each line with the
    seconds since the run's worker started): step, started_s, seconds (until the next step; the last one has none).
    Empty for runs from before the stamps, or without the artifact."""
    import json
    from pathlib import Path

    columns = ["step", "started_s", "seconds"]
    arts = store.artifacts(run_id)
    rows = arts[arts["name"] == "progress.jsonl"] if not arts.empty else arts
    if rows.empty:
        return pd.DataFrame(columns=columns)
    events = []
    try:
        lines = Path(rows.iloc[0]["path"]).read_text(errors="replace").splitlines()
    except OSError:
        return pd.DataFrame(columns=columns)
    for line in lines:
        try:
            event = json.loads(line)
            events.append((str(event["message"]), float(event["t"])))
        except (ValueError, KeyError, TypeError):
            continue
    out = [(msg, t, (events[i + 1][1] - t) if i + 1 < len(events) else None) for i, (msg, t) in enumerate(events)]
    return pd.DataFrame(out, columns=columns)
