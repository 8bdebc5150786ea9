"""The energy figures `compare --metric energy` judges: one per run and series, read from the stored metrics.

A run that measured energy (engine.measure.energy) stores, per timed window, `energy_per_<unit>` (J per step, token
or prefill: the whole board or CPU package) and, where the device's idle draw is known, `energy_above_idle_per_<unit>`
beside it, tagged with the series' phase and batch size (levels: phase "forward", no batch). A run that could not
measure it stores no figure and a note "energy: not available here (<why>)".
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from engine.store.db import Store

WHOLE = "energy_per_"
ABOVE_IDLE = "energy_above_idle_per_"
NOTE = "energy: not available here ("

Key = tuple[int, str, int]  # (run id, phase, batch; −1 where none)
Figure = tuple[float, float, str]  # (J per unit, J per unit above idle (nan where unknown), unit such as "J/step")


def load_figures(store: Store, run_ids: Sequence[int]) -> dict[Key, Figure]:
    """(run, phase, batch) → its energy figure, for these runs (one query); runs without energy are absent."""
    ids = [[int(r) for r in run_ids]]
    with store.connect(read_only=True) as con:
        frame = con.execute(
            "SELECT run_id, phase, coalesce(batch_size, -1) AS batch, name, value, unit FROM metrics "
            f"WHERE run_id IN (SELECT unnest(?::BIGINT[])) AND (starts_with(name, '{WHOLE}') OR "
            f"starts_with(name, '{ABOVE_IDLE}')) AND isfinite(value) AND value > 0", ids).df()
    whole: dict[Key, tuple[float, str]] = {}
    above: dict[Key, float] = {}
    for run_id, phase, batch, name, value, unit in frame.itertuples(index=False):
        key = (int(run_id), str(phase), int(batch))
        if name.startswith(ABOVE_IDLE):
            above[key] = float(value)
        else:
            whole[key] = (float(value), str(unit or f"J/{name[len(WHOLE):]}"))
    return {key: (joules, above.get(key, float("nan")), unit) for key, (joules, unit) in whole.items()}


def figure(figures: dict[Key, Figure], run_id: int, phase: str, batch: int) -> Figure | None:
    """A run's figure for one series: tagged with its batch, else with none (a run-wide window)."""
    return figures.get((int(run_id), phase, int(batch))) or figures.get((int(run_id), phase, -1))


def why_unmeasured(store: Store, run_ids: Sequence[int]) -> str:
    """The reason the first of these runs stored for having no energy ("no RAPL zones under …"), or ""."""
    ids = [int(r) for r in run_ids]
    if not ids:
        return ""
    frame = store.query("SELECT id, notes FROM runs WHERE id IN (SELECT unnest(?::BIGINT[])) AND notes IS NOT NULL "
                        "ORDER BY id", [ids])
    for run_id, notes in frame.itertuples(index=False):
        for note in json.loads(notes) if isinstance(notes, str) else []:
            if isinstance(note, str) and note.startswith(NOTE):
                reason = note[len(NOTE):]
                return f"run {run_id}: {reason[:-1] if reason.endswith(')') else reason}"
    return ""


def not_measured_line(store: Store, run_ids: Sequence[int]) -> str:
    """The one line for a comparison whose runs carry no energy figure."""
    ids = sorted({int(r) for r in run_ids})
    listed = ", ".join(map(str, ids[:10])) + (" …" if len(ids) > 10 else "")
    why = why_unmeasured(store, ids)
    return (f"energy: not measured in runs {listed}: NVML or RAPL not available there"
            + (f" ({why})" if why else "") + "; compare their time with --metric time")


def to_frame(figures: dict[Key, Figure]) -> pd.DataFrame:
    """The figures as rows run_id, phase, batch, med (J per unit, whole board): the shape ProcessNoise reads."""
    return pd.DataFrame([(r, p, b, j) for (r, p, b), (j, _, _) in figures.items()],
                        columns=["run_id", "phase", "batch", "med"])
