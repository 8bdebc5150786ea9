"""Did it get slower? Two sets of runs compared series by series on their raw samples, with a statistical gate.

    python -m engine compare --base commit:abc123 --head latest [--threshold 5%] [--kind bench] [--json]

Sides (SPEC)
------------
A SPEC is one or more clauses separated by spaces; clauses are ANDed, a key given twice ORs its values, and a value
with spaces is quoted (shell rules: `device:"NVIDIA H100 80GB HBM3"`). Only finished (ok) bench, levels and llm runs
are selected.

    ids:12,15,20-24          these runs
    commit:abc123            the git commit the run recorded starts with this (case-insensitive)
    torch:2.11.0+cu130       this torch version; a prefix stops at '.' or '+' (torch:2.11 is 2.11.x, not 2.110)
    device:"NVIDIA H100"     the recorded device name contains this (case-insensitive), or the run's device is it
                             (device:cuda:0, device:cpu)
    host:NAME                recorded on this host
    merged:other.duckdb      copied in by `python -m engine merge` from a store with this path or file name;
                             merged:none selects the runs made in this store
    kind:bench,levels,llm    also workload:NAME,… and mode:NAME,… (comma lists)
    latest  |  latest:N      of what the other clauses select, only the newest (N) run(s) of each series

`latest` alone is the newest run of every series in the store. A run selected by both sides stays on the head side
only (so `--base commit:abc --head latest` works when the latest runs are of commit abc); a side left empty is an
error.

Series
------
Samples are comparable when they measure the same thing: the kind, workload (the component for levels, llama-<preset>
for llm), mode (level), phase, batch size (llm: B), the configuration that changes the work (levels: the shape; llm:
P, N, dtype, layers, tensor parallelism, SDPA backend, fusion, autotune) and the device type (cpu/cuda). The device
name is part of the series too, unless the two sides share no device name: then the comparison is between machines
and series are matched across them. The samples of several runs of one series on one side are pooled.

The test
--------
For each series: the ratio of medians head/base of the raw samples, with a percentile-bootstrap confidence interval
(B = 2000 resamples, seeded, 1 − α = 95 %), and the Mann–Whitney U p-value beside it for reference.

Why the bootstrap CI of the ratio of medians: timings have a heavy right tail (a preemption, a page fault, a GC pass
can make one sample 10× the others), so the mean and a t-test are dragged by a few samples while the median is not;
the ratio is the effect size a reader wants ("12 % slower") and its interval says how sure that figure is, where a
p-value alone only says that *some* difference exists — with 10 000 samples a 0.1 % change is "significant" and
means nothing. The bootstrap needs no distributional assumption.

Each resample draws every sample of a side with replacement; its median is drawn directly from its exact sampling
distribution rather than by sorting a resample: the k-th smallest of N uniform draws on {1..N} is ceil(N·U(k)) with
U(k) ~ Beta(k, N−k+1) (and U(k+1) = U(k) + (1 − U(k))·Beta(1, N−k) for an even N's second middle value), so B
resamples cost O(B), not O(B·N log N), and equal the brute-force bootstrap in distribution (tested).

Processes, not samples, are the unit
------------------------------------
Samples from one process share its state (where the allocator put the tensors, which core the scheduler chose, the
clock the machine ran at, what else ran meanwhile), so two runs of one configuration differ by more than their
samples' spread says: an interval from the samples of one process on each side calls such pairs "slower". Each run
is one worker process (`bench --repeat N` makes N per mode), and the interval is hierarchical: a resample draws the
processes of a side with replacement first, then the samples from the mixture of the drawn processes (each weighing
the same) — a cluster bootstrap. With few processes that bootstrap is too narrow (it sees the processes' spread
with divisor n, not n − 1, and nothing of a t distribution's tails), so its deviations from the centre are widened by
t(df)/z · sqrt(m / (m − 1)), df = n_base + n_head − 2, m the smaller side's processes (3.1× at 2 + 2, 1.7× at 3 + 3,
→ 1 as they grow).

A side of one process has no process-to-process noise of its own. Then the machine's measured noise for that series
is used where there is one: the spread (standard deviation of log medians) between the processes of earlier repeat
groups of the same series on the same machine (device and host), unflagged; each bootstrap resample's log ratio gets
a normal draw of that spread (σ²/n for each one-process side). Without it the verdict is "cannot tell", with the
repeats a side would need: the fewest processes n for which the interval's half-width, t(2n − 2)/z · sqrt(n/(n−1))
· z · σ · sqrt(2/n), is within the threshold (log(1 + t)); σ from the machine's other series, else 5 %.

Flagged runs (engine.measure.noise: a noisy or interfered series, stored in runs.conditions) are left out of the
verdicts unless include_flagged (`--include-flagged`); the output says how many were and why.

Verdict (threshold t, default 5 %; α = 0.05):
    slower           the whole (1 − α) CI lies above 1 (significant at α) AND the ratio ≥ 1 + t (big enough)
    faster           the whole CI lies below 1 AND the ratio ≤ 1 / (1 + t)
    unchanged        otherwise: no significant difference, or one smaller than the threshold
    cannot tell      fewer than 2 processes on a side and no measured process noise for the series on its machine,
                     or every run of a side flagged (the row says which, and the repeats it would need)
    too few samples  fewer than 5 samples on a side (min_samples)

Energy (metric "energy", `--metric energy`): the same series judged on the runs' energy figures
(engine.compare.energy: J per step, token or prefill, whole board or CPU package; the median above the idle draw
reported beside it). A run
has one figure per series, so the runs are the samples: each resample draws a side's figures with replacement and
takes their median, widened as above; one run a side uses the spread of the series' energy in earlier repeat groups,
else "cannot tell". The verdicts read "more energy" / "less energy" for slower / faster; min_samples does not apply;
a comparison whose chosen runs carry no figure is a CompareError naming the runs and the reason they stored.

Beside each verdict: the correctness figures both sides stored (bench: max_abs_err, max_rel_err; levels: rel_l2_err
and its tolerance; llm: max_rel_err per phase, max_abs_err, tokens_matched, tolerance), and the `python -m engine …`
command that re-runs the head side's series, built from its newest run's stored parameters.
"""

from __future__ import annotations

import json
import math
import shlex
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from engine.compare import energy
from engine.store.db import Store
from engine.store.report import FLAGGED_STATES, fmt_joules, series_state

KINDS = ("bench", "levels", "llm")
KEYS = ("ids", "commit", "torch", "device", "host", "merged", "kind", "workload", "mode")
LIST_KEYS = ("ids", "kind", "workload", "mode")
VERDICTS = ("slower", "faster", "unchanged", "cannot tell", "too few samples")
UNDECIDED = ("cannot tell", "too few samples")
METRICS = ("time", "energy")
ENERGY_WORDS = {"slower": "more energy", "faster": "less energy"}  # the energy metric's names for a change
WORSE = ("slower", "more energy")
RESAMPLES = 2000
ALPHA = 0.05
THRESHOLD = 0.05
MIN_SAMPLES = 5
GUESSED_PROCESS_NOISE = 0.05  # σ of log process medians assumed for "repeats needed" where nothing is measured
MAX_REPEATS = 50
SERIES_COLUMNS = ["kind", "workload", "mode", "phase", "batch", "config", "devkind"]


class CompareError(ValueError):
    """A bad SPEC or option, a side that matches no run: one line for the user."""


# -- SPEC ------------------------------------------------------------------------------------------------------------
@dataclass
class Spec:
    text: str
    clauses: dict[str, list[str]] = field(default_factory=dict)
    latest: int | None = None


def _ids(text: str) -> list[str]:
    out: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise CompareError(f"ids:{text}: write run ids as 12,15,20-24")
        if dash and int(hi) - int(lo) > 100_000:
            raise CompareError(f"ids:{part}: a range of at most 100,000 runs")
        out += [str(i) for i in range(int(lo), int(hi) + 1)] if dash else [lo]
    return out


def parse_spec(text: str) -> Spec:
    """SPEC text → Spec (the grammar is in this module's docstring); raises CompareError."""
    try:
        words = shlex.split(text or "")
    except ValueError as exc:
        raise CompareError(f"SPEC {text!r}: {exc}") from None
    if not words:
        raise CompareError("empty SPEC: give e.g. commit:abc123, ids:12,15 or latest")
    spec = Spec(text=text)
    for word in words:
        if word[:1].isdigit():  # a bare run id (or id list) means ids:…: `--base 12` is `--base ids:12`
            spec.clauses.setdefault("ids", []).extend(_ids(word))
            continue
        key, colon, value = word.partition(":")
        key = key.strip().lower()
        if key == "latest":
            if colon and not (value.isdigit() and int(value) >= 1):
                raise CompareError(f"{word!r}: latest takes a count of at least 1, e.g. latest:3")
            spec.latest = int(value) if colon else 1
            continue
        if key not in KEYS or not colon or not value.strip():
            raise CompareError(f"{word!r} in SPEC {text!r}: write KEY:VALUE with KEY one of {', '.join(KEYS)}, "
                               "or latest[:N]")
        values = _ids(value) if key == "ids" else [v.strip() for v in value.split(",")] if key in LIST_KEYS \
            else [value.strip()]
        spec.clauses.setdefault(key, []).extend(v for v in values if v)
    return spec


def _clause_sql(key: str, value: str) -> tuple[str, list[Any]]:
    """One KEY:VALUE as a SQL condition on runs r, environments e and merged_runs m."""
    if key == "commit":
        return "starts_with(lower(e.git_commit), lower(?))", [value]
    if key == "torch":
        return "(e.torch = ? OR starts_with(e.torch, ? || '.') OR starts_with(e.torch, ? || '+'))", [value] * 3
    if key == "device":
        return "(contains(lower(e.device_name), lower(?)) OR lower(r.device) = lower(?))", [value] * 2
    if key == "host":
        return "(e.hostname = ? OR r.host = ?)", [value] * 2
    if key == "merged":
        if value.lower() == "none":
            return "m.source IS NULL", []
        full = str(Path(value).resolve()) if Path(value).exists() else value
        return "(m.source = ? OR ends_with(m.source, '/' || ?))", [full, value.lstrip("/")]
    return f"r.{key} = ?", [value]  # kind, workload, mode


def _where(spec: Spec, kinds: Sequence[str]) -> tuple[str, list[Any]]:
    where = ["r.status = 'ok'", f"r.kind IN ({','.join('?' * len(kinds))})"]
    args: list[Any] = list(kinds)
    for key, values in spec.clauses.items():
        if key == "ids":
            where.append("r.id IN (SELECT unnest(?::BIGINT[]))")
            args.append([int(v) for v in values])
            continue
        parts = [_clause_sql(key, v) for v in values]
        where.append("(" + " OR ".join(p[0] for p in parts) + ")")
        args += [a for p in parts for a in p[1]]
    return " AND ".join(where), args


def select_runs(store: Store, spec: Spec, kinds: Sequence[str] = KINDS) -> pd.DataFrame:
    """The ok runs a SPEC's clauses select (before `latest`), oldest first, with their environment and series
    columns (devkind, config) and parsed params."""
    where, args = _where(spec, kinds)
    frame = store.query(f"""
        SELECT r.id AS run_id, r.kind, r.workload, r.mode, r.device, r.params, r.finished_at, r.group_id,
               r.conditions, e.git_commit, e.torch, e.device_name, e.hostname, m.source AS merged_from
        FROM runs r LEFT JOIN environments e ON e.run_id = r.id LEFT JOIN merged_runs m ON m.run_id = r.id
        WHERE {where} ORDER BY r.id""", args)
    if frame.empty:
        return frame
    frame["params"] = [json.loads(p) if isinstance(p, str) and p else {} for p in frame["params"]]
    frame["devkind"] = frame["device"].str.split(":").str[0]
    frame["config"] = [series_config(k, p) for k, p in zip(frame["kind"], frame["params"])]
    frame["device_name"] = frame["device_name"].fillna(frame["device"])
    frame["hostname"] = frame["hostname"].fillna("")
    return frame


CHOICE_SQL = {
    "commit": "e.git_commit", "torch": "e.torch", "device": "e.device_name",
    "merged": "coalesce(regexp_extract(m.source, '[^/]+$'), 'none')",
}


def spec_choices(store: Store, kinds: Sequence[str] = KINDS) -> dict[str, list[str]]:
    """What a side can be picked by, from the store: commit, torch and device values newest first, merged stores
    (file names, 'none' for runs made here) and run ids ('12 · bench eager cpu'). Empty lists on an empty store."""
    marks = ",".join("?" * len(kinds))
    base = (f"FROM runs r LEFT JOIN environments e ON e.run_id = r.id LEFT JOIN merged_runs m ON m.run_id = r.id "
            f"WHERE r.status = 'ok' AND r.kind IN ({marks})")
    out: dict[str, list[str]] = {}
    for key, column in CHOICE_SQL.items():
        frame = store.query(f"SELECT {column} AS v, max(r.id) AS newest {base} AND {column} IS NOT NULL "
                            "GROUP BY 1 ORDER BY newest DESC", list(kinds))
        out[key] = [str(v) for v in frame.get("v", [])]
    runs = store.query(f"SELECT r.id, r.kind, r.workload, r.mode, r.device {base} ORDER BY r.id DESC LIMIT 500",
                       list(kinds))
    out["ids"] = [f"{r.id} · {r.kind} {r.workload} {r.mode} {r.device}" for r in runs.itertuples()] \
        if not runs.empty else []
    return out


# -- series ----------------------------------------------------------------------------------------------------------
def series_config(kind: str, params: dict[str, Any]) -> str:
    """What, besides kind/workload/mode/phase/batch/device, changes the work a run's samples measure."""
    if kind == "levels":
        return f"shape={params.get('shape')}"
    if kind != "llm":
        return ""
    parts = [f"P={params.get('prompt_len')}", f"N={params.get('new_tokens')}"]
    for key, default in (("dtype", None), ("layers", None), ("tp", 1), ("sdpa", None)):
        if params.get(key, default) not in (default, None):
            parts.append(f"{key}={params[key]}")
    parts += [flag for flag, on in (("no-fuse", params.get("fuse", True) is False),
                                    ("autotune", bool(params.get("autotune")))) if on]
    return " ".join(parts)


def series_label(row: dict[str, Any], with_device: bool) -> str:
    batch = int(row["batch"]) if row["batch"] >= 0 else None
    return " ".join(str(p) for p in (row["kind"], row["workload"], row["mode"], row["phase"],
                                     f"B={batch}" if batch is not None else "", row["config"], row["devkind"],
                                     row["device_name"] if with_device else "") if p)


def _ids_arg(run_ids: Sequence[int]) -> list[list[int]]:
    return [[int(r) for r in run_ids]]


def _series_counts(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """One row per run × (phase, batch) with samples: run_id, phase, batch (−1 where none), size."""
    with store.connect(read_only=True) as con:
        return con.execute(
            "SELECT run_id, phase, coalesce(batch_size, -1) AS batch, count(*) AS size FROM samples "
            "WHERE run_id IN (SELECT unnest(?::BIGINT[])) AND isfinite(value) AND value > 0 GROUP BY ALL",
            _ids_arg(run_ids)).df()


def _load_samples(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """Every raw sample of these runs: run_id, phase, batch (−1 where none), value, unit — one query."""
    with store.connect(read_only=True) as con:
        return con.execute(
            "SELECT run_id, phase, coalesce(batch_size, -1) AS batch, value, unit FROM samples "
            "WHERE run_id IN (SELECT unnest(?::BIGINT[])) AND isfinite(value) AND value > 0 "
            "ORDER BY run_id, phase, batch, idx", _ids_arg(run_ids)).df()


def _latest(groups: pd.DataFrame, n: int | None, key: list[str]) -> pd.DataFrame:
    """Keep the newest n measurements of each series (groups: one row per run and series): a run, or all the
    processes of a repeat group (`bench --repeat N`: runs sharing a group id), ranked by their newest run."""
    if n is None or groups.empty:
        return groups
    repeated = [int(p.get("repeats", 1) or 1) > 1 for p in groups["params"]] if "params" in groups else \
        [False] * len(groups)
    unit = [f"g{g}" if rep and isinstance(g, str) else f"r{r}"
            for g, r, rep in zip(groups.get("group_id", [None] * len(groups)), groups["run_id"], repeated)]
    groups = groups.assign(_unit=unit)
    newest = groups.groupby(key + ["_unit"], dropna=False)["run_id"].transform("max")
    rank = groups.assign(_newest=newest).groupby(key, dropna=False)["_newest"].rank(method="dense",
                                                                                     ascending=False)
    return groups[rank <= n].drop(columns=["_unit"])


# -- statistics ------------------------------------------------------------------------------------------------------
def _middle_uniforms(n: int, resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """U(k) (and U(k+1) for even n) of n uniforms: the order statistics whose quantiles are a resample's median."""
    k = (n + 1) // 2 if n % 2 else n // 2
    first = rng.beta(k, n - k + 1, resamples)
    if n % 2:
        return [first]
    return [first, first + (1 - first) * rng.beta(1, n - k, resamples)]


def _mixture_quantiles(runs: list[np.ndarray], pooled: np.ndarray, weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per resample b, the u[b]-quantile of the mixture Σ_r weights[b, r]·ECDF_r, on the pooled sorted values
    (vectorised bisection over their index)."""
    cdf = np.stack([np.searchsorted(np.sort(r), pooled, side="right") / len(r) for r in runs])  # runs × N
    lo, hi = np.zeros(len(u), dtype=np.int64), np.full(len(u), len(pooled) - 1)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        above = np.einsum("bk,kb->b", weights, cdf[:, mid]) >= u - 1e-12
        lo, hi = np.where(above, lo, mid + 1), np.where(above, mid, hi)
    return pooled[lo]


def bootstrap_medians(runs: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The medians of `resamples` bootstrap resamples of one side (its runs' samples pooled; runs drawn first when
    there are several): drawn from their exact distribution in O(resamples), see the module docstring."""
    runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
    pooled = np.sort(np.concatenate(runs))
    n = len(pooled)
    uniforms = _middle_uniforms(n, resamples, rng)
    if len(runs) == 1:
        picks = [pooled[np.clip(np.ceil(n * u).astype(np.int64) - 1, 0, n - 1)] for u in uniforms]
    else:
        weights = rng.multinomial(len(runs), np.full(len(runs), 1 / len(runs)), size=resamples) / len(runs)
        picks = [_mixture_quantiles(runs, pooled, weights, u) for u in uniforms]
    return np.mean(picks, axis=0)


def ratio_ci(base: Sequence[np.ndarray], head: Sequence[np.ndarray], *, resamples: int = RESAMPLES,
             alpha: float = ALPHA, seed: int = 0) -> tuple[float, float, float]:
    """(median(head) / median(base), CI low, CI high): percentile bootstrap, both sides resampled independently."""
    rng = np.random.default_rng(seed)
    ratios = bootstrap_medians(head, resamples, rng) / bootstrap_medians(base, resamples, rng)
    lo, hi = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    point = float(np.median(np.concatenate(head)) / np.median(np.concatenate(base)))
    return point, float(lo), float(hi)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (df ≥ 1), by bisection on its CDF (the density
    integrated numerically): no SciPy needed."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if df > 1e4:
        return NormalDist().inv_cdf(p)
    norm = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4001)
        y = norm * (1 + x * x / df) ** (-(df + 1) / 2)
        return 0.5 + float(np.sum((y[1:] + y[:-1]) / 2) * (x[1] - x[0]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def widening(n_base: int, n_head: int, alpha: float = ALPHA) -> float:
    """How much a cluster bootstrap's interval over few processes is widened: t(df)/z · sqrt(m / (m − 1)), df =
    n_base + n_head − 2, m the smaller side's count (1 where a side has one process: its noise comes from the
    machine's record, not from the bootstrap)."""
    m = min(n_base, n_head)
    if m < 2:
        return 1.0
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return t_quantile(1 - alpha / 2, n_base + n_head - 2) / z * math.sqrt(m / (m - 1))


def process_ratio_ci(base: Sequence[np.ndarray], head: Sequence[np.ndarray], *, resamples: int = RESAMPLES,
                     alpha: float = ALPHA, seed: int = 0, sigma_base: float | None = None,
                     sigma_head: float | None = None) -> tuple[float, float, float]:
    """(ratio of medians, CI low, CI high) with processes as the unit: the hierarchical bootstrap of ratio_ci (runs
    drawn first), its log-ratio deviations widened for few processes (widening), and, for a side of one process,
    a normal draw of that side's known process noise sigma (σ of log medians) added to each resample."""
    rng = np.random.default_rng(seed)
    logs = np.log(bootstrap_medians(head, resamples, rng)) - np.log(bootstrap_medians(base, resamples, rng))
    lo, hi = _process_interval(logs, len(base), len(head), alpha, rng, sigma_base, sigma_head)
    point = float(np.median(np.concatenate(head)) / np.median(np.concatenate(base)))
    return point, lo, hi


def _process_interval(logs: np.ndarray, n_base: int, n_head: int, alpha: float, rng: np.random.Generator,
                      sigma_base: float | None, sigma_head: float | None) -> tuple[float, float]:
    """The CI of a ratio from its bootstrap log ratios: deviations widened for few processes, a normal draw of the
    known process noise added for a side of one process."""
    centre = float(np.median(logs))
    logs = centre + widening(n_base, n_head, alpha) * (logs - centre)
    extra = sum(s ** 2 for s, n in ((sigma_base, n_base), (sigma_head, n_head)) if s is not None and n < 2)
    if extra:
        logs = logs + rng.normal(0.0, math.sqrt(extra), len(logs))
    lo, hi = np.quantile(logs, [alpha / 2, 1 - alpha / 2])
    return float(math.exp(lo)), float(math.exp(hi))


def figure_ratio_ci(base: Sequence[float], head: Sequence[float], *, resamples: int = RESAMPLES,
                    alpha: float = ALPHA, seed: int = 0, sigma_base: float | None = None,
                    sigma_head: float | None = None) -> tuple[float, float, float]:
    """(ratio of medians, CI low, CI high) of one figure per process (a run's energy per step): each resample draws
    a side's figures with replacement and takes their median (the process level of process_ratio_ci, with nothing
    below it), then the same widening and known process noise."""
    rng = np.random.default_rng(seed)

    def medians(values: Sequence[float]) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        return np.median(values[rng.integers(0, len(values), (resamples, len(values)))], axis=1)

    logs = np.log(medians(head)) - np.log(medians(base))
    lo, hi = _process_interval(logs, len(base), len(head), alpha, rng, sigma_base, sigma_head)
    return float(np.median(head) / np.median(base)), lo, hi


def repeats_needed(sigma: float, threshold: float, alpha: float = ALPHA) -> int:
    """The fewest processes a side for which the interval's half-width, with process noise sigma (σ of log medians),
    is within the threshold: t(2n − 2)/z · sqrt(n/(n − 1)) · z · σ · sqrt(2/n) ≤ log(1 + threshold)."""
    z = NormalDist().inv_cdf(1 - alpha / 2)
    target = math.log1p(max(threshold, 1e-3))
    for n in range(2, MAX_REPEATS + 1):
        if widening(n, n, alpha) * z * sigma * math.sqrt(2 / n) <= target:
            return n
    return MAX_REPEATS


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n with ties given their average rank, and the size of each group of ties."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    return (upper - (counts - 1) / 2.0)[inverse], counts


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(U of x, two-sided p): the normal approximation with the tie correction and a continuity correction of ½
    (scipy.stats.mannwhitneyu(x, y, method='asymptotic'))."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n1, n2 = len(x), len(y)
    ranks, ties = _average_ranks(np.concatenate([x, y]))
    u = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2)
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - float((ties ** 3 - ties).sum()) / (n * (n - 1)))
    if variance <= 0:  # every value equal
        return u, 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def verdict(ratio: float, lo: float, hi: float, n_base: int, n_head: int, *, threshold: float = THRESHOLD,
            min_samples: int = MIN_SAMPLES) -> str:
    """slower / faster / unchanged / too few samples: significance via the CI AND a minimum effect size."""
    if min(n_base, n_head) < min_samples:
        return "too few samples"
    if lo > 1 and ratio >= 1 + threshold:
        return "slower"
    if hi < 1 and ratio <= 1 / (1 + threshold):
        return "faster"
    return "unchanged"


def parse_threshold(text: str | float) -> float:
    """'5%' → 0.05, '0.05' → 0.05; a bare number ≥ 1 ('5') is ambiguous and refused."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise CompareError(f"threshold {raw!r} is not a number: write 5% or 0.05") from None
    if not raw.endswith("%") and value >= 1:
        raise CompareError(f"threshold {raw!r} is ambiguous: write {raw}% for a percentage or "
                           f"{value / 100:g} for the same as a fraction")
    if not 0 <= value < 1 or math.isnan(value):
        raise CompareError(f"threshold {raw!r} must lie between 0 % and 100 %")
    return value


# -- correctness and reproduce commands ------------------------------------------------------------------------------
CORRECTNESS = {"bench": ("max_abs_err", "max_rel_err"),
               "levels": ("rel_l2_err", "tolerance"),
               "llm": ("max_rel_err", "max_abs_err", "tokens_matched", "tolerance")}
LOWER_IS_WORSE = ("tokens_matched",)


MetricRows = dict[int, list[tuple[str | None, int, str, float]]]


def _correctness_rows(store: Store, run_ids: Sequence[int]) -> MetricRows:
    """run_id → its correctness metrics as (phase, batch (−1: none), name, value), one query."""
    names = sorted({n for names in CORRECTNESS.values() for n in names})
    with store.connect(read_only=True) as con:
        rows = con.execute(
            f"SELECT run_id, phase, coalesce(batch_size, -1), name, value FROM metrics "
            f"WHERE run_id IN (SELECT unnest(?::BIGINT[])) AND name IN ({','.join('?' * len(names))})",
            [*_ids_arg(run_ids), *names]).fetchall()
    out: MetricRows = {}
    for run_id, phase, batch, name, value in rows:
        out.setdefault(int(run_id), []).append((phase, int(batch), name, float(value)))
    return out


def _side_correctness(metrics: MetricRows, runs: Sequence[int], phase: str, batch: int, kind: str
                      ) -> dict[str, float]:
    """Worst value of each correctness figure over a side's runs, at this phase/batch (or stored run-wide)."""
    found: dict[str, list[float]] = {}
    for run_id in runs:
        for m_phase, m_batch, name, value in metrics.get(run_id, ()):
            if m_phase in (None, phase) and m_batch in (-1, batch) and value == value:
                found.setdefault(name, []).append(value)
    return {name: (min if name in LOWER_IS_WORSE else max)(found[name]) for name in CORRECTNESS.get(kind, ())
            if name in found}


def correctness_text(base: dict[str, float], head: dict[str, float]) -> tuple[str, bool]:
    """'max_rel_err 1e-06→3e-05 …' and whether the head got worse (an error ×10 up or past its tolerance, fewer
    matching tokens)."""
    parts, worse = [], False
    tolerance = head.get("tolerance")
    for name in dict.fromkeys([*base, *head]):
        b, h = base.get(name), head.get(name)
        parts.append(f"{name} {'—' if b is None else f'{b:.2g}'}→{'—' if h is None else f'{h:.2g}'}")
        if name == "tolerance" or b is None or h is None:
            continue
        if name in LOWER_IS_WORSE:
            worse |= h < b
        else:
            worse |= h > 10 * b and h > 0 or (tolerance is not None and h > tolerance)
    return " · ".join(parts), worse


def _flags(pairs: Sequence[tuple[str, Any, Any]], params: dict[str, Any]) -> list[str]:
    """--flag value for each (flag, param key, default) whose stored value differs from the default."""
    out: list[str] = []
    for flag, key, default in pairs:
        value = params.get(key)
        if value is None or value == default:
            continue
        out += [flag] if value is True else [flag, shlex.quote(str(value))]
    return out


def _bench_command(params: dict[str, Any], mode: str, device: str, phase: str, batch: int) -> str:
    what = (["--model", shlex.quote(str(params["model"]))]
            + _flags([("--inputs", "inputs", None), ("--model-path", "model_path", None), ("--seed", "seed", 0)],
                     params)) if params.get("model") else ["--workload", shlex.quote(str(params.get("workload")))]
    sizes = "--batch-sizes" if phase == "infer" else "--train-batch-sizes"
    loop = [] if "loop" not in params else ["--loop", "on" if params["loop"] else "off"]
    return " ".join(["python -m engine bench", *what, "--mode", mode, "--device", device, "--phases", phase, sizes,
                     str(batch), *_flags([("--iters", "iters", None), ("--warmup", "warmup", None)], params), *loop])


def _levels_command(params: dict[str, Any], mode: str, device: str) -> str:
    return " ".join(["python -m engine levels", "--component", str(params["component"]), "--level", mode,
                     "--shape", str(params["shape"]), "--device", device,
                     *_flags([("--iters", "iters", None), ("--warmup", "warmup", None)], params)])


LLM_FLAGS = [("--layers", "layers", None), ("--prompt-len", "prompt_len", None), ("--new-tokens", "new_tokens", None),
             ("--batch", "batch", None), ("--dtype", "dtype", None), ("--sdpa", "sdpa", None),
             ("--autotune", "autotune", False), ("--prefill-iters", "prefill_iters", None),
             ("--decode-passes", "decode_passes", None), ("--check-tokens", "check_tokens", None),
             ("--deep", "deep", False), ("--top-k", "top_k", None), ("--seed", "seed", None), ("--tp", "tp", 1)]
LLM_UNMAPPED = {"ceilings": "auto", "profile_decode_steps": 6}  # stored params no llm flag sets (their defaults)


def _llm_command(params: dict[str, Any], mode: str, device: str) -> str:
    parts = ["python -m engine llm", "--preset", str(params["preset"]), "--mode", mode, "--device", device,
             *_flags(LLM_FLAGS, params)]
    parts += ["--no-fuse"] if params.get("fuse") is False else []
    parts += ["--no-profile"] if params.get("profile") is False else []
    unmapped = [f"{k}={params[k]}" for k, default in LLM_UNMAPPED.items() if params.get(k, default) != default]
    return " ".join(parts) + (f"  # not settable from the CLI: {', '.join(unmapped)}" if unmapped else "")


REQUIRED = {"bench": ("workload",), "levels": ("component", "shape"), "llm": ("preset",)}


def reproduce_command(kind: str, params: dict[str, Any], mode: str, device: str, phase: str, batch: int) -> str:
    """The `python -m engine …` that re-runs this series from a run's stored params, or why there is none."""
    missing = [k for k in REQUIRED.get(kind, ("?",)) if k not in params and not (kind == "bench" and "model" in params)]
    if kind not in REQUIRED or missing:
        return f"(no CLI command: the run's stored params lack {', '.join(missing) or kind})"
    device = str(params.get("device") or device)
    if kind == "bench":
        return _bench_command(params, mode, device, phase, batch)
    return _levels_command(params, mode, device) if kind == "levels" else _llm_command(params, mode, device)


# -- the comparison --------------------------------------------------------------------------------------------------
@dataclass
class Row:
    series: str
    kind: str
    workload: str
    mode: str
    phase: str
    batch_size: int | None
    config: str
    device: str
    n_base: int
    n_head: int
    runs_base: list[int]
    runs_head: list[int]
    median_base: float
    median_head: float
    unit: str
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str
    correctness: str
    correctness_worse: bool
    command: str
    procs_base: int = 0  # processes (runs) the verdict rests on, flagged ones left out
    procs_head: int = 0
    process_noise: str = ""  # where the process-to-process noise came from ('' where there was none)
    repeats_needed: int | None = None  # cannot tell: processes a side would need (bench --repeat N)
    flagged_left_out: list[int] = field(default_factory=list)  # runs of this series left out as flagged
    why: str = ""  # the reason for a 'cannot tell'
    above_idle_base: float = float("nan")  # energy: the median figure above the idle draw (nan where unknown)
    above_idle_head: float = float("nan")
    unmeasured: list[int] = field(default_factory=list)  # energy: runs of this series that stored no figure


@dataclass
class Comparison:
    base: str
    head: str
    threshold: float
    alpha: float
    resamples: int
    seed: int
    min_samples: int
    base_runs: list[int]
    head_runs: list[int]
    across_devices: bool
    rows: list[Row] = field(default_factory=list)
    only_base: list[str] = field(default_factory=list)
    only_head: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    include_flagged: bool = False
    metric: str = "time"  # what the verdicts judge: the raw time samples, or the runs' energy figures

    @property
    def regressed(self) -> bool:
        """Some series got worse: slower (time), more energy (energy)."""
        return any(r.verdict in WORSE for r in self.rows)

    @property
    def undecided(self) -> bool:
        """Some series could not be judged: cannot tell, or too few samples."""
        return any(r.verdict in UNDECIDED for r in self.rows)

    @property
    def exit_code(self) -> int:
        """The CLI's: 1 slower (a regression), else 3 when a series cannot be told, else 0."""
        return 1 if self.regressed else 3 if self.undecided else 0

    def counts(self) -> dict[str, int]:
        return {v: sum(r.verdict == v for r in self.rows) for v in verdict_names(self.metric)}


def verdict_names(metric: str) -> tuple[str, ...]:
    """The verdicts of a metric, best first for sorting: time's VERDICTS, energy's with 'more/less energy'."""
    return tuple(ENERGY_WORDS.get(v, v) for v in VERDICTS) if metric == "energy" else VERDICTS


@dataclass
class Options:
    threshold: float = THRESHOLD
    alpha: float = ALPHA
    resamples: int = RESAMPLES
    seed: int = 0
    min_samples: int = MIN_SAMPLES
    kinds: tuple[str, ...] = KINDS
    include_flagged: bool = False  # flagged runs (engine.measure.noise) count in the verdicts too
    metric: str = "time"  # "energy": the runs' energy figures instead of the time samples (one figure per run)


def _side_groups(store: Store, spec: Spec, side: str, kinds: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, one row per run × series) of one side, `latest` applied."""
    runs = select_runs(store, spec, kinds)
    if runs.empty:
        raise CompareError(f"--{side} {spec.text!r} matches no finished bench, levels or llm run")
    groups = _series_counts(store, list(runs["run_id"])).merge(runs, on="run_id")
    groups = _latest(groups, spec.latest, SERIES_COLUMNS + ["device_name"])
    return runs, groups.assign(side=side)


def _pick_groups(store: Store, base: Spec, head: Spec, kinds: Sequence[str]
                 ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Both sides' run × series rows (a run × series on both sides stays on the head), the runs, and notes."""
    base_runs, base_groups = _side_groups(store, base, "base", kinds)
    head_runs, head_groups = _side_groups(store, head, "head", kinds)
    notes = []
    shared = base_groups.merge(head_groups[["run_id", "phase", "batch"]], on=["run_id", "phase", "batch"],
                               how="left", indicator=True)["_merge"].eq("both").to_numpy()
    if shared.any():
        both_ids = sorted(set(base_groups["run_id"][shared]))
        notes.append(f"{int(shared.sum())} run × series selected by both sides kept on the head side only (runs "
                     f"{', '.join(map(str, both_ids[:10]))}{' …' if len(both_ids) > 10 else ''})")
        base_groups = base_groups[~shared]
    if base_groups.empty or head_groups.empty:
        side, spec = ("base", base) if base_groups.empty else ("head", head)
        raise CompareError(f"--{side} {spec.text!r} has no samples left to compare"
                           + (" once the runs the head selects are taken out" if shared.any() else ""))
    return pd.concat([base_groups, head_groups], ignore_index=True), pd.concat([base_runs, head_runs]), notes


def _flagged(groups: pd.DataFrame) -> pd.Series:
    """Per run × series row: True where its stored noise state is noisy or interfered (engine.measure.noise)."""
    return pd.Series([series_state(c, p, None if b < 0 else int(b))[0] in FLAGGED_STATES
                      for c, p, b in zip(groups["conditions"], groups["phase"], groups["batch"])],
                     index=groups.index, dtype=bool)


def compare(store: Store, base: str | Spec, head: str | Spec, options: Options | None = None) -> Comparison:
    """Compare the runs two SPECs select, series by series; raises CompareError for a bad or empty side."""
    opts = options or Options()
    if opts.metric not in METRICS:
        raise CompareError(f"metric {opts.metric!r}: compare judges one of {', '.join(METRICS)}")
    base_spec = parse_spec(base) if isinstance(base, str) else base
    head_spec = parse_spec(head) if isinstance(head, str) else head
    groups, runs, notes = _pick_groups(store, base_spec, head_spec, opts.kinds)
    groups = groups.assign(flagged=_flagged(groups))
    names = groups.groupby("side")["device_name"].agg(lambda s: set(s.dropna()))
    across = not (names.get("base", set()) & names.get("head", set()))
    key = SERIES_COLUMNS + ([] if across else ["device_name"])
    groups = groups.assign(series=groups.groupby(key, dropna=False).ngroup())
    sides = groups.groupby("series")["side"].agg(set)
    both = sides[sides.map(len) == 2].index
    result = Comparison(base=base_spec.text, head=head_spec.text, threshold=opts.threshold, alpha=opts.alpha,
                        resamples=opts.resamples, seed=opts.seed, min_samples=opts.min_samples,
                        base_runs=sorted(set(groups.loc[groups["side"] == "base", "run_id"].astype(int))),
                        head_runs=sorted(set(groups.loc[groups["side"] == "head", "run_id"].astype(int))),
                        across_devices=across, notes=notes, include_flagged=opts.include_flagged,
                        metric=opts.metric)
    for side, target in (("base", result.only_base), ("head", result.only_head)):
        lonely = groups[groups["series"].isin(sides[sides == {side}].index)].drop_duplicates("series")
        target += [series_label(r, not across) for r in lonely.to_dict("records")]
    if both.empty:
        raise CompareError(f"no series in common: the base has {len(result.only_base)} "
                           f"({'; '.join(result.only_base[:3])}…), the head {len(result.only_head)} "
                           f"({'; '.join(result.only_head[:3])}…)")
    chosen = groups[groups["series"].isin(both)]
    figures = None
    if opts.metric == "energy":
        chosen, figures = _with_energy(store, chosen, result.notes, not across)
    noise = ProcessNoise.measure(store, chosen, opts.kinds, opts.metric)
    result.rows = _rows(store, chosen, runs, opts, across, noise, figures)
    flagged = chosen[chosen["flagged"]]
    if not flagged.empty:
        ids = sorted(set(flagged["run_id"].astype(int)))
        listed = ", ".join(map(str, ids[:10])) + (" …" if len(ids) > 10 else "")
        result.notes.append(
            f"{len(flagged)} run × series flagged noisy or interfered (runs {listed}): "
            + ("counted, as --include-flagged asks" if opts.include_flagged
               else "left out of the verdicts (--include-flagged counts them)"))
    if across:
        result.notes.append("the sides share no device name: series are matched across devices")
    return result


def _with_energy(store: Store, chosen: pd.DataFrame, notes: list[str], with_device: bool
                 ) -> tuple[pd.DataFrame, dict[energy.Key, energy.Figure]]:
    """The series with an energy figure in some run, and the figures; the series measured in no run are left out
    (a note names them); raises CompareError (the not-measured line) where no chosen run carries a figure."""
    figures = energy.load_figures(store, sorted(set(chosen["run_id"].astype(int))))
    has = pd.Series([energy.figure(figures, r, p, b) is not None
                     for r, p, b in zip(chosen["run_id"], chosen["phase"], chosen["batch"])], index=chosen.index)
    measured = set(chosen.loc[has, "series"])
    if not measured:
        raise CompareError(energy.not_measured_line(store, chosen["run_id"]))
    bare = chosen[~chosen["series"].isin(measured)]
    if not bare.empty:
        labels = [series_label(r, with_device) for r in bare.drop_duplicates("series").to_dict("records")]
        notes.append(f"{len(labels)} series with no energy figure in any run left out: " + "; ".join(labels[:5])
                     + (" …" if len(labels) > 5 else ""))
    return chosen[chosen["series"].isin(measured)], figures


# -- process-to-process noise measured earlier on a machine ----------------------------------------------------------
MachineKey = tuple[str, str]  # (device name, host)


@dataclass
class ProcessNoise:
    """The spread between the processes of earlier repeat groups (runs of one series sharing a group, unflagged), as
    the standard deviation of their log medians, pooled over groups: per series and machine, and per machine over
    every series (only for "repeats needed")."""
    series: dict[tuple, tuple[float, int]] = field(default_factory=dict)  # key → (σ, groups)
    machine: dict[MachineKey, float] = field(default_factory=dict)

    @staticmethod
    def key(row: dict[str, Any]) -> tuple:
        return (*(row[c] for c in SERIES_COLUMNS), row["device_name"], row.get("hostname") or "")

    @classmethod
    def measure(cls, store: Store, wanted: pd.DataFrame, kinds: Sequence[str], metric: str = "time"
                ) -> ProcessNoise:
        """From every ok run of a repeat group (params.repeats > 1) on the machines `wanted` ran on: the spread of
        their sample medians (time) or of their energy figures (energy)."""
        machines = set(zip(wanted["device_name"], wanted["hostname"].fillna("")))
        found = cls()
        runs = select_runs(store, Spec(text="(repeat groups)"), kinds)
        if runs.empty:
            return found
        runs = runs[[int(p.get("repeats", 1) or 1) > 1 for p in runs["params"]]]
        runs = runs[[(d, h) in machines for d, h in zip(runs["device_name"], runs["hostname"])]]
        if runs.empty:
            return found
        if metric == "energy":
            medians = energy.to_frame(energy.load_figures(store, list(runs["run_id"])))
        else:
            with store.connect(read_only=True) as con:
                medians = con.execute(
                    "SELECT run_id, phase, coalesce(batch_size, -1) AS batch, median(value) AS med FROM samples "
                    "WHERE run_id IN (SELECT unnest(?::BIGINT[])) AND isfinite(value) AND value > 0 GROUP BY ALL",
                    _ids_arg(list(runs["run_id"]))).df()
        rows = medians.merge(runs, on="run_id")
        rows = rows[~_flagged(rows)]
        pooled: dict[tuple, list[float]] = {}
        by_machine: dict[MachineKey, list[float]] = {}
        for _, group in rows.groupby(SERIES_COLUMNS + ["device_name", "hostname", "group_id"], dropna=False):
            if len(group) < 2:
                continue
            logs = np.log(group["med"].to_numpy(dtype=float))
            var, df = float(np.var(logs, ddof=1)), len(group) - 1
            first = group.iloc[0].to_dict()
            pooled.setdefault(cls.key(first), []).append((var, df))
            by_machine.setdefault((first["device_name"], first["hostname"]), []).append((var, df))
        for key, parts in pooled.items():
            found.series[key] = (math.sqrt(sum(v * d for v, d in parts) / sum(d for _, d in parts)), len(parts))
        for key, parts in by_machine.items():
            found.machine[key] = math.sqrt(sum(v * d for v, d in parts) / sum(d for _, d in parts))
        return found


def _rows(store: Store, groups: pd.DataFrame, runs: pd.DataFrame, opts: Options, across: bool,
          noise: ProcessNoise, figures: dict[energy.Key, energy.Figure] | None = None) -> list[Row]:
    """One row per series: judged on the raw samples, or on the runs' energy figures where `figures` is given."""
    ids = sorted(set(groups["run_id"].astype(int)))
    samples = _load_samples(store, ids) if figures is None else pd.DataFrame(
        columns=["run_id", "phase", "batch", "value", "unit"])
    by_run = {k: v["value"].to_numpy() for k, v in samples.groupby(["run_id", "phase", "batch"])}
    units = samples.groupby(["run_id", "phase"])["unit"].first().to_dict()
    metrics = _correctness_rows(store, ids)
    params = dict(zip(runs["run_id"], runs["params"]))
    rows = []
    for _, series in groups.sort_values("run_id").groupby("series"):
        sides = {side: part for side, part in series.groupby("side")}
        newest = sides["head"].iloc[-1].to_dict()  # the head's newest run: the label, unit and command come from it
        phase, batch = newest["phase"], int(newest["batch"])
        left_out = sorted(int(r) for r in series.loc[series["flagged"], "run_id"]) if not opts.include_flagged \
            else []
        kept = {s: part if opts.include_flagged else part[~part["flagged"]] for s, part in sides.items()}
        side_runs = {s: [int(r) for r in part["run_id"]] for s, part in kept.items()}
        sigma = {s: noise.series.get(ProcessNoise.key(part.iloc[-1].to_dict())) for s, part in sides.items()}
        machine = {s: noise.machine.get((part.iloc[-1]["device_name"], part.iloc[-1]["hostname"]))
                   for s, part in sides.items()}
        correct = [_side_correctness(metrics, side_runs[s], phase, batch, newest["kind"]) for s in ("base", "head")]
        device = " → ".join(", ".join(sorted(set(sides[s]["device_name"].astype(str)))) for s in ("base", "head")) \
            if across else str(newest["device_name"])
        command = reproduce_command(newest["kind"], params[newest["run_id"]], newest["mode"], newest["device"],
                                    phase, batch)
        if figures is not None:
            found = {s: [(r, energy.figure(figures, r, phase, batch)) for r in run_list]
                     for s, run_list in side_runs.items()}
            rows.append(_energy_row(series_label(newest, not across), newest, device, found, opts, correct, command,
                                    sigma, machine, left_out))
            continue
        arrays = {s: [by_run[(r, phase, batch)] for r in run_list] for s, run_list in side_runs.items()}
        rows.append(_row(series_label(newest, not across), newest, device, arrays, side_runs, opts, correct,
                         units.get((int(newest["run_id"]), phase), ""), command, sigma, machine, left_out))
    order = {v: i for i, v in enumerate(verdict_names(opts.metric))}
    return sorted(rows, key=lambda r: (order[r.verdict], -abs(math.log(r.ratio)) if r.ratio == r.ratio else 0,
                                       r.series))


def _row(label: str, newest: dict[str, Any], device: str, arrays: dict[str, list[np.ndarray]],
         side_runs: dict[str, list[int]], opts: Options, correct: list[dict[str, float]], unit: str,
         command: str, sigma: dict[str, tuple[float, int] | None], machine: dict[str, float | None],
         left_out: list[int]) -> Row:
    base, head = arrays["base"], arrays["head"]
    text, worse = correctness_text(*correct)
    batch = int(newest["batch"])
    row = Row(series=label, kind=newest["kind"], workload=newest["workload"], mode=newest["mode"],
              phase=newest["phase"], batch_size=batch if batch >= 0 else None, config=newest["config"],
              device=device, n_base=sum(map(len, base)), n_head=sum(map(len, head)), runs_base=side_runs["base"],
              runs_head=side_runs["head"], median_base=float("nan"), median_head=float("nan"), unit=unit,
              ratio=float("nan"), ci_low=float("nan"), ci_high=float("nan"), p_value=float("nan"),
              verdict="cannot tell", correctness=text, correctness_worse=worse, command=command,
              procs_base=len(base), procs_head=len(head), flagged_left_out=left_out)
    if not base or not head:
        row.why = (f"every {' and '.join(s for s in ('base', 'head') if not arrays[s])} run of this series is "
                   f"flagged (runs {', '.join(map(str, left_out))}); --include-flagged counts them")
        return row
    pooled_base, pooled_head = np.concatenate(base), np.concatenate(head)
    row.median_base, row.median_head = float(np.median(pooled_base)), float(np.median(pooled_head))
    row.p_value = mann_whitney(pooled_base, pooled_head)[1]
    seed = zlib.crc32(label.encode()) ^ opts.seed
    lonely = [s for s, runs in (("base", base), ("head", head)) if len(runs) < 2]
    known = {s: sigma[s][0] for s in lonely if sigma.get(s) is not None}
    if min(len(pooled_base), len(pooled_head)) < opts.min_samples:
        row.ratio, row.ci_low, row.ci_high = ratio_ci(base, head, resamples=opts.resamples, alpha=opts.alpha,
                                                      seed=seed)
        row.verdict = "too few samples"
        return row
    if lonely and len(known) < len(lonely):
        row.ratio, row.ci_low, row.ci_high = ratio_ci(base, head, resamples=opts.resamples, alpha=opts.alpha,
                                                      seed=seed)  # within the processes only: shown, not judged
        _cannot_tell(row, lonely, machine, opts, "this series")
        return row
    row.ratio, row.ci_low, row.ci_high = process_ratio_ci(
        base, head, resamples=opts.resamples, alpha=opts.alpha, seed=seed,
        sigma_base=known.get("base"), sigma_head=known.get("head"))
    row.process_noise = _noise_text(row, lonely, known, sigma)
    row.verdict = verdict(row.ratio, row.ci_low, row.ci_high, len(pooled_base), len(pooled_head),
                          threshold=opts.threshold, min_samples=opts.min_samples)
    return row


def _cannot_tell(row: Row, lonely: list[str], machine: dict[str, float | None], opts: Options, what: str) -> None:
    """A side of one process and no process noise measured for `what` on its machine: the repeats a side needs."""
    guess = next((machine[s] for s in lonely if machine.get(s) is not None), None)
    row.repeats_needed = repeats_needed(guess if guess is not None else GUESSED_PROCESS_NOISE, opts.threshold,
                                        opts.alpha)
    row.why = (f"{row.procs_base} process(es) base, {row.procs_head} head, and no process-to-process noise "
               f"measured for {what} on {'these machines' if ' → ' in row.device else 'this machine'}: run "
               f"each side with bench --repeat {row.repeats_needed} (from "
               + (f"the machine's other series' σ = {100 * guess:.1f} %)" if guess is not None else
                  f"an assumed σ = {100 * GUESSED_PROCESS_NOISE:.0f} % between processes)"))


def _noise_text(row: Row, lonely: list[str], known: dict[str, float], sigma: dict[str, tuple[float, int] | None]
                ) -> str:
    return "; ".join(
        [f"{s}: σ = {100 * known[s]:.1f} % from {sigma[s][1]} earlier repeat group(s) on its machine"
         for s in lonely] or [f"between these runs' processes ({row.procs_base} + {row.procs_head})"])


def _energy_row(label: str, newest: dict[str, Any], device: str,
                found: dict[str, list[tuple[int, energy.Figure | None]]], opts: Options,
                correct: list[dict[str, float]], command: str, sigma: dict[str, tuple[float, int] | None],
                machine: dict[str, float | None], left_out: list[int]) -> Row:
    """A series judged on its runs' energy figures, one per run (process): the ratio of the sides' median figures
    with the process-level bootstrap CI; the median above the idle draw is reported beside it."""
    figures = {s: [f for _, f in pairs if f is not None] for s, pairs in found.items()}
    text, worse = correctness_text(*correct)
    batch = int(newest["batch"])
    unit = next((f[2] for s in ("head", "base") for f in figures[s]), "J")
    runs = {s: [r for r, f in pairs if f is not None] for s, pairs in found.items()}
    base, head = ([f[0] for f in figures[s]] for s in ("base", "head"))
    row = Row(series=label, kind=newest["kind"], workload=newest["workload"], mode=newest["mode"],
              phase=newest["phase"], batch_size=batch if batch >= 0 else None, config=newest["config"],
              device=device, n_base=len(base), n_head=len(head), runs_base=runs["base"], runs_head=runs["head"],
              median_base=float("nan"), median_head=float("nan"), unit=unit, ratio=float("nan"),
              ci_low=float("nan"), ci_high=float("nan"), p_value=float("nan"), verdict="cannot tell",
              correctness=text, correctness_worse=worse, command=command, procs_base=len(base),
              procs_head=len(head), flagged_left_out=left_out,
              unmeasured=sorted(r for pairs in found.values() for r, f in pairs if f is None))
    if not found["base"] or not found["head"]:
        row.why = (f"every {' and '.join(s for s in ('base', 'head') if not found[s])} run of this series is "
                   f"flagged (runs {', '.join(map(str, left_out))}); --include-flagged counts them")
        return row
    if not base or not head:
        missing = [s for s in ("base", "head") if not figures[s]]
        row.why = (f"no energy figure in the {' and '.join(missing)} runs of this series (runs "
                   f"{', '.join(str(r) for s in missing for r, _ in found[s])}): NVML or RAPL not available there")
        return row
    row.median_base, row.median_head = float(np.median(base)), float(np.median(head))
    for side, values in (("base", figures["base"]), ("head", figures["head"])):
        above = [f[1] for f in values if f[1] == f[1]]
        setattr(row, f"above_idle_{side}", float(np.median(above)) if above else float("nan"))
    row.p_value = mann_whitney(base, head)[1]
    lonely = [s for s, values in (("base", base), ("head", head)) if len(values) < 2]
    known = {s: sigma[s][0] for s in lonely if sigma.get(s) is not None}
    if lonely and len(known) < len(lonely):
        row.ratio = row.median_head / row.median_base  # one figure a side: no interval to show
        _cannot_tell(row, lonely, machine, opts, "this series' energy")
        return row
    row.ratio, row.ci_low, row.ci_high = figure_ratio_ci(
        base, head, resamples=opts.resamples, alpha=opts.alpha, seed=zlib.crc32(label.encode()) ^ opts.seed,
        sigma_base=known.get("base"), sigma_head=known.get("head"))
    row.process_noise = _noise_text(row, lonely, known, sigma)
    judged = verdict(row.ratio, row.ci_low, row.ci_high, len(base), len(head), threshold=opts.threshold,
                     min_samples=1)  # one figure per process: the process count is the sample size
    row.verdict = ENERGY_WORDS.get(judged, judged)
    return row


# -- output ----------------------------------------------------------------------------------------------------------
def fmt_value(value: float, unit: str) -> str:
    if unit.startswith("J/"):
        return fmt_joules(value) + unit[1:]
    if unit != "us":
        return f"{value:.4g} {unit}".strip()
    if value >= 1e6:
        return f"{value / 1e6:.3f} s"
    return f"{value / 1e3:.3f} ms" if value >= 1e3 else f"{value:.2f} µs"


def _ratio_text(r: Row) -> str:
    if r.ratio != r.ratio:
        return "—"
    if r.ci_low != r.ci_low:
        return f"{r.ratio:.3f} [—]"
    return f"{r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" + (" (within processes)" if r.verdict == "cannot tell"
                                                                 else "")


def _above_idle_text(r: Row) -> str:
    """'0.21 J/step (41 %) → 0.25 J/step (44 %)': the median above the idle draw and its share of the whole."""
    parts = [f"{fmt_value(a, r.unit)} ({100 * a / w:.0f} %)" if a == a and w == w and w > 0 else "—"
             for a, w in ((r.above_idle_base, r.median_base), (r.above_idle_head, r.median_head))]
    return "—" if parts == ["—", "—"] else " → ".join(parts)


def table(comparison: Comparison) -> pd.DataFrame:
    """One display row per series (the page's table and the CLI's)."""
    if comparison.metric == "energy":
        return pd.DataFrame([{
            "#": i, "series": r.series, "runs base/head": f"{r.procs_base}/{r.procs_head}",
            "energy base → head": "—" if r.median_base != r.median_base else
            f"{fmt_value(r.median_base, r.unit)} → {fmt_value(r.median_head, r.unit)}",
            "above idle base → head": _above_idle_text(r), "ratio [CI]": _ratio_text(r),
            "p (MWU)": "—" if r.p_value != r.p_value else f"{r.p_value:.2g}",
            "verdict": r.verdict, "correctness": ("⚠ " if r.correctness_worse else "") + (r.correctness or "—"),
        } for i, r in enumerate(comparison.rows, 1)])
    return pd.DataFrame([{
        "#": i, "series": r.series, "procs base/head": f"{r.procs_base}/{r.procs_head}",
        "n base/head": f"{r.n_base}/{r.n_head}",
        "median base → head": "—" if r.median_base != r.median_base else
        f"{fmt_value(r.median_base, r.unit)} → {fmt_value(r.median_head, r.unit)}",
        "ratio [CI]": _ratio_text(r),
        "p (MWU)": "—" if r.p_value != r.p_value else f"{r.p_value:.2g}",
        "verdict": r.verdict, "correctness": ("⚠ " if r.correctness_worse else "") + (r.correctness or "—"),
    } for i, r in enumerate(comparison.rows, 1)])


def render(comparison: Comparison) -> str:
    c = comparison
    counts = ", ".join(f"{n} {v}" for v, n in c.counts().items() if n)
    method = (f"head/base ratio of medians, {100 * (1 - c.alpha):g} % hierarchical-bootstrap CI (processes, then "
              f"samples; B = {c.resamples}, seed {c.seed}); slower/faster: CI clear of 1 and the ratio beyond "
              f"{100 * c.threshold:g} %") if c.metric == "time" else (
        f"energy (whole board or CPU package; above idle beside it): head/base ratio of the runs' median figures, "
        f"{100 * (1 - c.alpha):g} % bootstrap CI over the runs (B = {c.resamples}, seed {c.seed}); more/less "
        f"energy: CI clear of 1 and the ratio beyond {100 * c.threshold:g} %")
    lines = [f"base: {c.base} ({len(c.base_runs)} runs)   head: {c.head} ({len(c.head_runs)} runs)", method, "",
             table(c).to_string(index=False), ""]
    for i, r in enumerate(c.rows, 1):
        if r.why:
            lines.append(f"[{i}] cannot tell: {r.why}")
        elif r.process_noise:
            lines.append(f"[{i}] process noise: {r.process_noise}")
        if r.flagged_left_out:
            lines.append(f"[{i}] left out as flagged: runs {', '.join(map(str, r.flagged_left_out))}")
        if r.unmeasured:
            lines.append(f"[{i}] no energy figure, left out: runs {', '.join(map(str, r.unmeasured))}")
    lines += ["", "reproduce the head side:"]
    lines += [f"  [{i}] {r.command}" for i, r in enumerate(c.rows, 1)]
    for title, names in (("only in the base", c.only_base), ("only in the head", c.only_head)):
        if names:
            lines.append(f"{title} ({len(names)}): " + "; ".join(names[:8]) + (" …" if len(names) > 8 else ""))
    lines += [f"note: {n}" for n in c.notes]
    lines.append(f"\n{counts}" + (" — REGRESSION" if c.regressed else " — CANNOT TELL" if c.undecided else ""))
    return "\n".join(lines)


def to_json(comparison: Comparison) -> str:
    data = asdict(comparison)
    data["regressed"] = comparison.regressed
    data["undecided"] = comparison.undecided
    data["exit_code"] = comparison.exit_code
    data["counts"] = comparison.counts()
    return json.dumps(data, indent=2, default=str)
