"""The one-screen summary at the top of the Benchmark page: per phase, the fastest mode at the headline batch size,
its speedup over eager and whether its timing can be trusted (engine.measure.noise's state, via
engine.store.report). A fastest mode whose series is flagged is named, but the headline is the fastest clean one."""

from __future__ import annotations

from dataclasses import dataclass

from app import queries
from engine.store import report
from engine.store.db import Store


@dataclass
class PhaseBest:
    phase: str
    batch: int
    mode: str
    median_us: float
    speedup: float | None  # eager median / this mode's median; None without an eager run
    state: str  # clean | noisy | interfered | '' (never judged)
    flags: str
    speedup_flag: str  # why the speedup is no headline ('' when both series are clean)
    modes: int  # modes measured at this point
    flagged_faster: str = ""  # a faster mode left out of the headline because its timing was flagged

    @property
    def trusted(self) -> bool:
        return self.state not in report.FLAGGED_STATES and not self.speedup_flag


def headline_batch(present: list[int], defaults: tuple[int, ...]) -> int | None:
    """The middle default batch size where it was measured, else the measured one nearest to it."""
    if not present:
        return None
    preferred = defaults[len(defaults) // 2] if defaults else present[len(present) // 2]
    return preferred if preferred in present else min(present, key=lambda b: (abs(b - preferred), b))


def best_of_phase(store: Store, workload: str, device: str, phase: str, batch: int) -> PhaseBest | None:
    summary = queries.latest_summary(store, workload, device, phase, batch)
    if summary.empty:
        return None
    rows = report.with_speedup(report.with_noise(summary, store)).sort_values("median_us")
    clean = rows[~rows["state"].isin(report.FLAGGED_STATES)]
    best = (clean if not clean.empty else rows).iloc[0]
    faster = rows[rows["median_us"] < best["median_us"]]
    speedup = best.get("speedup_vs_eager")
    return PhaseBest(phase=phase, batch=batch, mode=str(best["mode"]), median_us=float(best["median_us"]),
                     speedup=None if speedup is None or speedup != speedup else float(speedup),
                     state=str(best.get("state") or ""), flags=str(best.get("flags") or ""),
                     speedup_flag=str(best.get("speedup_flag") or ""), modes=len(rows),
                     flagged_faster=", ".join(f"{m} ({s})" for m, s in zip(faster["mode"], faster["state"])))


def state_text(best: PhaseBest) -> str:
    """'clean', 'noisy — CPU frequency changed', 'not judged (an older run)'."""
    if not best.state:
        return "not judged (a run from before noise checks)"
    return best.state + (f" — {best.flags}" if best.flags else "")


def speedup_note(best: PhaseBest) -> str:
    """' · speedup flagged: …' where the speedup rests on a flagged series, without repeating the mode's own flags
    (its timing line says them): then only eager's, if eager was flagged too."""
    if not best.speedup_flag:
        return ""
    if best.state not in report.FLAGGED_STATES:
        return f" · speedup flagged: {best.speedup_flag}"
    eager = [part for part in best.speedup_flag.split(" · ") if part.startswith("eager ")]
    return f" · eager's timing too: {eager[0].removeprefix('eager ')}" if eager else ""
