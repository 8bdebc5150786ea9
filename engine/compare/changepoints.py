"""Change points: where a series of per-run medians stepped up or down over time, and in which commit/environment.

The method is a penalised least-squares segmentation solved exactly by dynamic programming (optimal partitioning),
the family asv's step detection belongs to: asv fits a piecewise-constant function with a penalty per step and an L1
cost for robustness to outliers; this module gets that robustness by winsorising first and keeps L2's closed-form
segment cost (O(n²) with prefix sums, a few ms for 1000 runs).

1. x = log(per-run median), so a step is a ratio (+10 % is the same size at 20 µs and at 20 ms).
2. Noise, robustly: σ₀ = 1.4826 · MAD(first differences) / √2 — differences cancel the level, so steps barely move
   it, and the MAD ignores outlier runs; at least `NOISE_FLOOR` (0.5 %: no machine repeats a benchmark closer than
   that, and a perfectly flat series would otherwise turn any 0.1 % wobble into a step).
3. Winsorise: each point is clipped to ±3σ₀ around the median of the 5-run window centred on it (shifted inward at
   the ends). An excursion of one or two runs is pulled in; a level held for `MIN_SIZE` (3) runs or more is not
   touched, since it is the majority of every window centred on one of its runs.
4. The penalty's σ is the larger of σ₀ and the RMS of the winsorised series' differences / √2 (all n points: a MAD
   from a short series is often far too small, and a too small σ means spurious steps).
5. Segment: minimise Σ over segments (squared deviations from the segment mean) + β per segment, segments at least
   MIN_SIZE runs long, with β = 2σ² · ln(n / FLAT_SPLIT). 2σ²·ln(n/p) is the χ²₁ threshold a single split must beat
   to be significant at p after a Bonferroni correction over n positions, so a flat series of pure noise splits with
   probability about FLAT_SPLIT (1 %) whatever its length — unlike BIC's 2σ² ln n, which splits short flat series far
   more often. The rates measured are in docs/compare.md (tests/engine/compare/test_changepoints.py).

A step is reported at the first run of the new level, with its size as the ratio of the medians of the segments
after and before, that run's commit and environment (torch, device, host) and the commit of the run before it. A step
needs MIN_SIZE runs on its new level before it shows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.compare.verdict import series_config
from engine.store.db import Store

FLAT_SPLIT = 0.01
MIN_SIZE = 3
NOISE_FLOOR = 0.005
WINSOR_SIGMAS = 3.0
WINDOW = 2  # half-width of the winsorising window
ENV_COLUMNS = ("git_commit", "torch", "device_name", "hostname")


@dataclass
class Step:
    index: int  # position in the series of the first point of the new level
    ratio: float  # median after / median before
    before: float
    after: float
    run_id: int | None = None
    group: str | None = None  # e.g. the mode, when a frame holds several series
    commit: str | None = None
    previous_commit: str | None = None
    torch: str | None = None
    device_name: str | None = None
    hostname: str | None = None

    @property
    def label(self) -> str:
        """'+12.3 % at run #41 · commit abc123 (after def456) · torch 2.13.0 · NVIDIA H100'."""
        where = f"commit {self.commit}" if self.commit else "no commit recorded"
        if self.previous_commit and self.previous_commit != self.commit:
            where += f" (after {self.previous_commit})"
        env = " · ".join(str(v) for v in (self.torch and f"torch {self.torch}", self.device_name) if v)
        run = f" at run #{self.run_id}" if self.run_id is not None else ""
        return f"{100 * (self.ratio - 1):+.1f} %{run} · {where}" + (f" · {env}" if env else "")


def robust_sigma(x: np.ndarray) -> float:
    """σ of the noise from the median absolute deviation of first differences (robust to steps and outliers)."""
    if len(x) < 3:
        return NOISE_FLOOR
    d = np.diff(x)
    return max(1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2), NOISE_FLOOR)


def winsorise(x: np.ndarray, sigma: float) -> np.ndarray:
    """Each point clipped to ±WINSOR_SIGMAS·σ around the median of the 5-point window centred on it (shifted inward at
    the ends, so the first and last points are judged by their neighbours too)."""
    n, width = len(x), 2 * WINDOW + 1
    if n < width:
        return x.copy()
    starts = np.clip(np.arange(n) - WINDOW, 0, n - width)
    centre = np.median(x[starts[:, None] + np.arange(width)], axis=1)
    return centre + np.clip(x - centre, -WINSOR_SIGMAS * sigma, WINSOR_SIGMAS * sigma)


def segment(x: np.ndarray, beta: float, min_size: int = MIN_SIZE) -> list[int]:
    """Optimal partitioning: the start indices (after 0) of the segments minimising SSE + beta per segment."""
    n = len(x)
    if n < 2 * min_size:
        return []
    x = x - x.mean()
    s1, s2 = np.concatenate([[0.0], np.cumsum(x)]), np.concatenate([[0.0], np.cumsum(x * x)])
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    last = np.zeros(n + 1, dtype=np.int64)
    for t in range(min_size, n + 1):
        starts = np.arange(0, t - min_size + 1)
        cost = s2[t] - s2[starts] - (s1[t] - s1[starts]) ** 2 / (t - starts)
        total = best[starts] + cost + beta
        j = int(np.argmin(total))
        best[t], last[t] = total[j], starts[j]
    cuts, t = [], n
    while t > 0:
        t = int(last[t])
        if t > 0:
            cuts.append(t)
    return sorted(cuts)


def penalty_sigma(winsorised: np.ndarray, sigma0: float) -> float:
    """The σ the penalty scales with: σ₀, or the RMS of the winsorised differences / √2 where that is larger."""
    d = np.diff(winsorised)
    return max(sigma0, math.sqrt(float(np.mean(d * d)) / 2) if len(d) else 0.0)


def detect(values: Sequence[float], *, flat_split: float = FLAT_SPLIT, min_size: int = MIN_SIZE) -> list[Step]:
    """Steps of one series (positive values in time order), without run information."""
    y = np.asarray(values, dtype=float)
    if len(y) < 2 * min_size or not np.all(np.isfinite(y)) or np.any(y <= 0):
        return []
    x = np.log(y)
    sigma0 = robust_sigma(x)
    clipped = winsorise(x, sigma0)
    beta = 2 * penalty_sigma(clipped, sigma0) ** 2 * math.log(len(x) / flat_split)
    cuts = segment(clipped, beta, min_size)
    bounds = [0, *cuts, len(y)]
    steps = []
    for i, cut in enumerate(cuts, 1):
        before, after = float(np.median(y[bounds[i - 1]:cut])), float(np.median(y[cut:bounds[i + 1]]))
        steps.append(Step(index=cut, ratio=after / before, before=before, after=after))
    return steps


def by_commit(frame: pd.DataFrame, value: str) -> pd.DataFrame:
    """Commit order: one point per commit (in order of its first run), the median of its runs' values."""
    keyed = frame.assign(_commit=frame["git_commit"].fillna("?"))
    order = keyed.groupby("_commit", sort=False)
    out = order.agg(run_id=("run_id", "first"), **{value: (value, "median")}).reset_index()
    rest = keyed.drop_duplicates("_commit")[["_commit", *[c for c in keyed.columns if c not in out.columns]]]
    return out.merge(rest, on="_commit").drop(columns="_commit")


def find_steps(frame: pd.DataFrame, value: str, group: str | None = None, order: str = "run",
               flat_split: float = FLAT_SPLIT) -> list[Step]:
    """Steps of each group's series in a frame ordered by run (run_id, value, and the ENV_COLUMNS when known);
    order='commit' collapses the runs of each commit first."""
    steps: list[Step] = []
    parts = frame.groupby(group, sort=False) if group else [(None, frame)]
    for name, part in parts:
        part = part.sort_values("run_id").dropna(subset=[value]).reset_index(drop=True)
        if order == "commit" and "git_commit" in part:
            part = by_commit(part, value)
        for step in detect(part[value].to_numpy(), flat_split=flat_split):
            row, prev = part.iloc[step.index], part.iloc[step.index - 1]
            step.run_id, step.group = int(row["run_id"]), None if name is None else str(name)
            for attr, column in (("commit", "git_commit"), ("torch", "torch"), ("device_name", "device_name"),
                                 ("hostname", "hostname")):
                setattr(step, attr, _text(row.get(column)))
            step.previous_commit = _text(prev.get("git_commit"))
            steps.append(step)
    return steps


def _text(value: object) -> str | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def run_environments(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """run_id and the ENV_COLUMNS of these runs (one query)."""
    if not len(run_ids):
        return pd.DataFrame(columns=["run_id", *ENV_COLUMNS])
    with store.connect(read_only=True) as con:
        return con.execute(f"SELECT run_id, {', '.join(ENV_COLUMNS)} FROM environments "
                           "WHERE run_id IN (SELECT unnest(?::BIGINT[]))", [[int(r) for r in run_ids]]).df()


def history_steps(store: Store, frame: pd.DataFrame, value: str, group: str | None = "mode") -> list[Step]:
    """Steps of a page's history frame (run_id, value[, group]), each labelled with its run's environment."""
    if frame is None or frame.empty:
        return []
    env = run_environments(store, [int(r) for r in frame["run_id"]])
    return find_steps(frame.drop(columns=[c for c in ENV_COLUMNS if c in frame]).merge(env, on="run_id", how="left"),
                      value, group)


def series_history(store: Store, kind: str, workload: str, phase: str, *, device: str | None = None,
                   batch_size: int | None = None, config: str | None = None, limit: int = 2000) -> pd.DataFrame:
    """Per ok run of a series (every mode): run_id, mode, finished_at, median of its raw samples, n; oldest first.
    config: engine.compare.verdict.series_config of the runs to keep (levels: 'shape=…'; llm: 'P=… N=…')."""
    where, args = ["r.kind = ?", "r.status = 'ok'", "r.workload = ?", "s.phase = ?"], [kind, workload, phase]
    for clause, arg in (("r.device = ?", device), ("s.batch_size = ?", batch_size)):
        if arg is not None:
            where.append(clause)
            args.append(arg)
    frame = store.query(f"""
        SELECT r.id AS run_id, r.mode, r.finished_at, r.params, median(s.value) AS median_us, count(*) AS n
        FROM runs r JOIN samples s ON s.run_id = r.id WHERE {' AND '.join(where)}
        GROUP BY ALL ORDER BY r.id DESC LIMIT {int(limit)}""", args)
    if frame.empty:
        return frame
    if config is not None:
        keep = [series_config(kind, json.loads(p or "{}")) == config for p in frame["params"]]
        frame = frame[keep]
    return frame.drop(columns="params").iloc[::-1].reset_index(drop=True)


def run_series_history(store: Store, run_id: int, phase: str) -> pd.DataFrame:
    """series_history of the series a run belongs to (its kind, workload, device, batch and config; every mode)."""
    run = store.run(run_id)
    if run is None:
        return pd.DataFrame()
    batch = run["params"].get("batch") if run["kind"] == "llm" else None
    return series_history(store, run["kind"], run["workload"], phase, device=run["device"], batch_size=batch,
                          config=series_config(run["kind"], run["params"]))
