"""Reading level runs back from the store: one row per run with its figures, for the CLI table and the page."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from engine.measure.op_stats import short_name
from engine.store.db import Store
from engine.store.report import parse_conditions, run_state

FIGURES = {"median": "median_us", "p10": "p10_us", "p90": "p90_us", "first_call": "first_call_us",
           "flops_per_s": "flops_per_s", "bytes_per_s": "bytes_per_s", "intensity": "intensity",
           "rel_l2_err": "rel_l2_err", "tolerance": "tolerance", "interpreted": "interpreted",
           "pct_copy_bw": "pct_copy_bw", "flops": "flops", "min_bytes": "min_bytes",
           "ceiling_copy_bw": "ceiling_copy_bw", "ceilings_run_id": "ceilings_run_id",
           "graph_median": "graph_median_us",  # CUDA runs: the calls replayed from a CUDA graph (device time)
           "kernel_median": "kernel_median_us"}  # CUDA runs: the profiler's device busy time per call


def level_results(store: Store, *, run_ids: Sequence[int] | None = None, component: str | None = None,
                  shape: str | None = None, device: str | None = None, phase: str = "forward",
                  latest_only: bool = False) -> pd.DataFrame:
    """Level runs (ok and failed) with their `phase` figures and their timing's state, flags and condition notes
    (engine.measure.noise); `speedup` is vs the newest ok L1-naive run of the same component, shape and device.
    latest_only keeps the newest run per (component, shape, level, device)."""
    where, args = ["kind = 'levels'"], []
    if run_ids is not None:
        if not run_ids:
            return pd.DataFrame()
        where.append(f"id IN ({','.join('?' * len(run_ids))})")
        args += [int(r) for r in run_ids]
    for column, value in (("workload", component), ("device", device)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    runs = store.query(f"SELECT id, group_id, workload, mode, device, status, error, params, notes, conditions, "
                       f"finished_at FROM runs WHERE {' AND '.join(where)} ORDER BY id", args)
    if runs.empty:
        return runs
    runs["shape"] = [json.loads(p or "{}").get("shape") for p in runs["params"]]
    judged = [run_state(c) for c in runs["conditions"]]  # the timing's noise state: a flagged figure is no headline
    runs["state"] = [state for state, _ in judged]
    runs["flags"] = ["; ".join(flags) for _, flags in judged]
    runs["condition_notes"] = ["; ".join(map(str, (parse_conditions(c) or {}).get("notes") or []))
                               for c in runs["conditions"]]
    if shape is not None:
        runs = runs[runs["shape"] == shape]
    if latest_only:
        runs = runs.groupby(["workload", "shape", "mode", "device"], as_index=False).tail(1)
    if runs.empty:
        return runs
    metrics = store.metrics(list(runs["id"]))
    if not metrics.empty:
        metrics = metrics[(metrics["phase"] == phase) | metrics["name"].str.startswith("ceiling")]
        wide = metrics.pivot_table(index="run_id", columns="name", values="value", aggfunc="last")
        pct = [c for c in wide.columns if c.startswith("pct_matmul_")]
        wide["pct_matmul"] = wide[pct].bfill(axis=1).iloc[:, 0] if pct else float("nan")
        wide["matmul_ceiling_name"] = [next((c[len("pct_matmul_"):] for c in pct if pd.notna(wide.at[i, c])), None)
                                       for i in wide.index]
        keep = {k: v for k, v in FIGURES.items() if k in wide.columns}
        wide = wide[list(keep) + ["pct_matmul", "matmul_ceiling_name"]].rename(columns=keep)
        runs = runs.merge(wide, left_on="id", right_index=True, how="left")
    for column in FIGURES.values():
        if column not in runs.columns:
            runs[column] = float("nan")
    runs["speedup"] = float("nan")
    baselines = _naive_medians(store, phase)
    for i, r in runs.iterrows():
        base = baselines.get((r["workload"], r["shape"], r["device"]))
        if base and pd.notna(r["median_us"]) and r["median_us"] > 0:
            runs.at[i, "speedup"] = base / r["median_us"]
    return runs.reset_index(drop=True)


def _naive_medians(store: Store, phase: str) -> dict[tuple[str, str, str], float]:
    frame = store.query(
        "SELECT r.id, r.workload, r.device, r.params, m.value FROM runs r JOIN metrics m ON m.run_id = r.id "
        "WHERE r.kind = 'levels' AND r.mode = 'L1-naive' AND r.status = 'ok' AND m.name = 'median' AND m.phase = ? "
        "ORDER BY r.id", [phase])
    out: dict[tuple[str, str, str], float] = {}
    for _, r in frame.iterrows():
        out[(r["workload"], json.loads(r["params"] or "{}").get("shape"), r["device"])] = float(r["value"])
    return out


def stage_results(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """Per-run figures of the stages timed on their own (e.g. the ViT patch embedding)."""
    metrics = store.metrics(list(run_ids))
    if metrics.empty:
        return metrics
    stages = metrics[~metrics["phase"].isin(["forward"]) & metrics["phase"].notna()]
    if stages.empty:
        return stages
    return stages.pivot_table(index=["run_id", "phase"], columns="name", values="value",
                              aggfunc="last").reset_index()


DEEP_COLUMNS = {  # ncu metric → column of deep_table (the first three are ncu_kernel_metrics' own columns)
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
    "launch__registers_per_thread": "regs/thread",
    # engine.levels.run.PIPE_METRICS: % of the pipe's peak while the SM is active; stalls: warps per issued
    # instruction
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe %",  # mma.sync and wgmma
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "XU %",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall memory",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall barrier",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall wait",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "stall math pipe",
}


def deep_table(store: Store, run_ids: Sequence[int]) -> pd.DataFrame:
    """`levels --deep`: one row per (run, kernel) that Nsight Compute measured — the level, the kernel, its launches
    over the measured calls, mean µs, DRAM and SM throughput (% of peak), achieved occupancy, registers per thread,
    and where measured the tensor and XU pipes' activity and the warps stalled per issued
    instruction on memory, barriers, fixed-latency waits and a busy math pipe (engine.levels.run.PIPE_METRICS)."""
    if not run_ids:
        return pd.DataFrame()
    kernels = store.kernel_metrics(list(run_ids))
    if kernels.empty:
        return pd.DataFrame()
    levels = store.query(f"SELECT id, mode FROM runs WHERE id IN ({','.join('?' * len(run_ids))})",
                         [int(i) for i in run_ids]).set_index("id")["mode"]
    rows = []
    for r in kernels.itertuples():
        extra = json.loads(r.metrics) if isinstance(r.metrics, str) and r.metrics else {}
        row = {"run": int(r.run_id), "level": levels.get(r.run_id, ""), "kernel": short_name(str(r.kernel), 60),
               "launches": int(r.launches), "us": r.duration_us, "DRAM %": r.mem_throughput_pct,
               "SM %": r.sm_throughput_pct}
        for metric, column in DEEP_COLUMNS.items():
            row[column] = (extra.get(metric) or {}).get("mean")
        rows.append(row)
    table = pd.DataFrame(rows)
    # a figure no row has (the pipe figures of an Nsight Compute that refused them): no column
    empty = [c for c in DEEP_COLUMNS.values() if c in table and table[c].isna().all()]
    return table.drop(columns=empty)
