"""The Kernel Levels page: cards per level (greyed with the reason where a level cannot run), charts and roofline
from stored runs, interpreted runs kept off the charts, sources per level, failures, and queuing runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.runner import jobs
from engine.store.db import Metric, RunResult, Samples, Store

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "5_Kernel_Levels.py"
ENV = {"python": "3.12", "torch": "2.11.0", "device_name": "NVIDIA H100 80GB HBM3", "cpu_model": "x", "threads": 16,
       "git_commit": "abc", "hostname": "gpu", "platform": "Linux"}


def open_levels() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def add_ceilings(store: Store, device: str = "cuda") -> int:
    run_id = store.create_run("ceilings", "ceilings", "measure", device, {"device": device})
    store.start_run(run_id)
    store.record_result(run_id, RunResult(env=ENV, metrics=[
        Metric("copy_bw", 2.98e12, "B/s"), Metric("matmul_bf16", 774e12, "FLOP/s"),
        Metric("matmul_fp32", 51e12, "FLOP/s"), Metric("launch_us", 5.0, "us")]))
    return run_id


def add_level_run(store: Store, level: str, median_us: float, *, device: str = "cuda", shape: str = "S=4096",
                  component: str = "causal_attention", interpreted: bool = False, stage_us: float | None = None,
                  graph_us: float | None = None, stage_graph_us: float | None = None,
                  kernel_us: float | None = None, notes: list[str] | None = None,
                  kernel_metrics: list[dict] | None = None, conditions: dict | None = None) -> int:
    run_id = store.create_run("levels", component, level, device,
                              {"component": component, "shape": shape, "level": level, "device": device})
    store.start_run(run_id)
    flops, nbytes = 2.2e12 / 4, 5.4e8
    sec = median_us * 1e-6
    metrics = [Metric(n, v, "us", "forward") for n, v in (("median", median_us), ("p10", median_us * 0.95),
                                                           ("p90", median_us * 1.1), ("first_call", median_us * 9))]
    metrics += [Metric("rel_l2_err", 4e-3, "", "forward"), Metric("tolerance", 2e-2, "", "forward"),
                Metric("interpreted", float(interpreted), "", "forward"), Metric("flops", flops, "FLOP", "forward"),
                Metric("min_bytes", nbytes, "B", "forward"), Metric("flops_per_s", flops / sec, "FLOP/s", "forward"),
                Metric("bytes_per_s", nbytes / sec, "B/s", "forward"),
                Metric("intensity", flops / nbytes, "FLOP/B", "forward"),
                Metric("pct_matmul_bf16", 100 * flops / sec / 774e12, "%", "forward"),
                Metric("pct_copy_bw", 100 * nbytes / sec / 2.98e12, "%", "forward"),
                Metric("ceiling_copy_bw", 2.98e12, "B/s")]
    samples = [Samples("forward", [median_us] * 5)]
    if graph_us is not None:
        metrics.append(Metric("graph_median", graph_us, "us", "forward"))
    if stage_graph_us is not None:
        metrics.append(Metric("graph_median", stage_graph_us, "us", "patch_embed"))
    if kernel_us is not None:
        metrics.append(Metric("kernel_median", kernel_us, "us", "forward"))
    if stage_us is not None:
        metrics += [Metric("median", stage_us, "us", "patch_embed"), Metric("rel_l2_err", 1e-3, "", "patch_embed"),
                    Metric("flops_per_s", 14.8e9 / (stage_us * 1e-6), "FLOP/s", "patch_embed")]
    store.record_result(run_id, RunResult(env=ENV, metrics=metrics, samples=samples,
                                          notes=(["interpreted"] if interpreted else []) + (notes or []),
                                          kernel_metrics=kernel_metrics or [], conditions=conditions))
    return run_id


@pytest.fixture
def gpu_results(lab: Store) -> Store:
    add_ceilings(lab)
    for level, median in (("L1-naive", 20000.0), ("L1-native", 1000.0), ("L3-compile", 9000.0),
                          ("L4-triton", 1200.0)):
        add_level_run(lab, level, median)
    failed = lab.create_run("levels", "causal_attention", "L5-cuda", "cuda",
                            {"component": "causal_attention", "shape": "S=4096", "level": "L5-cuda"})
    lab.start_run(failed)
    lab.fail_run(failed, "LevelMismatchError: L5-cuda on causal_attention S=4096: relative L2 error 0.9 against "
                         "the naive fp32 reference exceeds the tolerance 0.02\n--- traceback ---")
    return lab


def _select_stored_gpu(at: AppTest) -> AppTest:
    at.run()
    device = at.sidebar.selectbox(key="device")
    assert any(o.startswith("cuda") for o in device.options), device.options  # stored results only
    device.set_value("cuda").run()
    at.sidebar.selectbox(key="shape-causal_attention-cuda").set_value("S=4096").run()
    return at


def test_stored_gpu_results_draw_cards_charts_and_roofline(gpu_results: Store) -> None:
    at = _select_stored_gpu(open_levels())
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Median"] in ("20.00 ms", "1,000.0 µs", "9,000.0 µs", "1,200.0 µs")
    captions = "\n".join(c.value for c in at.caption)
    assert "% of the measured bf16 matmul rate" in captions
    assert "of the measured copy bandwidth" in captions
    assert "20.00× L1-naive" in "\n".join(str(m.delta) for m in at.metric)  # L1-native: 20 ms / 1 ms
    errors = "\n".join(e.value for e in at.error)
    assert "relative L2 error 0.9" in errors  # the failed CUDA level shows its reason
    charts = [c for c in at.get("plotly_chart")]
    assert len(charts) >= 5  # latency, speedup, TFLOP/s, GB/s, roofline
    assert "measured copy bandwidth" in captions and "datasheet" in captions.lower()
    # Buttons are off: this machine has no cuda device.
    assert at.button(key="run-L4-triton").disabled
    assert "stored results only" in captions


def test_a_flagged_timing_is_greyed_with_its_reason_and_the_conditions_are_shown(lab: Store) -> None:
    """The issue's rule on this page: a speedup resting on a flagged run is no headline, its reasons beside the card;
    a power-capped clock is a note; each run's conditions in an expander."""
    add_ceilings(lab)
    window = {"cores": 16, "other_cores": 0.02, "gpu_sm_clock_min_mhz": 1605.0, "gpu_sm_clock_median_mhz": 1785.0,
              "gpu_reasons": ["sw_power_cap"], "gpu_other_processes": [4242]}
    note = "SM clock 1605-1785 MHz, held by the software power cap (the workload's own draw)"
    flag = "1 other process on the GPU (pid 4242)"
    add_level_run(lab, "L1-naive", 20000.0, conditions={
        "state": "clean", "flags": [], "notes": [], "series": [{"phase": "forward", "state": "clean", "flags": []}]})
    native = add_level_run(lab, "L1-native", 1000.0, conditions={
        "state": "interfered", "flags": [flag], "notes": [note],
        "series": [{"phase": "forward", "batch_size": None, "state": "interfered", "flags": [flag],
                    "notes": [note], "conditions": window}]})
    at = _select_stored_gpu(open_levels())
    assert not at.exception
    assert "(20.00× L1-naive, a flagged timing)" in [str(m.delta) for m in at.metric]
    captions = "\n".join(c.value for c in at.caption)
    assert f"Timing: interfered — {flag} · {note}" in captions and "Timing: clean" in captions
    [expander] = [e for e in at.expander if e.label == f"Conditions of run #{native}"]
    shown = expander.dataframe[0].value
    assert shown.loc[0, "clock-event reasons"] == "sw_power_cap" and shown.loc[0, "SM clock min (MHz)"] == "1,605"
    assert shown.loc[0, "other processes on the GPU"] == "4242" and "CPU clock (MHz)" not in shown.columns


def test_a_deep_run_shows_what_holds_each_kernel_back(lab: Store) -> None:
    """A `levels --deep` run's Nsight Compute rows (as engine.profiling.ncu.summarize stores them) under the charts;
    the toggle that asks for them is off on this machine, with the reason."""
    import json

    add_ceilings(lab)
    add_level_run(lab, "L1-naive", 20000.0)
    add_level_run(lab, "L4-triton", 556.0, kernel_metrics=[{
        "phase": "forward", "kernel": "_attn_fwd_kernel", "launches": 2, "duration_us": 555.1,
        "mem_throughput_pct": 21.4, "sm_throughput_pct": 83.2,
        "metrics": json.dumps({"sm__warps_active.avg.pct_of_peak_sustained_active": {"mean": 12.4, "unit": "%"},
                               "launch__registers_per_thread": {"mean": 188.0, "unit": "register/thread"}})}])
    at = _select_stored_gpu(open_levels())
    assert not at.exception
    assert "Nsight Compute: what holds each kernel back" in [h.value for h in at.subheader]
    table = next(d.value for d in at.dataframe if "occupancy %" in d.value.columns)
    (row,) = table.to_dict("records")
    assert (row["level"], row["kernel"], row["SM %"], row["occupancy %"], row["regs/thread"]) == (
        "L4-triton", "_attn_fwd_kernel", "83.2", "12.4", "188")
    toggle = at.sidebar.toggle(key="deep")
    assert toggle.disabled  # no ncu here (and no CUDA device)


def test_interpreted_runs_stay_off_the_charts(lab: Store) -> None:
    add_level_run(lab, "L4-triton", 5e6, device="cpu", shape="small", interpreted=True)
    at = open_levels()
    at.run()
    assert not at.exception
    captions = "\n".join(c.value for c in at.caption)
    assert "Triton interpreter on the CPU" in captions
    assert "Interpreted runs (correctness only" in captions
    assert not at.get("plotly_chart")  # nothing timed for real: no charts
    assert any("No timed results" in i.value for i in at.info)


def test_cpu_cards_grey_out_cuda_with_the_reason_and_show_sources(lab: Store) -> None:
    at = open_levels()
    at.run()
    assert at.button(key="run-L5-cuda").disabled
    assert "Not available on cpu: needs a CUDA device" in "\n".join(c.value for c in at.caption)
    assert not at.button(key="run-L1-naive").disabled
    code = "\n".join(c.value for c in at.code)
    assert "class NaiveCausalAttention" in code  # the naive module's source is on the page
    assert "def attention" in code or "@triton.jit" in code


def test_vit_stage_table(lab: Store) -> None:
    add_ceilings(lab)
    add_level_run(lab, "L1-naive", 3000.0, component="vit_patch_attention", shape="ViT-B/16", stage_us=657.0)
    add_level_run(lab, "L4-triton", 400.0, component="vit_patch_attention", shape="ViT-B/16", stage_us=145.0,
                  graph_us=350.0, stage_graph_us=41.5)
    at = open_levels()
    at.run()
    at.sidebar.selectbox(key="component").set_value("vit_patch_attention").run()
    at.sidebar.selectbox(key="device").set_value("cuda").run()
    assert not at.exception
    assert any(s.value == "Stages timed on their own" for s in at.subheader)
    table = at.dataframe[0].value
    assert set(table["stage"]) == {"patch_embed"} and "657.0 µs" in set(table["median"])
    # The CUDA-graph (device) time sits beside the per-call median, where the run has one.
    triton_row = table[table["level"] == "L4-triton"].iloc[0]
    assert triton_row["median"] == "145.0 µs" and triton_row["in a CUDA graph"] == "41.5 µs"
    assert table[table["level"] == "L1-naive"].iloc[0]["in a CUDA graph"] == "—"
    captions = "\n".join(c.value for c in at.caption)
    assert "Per call — events 400.0 µs · in a CUDA graph 350.0 µs (events include" in captions
    assert "Hollow points: the same calls replayed from one CUDA graph" in captions  # the roofline says what it shows


def test_cards_show_the_three_timers_and_where_they_disagree(lab: Store) -> None:
    """A CUDA level's card puts events per call, the CUDA-graph time and the profiler's kernel time side by side; the
    run's cross-timer notes show as a warning with why the timers may differ, or as one line where they agree."""
    from engine.measure.kernel_timers import AGREE_NOTE, CrossTimers, notes

    add_ceilings(lab)
    disagree = notes(CrossTimers(events_us=270.0, graph_us=60.0, kernel_us=52.5))  # host-bound per call
    add_level_run(lab, "L4-triton", 270.0, graph_us=60.0, kernel_us=52.5, notes=["timed over 2 sets", *disagree])
    add_level_run(lab, "L1-native", 1000.0, graph_us=990.0, kernel_us=980.0, notes=[AGREE_NOTE])
    add_level_run(lab, "L3-compile", 900.0)  # no graph, no profiler figure (e.g. an older run): one timer
    at = _select_stored_gpu(open_levels())
    assert not at.exception
    captions = "\n".join(c.value for c in at.caption)
    assert ("Per call — events 270.0 µs · in a CUDA graph 60.0 µs · profiler kernel time 52.5 µs (events include "
            "the host's cost of each call") in captions
    assert ("Per call — events 1,000.0 µs · in a CUDA graph 990.0 µs · profiler kernel time 980.0 µs" in captions
            and "they agree within the stated bounds" in captions)
    assert "events 900.0 µs" not in captions
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1, warnings  # only the disagreeing level
    assert "host/launch bound: events 270.0 µs per call against profiler kernel busy 52.5 µs" in warnings[0]
    assert "cross-timer:" not in warnings[0] and "Why they may" in warnings[0] and "Three timers" in warnings[0]


def test_a_profiler_that_could_not_measure_is_said_in_a_caption(lab: Store) -> None:
    from engine.measure.kernel_timers import NOT_MEASURED

    add_ceilings(lab)
    add_level_run(lab, "L4-triton", 270.0, graph_us=60.0, notes=[f"{NOT_MEASURED} (RuntimeError: CUPTI missing)"])
    at = _select_stored_gpu(open_levels())
    assert not at.exception and not at.warning
    captions = "\n".join(c.value for c in at.caption)
    assert "Per call — events 270.0 µs · in a CUDA graph 60.0 µs (events" in captions
    assert "profiler kernel time not measured (RuntimeError: CUPTI missing)" in captions


def test_run_all_queues_every_available_level(lab: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    queued: list[jobs.JobSpec] = []
    monkeypatch.setattr(jobs, "submit", lambda store, specs, group_id=None: (queued.extend(specs),
                                                                             list(range(1, len(specs) + 1)))[1])
    at = open_levels()
    at.run()
    at.button(key="run-all").click().run()
    assert not at.exception
    levels = [s.mode for s in queued]
    assert levels[:4] == ["L1-naive", "L1-native", "L2-torchscript", "L3-compile"] and "L5-cuda" not in levels
    assert all(s.kind == "levels" and s.params["shape"] == "small" for s in queued)
    assert any("Queued #1 L1-naive" in s.value for s in at.success)


def test_charts_add_the_in_graph_time_where_a_run_has_one(lab: Store) -> None:
    """A level timed in a CUDA graph too gets a diamond on the latency bars and a hollow roofline point at the same
    FLOPs over the in-graph time; a level without one gets neither."""
    from app import level_charts
    from engine.levels.results import level_results
    from engine.measure.ceilings import latest_ceilings

    add_ceilings(lab)
    add_level_run(lab, "L1-native", 500.0)
    add_level_run(lab, "L4-triton", 270.0, graph_us=60.0)  # host-bound per call: the kernel itself is 4.5x faster
    frame = level_results(lab, component="causal_attention", device="cuda")
    levels = ["L1-native", "L4-triton"]
    bars = level_charts.latency_bar(frame, levels)
    diamonds = [t for t in bars.data if t.name == "in a CUDA graph (device time)"]
    assert len(diamonds) == 1 and list(diamonds[0].x) == ["L4-triton"] and list(diamonds[0].y) == [60.0]
    roof = level_charts.roofline(frame, latest_ceilings(lab, device="cuda"), "bf16", levels)
    per_call = {t.name: t.y[0] for t in roof.data if t.name in levels}
    hollow = {t.name: t.y[0] for t in roof.data if t.name and t.name.endswith("in a CUDA graph")}
    assert list(hollow) == ["L4-triton in a CUDA graph"]
    assert hollow["L4-triton in a CUDA graph"] == pytest.approx(per_call["L4-triton"] * 270.0 / 60.0)


def test_your_kernel_field_checks_it_and_your_kernels_show_their_guard_verdicts(lab: Store) -> None:
    """A stored yours: run appears under "Your kernels" with its figures and verdicts; the "Your kernel" field checks
    the kernel in a separate process: a bad one gets its one-line reason, a good one a Run button."""
    kernels = str(Path(__file__).resolve().parents[1] / "engine" / "levels" / "user_kernels")
    add_level_run(lab, "L1-naive", 400.0, device="cpu", shape="small")
    key = "yours:user_attention:attention"
    run_id = lab.create_run("levels", "causal_attention", key, "cpu",
                            {"component": "causal_attention", "shape": "small", "level": key, "device": "cpu"})
    lab.start_run(run_id)
    verdicts = ["guard threads: PASS — no host thread started by a call",
                "guard roofline: FLAG — the median beats the floor of the measured ceilings"]
    lab.record_result(run_id, RunResult(env=ENV, notes=["your kernel user_attention:attention", *verdicts], metrics=[
        Metric("median", 200.0, "us", "forward"), Metric("p10", 190.0, "us", "forward"),
        Metric("p90", 220.0, "us", "forward"), Metric("rel_l2_err", 1e-7, "", "forward"),
        Metric("tolerance", 2e-3, "", "forward"), Metric("interpreted", 0.0, "", "forward"),
        Metric("flops_per_s", 1e9, "FLOP/s", "forward"), Metric("bytes_per_s", 1e8, "B/s", "forward"),
        Metric("guard_threads", 1.0, "", "forward"), Metric("guard_roofline", 0.0, "", "forward")],
        samples=[Samples("forward", [200.0] * 5)]))
    at = open_levels()
    at.run()
    assert not at.exception
    assert any(s.value == "Your kernels" for s in at.subheader)
    text = "\n".join(m.value for m in at.markdown)
    assert "**yours:user_attention:attention** — median 200.0 µs · 2.00× L1-naive" in text and f"run #{run_id}" in text
    captions = "\n".join(c.value for c in at.caption)
    assert all(v in captions for v in verdicts)  # every guard's verdict, and only those notes
    assert "your kernel user_attention:attention" not in captions
    at.sidebar.text_input(key="impl-path").set_value(kernels)
    at.sidebar.text_input(key="impl").set_value("user_cheats:wrong_signature").run()
    assert not at.exception
    assert any("user_cheats:wrong_signature has the signature" in e.value for e in at.error)
    assert not [b for b in at.button if b.key == "run-yours"]
    at.sidebar.text_input(key="impl").set_value("user_attention:attention").run()
    assert at.button(key="run-yours").label == "Run your kernel user_attention:attention"
