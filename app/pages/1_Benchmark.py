"""Benchmark: one card per execution mode, run buttons, live progress, and charts of what the store holds."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import streamlit as st

from app import charts, explain_view, queries, tables
from app import summary as summary_view
from app.common import (
    device_info,
    first_line,
    flash,
    fmt_time,
    fmt_us,
    get_store,
    model_field,
    page_header,
    parse_batch_sizes,
    show_flash,
    submit,
    watch_active_runs,
)
from app.conditions_view import show_conditions
from engine.compare.changepoints import history_steps
from engine.explain.why import first_use as first_use_caches
from engine.modes import MODES
from engine.runner.jobs import JobSpec
from engine.store import report
from engine.store.report import fmt_joules, group_timeline, hold_overlaps, pareto_front, run_timeline, with_speedup
from engine.workloads import get_workload
from engine.workloads.user_model import BENCH_TARGET

WORKLOAD = "house_price"
PHASE_LABELS = {"infer": "Inference (forward, no_grad)", "train": "Training step (fwd + bwd + Adam)"}

st.set_page_config(page_title="Benchmark · Mode Lab", layout="wide")
store = get_store()
info = device_info()
workload = get_workload(WORKLOAD)
mode_names = list(MODES)
with st.sidebar:
    st.header("Model")
    mine = model_field("bench", st.sidebar)  # your own model by import path; empty: the lab's house-price model
    st.caption("Empty: the lab's house-price MLP." if mine is None else
               (mine.description if mine.ok else "Runs are off until the model checks out."))
if mine is not None:
    WORKLOAD = mine.spec.name  # results are stored (and charted) under the model's name
    if mine.ok:  # the page reads only the name, description and default batch sizes of the workload
        workload = replace(workload, name=WORKLOAD, description=mine.description,
                           default_batch_sizes=tuple(mine.batch_sizes),
                           default_train_batch_sizes=tuple(mine.train_batch_sizes))

page_header("Benchmark", f"{workload.description} Each card times one execution mode against eager; "
            "charts read every result from the store.")

# -- filters --------------------------------------------------------------------------------------------------------
with st.sidebar:
    st.header("Filters")
    # Devices this machine has, then devices that only have stored results (e.g. a store copied from a GPU box).
    stored = [d for d in queries.stored_devices(store) if d not in info["devices"]]
    device = st.selectbox("Device", info["devices"] + stored, key="device",
                          format_func=lambda d: f"{d} — {info['names'].get(d, 'stored results only')}")
    phase = st.radio("Phase", ["infer", "train"], key="phase", format_func=PHASE_LABELS.get)
    present = queries.batch_sizes(store, WORKLOAD, device, phase)
    defaults = workload.default_batch_sizes if phase == "infer" else workload.default_train_batch_sizes
    preferred = defaults[len(defaults) // 2]  # the middle default (64 for inference) is the headline number
    batch = None
    if present:
        batch = st.selectbox("Batch size", present, key=f"batch-{device}-{phase}",
                             index=present.index(preferred) if preferred in present else 0)
    else:
        st.caption("No results for this device and phase yet, so no batch size to pick.")
    show_history = st.toggle("Show history of earlier runs", key="history")

# -- the summary: per phase, the fastest mode, its speedup and whether its timing can be trusted (app/summary.py) ----
with st.container(border=True, key="summary"):
    bests = []
    for p in ("infer", "train"):
        headline = summary_view.headline_batch(queries.batch_sizes(store, WORKLOAD, device, p),
                                         workload.default_batch_sizes if p == "infer"
                                         else workload.default_train_batch_sizes)
        found = summary_view.best_of_phase(store, WORKLOAD, device, p, headline) if headline is not None else None
        if found is not None:
            bests.append(found)
    if not bests:
        st.markdown(f"**Summary** — nothing measured on {device} yet: **Run all** below times every mode.")
    for col, best in zip(st.columns(max(len(bests), 1)), bests):
        speed = ("" if best.speedup is None or best.mode == "eager" else
                 f"{best.speedup:.2f}× eager" if best.trusted else f"({best.speedup:.2f}× eager, flagged)")
        col.metric(f"Fastest · {PHASE_LABELS[best.phase].split(' (')[0].lower()} · B={best.batch}",
                   f"{best.mode} · {fmt_us(best.median_us)}", delta=speed or None, delta_color="off",
                   delta_arrow="off", help=f"The fastest of the {best.modes} modes measured at this point whose timing "
                                           "is not flagged; noise states: docs/measurement.md.")
        col.caption((":material/check_circle: " if best.trusted else ":material/warning: ")
                    + f"Timing: {summary_view.state_text(best)}"
                    + summary_view.speedup_note(best)
                    + (f" · faster but flagged: {best.flagged_faster}" if best.flagged_faster else ""))

# -- settings for new runs ------------------------------------------------------------------------------------------
settings_errors: list[str] = []
with st.expander("Run settings", expanded=False):
    c1, c2, c3 = st.columns(3)
    iters = int(c1.number_input("Timed iterations", min_value=1, max_value=100_000, value=100, step=10, key="iters"))
    warmup = int(c2.number_input("Warm-up calls", min_value=0, max_value=10_000, value=10, step=1, key="warmup"))
    phases = c3.multiselect("Phases", ["infer", "train"], default=["infer", "train"], key="phases")
    c4, c5, c6 = st.columns(3)
    repeats = int(c6.number_input("Repeats", min_value=1, max_value=20, value=1, step=1, key="repeats",
                                  help="Worker processes per mode, interleaved across modes (A B C A B C …): "
                                       "what Compare needs (2 or more) to tell process-to-process noise from a "
                                       "change."))
    per_model = "" if mine is None else f"-{WORKLOAD}"  # another model starts from its own defaults
    infer_text = c4.text_input("Inference batch sizes", ", ".join(map(str, workload.default_batch_sizes)),
                               key=f"batch_text{per_model}", help="Whole numbers separated by commas or spaces.")
    train_text = c5.text_input("Training batch sizes", ", ".join(map(str, workload.default_train_batch_sizes)),
                               key=f"train_batch_text{per_model}")
    parsed: dict[str, list[int]] = {}
    for name, label, text in (("batch_sizes", "Inference batch sizes", infer_text),
                              ("train_batch_sizes", "Training batch sizes", train_text)):
        try:
            parsed[name] = parse_batch_sizes(text)
        except ValueError as exc:
            settings_errors.append(f"{label}: {exc}")
    if not phases:
        settings_errors.append("Pick at least one phase to benchmark.")
if mine is not None and not mine.ok:
    settings_errors.append(f"Your model cannot run: {first_line(mine.error)}")
for message in settings_errors:  # outside the expander, so a collapsed expander cannot hide why buttons are off
    st.error(message, icon=":material/error:")
settings_ok = not settings_errors
params: dict[str, Any] = {"workload": WORKLOAD, "device": device, "phases": phases, "warmup": warmup, "iters": iters,
                          **parsed, **(mine.spec.params() if mine is not None else {})}


def queue_runs(modes: list[str], device: str, params: dict[str, Any], repeats: int = 1) -> None:
    target = BENCH_TARGET if params.get("model") else None  # a user model is imported by the worker, not here
    rounds = [{"repeat": r, "repeats": repeats} if repeats > 1 else {} for r in range(repeats)]
    specs = [JobSpec("bench", params["workload"], m, device, {**params, "mode": m, "device": device, **extra},
                     target=target) for extra in rounds for m in modes]  # interleaved: A B C A B C …
    group = uuid.uuid4().hex[:12] if len(specs) > 1 else None
    ids = submit(specs, group_id=group)
    if ids:
        what = ", ".join(f"#{i} {m}" for i, m in zip(ids, modes * repeats))
        flash("success", f"Queued {what} on {device}. Progress shows above the cards; charts update when a run "
              "finishes.", where=f"card-{modes[0]}" if len(modes) == 1 and repeats == 1 else "")


if device in info["devices"]:
    available = {name: MODES[name].available(device) for name in mode_names}
else:
    available = {name: (False, "this machine has no such device; showing stored results only")
                 for name in mode_names}
runnable = [name for name, (ok, _) in available.items() if ok]

top = st.columns([1, 3])
top[0].button(f"Run all ({len(runnable)} modes)", key="run-all", type="primary",
              disabled=not (settings_ok and runnable), on_click=queue_runs, args=(runnable, device, params, repeats),
              help="Queue every mode available on this device, one after another, as one group.")
top[1].caption(f"New runs use {iters} timed iterations after {warmup} warm-up calls, "
               f"phases {', '.join(phases) or '—'}"
               + (f", inference batches {parsed['batch_sizes']}" if "batch_sizes" in parsed else "")
               + (f", training batches {parsed['train_batch_sizes']}" if "train_batch_sizes" in parsed else "")
               + ". Change them under *Run settings*.")
show_flash()
watch_active_runs(kind="bench")

# -- mode cards -----------------------------------------------------------------------------------------------------
summary = queries.latest_summary(store, WORKLOAD, device, phase, batch) if batch is not None else None
# each row's noise state (engine.measure.noise) rides along: a speedup resting on a flagged series is no headline
summary = with_speedup(report.with_noise(summary, store)) if summary is not None and not summary.empty else None
by_mode = {row["mode"]: row for row in summary.to_dict("records")} if summary is not None else {}
notes = queries.latest_notes(store, WORKLOAD, device)
first_use = first_use_caches(store, [r["run_id"] for r in by_mode.values()], phase, batch) if by_mode else {}

for start in range(0, len(mode_names), 3):
    for col, name in zip(st.columns(3), mode_names[start:start + 3]):
        mode = MODES[name]
        ok, reason = available[name]
        with col, st.container(border=True):
            st.subheader(name)
            st.caption(mode.description)
            row = by_mode.get(name)
            if row is not None:
                speedup = row.get("speedup_vs_eager")
                versus = "" if name == "eager" or speedup != speedup or speedup is None else f"{speedup:.2f}× eager"
                flag = row.get("speedup_flag") or ""
                st.metric(f"Median · {phase} · B={batch}", fmt_us(row["median_us"]),
                          delta=(f"({versus}, flagged)" if flag and versus else versus) or None, delta_color="off",
                          delta_arrow="off", help=f"Not a headline: {flag}" if flag and versus else None)
                st.caption(f"p10–p90 {fmt_us(row['p10_us'])} – {fmt_us(row['p90_us'])} · first call "
                           f"{fmt_us(row['first_call_us'])} · run #{row['run_id']} · {fmt_time(row['finished_at'])}")
                if row.get("state"):  # clean | noisy | interfered, with the reasons (engine.measure.noise)
                    st.caption((":material/warning: " if row["state"] in report.FLAGGED_STATES else "")
                               + f"Timing: {row['state']}" + (f" — {row['flags']}" if row.get("flags") else ""))
                joules = row.get("j_per_step")
                if joules is not None and joules == joules:  # NaN where the run had no energy reader
                    st.caption(f"Energy: {fmt_joules(joules)} per step ({fmt_joules(row['j_above_idle_per_step'])} "
                               f"above idle) · {row['avg_power_w']:.0f} W average")
                loop_us = row.get("loop_median_us")
                if loop_us is not None and loop_us == loop_us:  # NaN where the run timed per call only
                    st.caption(f"In a loop: {fmt_us(loop_us)} per call (median of blocks of "
                               f"{int(row['loop_block'])} back-to-back calls, one event pair per block, so no "
                               "per-call event cost)")
                if first_use.get(row["run_id"]):  # which compiled artifacts the first call found cached
                    st.caption(f"First call: {first_use[row['run_id']]}")
                native = row.get("native_median_us")
                if native is not None and native == native:  # NaN where the mode has no native runner
                    gap = row["median_us"] - native
                    st.caption(f"Native runner (C++, same .pt2): {fmt_us(native)} · "
                               + (f"Python adds {fmt_us(gap)} per call" if gap >= 0 else
                                  f"the native call is {fmt_us(-gap)} slower"))
                timeline = run_timeline(store, int(row["run_id"]))
                if not timeline.empty:  # where this run's time went: preparing, compiling, checking, timing …
                    with st.expander(f"Timeline of run #{row['run_id']}", icon=":material/schedule:",
                                     key=f"timeline-{name}"):
                        tables.show(timeline, {"step": "step", "started_s": ("started after", "s"),
                                               "seconds": ("took", "s")})
                stored = store.run(int(row["run_id"])) or {}
                show_conditions(stored.get("conditions"), int(row["run_id"]), key=f"conditions-{name}")
            else:
                st.caption("No result for these filters yet.")
            if notes.get(name):  # once per card, however many batch sizes repeated the warning
                with st.expander(f"Notes ({len(notes[name])})", icon=":material/info:", key=f"notes-{name}"):
                    for note in notes[name]:
                        st.caption(note)
            if not ok:
                st.caption(f":material/block: Not available on {device}: {reason}")
            st.button("Run benchmark", key=f"run-{name}", disabled=not (ok and settings_ok), help=reason or None,
                      on_click=queue_runs, args=([name], device, params, repeats))
            show_flash(f"card-{name}")  # its confirmation, beside the button

# -- charts ---------------------------------------------------------------------------------------------------------
with st.container(border=True, key="charts"):
    st.subheader("Median latency by mode")
    if summary is None:
        where = f"{device}, {phase}" + (f", batch {batch}" if batch is not None else "")
        st.info(f"No results for {where} yet. Use a card's **Run benchmark** or **Run all** above; charts appear "
                "here when a run finishes.", icon=":material/info:")
    else:
        st.plotly_chart(charts.latency_bar(summary, mode_names), key="chart-latency")
        left, right = st.columns(2)
        samples = queries.samples_for(store, summary, phase, batch)
        if not samples.empty:
            left.plotly_chart(charts.sample_distribution(samples, mode_names), key="chart-samples")
        if summary["speedup_vs_eager"].notna().any():
            right.plotly_chart(charts.speedup_bar(summary, mode_names), key="chart-speedup")
        else:
            right.info("Run eager on this device to see speedups.")
        left2, right2 = st.columns(2)
        if summary["first_call_us"].notna().any():
            left2.plotly_chart(charts.first_call_bar(summary, mode_names), key="chart-first-call")
        compiled = summary.dropna(subset=["recompiles"])
        if not compiled.empty:
            right2.caption("Compile counters (latest run per mode)")
            tables.show(compiled, {"mode": "mode", "recompiles": ("recompiles", "int"),
                                   "graph_breaks": ("graph breaks", "int"),
                                   "max_abs_err": ("max abs error vs eager", "sci")}, where=right2)
        if summary["native_median_us"].notna().any():
            st.plotly_chart(charts.python_vs_native(summary), key="chart-native")
        if summary["j_per_step"].notna().any():  # energy beside latency (engine.measure.energy)
            measured = summary.dropna(subset=["j_per_step"])
            points = measured.assign(pareto=pareto_front(measured, "median_us", "j_per_step"))
            st.plotly_chart(charts.energy_latency(points, "median_us", "j_per_step", x_title="median µs per step",
                                                  y_title="J per step", title="Energy vs latency (stars: Pareto "
                                                  "front, nothing both faster and cheaper)", modes=mode_names),
                            key="chart-energy")
            st.caption("Whole-board (or CPU-package) energy over the timed calls, idle draw included; the cards give "
                       "the share above the device's idle draw. How it is taken: docs/measurement.md.")
        if show_history:
            past = queries.history(store, WORKLOAD, device, phase, batch)
            steps = history_steps(store, past, "median_us")  # change points per mode, with commit and environment
            st.plotly_chart(charts.history_line(past, mode_names, steps), key="chart-history")
            for step in steps:
                st.caption(f":material/trending_flat: change point in {step.group}: {step.label}")

# -- the latest group's timeline: who prepared when, who waited for the device, who timed alone ------------------
group = queries.latest_group(store, "bench", device)
if group:
    timeline = group_timeline(store, group)
    if not timeline.empty:
        with st.expander(f"Timeline of the latest group (runs #{group[0]}–#{group[-1]})", icon=":material/schedule:",
                         key="group-timeline"):
            st.plotly_chart(charts.group_timeline_chart(timeline), key="chart-group-timeline")
            waited = timeline[timeline["step"].str.startswith("waiting for")]
            waits = (waited.assign(s=waited["end_s"] - waited["start_s"]).groupby("mode")["s"].sum()
                     if not waited.empty else None)
            clashes = hold_overlaps(timeline)
            st.caption(f"{timeline['end_s'].max():.1f} s from the first run's start to the last one's end. "
                       + ("Waited for the device: " + ", ".join(f"{m} {s:.1f} s" for m, s in waits.items()) + ". "
                          if waits is not None else "")
                       + ("No run timed while another held the device." if clashes.empty else
                          f"{len(clashes)} timing spans overlapped another run's hold: see the table below."))
            if not clashes.empty:
                tables.show(clashes, {"run_id": ("run", "int"), "step": "step", "start_s": ("from", "s"),
                                      "end_s": ("to", "s"), "run_id_other": ("other run", "int"),
                                      "step_other": "its step", "hold_other": "its hold"})

# -- why is X slower than Y? (engine.explain.why; the view is app/explain_view.py) ------------------------------------
with st.container(border=True, key="explain"):
    explain_view.section(store, WORKLOAD, device, phase, batch, mode_names,
                         runs={m: int(r["run_id"]) for m, r in by_mode.items()})  # the runs the cards show

# -- failures -------------------------------------------------------------------------------------------------------
failed = store.runs(kind="bench", status=["failed"], limit=10)
if not failed.empty:
    st.subheader("Failed runs")
    for row in failed.itertuples():
        st.markdown(f"**#{row.id}** `{row.mode}` on {row.device} · {fmt_time(row.finished_at)}")
        st.error(first_line(row.error) or "failed without a message", icon=":material/error:")
        with st.expander(f"Full error of run #{row.id}"):
            st.code(row.error or "", language=None)
