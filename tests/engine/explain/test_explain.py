"""The explainer: a step's terms from a trace (by hand and from real CPU runs made by the job runner), the sentence
that names the dominant difference, the floor and the ceilings it names, the CLI, and the first-call cache record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.cli import main as cli
from engine.explain.why import (
    ADD_UP_TOLERANCE,
    TERMS,
    Partition,
    Side,
    dominant_sentence,
    explain,
    fmt,
    partition,
    partition_from_stats,
    render,
)
from engine.measure.ceilings import CEILINGS
from engine.measure.op_stats import load_trace, parse_events, step_spans
from engine.runner import jobs
from engine.store.db import Store
from engine.workloads.house_price import step_cost


# -- a GPU trace, by hand -------------------------------------------------------------------------------------------
def gpu_trace() -> dict:
    """Two steps of a Kineto-style CUDA trace with a guard check, launches on two threads and a gap between steps."""
    H, T2, D = {"pid": 1, "tid": 1}, {"pid": 1, "tid": 2}, {"pid": 0, "tid": 7}
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **H},
        {"ph": "X", "cat": "cpu_op", "name": "TorchDynamo Cache Lookup", "ts": 2, "dur": 4, **H},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 10, "dur": 30, **H},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 8, **H},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 30, "dur": 20, **D},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 50, "dur": 20, **H},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 55, "dur": 5, **H},
        {"ph": "X", "cat": "kernel", "name": "relu", "ts": 60, "dur": 10, **D},
        # The autograd thread launches while the main thread waits: launch time, not framework.
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 80, "dur": 5, **T2},
        # 100–104: no step, no host event, device idle → idle.
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 104, "dur": 96, **H},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 110, "dur": 12, **H},
        {"ph": "X", "cat": "kernel", "name": "triton_fused", "ts": 130, "dur": 30, **D},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 170, "dur": 40, **D},  # past the last step: window → 210
        {"ph": "M", "name": "process_name", **H, "args": {"name": "python"}},
    ]
    return {"traceEvents": ev}


def test_partition_of_a_gpu_trace_by_hand():
    p = partition(gpu_trace())
    assert p.has_device and p.steps == 2
    assert p.step_us == pytest.approx(210 / 2)
    # busy [30,50] ∪ [60,70] ∪ [130,160] ∪ [170,210] = 100; launches outside busy: 8 + 5 + 5 + 12 = 30;
    # guard 4; idle 100–104 = 4; framework: the rest of the 210 µs window = 72.
    assert p.terms == pytest.approx({"compute": 50, "launch": 15, "guard": 2, "framework": 36, "idle": 2})
    assert p.total == pytest.approx(p.step_us)
    assert p.device_idle_us == pytest.approx(55)
    assert p.host["launches_per_step"] == 2 and p.host["launch_host_us"] == pytest.approx(15)
    assert p.host["kernels_per_step"] == 2


def test_a_launch_hidden_under_device_work_is_not_launch_cost():
    ev = gpu_trace()["traceEvents"]
    # Move the first launch under the gemm kernel: the device is busy, so that instant is compute.
    ev[3] = {**ev[3], "ts": 32}
    assert partition({"traceEvents": ev}).terms["launch"] == pytest.approx((5 + 5 + 12) / 2)


def graphed_step_trace() -> dict:
    """One step of a compiled, CUDA-graphed inference (what reduce-overhead does) at a tiny batch: Inductor's wrapper
    copies the input into the graph's static buffer, launches the graph, then the caller synchronises."""
    H, D = {"pid": 1, "tid": 1}, {"pid": 0, "tid": 7}
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **H},
        {"ph": "X", "cat": "cpu_op", "name": "TorchDynamo Cache Lookup", "ts": 1, "dur": 4, **H},
        {"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph fabc ##", "ts": 5, "dur": 60, **H},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 10, "dur": 15, **H},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 15, "dur": 5, **H},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 22, "dur": 3, **D},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 40, "dur": 10, **H},
        {"ph": "X", "cat": "kernel", "name": "triton_fused", "ts": 52, "dur": 8, **D},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 70, "dur": 20, **H},
    ]
    return {"traceEvents": ev}


def test_named_parts_of_a_graphed_step_by_hand():
    p = partition(graphed_step_trace())
    # device busy: memcpy 22–25, kernel 52–60 → 11; launches outside it: 15–20 and 40–50 → 15; guard 1–5 → 4;
    # framework: the wrapper's own time (5–10, 25–40, 50–52, 60–65 less the busy 52–60 → 27), the copy's own time
    # (10–15, 20–22 → 7), the sync 70–90 (20) and the step's own 0–1, 65–70, 90–100 (16) → 70.
    assert p.terms == pytest.approx({"compute": 11, "launch": 15, "guard": 4, "framework": 70, "idle": 0})
    assert p.details == pytest.approx({"sync": 20, "graph_wrapper": 27, "copy_ops": 7, "memcpy": 3})


def test_sentence_names_the_parts_a_compiled_small_step_pays_for():
    slow = side("compile-reduce-overhead", {"compute": 11, "launch": 15, "guard": 4, "framework": 70})
    slow.partition.details = {"sync": 20.0, "graph_wrapper": 27.0, "copy_ops": 7.0, "memcpy": 3.0}
    fast = side("eager", {"compute": 12, "launch": 20, "framework": 18})
    fast.partition.details = {"sync": 16.0}
    text = dominant_sentence(slow, fast)
    assert "the host spends 70.0 µs in Python and framework code" in text
    # parts of at least a tenth of the 50 µs gap, largest first; the 4 µs more of syncs is too small to name
    assert ("of it: Inductor's wrapper around the compiled graph (CUDA-graph bookkeeping, checks) 27.0 µs "
            "(eager: 0.0 µs), host dispatching copies (aten::copy_, e.g. inputs into static buffers) 7.0 µs") in text
    assert "synchronisations" not in text


def side(mode: str, terms: dict[str, float], **host) -> Side:
    s = Side(label="A", mode=mode, device="cuda", workload="house_price", phase="train", batch_size=64, given_run=1)
    s.partition = Partition(step_us=sum(terms.values()), terms={t: terms.get(t, 0.0) for t in TERMS}, steps=5,
                            has_device=True, host=host)
    return s


def test_sentence_names_launches_when_the_host_launches_too_much():
    eager = side("eager", {"compute": 132, "launch": 300, "framework": 500}, launches_per_step=30,
                 launch_host_us=400, kernels_per_step=30)
    compiled = side("compile", {"compute": 142, "launch": 1500, "framework": 200}, launches_per_step=16,
                    launch_host_us=1800, kernels_per_step=16)
    text = dominant_sentence(eager, compiled)
    assert text.startswith("compile is slower than eager (train, B=64, cuda): 1.84 ms vs 932 µs per step")
    assert "device busy 142 µs vs 132 µs" in text
    assert "the host takes 1.80 ms launching 16 kernels" in text and "CUDA graphs" in text
    assert "133% of the gap" not in text and "of the gap" in text


def test_sentence_names_framework_compute_and_equal_speed():
    a = side("fx", {"compute": 100, "framework": 900})
    b = side("compile", {"compute": 100, "framework": 100})
    assert "Python and framework code" in dominant_sentence(a, b)
    slow_kernels = side("torchscript", {"compute": 900, "framework": 100}, kernels_per_step=12)
    assert "most of the gap is compute" in dominant_sentence(slow_kernels, b)
    same = side("fx2", {"compute": 100, "framework": 102})
    assert "take about the same time" in dominant_sentence(same, b)


def test_sentence_asks_for_a_profile_when_one_is_missing():
    a = side("eager", {"compute": 100, "framework": 900})
    a.unprofiled_us = 950.0
    b = Side(label="B", mode="fx", device="cpu", workload="house_price", phase="train", batch_size=64, given_run=2,
             bench_median_us=5000.0, unprofiled_us=5000.0, missing_profile="python -m engine profile --mode fx")
    text = dominant_sentence(a, b)
    # Without a profile on both sides, the times compared are both measured without the profiler.
    assert text.startswith("fx is slower than eager (train, B=64, cpu): 5.00 ms vs 950 µs per step")
    assert "profile fx: `python -m engine profile --mode fx`" in text


def test_step_cost_of_the_mlp():
    train, infer = step_cost(64, "train"), step_cost(64, "infer")
    layers = 5 * 256 + 256 * 256 + 256
    assert infer.flops == 2 * 64 * layers
    assert train.flops == 2 * 64 * layers * 2 + 2 * 64 * (256 * 256 + 256)  # ≈ 25.6 MFLOP
    params = 5 * 256 + 256 + 256 * 256 + 256 + 256 + 1
    assert train.bytes == 6 * 4 * params + 4 * 64 * 6 and infer.bytes == 4 * params + 4 * 64 * 6
    with pytest.raises(ValueError):
        step_cost(0, "train")


# -- real CPU runs, made by the job runner ---------------------------------------------------------------------------
def trace_of(store: Store, run_id: int) -> str:
    return store.artifacts(run_id).query("kind == 'chrome_trace'")["path"].iloc[0]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, module_lab):
    """Ceilings, bench runs of eager, compile and fx, and profiles of eager and compile (train, B=64): tiny runs."""
    with module_lab(tmp_path_factory.mktemp("explain")) as (store, env):
        bench = {"workload": "house_price", "device": "cpu", "phases": ["train"], "train_batch_sizes": [64],
                 "warmup": 1, "iters": 5}
        prof = {"workload": "house_price", "device": "cpu", "phases": ["train"], "batch_size": 64, "wait": 0,
                "warmup": 1, "active": 2, "settle": 1, "unprofiled_iters": 3}
        specs = [jobs.JobSpec("ceilings", "ceilings", "measure", "cpu", {"device": "cpu", "quick": True})]
        specs += [jobs.JobSpec("bench", "house_price", m, "cpu", {**bench, "mode": m}) for m in ("eager", "compile",
                                                                                                 "fx")]
        specs += [jobs.JobSpec("profile", "house_price", m, "cpu", {**prof, "mode": m}) for m in ("eager", "compile")]
        ids = jobs.create_runs(store, specs)
        statuses = jobs.run_jobs(store, ids)
        failed = {i: store.run(i)["error"] for i, s in statuses.items() if s != "ok"}
        assert not failed, failed
        names = ["ceilings", "bench_eager", "bench_compile", "bench_fx", "profile_eager", "profile_compile"]
        yield {"store": store, "env": env, **dict(zip(names, ids))}


def test_terms_add_up_to_the_measured_step_on_real_runs(lab):
    store = lab["store"]
    e = explain(store, lab["profile_eager"], lab["profile_compile"])
    assert (e.a.phase, e.a.batch_size) == ("train", 64)
    for s in (e.a, e.b):
        p = s.partition
        assert p is not None and not p.has_device and p.steps == 2
        assert all(v >= 0 for v in p.terms.values())
        # The stated tolerance: the terms partition the profiled step, only rounding may separate them.
        assert abs(p.total - p.step_us) <= ADD_UP_TOLERANCE * p.step_us
        # …and that step is the one the profile measured: its steps' wall time (the stored metric) plus the gaps
        # between steps, which are the idle term on a CPU.
        m = store.metrics([s.profile_run]).set_index("name")["value"]
        spans = step_spans(parse_events(load_trace(trace_of(store, s.profile_run))))
        gaps = sum(b[0] - a[1] for a, b in zip(spans, spans[1:]))
        assert p.step_us * p.steps == pytest.approx(m["profiled_wall_us"] + gaps, rel=1e-6)
        assert p.terms["idle"] * p.steps == pytest.approx(gaps, abs=1e-3)
        assert p.terms["compute"] > 0 and p.terms["framework"] > 0 and p.terms["launch"] == 0  # CPU: no launches
        # The same step timed without the profiler, in the same worker, is reported beside it.
        assert s.unprofiled_us == pytest.approx(m["step_median_us"]) and s.unprofiled_us > 0
        assert any(f"without the profiler {fmt(s.unprofiled_us)}" in n for n in e.notes)
    assert e.b.partition.terms["guard"] > 0  # dynamo's cache lookup runs on every compiled call
    assert e.a.partition.terms["guard"] == 0


def test_the_partition_from_stored_op_stats_matches_the_trace_on_cpu(lab):
    store = lab["store"]
    run_id = lab["profile_eager"]
    trace = trace_of(store, run_id)
    exact = partition(load_trace(trace))
    metrics = store.metrics([run_id]).set_index("name")["value"].to_dict()
    approx = partition_from_stats(store.op_stats([run_id], phase="train"), metrics)
    assert approx.terms["compute"] == pytest.approx(exact.terms["compute"], rel=0.01)
    assert approx.total == pytest.approx(approx.step_us)
    # With the trace gone, explain falls back to it and says so.
    moved = Path(trace).with_suffix(".moved")
    os.replace(trace, moved)
    try:
        e = explain(store, run_id, lab["profile_compile"])
    finally:
        os.replace(moved, trace)
    assert e.a.approximate and any("trace of profile run" in n for n in e.notes)


def test_sentence_on_real_runs_names_the_largest_difference(lab):
    e = explain(lab["store"], lab["bench_eager"], lab["bench_compile"])
    # Bench runs find the newest profile of the same mode, device, phase and batch.
    assert (e.a.profile_run, e.b.profile_run) == (lab["profile_eager"], lab["profile_compile"])
    assert e.a.bench_median_us and e.b.first_call_us and e.b.compile_once_us > 0
    # The sentence compares the bench medians (what a page's cards show) and names the bench runs.
    slow, fast = (e.a, e.b) if e.a.bench_median_us >= e.b.bench_median_us else (e.b, e.a)
    if (slow.bench_median_us - fast.bench_median_us) / fast.bench_median_us < 0.05:
        assert "about the same time" in e.sentence
        return
    assert e.sentence.startswith(f"{slow.mode} is slower than {fast.mode} (train, B=64, cpu): "
                                 f"{fmt(slow.bench_median_us)} vs {fmt(fast.bench_median_us)} per step (bench runs "
                                 f"#{slow.bench_run} and #{fast.bench_run})")
    disturbed = [s for s in (e.a, e.b) if s.profile_problem]
    if disturbed:  # a shared machine can disturb a run this much: the profile is then left out, and said so
        assert all(s.partition is None for s in disturbed) and "to see why, profile" in e.sentence
        assert all(any(s.profile_problem in n for n in e.notes) for s in disturbed)
        return
    if slow.partition.step_us <= fast.partition.step_us:
        assert "time it the other way round" in e.sentence
        return
    deltas = {t: slow.partition.terms[t] - fast.partition.terms[t] for t in TERMS}
    top = max(deltas, key=deltas.get)
    phrase = {"compute": "most of the gap is compute", "framework": "Python and framework code",
              "guard": "guard checks", "idle": "sits idle", "launch": "launching"}[top]
    assert e.sentence.startswith(f"{slow.mode} is slower than {fast.mode} (train, B=64, cpu)")
    assert phrase in e.sentence and "CPU compute" in e.sentence


def test_floor_names_the_ceilings_it_divides_by(lab):
    store = lab["store"]
    e = explain(store, lab["profile_eager"], lab["profile_compile"])
    ceilings = store.metrics([lab["ceilings"]]).set_index("name")["value"]
    floor = e.floor
    assert floor is not None and floor.ceilings_run == lab["ceilings"]
    cost = step_cost(64, "train")
    assert (floor.flops, floor.bytes) == (cost.flops, cost.bytes)
    by_name = {t.name: t for t in floor.terms}
    assert {t.ceiling for t in floor.terms} == {"matmul_fp32", "copy_bw", "launch_us"}  # CPU: no CUDA graphs
    assert by_name["compute"].us == pytest.approx(cost.flops / ceilings["matmul_fp32"] * 1e6)
    assert by_name["memory"].us == pytest.approx(cost.bytes / ceilings["copy_bw"] * 1e6)
    assert by_name["launch"].us == pytest.approx(ceilings["launch_us"])
    assert floor.us == max(t.us for t in floor.terms)
    for t in floor.terms:
        assert t.label.startswith(CEILINGS[t.ceiling][1])
    times, above = e.distance(e.a)
    assert times == pytest.approx(e.a.unprofiled_us / floor.us)
    assert above == pytest.approx(e.a.unprofiled_us - floor.us)
    text = render(e)
    assert "floor = " in text and "measured fp32 matmul rate" in text and "× the floor" in text


def test_a_bench_run_without_a_profile_says_which_profile_to_run(lab):
    e = explain(lab["store"], lab["bench_fx"], lab["bench_eager"])
    assert e.a.partition is None and e.a.profile_run is None
    command = ("python -m engine profile --workload house_price --mode fx --device cpu --phases train "
               "--batch-size 64")
    assert e.a.missing_profile == command
    assert command in " ".join(e.notes)
    if "about the same time" not in e.sentence:
        assert e.a.mode in e.sentence


def test_first_call_record_says_what_the_caches_held(lab):
    store = lab["store"]
    m = store.query("SELECT name, value FROM metrics WHERE run_id = ? AND phase = 'train' AND name LIKE 'cache_%'",
                    [lab["bench_compile"]]).set_index("name")["value"]
    lookups = m.get("cache_fxgraph_hit", 0) + m.get("cache_fxgraph_miss", 0)
    assert lookups >= 2  # the forward and the backward graph
    e = explain(store, lab["bench_eager"], lab["bench_compile"])
    assert "Inductor FX graph cache" in e.b.cache_text and e.a.cache_text == ""


def test_depyf_dump_of_a_compiled_profile(lab):
    pytest.importorskip("depyf")
    e = explain(lab["store"], lab["profile_eager"], lab["profile_compile"])
    assert e.a.depyf_files == []
    names = [Path(p).name for p in e.b.depyf_files]
    assert any(n.startswith("full_code_for_") for n in names)
    from engine.explain.why import read_depyf

    text = "".join(read_depyf(e.b.depyf_files).values())
    assert "__guard_" in text and "def forward" in text


def test_cli_explain(lab, capsys):
    db = lab["env"]["RESULTS_DB"]
    assert cli.main(["explain", str(lab["bench_eager"]), str(lab["profile_compile"]), "--db", db]) == 0
    out = capsys.readouterr().out
    assert "Python / framework overhead" in out and "= profiled step" in out and "floor = " in out
    assert cli.main(["explain", str(lab["bench_eager"]), str(lab["bench_compile"]), "--json", "--db", db]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sentence"] and (data["a"]["missing_profile"] or set(data["a"]["terms"]) == set(TERMS))
    # profile runs asked for by id are always read
    assert cli.main(["explain", str(lab["profile_eager"]), str(lab["profile_compile"]), "--json", "--db", db]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["a"]["terms"]) == set(TERMS) and set(data["b"]["terms"]) == set(TERMS)


@pytest.mark.parametrize("which, extra, message", [
    (("bench_eager", None), [], "no run 999"),
    (("bench_eager", "bench_compile"), ["--phase", "infer"], "measured no common phase and batch size at infer"),
    (("ceilings", "bench_eager"), [], "is a ceilings run; explain compares bench or profile runs"),
])
def test_cli_explain_errors(lab, capsys, which, extra, message):
    ids = [str(lab[w]) if w else "999" for w in which]
    assert cli.main(["explain", *ids, *extra, "--db", lab["env"]["RESULTS_DB"]]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_explain_is_a_registered_command():
    assert "engine.cli.explain" in cli.COMMAND_MODULES


def test_frame_for_the_stacked_bar(lab):
    e = explain(lab["store"], lab["profile_eager"], lab["profile_compile"])
    frame = e.frame()
    assert list(frame["term"].unique()) == list(TERMS)
    totals = frame.groupby("mode")["us"].sum()
    assert totals["eager"] == pytest.approx(e.a.partition.step_us, rel=ADD_UP_TOLERANCE)


def test_what_counts_as_cpu_compute():
    from engine.explain.why import is_cpu_compute

    assert is_cpu_compute("operator", "aten::addmm") and is_cpu_compute("operator", "modelab::bias_relu")
    assert is_cpu_compute("annotation", "## Call CompiledFxGraph fabc ##")
    assert is_cpu_compute("annotation", "## Call AOTInductor package ##")
    for kind, name in (("operator", "aten::linear"), ("operator", "aten::t"), ("operator", "AddmmBackward0"),
                       ("operator", "autograd::engine::evaluate_function: AddmmBackward0"),
                       ("operator", "TorchDynamo Cache Lookup"), ("annotation", "Optimizer.step#Adam.step"),
                       ("annotation", "ProfilerStep#3")):
        assert not is_cpu_compute(kind, name), name


def test_the_aoti_call_is_marked_for_the_profiler_only_while_profiling(monkeypatch, tmp_path):
    """The package runs without the dispatcher: its call gets a range (counted as compute) under the profiler."""
    import torch

    from engine.modes import aoti as aoti_mode
    from engine.native import aoti
    from engine.workloads.house_price import make_model

    pkg = aoti.Package(path=tmp_path / "model.pt2", digest="x", cache_hit=True, export_s=0.0, compile_s=0.0,
                       dynamic_batch=True, options={}, exported_program="")
    model = make_model().eval()
    monkeypatch.setattr(aoti, "compile_package", lambda m, inputs: pkg)
    monkeypatch.setattr(aoti, "load", lambda path, device: model)
    monkeypatch.setattr(aoti, "generated_sources", lambda path: {})
    x = torch.randn(4, 5)
    fn = aoti_mode.prepare(model, (x,), False).fn
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(x)
    names = {e.name for e in prof.events()}
    assert aoti_mode.PROFILER_LABEL in names
    with torch.no_grad():
        assert torch.equal(fn(x), model(x))  # and outside the profiler it is the plain call


def test_cli_explain_profile_runs_the_missing_profile_then_explains(lab, capsys):
    """Last in this module: it adds a profile of fx to the shared lab."""
    db = lab["env"]["RESULTS_DB"]
    assert cli.main(["explain", str(lab["bench_fx"]), str(lab["bench_eager"]), "--db", db]) == 0
    assert "fx: no profile at train B=64; run `python -m engine profile" in capsys.readouterr().out
    assert cli.main(["explain", str(lab["bench_fx"]), str(lab["bench_eager"]), "--profile", "--db", db]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("profiling fx")  # (and eager too, where its profile disagreed with its bench run)
    assert "fx: no profile" not in captured.out
    e = explain(lab["store"], lab["bench_fx"], lab["bench_eager"])
    if not (e.a.profile_problem or e.b.profile_problem):
        assert "to see why" not in captured.out
    assert "= profiled step" in captured.out
    assert lab["store"].runs(kind="profile", status=["ok"]).query("mode == 'fx'").shape[0] == 1
