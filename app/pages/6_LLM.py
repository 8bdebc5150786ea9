"""LLM: prefill and decode of a Llama-style decoder per execution mode — TTFT, TPOT, tokens/s, MFU, MBU, operator
breakdowns, a roofline of sweeps, two runs side by side and the report."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from app import envelope_section
from app.axes import log_axis, si_text
from app.charts import energy_latency, history_line
from app.common import (
    device_info,
    first_line,
    flash,
    fmt_time,
    get_store,
    page_header,
    show_flash,
    submit,
    watch_active_runs,
)
from app.conditions_view import show_conditions
from engine.compare.changepoints import history_steps, run_series_history
from engine.llm import metrics as llm_metrics
from engine.llm.report import (
    ENERGY_PHASES,
    REPORT_FILES,
    bound_sentences,
    ceiling_text,
    energy_points,
    fmt_num,
    fmt_pct,
    from_store,
    gate_text,
    headline,
    latest_native_vs_transformers,
    llm_runs,
    modes_table,
    peak_key,
    quant_scheme,
    report_files,
    roofline_points,
    same_setup,
    top_operators,
)
from engine.llm.report import (
    fmt_time as fmt_duration,
)
from engine.measure.op_stats import short_name
from engine.runner.jobs import JobSpec
from engine.store.report import FLAGGED_STATES, fmt_joules, run_state
from engine.workloads.llama import PRESETS

SWEEP_PARAMS = {"none": None, "batch B": ("batch", "1, 2, 4, 8, 16, 32, 64"),
                "prompt length P": ("prompt_len", "128, 256, 512, 1024, 2048, 4096")}

st.set_page_config(page_title="LLM · Mode Lab", layout="wide")
store = get_store()
page_header("LLM", "Prefill (the prompt in one pass) and decode (one token a step) of a Llama-style decoder with a "
            "static KV cache, per execution mode. Each phase is judged by MFU or MBU according to the roof that bounds "
            "it here: its arithmetic intensity against this device's ridge point. Every mode's logits and greedy "
            "tokens are checked against eager before its time is shown.")


def fmt_us(value: Any) -> str:
    return "—" if value is None or pd.isna(value) else fmt_duration(float(value))


def value(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return None if v is None or pd.isna(v) else float(v)


def run_label(row: dict[str, Any]) -> str:
    model = row.get("checkpoint") or row["preset"]  # a checkpoint run: its folder, architecture and hash
    return (f"#{row['id']} · {model} · {row['mode']} · B={row['batch']} P={row['prompt_len']} "
            f"N={row['new_tokens']} · {row['device']} · {fmt_time(row['finished_at'])}")


def queue(configs: list[dict[str, Any]]) -> None:
    specs = [JobSpec("llm", f"llama-{c['preset']}", c["mode"], c["device"], c) for c in configs]
    ids = submit(specs, group_id=uuid.uuid4().hex[:12] if len(specs) > 1 else None)
    if ids:
        flash("success", f"Queued {len(ids)} LLM run(s): #{ids[0]}"
              + (f"–#{ids[-1]}" if len(ids) > 1 else "") + ". Progress shows below; results appear when they finish.")


# -- charts (frame in, figure out) ----------------------------------------------------------------------------------
def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=50, b=10), height=height)
    return fig


def decode_latency_chart(samples: pd.DataFrame, steps: int) -> go.Figure:
    df = samples.assign(step=samples["idx"] % steps, timed_pass=(samples["idx"] // steps + 1).astype(str))
    fig = px.line(df, x="step", y="value", color="timed_pass", markers=len(df) <= 300,
                  labels={"value": "µs per step", "step": "decode step (token index after the prompt)",
                          "timed_pass": "pass"})
    return _layout(fig, "Per-token decode latency")


def ops_chart(top: pd.DataFrame, title: str) -> go.Figure:
    df = top.iloc[::-1].assign(label=[short_name(n, 55) for n in top["name"].iloc[::-1]])
    fig = px.bar(df, x="us_per_step", y="label", orientation="h", color="kind",
                 hover_data={"name": True, "calls_per_step": ":.1f", "share": ":.1f", "label": False})
    fig.update_layout(xaxis_title="self time per step (µs)", yaxis_title=None, showlegend=df["kind"].nunique() > 1)
    return _layout(fig, title, height=max(280, 30 * len(df) + 120))


def roofline_chart(points: pd.DataFrame, peak: float | None, bw: float | None, peak_label: str) -> go.Figure:
    fig = go.Figure()
    lo = float(points["intensity"].min()) / 3 if not points.empty else 0.1
    hi = float(points["intensity"].max()) * 3 if not points.empty else 1e4
    if peak and bw:  # the range holds the points and the ridge, nothing more
        ridge = peak / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        xs = np.logspace(np.log10(lo), np.log10(hi), 200)
        fig.add_trace(go.Scatter(x=xs, y=np.minimum(xs * bw, peak), mode="lines", name="measured roof",
                                 line=dict(color="grey"),
                                 hovertemplate="AI %{x:.3g} FLOP/B → %{y:.3g} FLOP/s<extra>roof</extra>"))
        fig.add_vline(x=ridge, line_dash="dot", line_color="grey",
                      annotation_text=f"ridge {ridge:,.0f} FLOP/B", annotation_position="top left")
    for phase, symbol in (("prefill", "circle"), ("decode", "diamond")):
        sel = points[points["phase"] == phase]
        if sel.empty:
            continue
        text = [f"B={b} P={p}" for b, p in zip(sel["batch"], sel["prompt_len"])]
        fig.add_trace(go.Scatter(x=sel["intensity"], y=sel["flops_per_s"], mode="markers+text", name=phase,
                                 text=text, textposition="top center", marker=dict(symbol=symbol, size=11),
                                 customdata=np.stack([sel["run_id"], sel["mode"]], axis=-1),
                                 hovertemplate="%{text} · %{customdata[1]} · run #%{customdata[0]}<br>"
                                               "%{x:.3g} FLOP/B, %{y:.3g} FLOP/s<extra>" + phase + "</extra>"))
    log_axis(fig, [lo, hi], axis="x", label=si_text, pad=1.0)
    fig.update_xaxes(title="arithmetic intensity (FLOP per byte that must move)")
    rates = [*points["flops_per_s"], *([peak, lo * bw] if peak and bw else [])]
    log_axis(fig, rates, label=lambda v: si_text(v, "FLOP/s"), pad=2.0)
    fig.update_yaxes(title="achieved FLOP/s")
    return _layout(fig, f"Roofline (roofs: measured copy bandwidth and {peak_label})", height=460)


# -- new runs -------------------------------------------------------------------------------------------------------
def new_run_form(runs: pd.DataFrame) -> None:
    """The New LLM run form: preset, lengths, batch, device, mode or all, a sweep; Run queues the group."""
    with st.expander("New LLM run", expanded=runs.empty, icon=":material/rocket_launch:"):
        from engine.llm.modes import MODES, availability, phase_unavailable
        from engine.llm.run import DTYPES, LLMConfig, params_of

        info = device_info()
        c1, c2, c3, c4, c5 = st.columns(5)
        preset = c1.selectbox("Preset", list(PRESETS), key="new-preset",
                              format_func=lambda p: f"{p} (d={PRESETS[p]['dim']}, {PRESETS[p]['layers']} layers)")
        prompt_len = int(c2.number_input("Prompt length P", 1, 32768, 32 if preset in ("tiny", "small") else 512,
                                         key=f"new-p-{preset}"))
        new_tokens = int(c3.number_input("New tokens N", 1, 8192, 16 if preset in ("tiny", "small") else 128,
                                         key=f"new-n-{preset}"))
        batch = int(c4.number_input("Batch B", 1, 1024, 1, key="new-b"))
        device = c5.selectbox("Device", info["devices"], key="new-device",
                              format_func=lambda d: f"{d} — {info['names'].get(d, '')}")
        dtype = DTYPES["bfloat16" if device.startswith("cuda") else "float32"]
        # presets only here: the transformers-* modes run an --hf folder's own transformers module (CLI)
        reasons = {name: availability(m, device, dtype) for name, m in MODES.items() if m.route == "native"}
        runnable = [n for n, r in reasons.items() if r is None]
        c6, c7, c8 = st.columns([2, 1, 2])
        mode = c6.selectbox("Mode", ["all"] + list(reasons), key="new-mode",
                            format_func=lambda m: f"all available ({len(runnable)})" if m == "all" else
                            (m if reasons[m] is None else f"{m} (unavailable)"))
        sweep_kind = c7.selectbox("Sweep", list(SWEEP_PARAMS), key="new-sweep")
        sweep_values: list[int] = []
        errors: list[str] = []
        if SWEEP_PARAMS[sweep_kind]:
            param, default = SWEEP_PARAMS[sweep_kind]
            text = c8.text_input(f"{sweep_kind} values", default, key=f"new-sweep-{param}")
            try:
                sweep_values = [int(v) for v in text.replace(",", " ").split()]
                if not sweep_values or any(v < 1 for v in sweep_values):
                    raise ValueError
            except ValueError:
                errors.append(f"Sweep values must be whole numbers ≥ 1, e.g. {default}.")
        profile = st.toggle("Profile each run (torch.profiler; adds a few seconds per run)", value=not sweep_values,
                            key="new-profile")
        st.caption(MODES[mode].description if mode != "all" else
                   "Every mode available on this device, one run each, as one group.")
        if mode != "all" and reasons[mode]:
            errors.append(f"{mode} is not available on {device}: {reasons[mode]}")
        elif mode != "all":
            why = phase_unavailable(MODES[mode], "decode", device, dtype)
            if why:
                st.caption(f":material/info: prefill only here — {why}")
        if device == "cpu" and preset not in ("tiny", "small"):
            st.caption(":material/warning: a billion-parameter model in float32 on the CPU takes minutes per run.")
        modes = runnable if mode == "all" else [mode]
        configs: list[dict[str, Any]] = []
        for v in sweep_values or [None]:
            for m in modes:
                cfg = LLMConfig(preset=preset, prompt_len=prompt_len, new_tokens=new_tokens, batch=batch, mode=m,
                                device=device, profile=profile, sweep=SWEEP_PARAMS[sweep_kind][0].replace("_len", "")
                                if SWEEP_PARAMS[sweep_kind] else None)
                if v is not None:
                    setattr(cfg, SWEEP_PARAMS[sweep_kind][0], v)
                try:
                    cfg.validate()
                except ValueError as exc:
                    errors.append(str(exc))
                    break
                configs.append(params_of(cfg))
        for message in dict.fromkeys(errors):
            st.error(message, icon=":material/error:")
        st.button(f"Run ({len(configs)} run{'s' if len(configs) != 1 else ''})", key="llm-run", type="primary",
                  disabled=bool(errors) or not configs, on_click=queue, args=(configs,))


# -- the selected run -----------------------------------------------------------------------------------------------
def show_run(runs: pd.DataFrame) -> None:
    """The selected run: its cards, its group's modes, energy, latency, operators, roofline, envelope, a second run
    beside it and its report."""
    records = {int(r["id"]): r for r in runs.to_dict("records")}
    ids = list(records)
    run_id = st.selectbox("Run", ids, key="run-a", format_func=lambda i: run_label(records[i]))
    row = records[run_id]
    view = from_store(store, run_id)
    if row.get("checkpoint"):  # native and transformers' own modes of this checkpoint in one group
        for found in latest_native_vs_transformers(runs, row["checkpoint"]):
            line = found.line()
            st.info(f"{line[0].upper()}{line[1:]} · runs #{found.native_run} and #{found.transformers_run}, the "
                    "newest group of this checkpoint with both", icon=":material/compare_arrows:")
    _cards(run_id, row, view)
    _group_modes(runs, row)
    _energy(runs, row)
    _latency(run_id, row, view)
    _operators(view)
    _roofline(runs, records, row, run_id, view)
    envelope_section.render(runs)
    _side_by_side(records, run_id, view)
    _report(run_id)


def _cards(run_id: int, row: dict[str, Any], view: Any) -> None:
    with st.container(border=True, key="cards"):
        cols = st.columns(5)
        cols[0].metric("TTFT (prefill)", fmt_us(value(row, "ttft_us")),
                       help="Median prefill latency: the prompt through the model and the first token chosen.")
        cols[1].metric("TPOT (decode)", fmt_us(value(row, "tpot_median_us")),
                       delta=f"p90 {fmt_us(value(row, 'tpot_p90_us'))}", delta_color="off", delta_arrow="off",
                       help="Median time per decode step (one token per sequence), every step of every timed pass.")
        cols[2].metric("Tokens/s (decode)", fmt_num(value(row, "tokens_per_s")),
                       help=f"B / TPOT median. End to end (TTFT + N steps): "
                            f"{fmt_num(value(row, 'e2e_tokens_per_s'))} tokens/s.")
        cols[3].metric("MFU (prefill)", fmt_pct(value(row, "mfu_pct")),
                       help="Model FLOPs of the prefill / TTFT / the measured matmul ceiling. "
                            f"Datasheet: {fmt_pct(value(row, 'mfu_datasheet_pct'))}.")
        cols[4].metric("MBU (decode)", fmt_pct(value(row, "mbu_pct")),
                       help="Bytes a decode step must move (weights + K/V read so far) / TPOT / the measured copy "
                            f"bandwidth. Datasheet: {fmt_pct(value(row, 'mbu_datasheet_pct'))}.")
        cols[3].caption(f"% of {ceiling_text(view, 'peak')}" if value(row, "mfu_pct") is not None else
                        ceiling_text(view, "peak"))
        cols[4].caption(f"% of {ceiling_text(view, 'bw')}" if value(row, "mbu_pct") is not None else
                        ceiling_text(view, "bw"))
        checked = (gate_text(view.get) if quant_scheme(row["mode"]) else
                   f"logits vs eager: rel. error {value(row, 'prefill_rel_err') or 0:.2g} (prefill), "
                   f"{value(row, 'decode_rel_err') or 0:.2g} (decode), tolerance {view.get('tolerance') or 0:.3g}")
        st.caption(f"Run #{run_id} · first prefill {fmt_us(value(row, 'first_call_prefill_us'))}, first decode step "
                   f"{fmt_us(value(row, 'first_call_decode_us'))} (compile / capture) · peak memory "
                   f"{fmt_num(value(row, 'peak_memory_bytes'), 'B')} · decode step "
                   f"{fmt_num(value(row, 'decode_bytes'), 'B', 2)} moved · {checked}")
        if value(row, "j_per_token") is not None or value(row, "j_per_prefill") is not None:
            st.caption(f":material/bolt: Energy: {fmt_joules(value(row, 'j_per_token'))} per token "
                       f"({fmt_joules(value(row, 'j_per_token_above_idle'))} above idle, "
                       f"{fmt_num(value(row, 'tokens_per_j'))} tokens/J, {fmt_num(value(row, 'decode_power_w'))} W) "
                       f"· {fmt_joules(value(row, 'j_per_prefill'))} per prefill "
                       f"({fmt_joules(value(row, 'j_per_prefill_above_idle'))} above idle) · whole board, idle "
                       "draw included")
        for sentence in bound_sentences(view):
            st.caption(f":material/speed: {sentence}")
        for note in view.notes:
            st.caption(f":material/info: {note}")
        conditions = row.get("conditions")
        state, flags = run_state(conditions)
        if state:  # a flagged run's figures are no headline: its reasons beside them
            st.caption((":material/warning: " if state in FLAGGED_STATES else "") + f"Timing: {state}"
                       + (f" — {'; '.join(flags)}" if flags else ""))
        show_conditions(conditions, run_id, key=f"conditions-llm-{run_id}")


def _group_modes(runs: pd.DataFrame, row: dict[str, Any]) -> None:
    group = row.get("group_id")
    members = (runs[runs["group_id"] == group] if "group_id" in runs and group is not None and not pd.isna(group)
               else runs.iloc[0:0])
    if len(members) > 1:  # the modes of one `llm --mode all` (or a page group): bytes and accuracy beside TPOT
        st.subheader("Modes of this group")
        st.dataframe(modes_table(members), hide_index=True, key="modes-table")
        st.caption("bytes / token: what one decode step must move per generated token (weights, or a quantized "
                   "mode's codes and scales, + the K/V read), MBU's numerator. vs plain: the lab's fused quantized "
                   "GEMV against the same scheme dequantized in PyTorch then multiplied, from this group. TTFT of a "
                   "quantized mode: its prefill forms each bf16 weight from the codes (the lab's modes in one Triton "
                   "kernel, the plain ones as Inductor compiles the PyTorch dequantization), then multiplies the "
                   "prompt's rows by it (a GEMM, not a quantized kernel). accuracy: "
                   "unquantized modes match eager's logits within the tolerance; quantized ones pass their own gate "
                   "(greedy top-1 agreement and mean KL against the unquantized model, thresholds in "
                   "docs/quantization.md).")


def _energy(runs: pd.DataFrame, row: dict[str, Any]) -> None:
    setup = same_setup(runs, row)  # every mode's newest run of this model, device, B, P and N
    energy_cols = [(phase, energy_points(setup, phase)) for phase in ENERGY_PHASES]
    if any(not pts.empty for _, pts in energy_cols):
        st.subheader("Energy vs latency")
        for col, (phase, pts) in zip(st.columns(2), energy_cols):
            latency, _, unit = ENERGY_PHASES[phase]
            if pts.empty:
                col.info(f"No {phase} energy in these runs.", icon=":material/info:")
                continue
            col.plotly_chart(energy_latency(pts, "latency_us", "joules", x_title=f"{latency.split('_')[0].upper()} "
                                            "(median µs)", y_title=unit, title=f"{phase.capitalize()}: energy vs "
                                            "latency per mode (stars: Pareto front)"), key=f"chart-energy-{phase}")
        st.caption("Each mode's newest run of this model, device, B, P and N. Whole-board energy over the timed "
                   "region, idle draw included (docs/measurement.md); a star is a mode no other beats on both.")


def _latency(run_id: int, row: dict[str, Any], view: Any) -> None:
    with st.expander("Formulas", icon=":material/functions:"):
        st.code((llm_metrics.__doc__ or "").strip(), language=None)

    left, right = st.columns(2)
    decode_samples = view.samples[view.samples["phase"] == "decode"] if not view.samples.empty else view.samples
    if decode_samples.empty:
        left.info("No decode samples in this run (its mode measured the prefill only; see the notes).",
                  icon=":material/info:")
    else:
        left.plotly_chart(decode_latency_chart(decode_samples, int(row["new_tokens"])), key="chart-decode")
    prefill_samples = view.samples[view.samples["phase"] == "prefill"] if not view.samples.empty else view.samples
    if not prefill_samples.empty:
        fig = px.box(prefill_samples, y="value", points="all", labels={"value": "µs per prefill"})
        right.plotly_chart(_layout(fig, "Prefill latency, every timed prefill"), key="chart-prefill")
    if st.toggle("Show the history of this configuration (every mode; change points marked)", key="history"):
        past = run_series_history(store, run_id, "decode")
        st.plotly_chart(history_line(past, None, history_steps(store, past, "median_us"),
                                     "History: median decode step (TPOT) of runs like this one"), key="chart-history")


def _operators(view: Any) -> None:
    st.subheader("Where the time goes: prefill vs decode")
    k = int(st.number_input("Top k", 3, 30, 8, key="top-k"))
    op_cols = st.columns(2)
    for col, phase in zip(op_cols, ("prefill", "decode")):
        top = top_operators(view, phase, k)
        if top.empty:
            col.info(f"No {phase} profile in this run.", icon=":material/info:")
        else:
            what = "kernels" if (top["kind"] != "operator").any() else "operators"
            col.plotly_chart(ops_chart(top, f"{phase.capitalize()}: top {k} {what} per step"), key=f"chart-ops-{phase}")


def _roofline(runs: pd.DataFrame, records: dict[int, dict[str, Any]], row: dict[str, Any], run_id: int,
              view: Any) -> None:
    st.subheader("Roofline")
    groups = runs[runs["group_id"].notna() & runs["sweep"].notna()] if "group_id" in runs else runs.iloc[0:0]
    sweep_ids = {g: [int(i) for i in f["id"]] for g, f in groups.groupby("group_id")} if not groups.empty else {}
    default = [i for i in sweep_ids.get(row.get("group_id"), [])] or [run_id]
    chosen = st.multiselect("Runs on the roofline", list(records), default=default, key=f"roof-{run_id}",
                            format_func=lambda i: run_label(records[i]),
                            help="A sweep (B or P) shows the step from memory- to compute-bound; its runs are "
                                 "picked when the selected run belongs to one.")
    points = roofline_points(store, chosen)
    if points.empty:
        st.info("The chosen runs have no FLOP figures.", icon=":material/info:")
    else:
        peak, bw = view.get(f"ceiling_{peak_key(view)}"), view.get("ceiling_copy_bw")
        st.plotly_chart(roofline_chart(points, peak, bw, ceiling_text(view, "peak").split(" (")[0]
                                       .removeprefix("the ")), key="chart-roofline")
        if not (peak and bw):
            st.caption("No measured ceilings with this run, so no roofs: run `python -m engine ceilings`.")
        if sweep_ids:
            st.caption(f"{len(sweep_ids)} sweep group(s) stored; queue one under *New LLM run* → *Sweep*.")


def _side_by_side(records: dict[int, dict[str, Any]], run_id: int, view: Any) -> None:
    st.subheader("Two runs side by side")
    others = [i for i in records if i != run_id]
    if not others:
        st.info("Run a second mode (or size) to compare it with this one.", icon=":material/info:")
    else:
        run_b = st.selectbox("B", others, key="run-b", format_func=lambda i: run_label(records[i]))
        both = headline(store, [run_id, run_b])
        shown = [("TTFT", "ttft_us", fmt_us), ("TPOT median", "tpot_median_us", fmt_us),
                 ("TPOT p90", "tpot_p90_us", fmt_us), ("tokens/s (decode)", "tokens_per_s", fmt_num),
                 ("MFU", "mfu_pct", fmt_pct), ("MBU", "mbu_pct", fmt_pct),
                 ("first prefill", "first_call_prefill_us", fmt_us), ("first decode step", "first_call_decode_us",
                                                                      fmt_us),
                 ("peak memory", "peak_memory_bytes", lambda v: fmt_num(v, "B"))]
        table = []
        for label, key, fmt in shown:
            a = both.loc[run_id, key] if run_id in both.index else None
            b = both.loc[run_b, key] if run_b in both.index else None
            a = None if a is None or pd.isna(a) else float(a)
            b = None if b is None or pd.isna(b) else float(b)
            table.append({"figure": label, f"A #{run_id} {records[run_id]['mode']}": fmt(a),
                          f"B #{run_b} {records[run_b]['mode']}": fmt(b),
                          "B / A": f"{b / a:.2f}×" if a and b is not None else "—"})
        st.dataframe(pd.DataFrame(table), hide_index=True, key="compare-table")
        view_b = from_store(store, run_b)
        cmp_cols = st.columns(2)
        for col, phase in zip(cmp_cols, ("prefill", "decode")):
            ta, tb = top_operators(view, phase, 8), top_operators(view_b, phase, 8)
            if ta.empty and tb.empty:
                continue
            merged = pd.concat([ta.assign(run=f"A #{run_id}"), tb.assign(run=f"B #{run_b}")])
            merged["label"] = [short_name(n, 45) for n in merged["name"]]
            fig = px.bar(merged, x="us_per_step", y="label", color="run", barmode="group", orientation="h")
            fig.update_layout(xaxis_title="self time per step (µs)", yaxis_title=None)
            col.plotly_chart(_layout(fig, f"{phase.capitalize()}: top operators, A vs B",
                                     max(300, 26 * merged["label"].nunique() + 140)), key=f"chart-cmp-{phase}")


def _report(run_id: int) -> None:
    with st.container(border=True, key="report"):
        st.markdown("**Report**")
        try:
            files = report_files(store, run_id)
        except (OSError, ValueError) as exc:
            st.warning(f"The report files cannot be read: {exc}", icon=":material/warning:")
            files = {}
        cols = st.columns(len(REPORT_FILES))
        for col, name in zip(cols, REPORT_FILES):
            path = files.get(name)
            if path is not None and path.exists():
                col.download_button(name, data=path.read_bytes(), file_name=f"llm-run{run_id}-{name}",
                                    key=f"download-{name}", on_click="ignore", icon=":material/download:")
        if "report.md" in files and files["report.md"].exists():
            with st.expander("report.md"):
                st.markdown(files["report.md"].read_text())
        st.caption(f"Also: `python -m engine llm-report {run_id}`.")


def show_failures() -> None:
    failed = store.runs(kind="llm", status=["failed"], limit=10)
    if not failed.empty:
        st.subheader("Failed runs")
        for frow in failed.itertuples():
            st.markdown(f"**#{frow.id}** `{frow.mode}` on {frow.device} · {fmt_time(frow.finished_at)}")
            st.error(first_line(frow.error) or "failed without a message", icon=":material/error:")
            with st.expander(f"Full error of run #{frow.id}"):
                st.code(frow.error or "", language=None)


runs = llm_runs(store, status="ok")
new_run_form(runs)
show_flash()
watch_active_runs(kind="llm")
if runs.empty:
    st.info("No LLM runs yet. Open **New LLM run**, pick a preset and press **Run** (the tiny preset on the CPU takes "
            "seconds), or run `python -m engine llm --preset 1B --mode all --device cuda`.", icon=":material/info:")
else:
    show_run(runs)
show_failures()
