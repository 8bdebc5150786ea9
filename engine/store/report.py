"""Tables built from the store, shared by the CLI and the dashboard (one definition of 'speedup', one of a flag)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from engine.store.db import Store

FLAGGED_STATES = ("noisy", "interfered")  # engine.measure.noise's states that make a figure no headline


# -- the noise judgement stored with each run (runs.conditions, engine.measure.noise.record) ------------------------
def parse_conditions(value: Any) -> dict[str, Any] | None:
    """runs.conditions as stored (JSON text, or already a dict) → dict, or None for a run judged before it existed."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def run_state(conditions: Any) -> tuple[str, list[str]]:
    """(state, flags) of a whole run: its worst series' state and every flag; ("", []) where it was never judged."""
    c = parse_conditions(conditions)
    if c is None:
        return "", []
    return str(c.get("state") or ""), [str(f) for f in c.get("flags") or []]


def run_condition_summary(conditions: Any) -> dict[str, Any]:
    """What a run's timed windows saw, over all its series: other processes' cores (most), the timing cores'
    hyperthread siblings' busy cores (most), load (most), device-lock wait (total); on a GPU the SM clock (lowest
    minimum, median of medians), the clock-event reasons seen and the hottest temperature. Keys whose figures were
    never read are left out; {} where nothing was recorded."""
    c = parse_conditions(conditions)
    windows = [e.get("conditions") or {} for e in (c or {}).get("series") or []]
    if not windows:
        return {}

    def values(key: str) -> list[float]:
        return [float(w[key]) for w in windows if isinstance(w.get(key), (int, float))]

    out: dict[str, Any] = {}
    for key, name, pick in (("other_cores", "other_cores_max", max), ("sibling_cores", "sibling_cores_max", max),
                            ("load_end", "load_max", max),
                            ("device_wait_s", "device_wait_s", sum),
                            ("gpu_sm_clock_min_mhz", "gpu_sm_clock_min_mhz", min),
                            ("gpu_sm_clock_median_mhz", "gpu_sm_clock_median_mhz", statistics.median),
                            ("gpu_temperature_c", "gpu_temperature_c_max", max)):
        found = values(key)
        if found:
            out[name] = round(pick(found), 3)
    reasons = sorted({str(r) for w in windows for r in w.get("gpu_reasons") or []})
    if reasons:
        out["gpu_reasons"] = reasons
    return out


CONDITION_COLUMNS = ("series", "state", "flags", "notes", "other_cores", "sibling_cores", "cpu_wait_frac", "load_end",
                     "cpu_mhz_median", "device_wait_s", "gpu_sm_clock_min_mhz", "gpu_sm_clock_median_mhz",
                     "gpu_reasons", "gpu_temperature_c", "gpu_other_processes", "gpu_group_processes", "window_s")


def condition_rows(conditions: Any) -> pd.DataFrame:
    """One row per timed series of a run: its state, flags and notes beside what its window recorded (other
    processes' cores, its threads' CPU wait, load, CPU clock, device-lock wait; on a GPU the SM clock, clock-event
    reasons, temperature, other and own-group processes). Empty where the run recorded none."""
    c = parse_conditions(conditions)
    rows = []
    for entry in (c or {}).get("series") or []:
        window = entry.get("conditions") or {}
        phase, batch = entry.get("phase"), entry.get("batch_size")
        row = {"series": " ".join(str(x) for x in (phase, f"B={batch}" if batch is not None else None) if x)
               or "the timing", "state": entry.get("state") or "",
               "flags": "; ".join(map(str, entry.get("flags") or [])),
               "notes": "; ".join(map(str, entry.get("notes") or []))}
        for key in CONDITION_COLUMNS[4:]:
            value = window.get(key)
            row[key] = ", ".join(map(str, value)) if isinstance(value, list) else value
        rows.append(row)
    return pd.DataFrame(rows, columns=list(CONDITION_COLUMNS))


def series_state(conditions: Any, phase: str | None, batch_size: Any) -> tuple[str, list[str]]:
    """(state, flags) of one series of a run (phase, batch size); ("", []) where it was never judged."""
    c = parse_conditions(conditions)
    if c is None:
        return "", []
    batch = None if batch_size is None or batch_size != batch_size else int(batch_size)
    for entry in c.get("series") or []:
        if entry.get("phase") == phase and entry.get("batch_size") == batch:
            return str(entry.get("state") or ""), [str(f) for f in entry.get("flags") or []]
    return "", []


def run_conditions(store: Store, run_ids: Sequence[int]) -> dict[int, dict[str, Any] | None]:
    """run id → its stored conditions record (None where it has none)."""
    ids = sorted({int(r) for r in run_ids})
    if not ids:
        return {}
    frame = store.query(f"SELECT id, conditions FROM runs WHERE id IN ({','.join('?' * len(ids))})", ids)
    return {int(i): parse_conditions(c) for i, c in zip(frame.get("id", []), frame.get("conditions", []))}


def with_noise(summary: pd.DataFrame, store: Store) -> pd.DataFrame:
    """Add `state` (clean | noisy | interfered, '' where never judged) and `flags` ('; '-joined reasons) per row
    (run_id, phase, batch_size) of a latency summary."""
    if summary.empty:
        return summary.assign(state=pd.Series(dtype=str), flags=pd.Series(dtype=str))
    found = run_conditions(store, summary["run_id"].tolist())
    states = [series_state(found.get(int(r)), p, b)
              for r, p, b in zip(summary["run_id"], summary["phase"], summary["batch_size"])]
    return summary.assign(state=[s for s, _ in states], flags=["; ".join(f) for _, f in states])


def with_speedup(summary: pd.DataFrame) -> pd.DataFrame:
    """Add `speedup_vs_eager` = eager median / mode median, per device, phase and batch size.

    Eager's median comes from the eager row of the same frame (the same group of runs, or the latest eager run);
    without an eager row the speedup is left empty rather than guessed. Where the frame has `state` and `flags`
    (with_noise), `speedup_flag` says why a speedup is no headline: the mode's or eager's series was flagged
    ('' when both are clean).
    """
    if summary.empty:
        return summary.assign(speedup_vs_eager=pd.Series(dtype=float), speedup_flag=pd.Series(dtype=str))
    keys = ["device", "phase", "batch_size"]
    noise = [c for c in ("state", "flags") if c in summary.columns]
    eager = (summary[summary["mode"] == "eager"].sort_values("run_id").groupby(keys, as_index=False).last()
             [keys + ["median_us", *noise]].rename(columns={"median_us": "eager_median_us", "state": "eager_state",
                                                            "flags": "eager_flags"}))
    out = summary.merge(eager, on=keys, how="left")
    out["speedup_vs_eager"] = out["eager_median_us"] / out["median_us"]
    out["speedup_flag"] = [_speedup_flag(row) for row in out.to_dict("records")] if noise else ""
    return out.drop(columns=["eager_median_us", *(f"eager_{c}" for c in noise)])


def _speedup_flag(row: dict[str, Any]) -> str:
    """Why a row's speedup rests on a flagged series (its own or eager's), or ''."""
    parts = []
    if row.get("state") in FLAGGED_STATES:
        parts.append(f"{row['mode']} {row['state']}" + (f": {row['flags']}" if row.get("flags") else ""))
    if row["mode"] != "eager" and row.get("eager_state") in FLAGGED_STATES:
        parts.append(f"eager {row['eager_state']}" + (f": {row['eager_flags']}" if row.get("eager_flags") else ""))
    return " · ".join(parts)


def pooled_summary(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """One row per (mode, device, phase, batch size) of these bench runs, its processes pooled: a mode run in
    several worker processes (`bench --repeat N`) is one row whose median, p10 and p90 come from every process's
    samples, with `procs` (how many), `proc_spread` ((max - min) / median of the processes' medians), the worst
    `state` of its processes and their `flags`; `run_id` is the newest process's."""
    frame = store.latency_summary(latest_only=False)
    if frame.empty:
        return frame
    frame = with_noise(frame[frame["run_id"].isin([int(r) for r in run_ids])], store)
    if frame.empty:
        return frame
    samples = store.samples(sorted(set(frame["run_id"].astype(int))))
    by_series = {k: v["value"].to_numpy() for k, v in samples.groupby(["run_id", "phase", "batch_size"])} \
        if not samples.empty else {}
    rows = []
    for (mode, device, phase, batch), part in frame.groupby(["mode", "device", "phase", "batch_size"], sort=False):
        part = part.sort_values("run_id")
        pooled = [by_series[k] for k in zip(part["run_id"], part["phase"], part["batch_size"]) if k in by_series]
        values = np.concatenate(pooled) if pooled else np.array([])
        medians = part["median_us"].to_numpy(dtype=float)
        states = [s for s in part["state"] if s]
        p10, p50, p90 = (np.percentile(values, [10, 50, 90]) if values.size else
                         (part["p10_us"].median(), np.median(medians), part["p90_us"].median()))
        flags = list(dict.fromkeys(f for text in part["flags"] if text for f in text.split("; ")))
        rows.append({
            "run_id": int(part["run_id"].iloc[-1]), "mode": mode, "device": device, "phase": phase,
            "batch_size": batch, "procs": len(part), "median_us": float(p50), "p10_us": float(p10),
            "p90_us": float(p90), "proc_spread": float((medians.max() - medians.min()) / np.median(medians))
            if len(part) > 1 else float("nan"),
            "first_call_us": float(part["first_call_us"].median()), "max_abs_err": float(part["max_abs_err"].max()),
            "state": max(states, key=["clean", *FLAGGED_STATES].index) if states else "",
            "flags": "; ".join(flags)})
    return pd.DataFrame(rows)


def bench_table(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """Readable per-(mode, phase, batch) table for the given runs: a mode's processes pooled (pooled_summary), its
    noise state, and a speedup that rests on a flagged series shown in parentheses, not as a headline
    (bench_flags lists why)."""
    frame = pooled_summary(store, run_ids)
    if frame.empty:
        return frame
    frame = with_speedup(frame)
    table = pd.DataFrame({
        "mode": frame["mode"],
        "phase": frame["phase"],
        "batch": frame["batch_size"].astype(int),
        "median_us": frame["median_us"].round(1),
        "p10_us": frame["p10_us"].round(1),
        "p90_us": frame["p90_us"].round(1),
        "first_call_ms": (frame["first_call_us"] / 1e3).round(1),
        "speedup": [_speedup_text(v, flag) for v, flag in zip(frame["speedup_vs_eager"], frame["speedup_flag"])],
        "state": frame["state"].replace("", "—"),
        "max_abs_err": frame["max_abs_err"].map(lambda v: f"{v:.1e}"),
    })
    if (frame["procs"] > 1).any():
        table.insert(3, "procs", frame["procs"].astype(int))
        table.insert(7, "proc_spread", frame["proc_spread"].map(lambda v: "" if v != v else f"{100 * v:.1f}%"))
    energy = energy_summary(store, run_ids)
    if not energy.empty:  # J/step beside the latency where the runs measured it (engine.measure.energy)
        joined = frame[["mode", "device", "phase", "batch_size"]].merge(energy, how="left")
        table["J/step"] = joined["j_per_step"].map(fmt_joules).to_numpy()
        table["above_idle"] = joined["j_above_idle_per_step"].map(fmt_joules).to_numpy()
        table["avg_W"] = joined["avg_power_w"].map(lambda v: "—" if v != v else f"{v:.0f}").to_numpy()
    return table.sort_values(["phase", "batch", "mode"]).reset_index(drop=True)


# -- energy beside latency (engine.measure.energy's metrics) -----------------------------------------------------------
ENERGY_COLUMNS = {"energy_per_step": "j_per_step", "energy_above_idle_per_step": "j_above_idle_per_step",
                  "avg_power_w": "avg_power_w"}


def energy_summary(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """Per (mode, device, phase, batch size) of these bench runs: J/step (whole board), J/step above the idle draw
    and the average power, the median over a mode's processes; empty where no run measured energy."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return pd.DataFrame()
    names = list(ENERGY_COLUMNS)
    frame = store.query(f"SELECT r.mode, r.device, m.phase, m.batch_size, m.name, m.value FROM runs r JOIN metrics m "
                        f"ON m.run_id = r.id WHERE r.id IN ({','.join('?' * len(ids))}) AND m.name IN "
                        f"({','.join('?' * len(names))})", [*ids, *names])
    if frame.empty:
        return frame
    wide = (frame.groupby(["mode", "device", "phase", "batch_size", "name"])["value"].median()
            .unstack("name").rename(columns=ENERGY_COLUMNS).reset_index())
    return wide.reindex(columns=["mode", "device", "phase", "batch_size", *ENERGY_COLUMNS.values()])


def pareto_front(frame: pd.DataFrame, x: str, y: str) -> pd.Series:
    """True for the rows no other row beats on both `x` and `y` (lower is better on both: latency and energy), the
    trade-off front; rows missing either are False."""
    ok = frame[x].notna() & frame[y].notna()
    xs, ys = frame[x].to_numpy(dtype=float), frame[y].to_numpy(dtype=float)
    front = []
    for i in range(len(frame)):
        if not ok.iloc[i]:
            front.append(False)
            continue
        beaten = ok.to_numpy() & (xs <= xs[i]) & (ys <= ys[i]) & ((xs < xs[i]) | (ys < ys[i]))
        front.append(not beaten.any())
    return pd.Series(front, index=frame.index, dtype=bool)


def fmt_joules(value: float | None) -> str:
    """Joules in the unit that keeps 3 significant figures readable (µJ, mJ, J, kJ); "—" for none."""
    if value is None or value != value:
        return "—"
    for scale, unit in ((1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "µJ")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} nJ" if value else "0 J"


def _speedup_text(value: float, flag: str) -> str:
    if value != value:
        return ""
    return f"({value:.2f})" if flag else f"{value:.2f}"


def bench_flags(store: Store, run_ids: Sequence[int]) -> list[str]:
    """One line per (mode, phase, batch) whose series or speedup is flagged: what the table's state and
    parenthesised speedups rest on."""
    frame = pooled_summary(store, run_ids)
    if frame.empty:
        return []
    frame = with_speedup(frame)
    lines = []
    for row in frame.sort_values(["phase", "batch_size", "mode"]).to_dict("records"):
        if row["state"] in FLAGGED_STATES:
            lines.append(f"{row['mode']} {row['phase']} B={int(row['batch_size'])} {row['state']}: {row['flags']}")
    return lines


def flag_lines(store: Store, run_ids: Sequence[int]) -> list[str]:
    """A heading and one line per flagged run of these (noisy or interfered timings, engine.measure.noise), in id
    order, then the runs whose conditions carry notes (a power-capped clock); [] when none: what the levels and llm
    commands print under their tables."""
    runs = store.runs(run_ids=[int(r) for r in run_ids], limit=max(1, len(run_ids)))
    if runs.empty or "conditions" not in runs:
        return []
    lines, noted = [], []
    for row in runs.sort_values("id").to_dict("records"):
        state, flags = run_state(row.get("conditions"))
        if state in FLAGGED_STATES:
            lines.append(f"  run {row['id']} ({row['mode']}): {state} — {'; '.join(flags)}")
        notes = (parse_conditions(row.get("conditions")) or {}).get("notes") or []
        if notes:
            noted.append(f"  run {row['id']} ({row['mode']}): {'; '.join(map(str, notes))}")
    return ((["", "flagged timings (not headline figures):", *lines] if lines else [])
            + (["", "conditions (recorded, not flags):", *noted] if noted else []))


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
