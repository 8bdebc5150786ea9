"""Profiler: where a mode's step spends its time — operators and kernels, CPU vs device, idle time, launches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from app import tables
from app.common import (
    device_info,
    first_line,
    flash,
    fmt_time,
    fmt_us,
    get_store,
    model_field,
    page_header,
    show_flash,
    submit,
    watch_active_runs,
)
from engine.measure.op_stats import comparable_kinds, compare, compare_metrics, short_name
from engine.modes import MODES
from engine.profiling import ncu
from engine.profiling.profile import BUDGET_S, MAX_ACTIVE, MIN_ACTIVE, default_phases, judgements
from engine.runner.jobs import JobSpec
from engine.workloads import get_workload
from engine.workloads.user_model import PROFILE_TARGET

WORKLOAD = "house_price"
PHASE_LABELS = {"train": "Training step (fwd + bwd + Adam)", "infer": "Inference (forward, no_grad)"}
NOT_ON_CPU = "not applicable on CPU"
DEVICE_FIGURES = {"launches_per_step", "cpu_launch_per_step_us", "kernels_per_step", "device_busy_per_step_us",
                  "idle_fraction"}
UNTRACKED = "ProfilerStep* (Python between ops)"
INLINE_DOWNLOAD_BYTES = 64 << 20  # larger traces are read only when the button is clicked

st.set_page_config(page_title="Profiler · Mode Lab", layout="wide")
store = get_store()
workload = get_workload(WORKLOAD)

page_header("Profiler", f"{workload.description} torch.profiler traces of one step per mode: the top operators and "
            "kernels, CPU vs device time, device idle time and kernel launches, two modes side by side, and the "
            "Chrome trace to open in Perfetto.")


# -- charts (frame in, figure out) ----------------------------------------------------------------------------------
def _labels(names: pd.Series, width: int = 60) -> list[str]:
    """Short, unique axis labels for long kernel names."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        label = short_name(name, width)
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=50, b=10), height=height)
    return fig


def top_bar(rows: pd.DataFrame, steps: float, k: int, title: str) -> go.Figure:
    top = rows.nlargest(k, "self_us").iloc[::-1]
    df = top.assign(label=_labels(top["name"]), per_step=top["self_us"] / steps, calls_per_step=top["calls"] / steps,
                    shapes=top["input_shapes"].fillna("—").str.slice(0, 80))
    spread = {c: ":,.1f" for c in ("self_p10_us", "self_p90_us") if c in df.columns and df[c].notna().any()}
    fig = px.bar(df, x="per_step", y="label", orientation="h", color="kind",
                 hover_data={"name": True, "calls_per_step": ":.1f", "shapes": True, "label": False,
                             "per_step": ":,.1f", **spread})
    fig.update_layout(xaxis_title="self time per step (µs)", yaxis_title=None, showlegend=df["kind"].nunique() > 1)
    return _layout(fig, title, height=max(300, 28 * len(df) + 120))


def treemap(rows: pd.DataFrame, group: str, title: str) -> go.Figure:
    df = rows[rows["self_us"] > 0]
    df = df.assign(group=df[group].fillna("(none)").map(lambda g: short_name(g, 50)),
                   label=df["name"].map(lambda n: UNTRACKED if n == "ProfilerStep*" else short_name(n, 50)))
    fig = px.treemap(df, path=[px.Constant("all"), "group", "label"], values="self_us",
                     hover_data={"name": True, "calls": True})
    fig.update_traces(root_color="lightgrey")
    return _layout(fig, title, height=420)


def time_split(figures: dict[str, float], on_device: bool) -> go.Figure:
    """Host and device time per step, side by side."""
    items = [("host wall", figures.get("step_wall_us")),
             ("CPU (self, all threads)", figures.get("cpu_time_per_step_us")),
             ("CPU in operators", figures.get("cpu_op_self_us", 0.0) / max(figures.get("steps", 1.0), 1.0))]
    if on_device:
        steps = max(figures.get("steps", 1.0), 1.0)
        items += [("CPU launching kernels", figures.get("cpu_launch_per_step_us")),
                  ("device busy", figures.get("device_busy_per_step_us")),
                  ("device idle", figures.get("device_idle_us", 0.0) / steps)]
    df = pd.DataFrame([{"what": w, "us": v or 0.0, "side": "device" if w.startswith("device") else "host"}
                       for w, v in items])
    fig = px.bar(df, x="what", y="us", color="side", text=df["us"].map(fmt_us))
    fig.update_layout(xaxis_title=None, yaxis_title="µs per step", showlegend=False)
    return _layout(fig, "CPU vs device time per step" if on_device else
                   "CPU time per step (no device on a CPU profile)")


def compare_bar(table: pd.DataFrame, label_a: str, label_b: str, k: int) -> go.Figure:
    top = table.assign(_m=table[["self_us_a", "self_us_b"]].max(axis=1)).nlargest(k, "_m").iloc[::-1]
    labels = _labels(top["name"], 50)
    fig = go.Figure([go.Bar(y=labels, x=top["self_us_a"], orientation="h", name=label_a),
                     go.Bar(y=labels, x=top["self_us_b"], orientation="h", name=label_b)])
    fig.update_layout(barmode="group", xaxis_title="self time per step (µs)",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0))
    return _layout(fig, "Per-step time, A vs B", height=max(320, 36 * len(top) + 120))


# -- data -----------------------------------------------------------------------------------------------------------
def figures_of(run_id: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for row in store.metrics([run_id]).itertuples():
        out.setdefault(str(row.phase), {})[str(row.name)] = float(row.value)
    return out


def profiled_phases(store, run_ids: list[int]) -> dict[int, set[str]]:
    """run id → the phases it profiled (one query for all of them)."""
    if not run_ids:
        return {}
    frame = store.query(f"SELECT DISTINCT run_id, phase FROM metrics WHERE run_id IN ({','.join('?' * len(run_ids))})"
                        " AND phase IS NOT NULL", run_ids)
    out: dict[int, set[str]] = {}
    for run_id, phase in zip(frame.get("run_id", []), frame.get("phase", [])):
        out.setdefault(int(run_id), set()).add(str(phase))
    return out


def fmt_figure(value: float | None, unit: str, key: str) -> str:
    if value is None or pd.isna(value):
        return NOT_ON_CPU if key in DEVICE_FIGURES else "—"
    if unit == "us":
        return fmt_us(value)
    return f"{value:.1%}" if key == "idle_fraction" else f"{value:,.1f}"


def run_label(row: dict[str, Any]) -> str:
    model = "" if row.get("workload") in (WORKLOAD, None) else f" · {row['workload']}"  # your own model's profiles
    return f"#{row['id']} · {row['mode']} on {row['device']}{model} · {fmt_time(row['finished_at'])}"


def queue_profile(mode: str, device: str, params: dict[str, Any]) -> None:
    target = PROFILE_TARGET if params.get("model") else None  # a user model is imported by the worker, not here
    ids = submit([JobSpec("profile", params["workload"], mode, device, {**params, "mode": mode, "device": device},
                          target=target)])
    if ids:
        flash("success", f"Queued profile #{ids[0]} of {mode} on {device}. Progress shows below; the profile appears "
                         "here when it finishes.")


# -- new profile ----------------------------------------------------------------------------------------------------
runs = store.runs(kind="profile", status=["ok"], limit=200)
with st.expander("New profile", expanded=runs.empty, icon=":material/speed:"):
    info = device_info()
    c1, c2, c3, c4 = st.columns(4)
    mode = c1.selectbox("Mode", list(MODES), key="new-mode")
    device = c2.selectbox("Device", info["devices"], key="new-device",
                          format_func=lambda d: f"{d} — {info['names'].get(d, '')}")
    offered = [p for p in ("train", "infer") if p in MODES[mode].phases]
    phases = c3.multiselect("Phases", offered, default=list(default_phases(MODES[mode])), key=f"new-phases-{mode}",
                            format_func=PHASE_LABELS.get,
                            help=None if len(offered) > 1 else f"{mode} runs only the {offered[0]} phase.")
    active = c4.number_input("Profiled steps", min_value=1, max_value=100, value=None, step=1, key="new-active",
                             placeholder=f"auto ({MIN_ACTIVE}–{MAX_ACTIVE})",
                             help="The schedule skips 1 step, traces 2 warm-up steps and keeps this many. Empty: as "
                                  f"many as fit in {BUDGET_S:g} s of profiling, {MIN_ACTIVE} to {MAX_ACTIVE}, so "
                                  "each step's and each operator's p10–p90 rests on enough steps.")
    why_not_deep = ncu.unavailable(device)
    deep = st.toggle("Deep profile: Nsight Compute on the top-5 kernels", key="new-deep",
                     disabled=why_not_deep is not None, help=why_not_deep)
    if ncu.ncu_path() is None:
        st.caption(f":material/info: {ncu.NOT_FOUND}: deep profiles (per-kernel duration, memory and SM "
                   "throughput) are off on this machine.")
    elif why_not_deep:
        st.caption(f":material/info: Deep profile: {why_not_deep}.")
    ok, reason = MODES[mode].available(device)
    if not ok:
        st.caption(f":material/block: {mode} is not available on {device}: {reason}")
    if not phases:
        st.caption(":material/error: Pick at least one phase to profile.")
    mine = model_field("profile")  # your own model by import path; empty: the lab's house-price model
    params = {"workload": mine.spec.name if mine else WORKLOAD, "phases": phases, "wait": 1, "warmup": 2,
              "active": None if active is None else int(active), "deep": bool(deep and why_not_deep is None),
              "top_k": 5,
              **(mine.spec.params() if mine else {})}
    model_ok = mine is None or mine.ok
    st.button("Profile", key="profile-run", type="primary", disabled=not (ok and phases and model_ok),
              on_click=queue_profile, args=(mode, device, params), help=reason or None)
show_flash()
watch_active_runs(kind="profile")

# -- the selected profile -------------------------------------------------------------------------------------------
def show_profile(runs: pd.DataFrame) -> None:
    """The selected profile: its figures, operators and kernels, trace, deep profile, and a comparison."""
    records = {int(r["id"]): r for r in runs.to_dict("records")}
    ids = list(records)
    newest = max(ids)
    if newest > st.session_state.get("profiler-newest", newest):  # a profile just finished: show it
        st.session_state["run-a"] = newest
    st.session_state["profiler-newest"] = newest
    top = st.columns([3, 2, 1])
    run_id = top[0].selectbox("Profile", ids, key="run-a", format_func=lambda i: run_label(records[i]))
    run = records[run_id]
    figures = figures_of(run_id)
    phases_done = [p for p in ("train", "infer") if p in figures] + [p for p in figures if p not in PHASE_LABELS]
    phase = top[1].radio("Phase", phases_done, key="phase", format_func=lambda p: PHASE_LABELS.get(p, p),
                         horizontal=True) if phases_done else None
    k = int(top[2].number_input("Top k", min_value=3, max_value=50, value=10, key="top-k"))
    m = figures.get(phase, {}) if phase else {}
    steps = max(m.get("steps", 1.0), 1.0)
    on_device = "device_busy_us" in m
    stats = store.op_stats([run_id], phase)
    _cards(run_id, run, m, on_device, phase)
    _operators(stats, m, steps, k)
    _trace(run_id, run, phase)
    _deep(run_id, phase)
    _comparison(records, run_id, run, phase, m, stats, steps, k)


def spread_line(m: dict[str, float]) -> str | None:
    """The profiled steps' spread in words, or None for a profile stored before it was kept."""
    if "step_wall_p10_us" not in m:
        return None
    text = (f"Per profiled step: host wall {fmt_us(m['step_wall_median_us'])} median, p10–p90 "
            f"{fmt_us(m['step_wall_p10_us'])} – {fmt_us(m['step_wall_p90_us'])}")
    if "device_busy_p10_us" in m:
        text += (f"; device busy {fmt_us(m['device_busy_median_us'])} median, p10–p90 "
                 f"{fmt_us(m['device_busy_p10_us'])} – {fmt_us(m['device_busy_p90_us'])}")
    return text + "."


def _cards(run_id: int, run: dict[str, Any], m: dict[str, float], on_device: bool, phase: str | None) -> None:
    stored = store.run(run_id) or {}
    flagged = [(series, state, flags) for series, state, flags in judgements(stored.get("conditions"), phase or "")
               if state and state != "clean"]
    for series, state, flags in flagged:
        st.warning(f"Disturbed profile: its {series} are **{state}** ({'; '.join(flags)}). Its per-step figures "
                   "may be the machine's as much as the code's; profile again when the machine is quiet.",
                   icon=":material/warning:")
    with st.container(border=True, key="cards"):
        cols = st.columns(6)
        cols[0].metric("Host wall / step", fmt_us(m.get("step_wall_us")))
        cols[1].metric("CPU time / step", fmt_us(m.get("cpu_time_per_step_us")),
                       help="Self time of every host event (operators, runtime calls, untracked Python) over all "
                            "threads, per profiled step.")
        if on_device:
            cols[2].metric("Device busy / step", fmt_us(m.get("device_busy_per_step_us")))
            cols[3].metric("Device idle", f"{m.get('idle_fraction', 0.0):.1%}",
                           help="Share of the profiled window (first step start → last device work end) in which no "
                                "kernel, memcpy or memset ran.")
            cols[4].metric("Kernel launches / step", f"{m.get('launches_per_step', 0.0):,.1f}",
                           help=f"{m.get('kernels_per_step', 0.0):,.1f} kernels ran on the device per step; a CUDA "
                                "graph replay launches many kernels with one call.")
            cols[5].metric("CPU launching / step", fmt_us(m.get("cpu_launch_per_step_us")))
        else:
            for col, label in zip(cols[2:], ("Device busy / step", "Device idle", "Kernel launches / step",
                                             "CPU launching / step")):
                col.metric(label, "n/a", help=f"{NOT_ON_CPU}: a CPU profile has no device kernels.")
        st.caption(f"Run #{run_id} · {run['mode']} on {run['device']} · {int(m.get('steps', 0))} profiled steps · "
                   + (f"{m.get('kernels_per_step', 0):,.1f} kernels per step" if on_device else
                      f"device busy/idle time and kernel launches are {NOT_ON_CPU} (no device kernels)"))
        spread = spread_line(m)
        if spread:
            st.caption(f":material/bar_chart: {spread}")
        shown = f"{phase}: the profile is disturbed"  # said by the warning above
        for note in stored.get("notes", []):
            if not (flagged and note.startswith(shown)):
                st.caption(f":material/info: {note}")


def _operators(stats: pd.DataFrame, m: dict[str, float], steps: float, k: int) -> None:
    if stats.empty:
        st.info("This profile stored no operator statistics.", icon=":material/info:")
    else:
        device_rows = stats[stats["device"] != "cpu"]
        op_rows = stats[stats["kind"] == "operator"]
        left, right = st.columns(2)
        if not device_rows.empty:
            left.plotly_chart(top_bar(device_rows, steps, k, f"Top {k} kernels by device time"), key="chart-top")
            right.plotly_chart(treemap(device_rows, "parent", "Device time by launching operator → kernel"),
                               key="chart-treemap")
            left2, right2 = st.columns(2)
            left2.plotly_chart(top_bar(op_rows, steps, k, f"Top {k} operators by self CPU time"), key="chart-top-ops")
            right2.plotly_chart(time_split(m, True), key="chart-split")
        else:
            host_rows = stats[stats["device"] == "cpu"]
            left.plotly_chart(top_bar(op_rows, steps, k, f"Top {k} operators by self CPU time"), key="chart-top")
            right.plotly_chart(treemap(host_rows, "kind", "CPU self time by kind → operator"), key="chart-treemap")
            st.plotly_chart(time_split(m, False), key="chart-split")
        with st.expander(f"All {len(stats)} operators and kernels of this phase"):
            table = stats.assign(calls_per_step=stats["calls"] / steps, self_us_per_step=stats["self_us"] / steps,
                                 total_us_per_step=stats["total_us"] / steps)
            tables.show(table, {"name": "name", "kind": "kind", "device": "device",
                                "calls_per_step": ("calls per step", "num"),
                                "self_us_per_step": ("self time per step", "us"),
                                "self_p10_us": ("self p10 per step", "us"),
                                "self_p90_us": ("self p90 per step", "us"),
                                "total_us_per_step": ("total time per step", "us"),
                                "device_us": ("device time (all steps)", "us"), "input_shapes": "input shapes",
                                "parent": "launched by"}, key="op-table")


def _trace(run_id: int, run: dict[str, Any], phase: str | None) -> None:
    traces = store.artifacts(run_id)
    traces = traces[traces["kind"] == "chrome_trace"] if not traces.empty else traces
    with st.container(border=True, key="trace"):
        st.markdown("**Chrome trace**")
        shown = traces[traces["name"] == f"trace-{phase}.json.gz"] if not traces.empty else traces
        if shown.empty:
            st.caption("No trace file was stored for this phase.")
        for row in shown.itertuples():
            path = Path(row.path)
            if not path.exists():
                st.warning(f"The trace file is gone: {path}", icon=":material/warning:")
                continue
            size = path.stat().st_size
            data: Any = path.read_bytes() if size <= INLINE_DOWNLOAD_BYTES else path.read_bytes
            st.download_button(f"Download trace ({size / 1024:,.0f} KiB, gzipped JSON)", data=data,
                               file_name=f"modelab-run{run_id}-{run['mode']}-{phase}.json.gz",
                               mime="application/gzip", key=f"download-{phase}", on_click="ignore",
                               icon=":material/download:")
            st.caption("Open it in [Perfetto](https://ui.perfetto.dev) or chrome://tracing (both read .json.gz). "
                       f"Stored at `{path}`.")


def _deep(run_id: int, phase: str | None) -> None:
    with st.container(border=True, key="deep"):
        st.markdown("**Deep profile (Nsight Compute)**")
        kernels = store.kernel_metrics([run_id])
        kernels = kernels[kernels["phase"] == phase] if not kernels.empty else kernels
        if not kernels.empty:
            shown_k = kernels.assign(label=_labels(kernels["kernel"], 50))
            fig = px.bar(shown_k.iloc[::-1], x="duration_us", y="label", orientation="h",
                         hover_data={"kernel": True, "mem_throughput_pct": ":.1f", "sm_throughput_pct": ":.1f"})
            fig.update_layout(xaxis_title="mean duration per launch (µs)", yaxis_title=None)
            st.plotly_chart(_layout(fig, "Nsight Compute: kernel duration", max(220, 40 * len(kernels) + 120)),
                            key="chart-ncu")
            tables.show(kernels, {"kernel": "kernel", "launches": ("launches", "int"),
                                  "duration_us": ("mean time per launch", "us"),
                                  "mem_throughput_pct": ("DRAM throughput", "pct"),
                                  "sm_throughput_pct": ("SM throughput", "pct")}, key="ncu-table")
        elif ncu.ncu_path() is None:
            st.info(f"{ncu.NOT_FOUND}: no deep profile on this machine. Install Nsight Compute (it ships with the "
                    "CUDA toolkit) to measure per-kernel duration, memory and SM throughput.", icon=":material/info:")
        else:
            st.caption("This run has no Nsight Compute metrics: profile on a CUDA device with *Deep profile* on.")


def _comparison(records: dict[int, dict[str, Any]], run_id: int, run: dict[str, Any], phase: str | None,
                m: dict[str, float], stats: pd.DataFrame, steps: float, k: int) -> None:
    st.subheader("Compare two profiles")
    others = [i for i in records if i != run_id]
    if not others:
        st.info("Profile a second mode to compare kernels, launches and device time side by side.",
                icon=":material/info:")
    else:
        phased = profiled_phases(store, others)

        def preferred(i: int) -> tuple:  # the same phase and device, another mode, eager (the reference), newest
            r = records[i]
            return (phase not in phased.get(i, ()), r["device"] != run["device"], r["mode"] == run["mode"],
                    r["mode"] != "eager", -i)

        others.sort(key=preferred)
        run_b_id = st.selectbox("B", others, key="run-b", format_func=lambda i: run_label(records[i]))
        run_b = records[run_b_id]
        figures_b = figures_of(run_b_id)
        if phase not in figures_b:
            st.warning(f"Run #{run_b_id} did not profile the {phase} phase.", icon=":material/warning:")
        else:
            mb = figures_b[phase]
            label_a, label_b = f"A: #{run_id} {run['mode']}", f"B: #{run_b_id} {run_b['mode']}"
            summary = compare_metrics(m, mb)
            st.dataframe(pd.DataFrame({
                "figure": summary["figure"],
                label_a: [fmt_figure(v, u, key) for v, u, key in zip(summary["a"], summary["unit"], summary["key"])],
                label_b: [fmt_figure(v, u, key) for v, u, key in zip(summary["b"], summary["unit"], summary["key"])],
                                       "B / A": summary["ratio_b_over_a"].map(
                                           lambda r: "—" if r is None or pd.isna(r) else f"{r:.2f}×")}),
                         hide_index=True, key="compare-figures")
            kinds = comparable_kinds([run["device"], run_b["device"]])
            what = "kernels" if "kernel" in kinds else "operators"
            table = compare(stats, store.op_stats([run_b_id], phase), kinds, steps, max(mb.get("steps", 1.0), 1.0))
            counts = table["where"].value_counts()
            c1, c2, c3 = st.columns(3)
            c1.metric(f"{what.capitalize()} only in A", int(counts.get("only in A", 0)),
                      help="Present in A, gone in B — e.g. fused away by the compiler.")
            c2.metric(f"{what.capitalize()} only in B", int(counts.get("only in B", 0)),
                      help="New in B — e.g. the fused kernels that replaced them.")
            c3.metric(f"{what.capitalize()} in both", int(counts.get("both", 0)))
            if not table.empty:
                st.plotly_chart(compare_bar(table, label_a, label_b, k), key="chart-compare")
            for where, title in (("only in A", f"Only in A ({run['mode']}): gone in B"),
                                 ("only in B", f"Only in B ({run_b['mode']}): new in B"),
                                 ("both", "In both")):
                sel = table[table["where"] == where]
                with st.expander(f"{title} — {len(sel)} {what}", expanded=where != "both" and len(sel) <= 30):
                    if sel.empty:
                        st.caption("None.")
                    else:
                        tables.show(sel, {"name": "name", "kind": "kind", "calls_a": ("calls per step, A", "num"),
                                          "calls_b": ("calls per step, B", "num"),
                                          "self_us_a": ("time per step, A", "us"),
                                          "self_us_b": ("time per step, B", "us"),
                                          "delta_us": ("B − A per step", "us")},
                                    key=f"compare-{where.replace(' ', '-')}")


def show_failures() -> None:
    failed = store.runs(kind="profile", status=["failed"], limit=10)
    if not failed.empty:
        st.subheader("Failed profiles")
        for row in failed.itertuples():
            st.markdown(f"**#{row.id}** `{row.mode}` on {row.device} · {fmt_time(row.finished_at)}")
            st.error(first_line(row.error) or "failed without a message", icon=":material/error:")
            with st.expander(f"Full error of profile #{row.id}"):
                st.code(row.error or "", language=None)


if runs.empty:
    st.info("No profiles yet. Open **New profile**, pick a mode and press **Profile**; results appear here when the "
            "run finishes (a CPU profile takes seconds).", icon=":material/info:")
else:
    show_profile(runs)
show_failures()
