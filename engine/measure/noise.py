"""Is this series a number to trust? Its spread and the conditions it was timed under → clean | noisy | interfered.

    judge(samples, conditions)  → Judgement(state, flags, reason, spread)
    record(result, windows)     → the run's judgement, per series, stored with the run (runs.conditions)

- **spread** (robust, so a handful of preemptions does not hide): IQR/median, MAD/median (scaled to a standard
  deviation), p90/p10, and the share of far outliers (beyond p75 + 3·IQR);
- **interfered**: the conditions show something else used what the timing needed — other processes took at least
  a quarter of its cores, its threads waited for a CPU a quarter of the time they wanted one (with others taking half
  a core or more), other processes on its GPU, or the GPU slowed its clock (thermal or power brake, or an SM clock
  dip of more than 10 %);
- **noisy**: nothing to blame in the conditions, but the spread is wide: p90/p10 ≥ 2, IQR/median ≥ 0.3, or more than
  10 % far outliers;
- **clean** otherwise.

The reason is in words, the flags one short phrase each: "p90/p10 = 250×; other processes took 1.6 of 2 cores".
A flagged series still stores every sample; flags travel with the run, so a speedup or a comparison that rests on it
can say so (engine.store.report, engine.compare.verdict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.measure.conditions import Conditions

STATES = ("clean", "noisy", "interfered")
# Spread limits beyond which a series is noisy.
MAX_P90_P10 = 2.0
MAX_IQR_REL = 0.3
MAX_OUTLIER_FRAC = 0.10
# Conditions beyond which a series is interfered with.
MAX_OTHER_SHARE = 0.25  # of the cores the timing could use, taken by other processes
MAX_CPU_WAIT = 0.25  # of the time its threads wanted a CPU, spent waiting for one ...
# ... while other processes used at least this much, in cores (not only its own threads). On an idle 2-core
# machine /proc's 10 ms ticks read 0.16-0.40 of a core as "other" over a 0.2 s window (the lab's supervisor, the
# kernel's threads), and a worker's own intra-op threads queue behind each other for a quarter of the time
# while its series stays tight (p90/p10 1.03): below half a core the wait is its own.
MIN_OTHER_CORES_FOR_WAIT = 0.5
MAX_CLOCK_DIP = 0.10  # SM clock minimum below the window's median
THROTTLE_WORDS = ("thermal", "power_brake", "power brake", "hw_slowdown", "hw slowdown")


@dataclass(frozen=True)
class Spread:
    n: int
    median: float
    iqr_rel: float
    mad_rel: float
    p90_p10: float
    outliers: int

    @property
    def outlier_frac(self) -> float:
        return self.outliers / self.n if self.n else 0.0


def spread(samples: Sequence[float] | np.ndarray) -> Spread:
    """Robust spread of a series (any positive unit)."""
    a = np.asarray(samples, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return Spread(0, float("nan"), float("nan"), float("nan"), float("nan"), 0)
    p10, p25, p50, p75, p90 = np.percentile(a, [10, 25, 50, 75, 90])
    mad = float(np.median(np.abs(a - p50))) * 1.4826
    iqr = p75 - p25
    return Spread(n=int(a.size), median=float(p50), iqr_rel=float(iqr / p50) if p50 > 0 else float("inf"),
                  mad_rel=mad / p50 if p50 > 0 else float("inf"),
                  p90_p10=float(p90 / p10) if p10 > 0 else float("inf"),
                  outliers=int(np.sum(a > p75 + 3 * iqr)) if iqr > 0 else 0)


def spread_flags(s: Spread) -> list[str]:
    """What makes this spread wide, one phrase each ([] when it is not)."""
    flags = []
    if s.n < 2:
        return flags
    if s.p90_p10 >= MAX_P90_P10:
        flags.append(f"p90/p10 = {_times(s.p90_p10)}")
    if s.iqr_rel >= MAX_IQR_REL:
        flags.append(f"IQR = {_times(s.iqr_rel)} the median" if s.iqr_rel >= 2 else
                     f"IQR = {100 * s.iqr_rel:.0f} % of the median")
    if s.outlier_frac > MAX_OUTLIER_FRAC:
        flags.append(f"{s.outliers} of {s.n} samples far out (beyond p75 + 3·IQR)")
    return flags


def settled(samples: Sequence[float] | np.ndarray) -> bool:
    """True when the spread is narrow enough to stop taking samples (engine.measure.timing.time_adaptive)."""
    return not spread_flags(spread(samples))


def _times(x: float) -> str:
    return f"{x:.0f}×" if x >= 10 else f"{x:.1f}×"


def condition_flags(c: Conditions | None) -> list[str]:
    """What in the conditions says the timing shared what it needed, one phrase each ([] when nothing does)."""
    if c is None:
        return []
    flags = []
    cores = c.cores or 1
    if c.other_cores is not None and c.other_cores >= MAX_OTHER_SHARE * cores:
        flags.append(f"other processes took {c.other_cores:.1f} of {cores} cores")
    elif (c.cpu_wait_frac is not None and c.cpu_wait_frac >= MAX_CPU_WAIT
          and (c.other_cores or 0.0) >= MIN_OTHER_CORES_FOR_WAIT):
        flags.append(f"its threads waited for a CPU {100 * c.cpu_wait_frac:.0f} % of the time")
    if c.gpu_other_processes:
        pids = ", ".join(map(str, c.gpu_other_processes[:4])) + (" …" if len(c.gpu_other_processes) > 4 else "")
        flags.append(f"{len(c.gpu_other_processes)} other process{'es' if len(c.gpu_other_processes) > 1 else ''} "
                     f"on the GPU (pid {pids})")
    throttles = [r for r in c.gpu_reasons if any(w in r.lower() for w in THROTTLE_WORDS)]
    if throttles:
        flags.append("GPU clock slowed: " + ", ".join(throttles))
    if _clock_dipped(c) and not _power_capped(c):
        flags.append(f"SM clock dipped to {c.gpu_sm_clock_min_mhz:.0f} MHz (median {c.gpu_sm_clock_median_mhz:.0f})")
    return flags


def _clock_dipped(c: Conditions) -> bool:
    low, mid = c.gpu_sm_clock_min_mhz, c.gpu_sm_clock_median_mhz
    return low is not None and bool(mid) and low < (1 - MAX_CLOCK_DIP) * mid


def _power_capped(c: Conditions) -> bool:
    """The clock was held by the board's software power cap and by nothing that throttles from outside (thermal,
    power brake, HW slowdown): the workload's own draw sets that clock, so it is part of what the timing measures
    (on the H200 a bf16 attention or matmul loop runs at 1500-1800 of 1980 MHz under its 700 W cap, every time)."""
    reasons = [r.lower() for r in c.gpu_reasons]
    return any("power_cap" in r or "power cap" in r for r in reasons) and not any(
        w in r for r in reasons for w in THROTTLE_WORDS)


def condition_notes(c: Conditions | None) -> list[str]:
    """What the conditions show that is not judged interference but belongs beside the figure, one phrase each: an
    SM clock held below its median by the software power cap; the timing cores' hyperthread siblings busy (work on
    the same physical cores, which can slow a host-bound step; recorded, not a flag)."""
    if c is None:
        return []
    notes = []
    if _clock_dipped(c) and _power_capped(c):
        notes.append(f"SM clock {c.gpu_sm_clock_min_mhz:.0f}-{c.gpu_sm_clock_median_mhz:.0f} MHz, held by the "
                     "software power cap (the workload's own draw)")
    if c.sibling_cores is not None and c.sibling_cores >= MIN_OTHER_CORES_FOR_WAIT:
        notes.append(f"the timing cores' hyperthread siblings were busy ({c.sibling_cores:.1f} cores' worth): other "
                     "work on the same physical cores")
    return notes


@dataclass
class Judgement:
    state: str
    flags: list[str] = field(default_factory=list)
    spread: Spread | None = None

    @property
    def reason(self) -> str:
        return "; ".join(self.flags)

    @property
    def flagged(self) -> bool:
        return self.state != "clean"


def judge(samples: Sequence[float] | np.ndarray, conditions: Conditions | dict[str, Any] | None = None) -> Judgement:
    """clean | noisy | interfered, with the reasons (spread first, then conditions)."""
    if isinstance(conditions, dict):
        conditions = Conditions.from_dict(conditions)
    s = spread(samples)
    wide, blamed = spread_flags(s), condition_flags(conditions)
    state = "interfered" if blamed else "noisy" if wide else "clean"
    return Judgement(state, wide + blamed, s)


def worst(states: Sequence[str]) -> str:
    return max(states, key=STATES.index, default="clean")


def _series_label(phase: str | None, batch: int | None) -> str:
    return " ".join(p for p in (phase or "", f"B={batch}" if batch is not None else "") if p)


def _window_for(windows: Sequence[Conditions], phase: str, batch: int | None) -> Conditions | None:
    """The window that timed this series: the one naming its phase and batch, else its phase, else one naming
    neither, else the only window there is."""
    for test in (lambda w: w.phase == phase and w.batch_size == batch,
                 lambda w: w.phase == phase and w.batch_size is None,
                 lambda w: w.phase is None):
        found = [w for w in windows if test(w)]
        if found:
            return found[-1]
    return windows[0] if len(windows) == 1 else None


def record(series: Sequence[Any], windows: Sequence[Conditions]) -> dict[str, Any]:
    """Judge every timed series (objects with phase, batch_size, values, unit: engine.store.db.Samples) against
    the window that timed it; the run's record for runs.conditions: its worst state, its flags (each with its series
    where the run has several) and one entry per series with the spread and conditions."""
    entries, flags, notes = [], [], []
    timed = [s for s in series if getattr(s, "unit", "us") == "us" and len(s.values)]
    for s in timed:
        c = _window_for(windows, s.phase, s.batch_size)
        j = judge(s.values, c)
        label = _series_label(s.phase, s.batch_size)
        figures = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(j.spread).items()}
        entries.append({"phase": s.phase, "batch_size": s.batch_size, "state": j.state, "flags": j.flags,
                        "notes": condition_notes(c), "spread": figures,
                        "conditions": c.to_dict() if c is not None else None})
        for flag in j.flags:
            flags.append(f"{label}: {flag}" if len(timed) > 1 and label else flag)
        for note in entries[-1]["notes"]:
            notes.append(f"{label}: {note}" if len(timed) > 1 and label else note)
    return {"state": worst([e["state"] for e in entries]), "flags": flags, "notes": notes, "series": entries}
