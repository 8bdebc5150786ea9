"""A run's timing conditions on a page: one row per timed series with what its window recorded
(engine.store.report.condition_rows), in an expander beside the run's other details."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import tables
from engine.store.report import condition_rows

COLUMNS = {"series": "series", "state": "state", "flags": "flags", "notes": "notes",
           "other_cores": ("other processes (cores)", "num"),
           "sibling_cores": ("hyperthread siblings busy (cores)", "num"),
           "cpu_wait_frac": ("its threads waiting", "share"),
           "load_end": ("load", "num"), "cpu_mhz_median": ("CPU clock (MHz)", "int"),
           "device_wait_s": ("device-lock wait", "s"), "gpu_sm_clock_min_mhz": ("SM clock min (MHz)", "int"),
           "gpu_sm_clock_median_mhz": ("SM clock median (MHz)", "int"), "gpu_reasons": "clock-event reasons",
           "gpu_temperature_c": ("GPU °C", "int"), "gpu_other_processes": "other processes on the GPU",
           "gpu_group_processes": "its group's processes on the GPU", "window_s": ("window", "s")}


def show_conditions(conditions: Any, run_id: int, key: str) -> None:
    """An expander 'Conditions of run #N' with the run's per-series conditions; nothing where none were recorded."""
    rows = condition_rows(conditions)
    if rows.empty:
        return
    with st.expander(f"Conditions of run #{run_id}", icon=":material/monitor_heart:", key=key):
        st.caption("What else the machine did while this run timed (docs/measurement.md, \"Conditions and noise\"): "
                   "a column is left out where nothing was read.")
        tables.show(rows.dropna(axis=1, how="all"), COLUMNS)
