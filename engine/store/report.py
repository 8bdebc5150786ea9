"""Tables built from the store, shared by the CLI and the dashboard (one definition of 'speedup')."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from engine.store.db import Store


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


def _progress_events(store: Store, run_id: int) -> list[dict]:
    """The lines of a run's progress.jsonl artifact (engine.runner.worker), oldest first; [] without the artifact."""
    import json
    from pathlib import Path

    arts = store.artifacts(run_id)
    rows = arts[arts["name"] == "progress.jsonl"] if not arts.empty else arts
    if rows.empty:
        return []
    try:
        lines = Path(rows.iloc[0]["path"]).read_text(errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
            if isinstance(event, dict) and "message" in event and "t" in event:
                events.append(event)
        except ValueError:
            continue
    return events


TIMELINE_COLUMNS = ["run_id", "mode", "step", "hold", "start_s", "end_s"]


def group_timeline(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """Each run's phases side by side, on one clock (seconds since the group's first recorded line): one row per step
    of a run (a progress message), with how the run held its device meanwhile — 'shared' while it prepared beside
    others, 'exclusive' while it timed alone, 'none' while it waited or had let go, 'whole run' for a run whose
    supervisor held the device from start to end. Runs whose lines carry no wall-clock stamp are left out."""
    rows = []
    for run_id in run_ids:
        run = store.run(int(run_id))
        events = [e for e in _progress_events(store, int(run_id)) if "wall" in e]
        if run is None or not events:
            continue
        phased = any("hold" in e for e in events)
        hold = "none" if phased else "whole run"
        for i, event in enumerate(events):
            hold = event.get("hold", hold)
            end = events[i + 1]["wall"] if i + 1 < len(events) else event["wall"]
            rows.append((int(run_id), run["mode"], str(event["message"]), hold, float(event["wall"]), float(end)))
    frame = pd.DataFrame(rows, columns=TIMELINE_COLUMNS)
    if not frame.empty:
        t0 = frame["start_s"].min()
        frame["start_s"] -= t0
        frame["end_s"] -= t0
    return frame


def hold_overlaps(timeline: pd.DataFrame) -> pd.DataFrame:
    """Spans where one run held its device exclusively (timing) while another run of the group held it at all:
    what phased supervision must never allow. Empty when the group kept that rule."""
    held = timeline[timeline["hold"].isin(["shared", "exclusive", "whole run"]) & (timeline["end_s"] >
                                                                                    timeline["start_s"])]
    alone = held[held["hold"].isin(["exclusive", "whole run"])]
    pairs = alone.merge(held, how="cross", suffixes=("", "_other"))
    clash = pairs[(pairs["run_id"] != pairs["run_id_other"]) & (pairs["start_s"] < pairs["end_s_other"])
                  & (pairs["start_s_other"] < pairs["end_s"])]
    return clash[["run_id", "step", "start_s", "end_s", "run_id_other", "step_other", "hold_other"]].reset_index(
        drop=True)


def run_timeline(store: Store, run_id: int) -> pd.DataFrame:
    """The phases a run went through, from its progress.jsonl artifact (engine.runner.worker stamps each line with the
    seconds since the run's worker started): step, started_s, seconds (until the next step; the last one has none).
    Empty for runs from before the stamps, or without the artifact. Lines that only record a change of the
    device hold repeat the step before them and are left out."""
    columns = ["step", "started_s", "seconds"]
    events = []
    for event in _progress_events(store, run_id):
        if "hold" in event and events and events[-1][0] == str(event["message"]):
            continue
        try:
            events.append((str(event["message"]), float(event["t"])))
        except (TypeError, ValueError):
            continue
    out = [(msg, t, (events[i + 1][1] - t) if i + 1 < len(events) else None) for i, (msg, t) in enumerate(events)]
    return pd.DataFrame(out, columns=columns)
