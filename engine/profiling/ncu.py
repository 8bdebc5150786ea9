"""Deep profile: Nsight Compute (`ncu`) on the top-k kernels of a profile, in a subprocess.

    ncu --clock-control none --target-processes all --profile-from-start off -k regex:<top-k kernel names>
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,
                  sm__throughput.avg.pct_of_peak_sustained_elapsed
        --csv --log-file ncu.csv  python -m engine.profiling.ncu --workload … --mode … --phase train …

The target (this module's main) builds the same step as the profile, runs it until warm, then brackets `--steps` steps
with cudaProfilerStart/Stop so ncu measures steady-state launches only (not compilation or autotuning). Clocks are
left alone (`--clock-control none`) so durations match what the application sees. The CSV (one row per kernel
launch and metric) is parsed into one row per kernel: launches, mean duration (µs), achieved DRAM throughput and SM
throughput (% of peak), for the ncu_kernel_metrics table.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.measure.op_stats import base_name
from engine.store.db import Artifact, Metric, RunResult

METRICS = {
    "gpu__time_duration.sum": "duration_us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "mem_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
}
NOT_FOUND = "Nsight Compute (ncu) not found on PATH"
TIME_UNITS_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "nsec": 1e-3, "us": 1.0, "usecond": 1.0, "usec": 1.0,
                    "ms": 1e3, "msecond": 1e3, "msec": 1e3, "s": 1e6, "second": 1e6, "sec": 1e6}
REPO_ROOT = Path(__file__).resolve().parents[2]


def ncu_path() -> str | None:
    return shutil.which("ncu")


def top_kernel_names(rows: list[dict]) -> list[str]:
    """Kernel names of op_stats rows, by own device time, longest first (what a deep profile measures)."""
    return [r["name"] for r in sorted((r for r in rows if r["kind"] == "kernel"), key=lambda r: -r["self_us"])]


def unavailable(device: str) -> str | None:
    """Why a deep profile cannot run here, or None."""
    if ncu_path() is None:
        return NOT_FOUND
    if not device.startswith("cuda"):
        return "Nsight Compute measures CUDA kernels; pick a CUDA device"
    return None


def deep_targets(device: str, rows: list[dict], what: str) -> tuple[list[str], str | None]:
    """The kernels a deep profile of `what` would measure (longest first), or why it cannot run: ncu missing, not a
    CUDA device, or a profile without kernels. The callers turn the reason into a run note, never a failure."""
    reason = unavailable(device)
    if reason:
        return [], f"deep profile skipped: {reason}"
    kernels = top_kernel_names(rows)
    if not kernels:
        return [], f"deep profile of {what} skipped: the profile recorded no kernels"
    return kernels, None


def kernel_regex(kernels: Sequence[str]) -> str:
    """`regex:` filter for ncu -k matching any of these kernels by function name (ncu's default name base)."""
    names = sorted({base_name(k) for k in kernels if base_name(k)})
    if not names:
        raise ValueError("no kernel names to filter on")
    return "regex:" + "|".join(re.escape(n) for n in names)


def ncu_options(kernels: Sequence[str] | None, *, ncu: str = "ncu", metrics: Sequence[str] = tuple(METRICS),
                log_file: str | os.PathLike[str] | None = None) -> list[str]:
    """ncu and its options: clocks left alone, child processes followed, measuring only between the target's
    cudaProfilerStart/Stop; `kernels` None measures every kernel in that range."""
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off"]
    if kernels is not None:
        cmd += ["-k", kernel_regex(kernels)]
    cmd += ["--metrics", ",".join(metrics), "--csv"]
    if log_file is not None:
        cmd += ["--log-file", str(log_file)]
    return cmd


def build_command(kernels: Sequence[str], target_args: Sequence[str], *, ncu: str = "ncu",
                  python: str = sys.executable, log_file: str | os.PathLike[str] | None = None) -> list[str]:
    """The ncu command line that measures `kernels` while `python -m engine.profiling.ncu target_args` runs."""
    return ncu_options(kernels, ncu=ncu, log_file=log_file) + [python, "-m", "engine.profiling.ncu", *target_args]


def _number(text: Any) -> float | None:
    if text is None:
        return None
    s = str(text).strip().replace(",", "")
    if not s or s.lower() in {"n/a", "nan", "-"}:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def _csv_lines(text: str) -> list[str]:
    """The CSV part of ncu's output: from the header line on, without ==PROF==/==WARNING== lines."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("==")]
    for i, line in enumerate(lines):
        if line.startswith('"ID"') or line.startswith("ID,"):
            return lines[i:]
    return []


def parse_csv(text: str) -> list[dict[str, Any]]:
    """ncu --csv output → [{id, kernel, metric, unit, value}], one per kernel launch and metric.

    Understands the default 'details' page (one row per launch and metric: … "Kernel Name", … "Metric Name",
    "Metric Unit", "Metric Value") and the 'raw' page (one row per launch, a column per metric, a units row).
    """
    lines = _csv_lines(text)
    if not lines:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    fields = reader.fieldnames or []
    out: list[dict[str, Any]] = []
    if "Metric Name" in fields:
        for row in reader:
            metric = (row.get("Metric Name") or "").strip()
            if not metric or row.get("ID") == "ID":
                continue
            out.append({"id": row.get("ID"), "kernel": (row.get("Kernel Name") or "").strip(), "metric": metric,
                        "unit": (row.get("Metric Unit") or "").strip(), "value": _number(row.get("Metric Value"))})
        return out
    metric_cols = [f for f in fields if f in METRICS or re.fullmatch(r"[a-z0-9_]+__[\w.]+", f or "")]
    units: dict[str, str] = {}
    for row in reader:
        if not (row.get("ID") or "").strip() or not (row.get("Kernel Name") or "").strip():
            units = {c: (row.get(c) or "").strip() for c in metric_cols}  # the units row right after the header
            continue
        for c in metric_cols:
            out.append({"id": row.get("ID"), "kernel": row["Kernel Name"].strip(), "metric": c,
                        "unit": units.get(c, ""), "value": _number(row.get(c))})
    return out


def to_us(value: float, unit: str) -> float:
    return value * TIME_UNITS_TO_US.get(unit.strip().lower(), 1e-3)  # ncu's time default is nanoseconds


def summarize(raw: Sequence[dict[str, Any]], phase: str | None = None) -> list[dict[str, Any]]:
    """One row per kernel: launches and the mean of each metric over its launches (durations in µs)."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    units: dict[str, str] = {}
    launches: dict[str, set] = defaultdict(set)
    order: list[str] = []
    for r in raw:
        kernel = r["kernel"]
        if kernel not in launches:
            order.append(kernel)
        launches[kernel].add(r["id"])
        if r["value"] is None:
            continue
        value = r["value"]
        if r["metric"] == "gpu__time_duration.sum":
            value, unit = to_us(value, r["unit"]), "us"
        else:
            unit = r["unit"]
        values[kernel][r["metric"]].append(value)
        units[r["metric"]] = unit
    rows = []
    for kernel in order:
        means = {m: sum(v) / len(v) for m, v in values[kernel].items() if v}
        row: dict[str, Any] = {"phase": phase, "kernel": kernel, "launches": len(launches[kernel])}
        for metric, column in METRICS.items():
            row[column] = means.get(metric)
        row["metrics"] = json.dumps({m: {"mean": v, "unit": units.get(m, "")} for m, v in means.items()})
        rows.append(row)
    rows.sort(key=lambda r: -(r["duration_us"] or 0.0))
    return rows


@dataclass
class DeepResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    command: list[str] = field(default_factory=list)

    def add_to(self, result: RunResult, phase: str, batch_size: int | None = None) -> None:
        """Into a run's result: the kernel rows, the notes, the CSV and log as artifacts, and `ncu_kernels`."""
        result.kernel_metrics.extend(self.rows)
        result.notes.extend(self.notes)
        result.artifacts += [Artifact(kind="ncu_csv" if path.suffix == ".csv" else "ncu_log", name=path.name,
                                      path=str(path)) for path in self.files]
        result.metrics.append(Metric("ncu_kernels", float(len(self.rows)), "", phase=phase, batch_size=batch_size))


def target_args(workload: str, mode: str, device: str, phase: str, batch_size: int, settle: int, steps: int
                ) -> list[str]:
    return ["--workload", workload, "--mode", mode, "--device", device, "--phase", phase,
            "--batch-size", str(batch_size), "--settle", str(settle), "--steps", str(steps)]


def run_deep_profile(*, workload: str, mode: str, device: str, phase: str, batch_size: int, kernels: Sequence[str],
                     out_dir: Path, settle: int = 3, steps: int = 1, timeout_s: float = 900.0,
                     ncu: str | None = None) -> DeepResult:
    """Run ncu on the step (in a subprocess) and parse its per-kernel metrics; problems become notes."""
    exe = ncu or ncu_path()
    if exe is None:
        return DeepResult(notes=[NOT_FOUND])
    csv_path = out_dir / f"ncu-{phase}.csv"
    cmd = build_command(kernels, target_args(workload, mode, device, phase, batch_size, settle, steps), ncu=exe,
                        log_file=csv_path)
    return run_ncu(cmd, csv_path, phase, timeout_s)


def run_ncu(cmd: list[str], csv_path: Path, phase: str | None, timeout_s: float) -> DeepResult:
    """Run an ncu command line whose options write `csv_path` (--log-file); parse one row per kernel. The log of
    the run lands beside the CSV. A timeout, a failure to start, a non-zero exit or no kernels become notes."""
    what = phase or "the call"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    result = DeepResult(command=cmd)
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        result.notes.append(f"Nsight Compute did not finish within {timeout_s:.0f} s; deep profile of {what} skipped")
        return result
    except OSError as exc:
        result.notes.append(f"could not start Nsight Compute: {exc}")
        return result
    log = csv_path.with_suffix(".log")
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    result.files.append(log)
    text = csv_path.read_text(errors="replace") if csv_path.exists() else proc.stdout
    if csv_path.exists():
        result.files.append(csv_path)
    result.rows = summarize(parse_csv(text), phase)
    errors = [line.strip() for line in (text + "\n" + proc.stderr).splitlines() if "==ERROR==" in line]
    if proc.returncode != 0 or not result.rows:
        why = "; ".join(errors[:3]) or (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if "ERR_NVGPUCTRPERM" in text + proc.stderr:
            why = ("ERR_NVGPUCTRPERM: this user may not read GPU performance counters (run as root or allow "
                   "profiling: NVreg_RestrictProfilingToAdminUsers=0)")
        result.notes.append(f"Nsight Compute measured {len(result.rows)} kernel(s) of {what} "
                            f"(exit code {proc.returncode}): {why}")
    return result


# -- the target ncu runs ------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.profiling.ncu",
                                     description="Run a profile's step under Nsight Compute (started by ncu).")
    parser.add_argument("--workload", default="house_price")
    parser.add_argument("--mode", default="eager")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--phase", default="train")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--settle", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from engine.bench.run import _sync, build_step
    from engine.modes import get_mode
    from engine.workloads import get_workload

    workload = get_workload(args.workload)
    base_model = workload.make_model().to(args.device)
    with torch.set_grad_enabled(args.phase == "train"):
        step, _ = build_step(workload, get_mode(args.mode), base_model, args.phase, args.batch_size, args.device)
        for _ in range(1 + args.settle):
            step()
        _sync(args.device)
        torch.cuda.profiler.start()  # ncu --profile-from-start off measures from here …
        for _ in range(args.steps):
            step()
        _sync(args.device)
        torch.cuda.profiler.stop()  # … to here
    return 0


if __name__ == "__main__":
    sys.exit(main())
