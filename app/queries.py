"""Store queries the pages need beyond engine.store.db's: aggregated in SQL and LIMITed, so pages stay fast with
thousands of runs."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from engine.store.db import Store

STAT_COLUMNS = """
    max(CASE WHEN m.name = 'median' THEN m.value END) AS median_us,
    max(CASE WHEN m.name = 'p10' THEN m.value END) AS p10_us,
    max(CASE WHEN m.name = 'p90' THEN m.value END) AS p90_us,
    max(CASE WHEN m.name = 'first_call' THEN m.value END) AS first_call_us,
    max(CASE WHEN m.name = 'max_abs_err' THEN m.value END) AS max_abs_err,
    max(CASE WHEN m.name = 'recompiles' THEN m.value END) AS recompiles,
    max(CASE WHEN m.name = 'graph_breaks' THEN m.value END) AS graph_breaks,
    max(CASE WHEN m.name = 'native_median' THEN m.value END) AS native_median_us,
    max(CASE WHEN m.name = 'native_p10' THEN m.value END) AS native_p10_us,
    max(CASE WHEN m.name = 'native_p90' THEN m.value END) AS native_p90_us,
    max(CASE WHEN m.name = 'loop_median' THEN m.value END) AS loop_median_us,
    max(CASE WHEN m.name = 'loop_block' THEN m.value END) AS loop_block,
    max(CASE WHEN m.name = 'energy_per_step' THEN m.value END) AS j_per_step,
    max(CASE WHEN m.name = 'energy_above_idle_per_step' THEN m.value END) AS j_above_idle_per_step,
    max(CASE WHEN m.name = 'avg_power_w' THEN m.value END) AS avg_power_w
"""


def latest_medians(store: Store, limit: int = 500) -> pd.DataFrame:
    """Median of every (phase, batch) of the latest ok bench run per workload, mode and device (Home's table)."""
    return store.query(f"""
        WITH latest AS (SELECT max(id) AS id FROM runs WHERE kind = 'bench' AND status = 'ok'
                        GROUP BY workload, mode, device)
        SELECT r.id AS run_id, r.workload, r.mode, r.device, r.finished_at, m.phase, m.batch_size,
               m.value AS median_us
        FROM latest JOIN runs r ON r.id = latest.id JOIN metrics m ON m.run_id = r.id
        WHERE m.name = 'median' AND m.phase IS NOT NULL
        ORDER BY r.device, r.mode, m.phase, m.batch_size
        LIMIT {int(limit)}
    """)


def latest_environment(store: Store) -> dict[str, Any] | None:
    frame = store.query("""
        SELECT e.*, r.device, r.finished_at FROM environments e JOIN runs r ON r.id = e.run_id
        ORDER BY e.run_id DESC LIMIT 1
    """)
    return None if frame.empty else frame.iloc[0].to_dict()


def stored_devices(store: Store, kind: str = "bench") -> list[str]:
    """Devices with at least one ok run of this kind, whether or not this machine has them."""
    frame = store.query("SELECT DISTINCT device FROM runs WHERE kind = ? AND status = 'ok' ORDER BY device", [kind])
    return [] if frame.empty else frame["device"].tolist()


def batch_sizes(store: Store, workload: str, device: str, phase: str) -> list[int]:
    """Batch sizes with at least one ok result for these filters."""
    frame = store.query("""
        SELECT DISTINCT m.batch_size FROM metrics m JOIN runs r ON r.id = m.run_id
        WHERE r.kind = 'bench' AND r.status = 'ok' AND r.workload = ? AND r.device = ? AND m.phase = ?
              AND m.name = 'median' AND m.batch_size IS NOT NULL
        ORDER BY 1
    """, [workload, device, phase])
    return [int(b) for b in frame.get("batch_size", [])]


def latest_summary(store: Store, workload: str, device: str, phase: str, batch_size: int) -> pd.DataFrame:
    """Per mode, the statistics of its latest ok run that measured this (phase, batch size).

    Unlike Store.latency_summary's "latest run per mode", a newer run that skipped this batch size does not hide
    the older one that has it. Columns match latency_summary, so engine.store.report.with_speedup applies.
    """
    return store.query(f"""
        WITH latest AS (
            SELECT max(r.id) AS id FROM runs r JOIN metrics m ON m.run_id = r.id
            WHERE r.kind = 'bench' AND r.status = 'ok' AND r.workload = ? AND r.device = ?
                  AND m.phase = ? AND m.batch_size = ? AND m.name = 'median'
            GROUP BY r.mode)
        SELECT r.id AS run_id, r.workload, r.mode, r.device, r.finished_at, m.phase, m.batch_size, {STAT_COLUMNS}
        FROM latest JOIN runs r ON r.id = latest.id JOIN metrics m ON m.run_id = r.id
        WHERE m.phase = ? AND m.batch_size = ?
        GROUP BY ALL ORDER BY r.id
    """, [workload, device, phase, batch_size, phase, batch_size])


def history(store: Store, workload: str, device: str, phase: str, batch_size: int, limit: int = 2000
            ) -> pd.DataFrame:
    """Median of every ok run at these filters, newest `limit` runs, oldest first."""
    frame = store.query(f"""
        SELECT r.id AS run_id, r.mode, r.finished_at, m.value AS median_us
        FROM runs r JOIN metrics m ON m.run_id = r.id
        WHERE r.kind = 'bench' AND r.status = 'ok' AND r.workload = ? AND r.device = ? AND m.phase = ?
              AND m.batch_size = ? AND m.name = 'median'
        ORDER BY r.id DESC LIMIT {int(limit)}
    """, [workload, device, phase, batch_size])
    return frame.iloc[::-1].reset_index(drop=True) if not frame.empty else frame


def samples_for(store: Store, summary: pd.DataFrame, phase: str, batch_size: int) -> pd.DataFrame:
    """Raw samples of the summary's runs at this batch size, labelled with their mode."""
    if summary.empty:
        return pd.DataFrame()
    frame = store.samples([int(r) for r in summary["run_id"]], phase=phase)
    if frame.empty:
        return frame
    frame = frame[frame["batch_size"] == batch_size]
    return frame.merge(summary[["run_id", "mode"]], on="run_id")


def latest_notes(store: Store, workload: str, device: str) -> dict[str, list[str]]:
    """mode → notes of its latest ok bench run on this device (e.g. TorchScript's deprecation warning)."""
    frame = store.query("""
        SELECT mode, notes FROM runs WHERE id IN (
            SELECT max(id) FROM runs WHERE kind = 'bench' AND status = 'ok' AND workload = ? AND device = ?
            GROUP BY mode)
    """, [workload, device])
    notes: dict[str, list[str]] = {}
    for mode, text in zip(frame.get("mode", []), frame.get("notes", [])):
        if isinstance(text, str) and text:
            try:
                notes[str(mode)] = [str(n) for n in json.loads(text)]
            except ValueError:
                notes[str(mode)] = [text]
    return notes


def device_ceilings(store: Store) -> pd.DataFrame:
    """The newest ceilings run per device name, one row each, in the store's units (B/s, FLOP/s, µs): one cheap
    aggregate query; pages pick the display unit per device (GB/s on a CPU, TB/s on a GPU)."""
    return store.query("""
        WITH latest AS (
            SELECT e.device_name, max(r.id) AS run_id FROM runs r JOIN environments e ON e.run_id = r.id
            WHERE r.kind = 'ceilings' AND r.status = 'ok' GROUP BY e.device_name)
        SELECT l.device_name AS device, l.run_id,
               max(CASE WHEN m.name = 'copy_bw' THEN m.value END) AS copy_bw,
               max(CASE WHEN m.name = 'matmul_bf16' THEN m.value END) AS matmul_bf16,
               max(CASE WHEN m.name = 'matmul_tf32' THEN m.value END) AS matmul_tf32,
               max(CASE WHEN m.name = 'matmul_fp32' THEN m.value END) AS matmul_fp32,
               max(CASE WHEN m.name = 'launch_us' THEN m.value END) AS launch_us,
               max(CASE WHEN m.name = 'graph_kernel_us' THEN m.value END) AS graph_kernel_us
        FROM latest l JOIN metrics m ON m.run_id = l.run_id GROUP BY ALL ORDER BY device
    """)


def latest_group(store: Store, kind: str, device: str) -> list[int]:
    """The run ids of the newest group (runs queued together, e.g. a Run all) of this kind on this device that has
    finished; [] when there is none of two runs or more."""
    frame = store.query("""
        SELECT id FROM runs WHERE group_id = (
            SELECT group_id FROM runs WHERE kind = ? AND device = ? AND group_id IS NOT NULL
              AND status IN ('ok', 'failed')
            GROUP BY group_id HAVING count(*) > 1 ORDER BY max(id) DESC LIMIT 1)
        ORDER BY id""", [kind, device])
    return [] if frame.empty else [int(i) for i in frame["id"]]
