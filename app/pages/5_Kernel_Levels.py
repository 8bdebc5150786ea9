"""Kernel Levels: one component written five ways (native → TorchScript → compile → Triton → CUDA), each checked
against the naive module, timed, and placed on a roofline under this device's measured ceilings."""

from __future__ import annotations

import json
import os
import uuid

import pandas as pd
import streamlit as st

from app import charts, level_charts, queries, tables
from app.axes import fmt_rate
from app.common import (
    device_info,
    first_line,
    flash,
    fmt_time,
    fmt_us,
    get_store,
    page_header,
    show_flash,
    submit,
    watch_active_runs,
)
from app.conditions_view import show_conditions
from engine.compare.changepoints import history_steps, series_history
from engine.levels import COMPONENTS, LEVELS
from engine.levels import yours as yours_levels
from engine.levels.results import deep_table, level_results, stage_results
from engine.measure.ceilings import CEILINGS, dtype_key, latest_ceilings
from engine.measure.kernel_timers import AGREE_NOTE as CROSS_AGREE
from engine.measure.kernel_timers import NOT_MEASURED as CROSS_NOT_MEASURED
from engine.measure.kernel_timers import NOTE_PREFIX as CROSS_TIMER
from engine.profiling.ncu import unavailable as ncu_unavailable
from engine.runner.jobs import JobSpec
from engine.store.db import REPO_ROOT
from engine.store.report import FLAGGED_STATES

st.set_page_config(page_title="Kernel Levels · Mode Lab", layout="wide")
store = get_store()
info = device_info()
level_keys = list(LEVELS)

page_header("Kernel Levels", "The same component written five ways — naive and idiomatic PyTorch, TorchScript, "
            "torch.compile, a hand-written Triton kernel and a hand-written CUDA kernel. Every level is checked "
            "against the naive module (in fp32) before its time is shown.")

with st.sidebar:
    st.header("Component")
    component = COMPONENTS[st.selectbox("Component", list(COMPONENTS), key="component")]
    stored = [d for d in queries.stored_devices(store, kind="levels") if d not in info["devices"]]
    device = st.selectbox("Device", info["devices"] + stored, key="device",
                          format_func=lambda d: f"{d} — {info['names'].get(d, 'stored results only')}")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    # Real (device-only) shapes first on a GPU: the small ones are there for tests and the CPU.
    shape_names = sorted((n for n, s in component.shapes.items() if kind in s.devices),
                         key=lambda n: len(component.shapes[n].devices))
    shape = component.shapes[st.selectbox("Shape", shape_names, key=f"shape-{component.name}-{kind}",
                                          format_func=lambda n: component.shapes[n].label())]
    iters = int(st.number_input("Timed calls", min_value=1, max_value=10_000, value=30, key="iters"))
    warmup = int(st.number_input("Warm-up calls", min_value=0, max_value=1_000, value=5, key="warmup"))
    no_ncu = ncu_unavailable(device)
    deep = st.toggle("Nsight Compute on each run", key="deep", disabled=no_ncu is not None,
                     help=no_ncu or "after timing, ncu measures every kernel of two calls (levels --deep): time, "
                                    "DRAM and SM throughput, occupancy, registers (ncu replays each kernel: the run "
                                    "takes longer)")
    st.header("Your kernel")
    impl = st.text_input("Your kernel (import path)", key="impl", placeholder="my_pkg.kernels:attention",
                         help="module.path:function with the component's reference signature; imported only in a "
                              "separate checking process and in worker processes, never here.").strip()
    impl_path = st.text_input("Its folder", value=os.getcwd(), key="impl-path").strip() or os.getcwd()


@st.cache_data(show_spinner="Checking your kernel (imported in a separate process)…", ttl=60, max_entries=64)
def check_impl(component_name: str, shape_name: str, impl: str, path: str, device: str) -> dict:
    from dataclasses import asdict

    return asdict(yours_levels.check_in_subprocess(component_name, shape_name, impl, path, device))

st.markdown(f"**{component.name}** — {component.description}  \nShape **{shape.label()}**"
            + (f" · {shape.note}" if shape.note else ""))
with st.expander("What is counted", icon=":material/functions:"):
    st.markdown(f"- FLOPs: {component.flops_formula} = **{component.flops(shape) / 1e9:,.3f} GFLOP**\n"
                f"- Minimum bytes: {component.bytes_formula} = **{component.min_bytes(shape) / 1e6:,.2f} MB**\n"
                f"- Arithmetic intensity: **{component.flops(shape) / component.min_bytes(shape):,.1f} FLOP/B**\n"
                f"- Correct when ‖out − ref‖ / ‖ref‖ ≤ {component.tolerance(shape):g} against the naive module "
                f"in fp32 ({shape.dtype} inputs upcast exactly), on two fresh input sets.")


def run_notes(row: dict) -> list[str]:
    """A stored run's notes (a JSON list in the store; NaN where it has none)."""
    notes = row.get("notes")
    if isinstance(notes, str):
        notes = json.loads(notes or "[]")
    return [str(n) for n in notes] if isinstance(notes, list) else []


def show_timers(row: dict) -> None:
    """The cross-timer panel of a CUDA level: events per call, in a CUDA graph, the profiler's kernel time side by
    side, and the run's cross-timer notes (engine.measure.kernel_timers) where they disagree beyond the stated
    bounds."""
    graph_us, kernel_us = row.get("graph_median_us"), row.get("kernel_median_us")
    has_graph, has_kernel = (v is not None and v == v for v in (graph_us, kernel_us))  # NaN where not measured
    notes = [n for n in run_notes(row) if n.startswith(CROSS_TIMER)]
    if not (has_graph or has_kernel or notes):  # CPU runs: one timer only
        return
    st.caption(f"Per call — events {fmt_us(row['median_us'])}"
               + (f" · in a CUDA graph {fmt_us(graph_us)}" if has_graph else "")
               + (f" · profiler kernel time {fmt_us(kernel_us)}" if has_kernel else "")
               + " (events include the host's cost of each call; the graph removes it; the profiler counts only "
                 "the time kernels ran)" + ("; they agree within the stated bounds" if CROSS_AGREE in notes else ""))
    lines = [n[len(CROSS_TIMER):] for n in notes if n != CROSS_AGREE]
    if any(n.startswith(CROSS_NOT_MEASURED) for n in notes):
        st.caption(":material/info: " + "; ".join(lines))
    elif lines:
        st.warning("The timers disagree beyond the stated bounds:\n\n" + "\n".join(f"- {n}" for n in lines)
                   + "\n\nWhy they may: events bracket each Python call, gaps while the device waits for the host "
                     "included; a CUDA graph removes the launches but not the gaps between dependent kernels; the "
                     "profiler counts only the time kernels (and copies) ran, on every stream. Bounds: "
                     "docs/measurement.md, \"Three timers\".", icon=":material/compare_arrows:")


def queue(levels: list[str]) -> None:
    specs = [JobSpec("levels", component.name, lv, device,
                     {"component": component.name, "shape": shape.name, "level": lv, "device": device,
                      "iters": iters, "warmup": warmup, **({"deep": True} if deep else {}),
                      **({"impl_path": impl_path} if yours_levels.is_yours(lv) else {})}) for lv in levels]
    ids = submit(specs, group_id=uuid.uuid4().hex[:12] if len(specs) > 1 else None)
    if ids:
        flash("success", f"Queued {', '.join(f'#{i} {lv}' for i, lv in zip(ids, levels))} on {device}.",
              where=f"card-{levels[0]}" if len(levels) == 1 and levels[0] in LEVELS else "")


here = device in info["devices"]
available = {k: (LEVELS[k].available(device) if here else (False, "this machine has no such device; showing "
                                                                   "stored results only")) for k in level_keys}
runnable = [k for k, (ok, _) in available.items() if ok]
st.button(f"Run all ({len(runnable)} levels)", type="primary", key="run-all", disabled=not runnable,
          on_click=queue, args=(runnable,))
if impl:
    impl_report = check_impl(component.name, shape.name, impl, impl_path, device) if here else {
        "ok": False, "error": "this machine has no such device"}
    if impl_report.get("ok"):
        st.button(f"Run your kernel {impl}", key="run-yours", on_click=queue,
                  args=([yours_levels.level_key(impl)],))
    else:
        st.error(first_line(impl_report.get("error")) or "your kernel could not be checked", icon=":material/error:")
show_flash()
watch_active_runs(kind="levels")

results = level_results(store, component=component.name, shape=shape.name, device=device, latest_only=True)
ok_runs = results[results["status"] == "ok"] if not results.empty else results
by_level = {r["mode"]: r for r in results.to_dict("records")} if not results.empty else {}
yours_keys = [m for m in by_level if yours_levels.is_yours(m)]
chart_keys = level_keys + yours_keys

for start in range(0, len(level_keys), 3):
    for col, key in zip(st.columns(3), level_keys[start:start + 3]):
        level = LEVELS[key]
        ok, reason = available[key]
        with col, st.container(border=True):
            st.subheader(key)
            st.caption(f"{level.title} — {level.description}")
            row = by_level.get(key)
            if row is not None and row["status"] == "ok":
                interpreted = row.get("interpreted") == 1
                versus = row.get("speedup")
                delta = None if key == "L1-naive" or versus != versus else f"{versus:.2f}× L1-naive"
                naive = by_level.get("L1-naive") or {}
                if delta and (row.get("state") in FLAGGED_STATES or naive.get("state") in FLAGGED_STATES):
                    delta = f"({delta}, a flagged timing)"  # greyed (delta_color off), never a headline
                st.metric("Median" + (" (interpreted)" if interpreted else ""), fmt_us(row["median_us"]),
                          delta=delta, delta_color="off", delta_arrow="off")
                if interpreted:
                    st.caption(":material/warning: Triton interpreter on the CPU: a correctness run; the time is "
                               "the interpreter's, never a kernel time.")
                else:
                    pct = row.get("pct_matmul")
                    st.caption(f"{fmt_rate(row['flops_per_s'], 'FLOP/s')} · {fmt_rate(row['bytes_per_s'], 'B/s')}"
                               + (f" · {pct:.0f} % of the measured {row['matmul_ceiling_name']} matmul rate"
                                  if pct == pct and pct is not None else "")
                               + (f" · {row['pct_copy_bw']:.0f} % of the measured copy bandwidth"
                                  if row.get("pct_copy_bw") == row.get("pct_copy_bw") else ""))
                    for note in level_charts.over_ceiling_notes(row):  # a figure above its ceiling, explained
                        st.caption(f":material/info: {note}")
                show_timers(row)
                st.caption(f"rel. error {row['rel_l2_err']:.1e} (≤ {row['tolerance']:g}) · p10–p90 "
                           f"{fmt_us(row['p10_us'])}–{fmt_us(row['p90_us'])} · first call "
                           f"{fmt_us(row['first_call_us'])} · run #{row['id']} · {fmt_time(row['finished_at'])}")
                if row.get("state"):  # a flagged timing is no headline: its reasons beside it
                    st.caption((":material/warning: " if row["state"] in FLAGGED_STATES else "")
                               + f"Timing: {row['state']}" + (f" — {row['flags']}" if row.get("flags") else "")
                               + (f" · {row['condition_notes']}" if row.get("condition_notes") else ""))
                show_conditions(row.get("conditions"), int(row["id"]), key=f"conditions-{key}")
            elif row is not None:
                st.error(f"Latest run #{row['id']} failed: {first_line(row['error'])}", icon=":material/error:")
            else:
                st.caption("No result for this shape on this device yet.")
            if not ok:
                st.caption(f":material/block: Not available on {device}: {reason}")
            st.button("Run", key=f"run-{key}", disabled=not ok, help=reason or None, on_click=queue, args=([key],))
            show_flash(f"card-{key}")  # its confirmation, beside the button

# -- your kernels: their figures and guard verdicts ------------------------------------------------------------------
if yours_keys:
    st.subheader("Your kernels")
    for key in yours_keys:
        row = by_level[key]
        with st.container(border=True):
            if row["status"] == "ok":
                versus = row.get("speedup")
                st.markdown(f"**{key}** — median {fmt_us(row['median_us'])}"
                            + (f" · {versus:.2f}× L1-naive" if versus == versus and versus is not None else "")
                            + f" · rel. error {row['rel_l2_err']:.1e} (≤ {row['tolerance']:g}) · run #{row['id']}")
            else:
                st.error(f"{key}: run #{row['id']} failed: {first_line(row['error'])}", icon=":material/error:")
            verdicts = [n for n in run_notes(row) if n.startswith("guard ")]
            if verdicts:
                st.caption("  \n".join(verdicts))

# -- charts ---------------------------------------------------------------------------------------------------------
timed = ok_runs[ok_runs["interpreted"] != 1] if not ok_runs.empty else ok_runs
ceilings = latest_ceilings(store, device=device) if not results.empty else None
if timed.empty:
    st.info("No timed results for this component, shape and device yet: use **Run** or **Run all** above.",
            icon=":material/info:")
else:
    left, right = st.columns(2)
    left.plotly_chart(level_charts.latency_bar(timed, chart_keys), key="chart-latency")
    if timed["speedup"].notna().any():
        right.plotly_chart(level_charts.value_bar(timed, chart_keys, "speedup", "Speedup vs L1-naive", "×"),
                           key="chart-speedup")
    left2, right2 = st.columns(2)
    left2.plotly_chart(level_charts.value_bar(timed, chart_keys, "flops_per_s", "Achieved {unit}", "FLOP/s"),
                       key="chart-tflops")
    right2.plotly_chart(level_charts.value_bar(timed, chart_keys, "bytes_per_s", "Achieved {unit} of minimum bytes",
                                               "B/s"), key="chart-gbps")
    matmul_key = dtype_key(shape.dtype)
    st.plotly_chart(level_charts.roofline(timed, ceilings, matmul_key, chart_keys), key="chart-roofline")
    if st.toggle("Show history of earlier runs (change points marked)", key="history"):
        past = series_history(store, "levels", component.name, "forward", device=device, config=f"shape={shape.name}")
        past = past[past["mode"].isin(timed["mode"])]  # interpreted levels time the interpreter: left out
        st.plotly_chart(charts.history_line(past, level_keys, history_steps(store, past, "median_us")),
                        key="chart-history")
    if "graph_median_us" in timed and timed["graph_median_us"].notna().any():
        st.caption("Filled points: per-call medians (a Python call each, CUDA events around it). Hollow points: the "
                   "same calls replayed from one CUDA graph — the kernel's own throughput without the host's cost "
                   "of each call. Where they differ a lot, the host, not the kernel, sets the per-call time.")
    if ceilings is None:
        st.warning("No ceilings measured for this device yet, so the roofline has no roof: run "
                   f"`python -m engine ceilings --device {device}` (level runs measure them on first use).")
    else:
        st.caption(f"Roofs: {ceilings.label('copy_bw')} = {fmt_rate(ceilings.copy_bw, 'B/s')}; "
                   f"{ceilings.label('matmul_' + ('bf16' if matmul_key == 'fp16' else matmul_key))} = "
                   f"{fmt_rate(ceilings.matmul(matmul_key) or 0, 'FLOP/s')} (ceilings run #{ceilings.run_id})."
                   + (f" Dotted: the datasheet of {ceilings.datasheet.name}, for reference."
                      if ceilings.datasheet else ""))
    stages = stage_results(store, list(timed["id"]))
    if not stages.empty:
        st.subheader("Stages timed on their own")
        stages = stages.merge(timed[["id", "mode"]], left_on="run_id", right_on="id")
        shown = pd.DataFrame({"level": stages["mode"], "stage": stages["phase"],
                              "median": stages["median"].map(fmt_us),
                              "in a CUDA graph": (stages["graph_median"].map(fmt_us) if "graph_median" in stages
                                                  else "—"),
                              "achieved": stages.get("flops_per_s", pd.Series(dtype=float)).map(
                                  lambda v: fmt_rate(v, "FLOP/s")),
                              "rel. error": stages["rel_l2_err"].map(lambda v: f"{v:.1e}")})
        st.dataframe(shown, hide_index=True)
        for stage, text in component.stages.items():
            st.caption(f"{stage}: {text}")

kernels = deep_table(store, [int(i) for i in ok_runs["id"]]) if not ok_runs.empty else pd.DataFrame()
if not kernels.empty:
    st.subheader("Nsight Compute: what holds each kernel back")
    tables.show(kernels, key="deep-table")  # every figure to 3 significant figures, "—" where ncu gave none
    st.caption("Per kernel of the calls ncu measured (`levels --deep`, clocks left alone): mean time, DRAM and SM "
               "throughput as % of the device's peak, achieved occupancy (% of the warps an SM can hold), registers "
               "per thread; where this Nsight Compute gives them, the tensor pipe's activity (mma.sync and wgmma) and "
               "the XU pipe's (exponentials) as % of their peak, and warps stalled per issued instruction on memory, "
               "barriers, fixed-latency waits and a busy math pipe. High DRAM % with low SM %: bandwidth-bound; low "
               "both: latency, occupancy or launch shape; high SM %: compute-bound.")

interpreted = ok_runs[ok_runs["interpreted"] == 1] if not ok_runs.empty else ok_runs
if not interpreted.empty:
    st.caption("Interpreted runs (correctness only, not plotted beside compiled timings): "
               + ", ".join(f"#{r['id']} {r['mode']} rel. error {r['rel_l2_err']:.1e}"
                           for r in interpreted.to_dict("records")))

# -- source of each level -------------------------------------------------------------------------------------------
st.subheader("What each level changed")
tabs = st.tabs(level_keys)
for tab, key in zip(tabs, level_keys):
    with tab:
        st.caption(LEVELS[key].description)
        for rel in LEVELS[key].sources(component):
            path = REPO_ROOT / rel
            with st.expander(rel, expanded=False):
                if path.exists():
                    st.code(path.read_text(), language="cpp" if path.suffix in (".cu", ".cpp", ".cuh") else "python")
                else:
                    st.caption("not written yet")

# -- failures -------------------------------------------------------------------------------------------------------
failed = results[results["status"] == "failed"] if not results.empty else results
if not failed.empty:
    st.subheader("Failed runs")
    for r in failed.to_dict("records"):
        st.markdown(f"**#{r['id']}** `{r['mode']}` on {r['device']} · {fmt_time(r['finished_at'])}")
        st.error(first_line(r["error"]) or "failed without a message", icon=":material/error:")
        with st.expander(f"Full error of run #{r['id']}"):
            st.code(r["error"] or "", language=None)

if ceilings is not None:
    with st.expander(f"Ceilings of {ceilings.device_name}", icon=":material/speed:"):
        rows = [{"ceiling": n, "value": (fmt_rate(ceilings.values[n], CEILINGS[n][0]) if CEILINGS[n][0].endswith("/s")
                                         else fmt_us(ceilings.values[n]) if CEILINGS[n][0] == "us"
                                         else f"{ceilings.values[n]:.3g} {CEILINGS[n][0]}"),
                 "what": CEILINGS[n][1]} for n in CEILINGS if ceilings.get(n) is not None]
        st.dataframe(pd.DataFrame(rows), hide_index=True)
