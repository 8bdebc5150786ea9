"""Every level of every component against the naive reference on small CPU shapes, through the real runner; a wrong
level fails its run; ceilings are measured once, stored and read back; the levels CLI checks its arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.levels import COMPONENTS, LEVELS, resolve_levels
from engine.levels.results import level_results
from engine.levels.run import LevelMismatchError, LevelsConfig, check, run_level
from engine.measure.ceilings import CEILINGS, all_ceilings, latest_ceilings
from engine.runner.jobs import JobSpec, create_runs, run_jobs
from engine.store.db import Store

CPU_SHAPES = [(c.name, s.name) for c in COMPONENTS.values() for s in c.shapes.values() if s.runs_on("cpu")]


def _figures(result) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics if m.phase in ("forward", None)}


@pytest.mark.parametrize("component,shape", CPU_SHAPES)
@pytest.mark.parametrize("level", ["L1-naive", "L1-native", "L2-torchscript"])
def test_eager_levels_match_the_reference(component: str, shape: str, level: str, store: Store) -> None:
    result = run_level(LevelsConfig(component=component, shape=shape, level=level, iters=3, warmup=1,
                                    db=str(store.path), quick_ceilings=True))
    figures = _figures(result)
    assert figures["rel_l2_err"] <= figures["tolerance"]
    assert figures["median"] > 0 and figures["flops_per_s"] > 0 and figures["interpreted"] == 0
    assert figures["flops"] == COMPONENTS[component].flops(COMPONENTS[component].shape(shape))
    # Percentages name their denominators: the ceilings used are copied into the run.
    assert "ceiling_copy_bw" in figures and "pct_copy_bw" in figures and "ceilings_run_id" in figures


@pytest.mark.slow
@pytest.mark.parametrize("component,shape", [("causal_attention", "small"), ("vit_patch_attention", "small"),
                                             ("gnn_message_passing", "small-unsorted-mean")])
def test_compile_level_matches_the_reference(component: str, shape: str, store: Store) -> None:
    result = run_level(LevelsConfig(component=component, shape=shape, level="L3-compile", iters=3, warmup=1,
                                    db=str(store.path), quick_ceilings=True))
    figures = _figures(result)
    assert figures["rel_l2_err"] <= figures["tolerance"]
    if component == "vit_patch_attention":  # its patch embedding is timed and checked on its own too
        stage = {m.name: m.value for m in result.metrics if m.phase == "patch_embed"}
        assert stage["median"] > 0 and stage["rel_l2_err"] < 1e-4


def test_ceilings_are_measured_once_and_read_back(store: Store) -> None:
    for _ in range(2):
        run_level(LevelsConfig(component="causal_attention", shape="small", level="L1-native", iters=2, warmup=0,
                               db=str(store.path), quick_ceilings=True))
    runs = store.runs(kind="ceilings")
    assert len(runs) == 1 and runs.iloc[0]["status"] == "ok"
    found = latest_ceilings(store, device="cpu")
    assert found is not None and found.run_id == int(runs.iloc[0]["id"])
    assert set(found.values) == {"copy_bw", "matmul_fp32", "launch_us"}  # no tf32/bf16/graph ceilings on CPU
    assert found.copy_bw > 1e8 and found.matmul("fp32") > 1e7 and found.get("launch_us") > 0
    assert found.get("matmul_bf16") is None
    assert [c.run_id for c in all_ceilings(store)] == [found.run_id]
    assert set(CEILINGS) >= set(found.values)


def test_ceilings_job_through_the_runner(store: Store) -> None:
    ids = create_runs(store, [JobSpec("ceilings", "ceilings", "measure", "cpu", {"device": "cpu", "quick": True})])
    assert run_jobs(store, ids)[ids[0]] == "ok"
    metrics = store.metrics(ids).set_index("name")
    assert metrics.loc["copy_bw", "unit"] == "B/s" and metrics.loc["matmul_fp32", "unit"] == "FLOP/s"
    assert latest_ceilings(store, device="cpu").run_id == ids[0]


def test_triton_level_runs_interpreted_in_a_worker(store: Store) -> None:
    specs = [JobSpec("levels", c, "L4-triton", "cpu", {"component": c, "shape": s, "level": "L4-triton",
                                                       "device": "cpu", "iters": 1, "warmup": 0,
                                                       "quick_ceilings": True})
             for c, s in [("causal_attention", "small"), ("gnn_message_passing", "small-sorted"),
                          ("gnn_message_passing", "small-unsorted-mean"), ("vit_patch_attention", "small")]]
    ids = create_runs(store, specs)
    statuses = run_jobs(store, ids)
    frame = level_results(store, run_ids=ids)
    errors = {r["shape"]: r["error"] for r in frame.to_dict("records") if r["status"] != "ok"}
    assert set(statuses.values()) == {"ok"}, errors
    assert (frame["interpreted"] == 1).all()
    assert (frame["rel_l2_err"] <= frame["tolerance"]).all()
    notes = store.run(ids[0])["notes"]
    assert any("TRITON_INTERPRET=1" in n for n in notes)


def test_a_wrong_level_fails_its_run_with_the_error(store: Store) -> None:
    ids = create_runs(store, [JobSpec("levels", "causal_attention", "L9-wrong", "cpu",
                                      {"component": "causal_attention", "shape": "small", "device": "cpu",
                                       "quick_ceilings": True},
                                      target="tests.engine.levels.wrong_level:wrong_level_job")])
    assert run_jobs(store, ids)[ids[0]] == "failed"
    run = store.run(ids[0])
    assert "LevelMismatchError" in run["error"] and "relative L2 error" in run["error"]
    assert store.metrics(ids).empty  # a wrong level is never timed


def test_check_rejects_shape_nan_and_drift() -> None:
    import torch

    ref = torch.randn(4, 4)
    assert check("ok", ref + 1e-6, ref, 1e-3) < 1e-3
    with pytest.raises(LevelMismatchError, match="shape"):
        check("bad", ref[:2], ref, 1e-3)
    with pytest.raises(LevelMismatchError, match=r"nan: the output has NaN or inf \(16 NaN and 0 inf"):
        check("nan", ref * float("nan"), ref, 1e-3)
    with pytest.raises(LevelMismatchError, match=r"the output has NaN or inf \(0 NaN and 1 inf"):
        check("inf", torch.where(ref == ref.max(), float("inf"), ref), ref, 1e-3)
    with pytest.raises(LevelMismatchError, match="the naive fp32 reference has NaN or inf"):
        check("nan ref", ref, ref * float("nan"), 1e-3)
    with pytest.raises(LevelMismatchError, match="exceeds"):
        check("drift", ref * 1.1, ref, 1e-3)


def test_levels_resolve_and_say_why_not() -> None:
    levels, skipped = resolve_levels("all", "cpu")
    assert "L5-cuda" in skipped and "CUDA" in skipped["L5-cuda"]
    assert [lv.key for lv in levels][:4] == ["L1-naive", "L1-native", "L2-torchscript", "L3-compile"]
    chosen, _ = resolve_levels("1,L4-triton", "cpu")
    assert [lv.key for lv in chosen] == ["L1-naive", "L1-native", "L4-triton"]
    with pytest.raises(ValueError, match="unknown level"):
        resolve_levels("L7", "cpu")
    assert set(LEVELS) == {"L1-naive", "L1-native", "L2-torchscript", "L3-compile", "L4-triton", "L5-cuda"}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "levels", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def _in_process(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """`levels` through main() in this process (the listing and the refusals: no interpreter start for each)."""
    from engine.cli.main import main

    code = main(["levels", *args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_cli_lists_checks_arguments_and_runs(child_env: dict[str, str], lab_env: dict[str, str],
                                             capsys: pytest.CaptureFixture) -> None:
    listed = _in_process(capsys, "--list")
    assert listed.returncode == 0 and "causal_attention" in listed.stdout and "L5-cuda" in listed.stdout
    bad = _in_process(capsys, "--component", "convolution")
    assert bad.returncode == 2 and "unknown component" in bad.stderr
    real_on_cpu = _in_process(capsys, "--component", "causal_attention", "--shape", "S=4096")
    assert real_on_cpu.returncode == 2 and "meant for cuda" in real_on_cpu.stderr
    only_cuda = _in_process(capsys, "--component", "causal_attention", "--level", "L5-cuda")
    assert only_cuda.returncode == 2 and "not available on cpu" in only_cuda.stderr
    ran = _cli("--component", "gnn_message_passing", "--shape", "small-sorted", "--level", "L1-naive,L1-native",
               "--iters", "2", "--warmup", "0", env=child_env)
    assert ran.returncode == 0, ran.stderr
    assert "L1-native" in ran.stdout and "1.00x" in ran.stdout  # L1-naive is its own baseline


def test_cli_tables_show_graph_time_and_stages(store: Store) -> None:
    """A CUDA level run stores per-call and in-graph figures for the whole forward and for its stages; the CLI's
    tables show both side by side (runs recorded as a GPU worker records them: no GPU is needed to read them)."""
    from engine.cli.levels import levels_table, stage_table
    from engine.store.db import Metric, RunResult

    ids = []
    for level, (per_call, graph, stage_call, stage_graph) in {"L4-triton": (561.9, 286.6, 153.8, 49.7),
                                                              "L5-cuda": (364.3, 338.1, 93.4, 78.2)}.items():
        run_id = store.create_run("levels", "vit_patch_attention", level, "cuda", params={"shape": "ViT-B/16"})
        store.start_run(run_id)
        store.record_result(run_id, RunResult(metrics=[
            Metric("median", per_call, "us", phase="forward"), Metric("graph_median", graph, "us", phase="forward"),
            Metric("median", stage_call, "us", phase="patch_embed"),
            Metric("graph_median", stage_graph, "us", phase="patch_embed")]))
        ids.append(run_id)
    table = levels_table(store, ids)
    assert list(table["median_us"]) == ["561.9", "364.3"] and list(table["in_graph_us"]) == ["286.6", "338.1"]
    stages = stage_table(store, ids)
    assert stages[["stage", "level", "median_us", "in_graph_us"]].values.tolist() == [
        ["patch_embed", "L4-triton", "153.8", "49.7"], ["patch_embed", "L5-cuda", "93.4", "78.2"]]


@pytest.mark.gpu
def test_the_cuda_level_names_the_attention_kernel_it_runs() -> None:
    """L5's notes say which attention kernel this GPU gets: FlashAttention-3's design (TMA, warp-specialised wgmma)
    with its TMA-stored epilogue, variant 8, on compute capability 9.0 (where it is built: D=128 and the ViT's D=64),
    mma.sync everywhere else; building the level needs no GPU, only running it."""
    import torch

    from engine.levels.builders import _cuda

    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    expected = "TMA + warp-specialised wgmma kernel with a TMA-stored output, variant 8" if hopper else \
        "mma.sync kernel, tile variant"
    for name, shape in (("causal_attention", "S=4096"), ("vit_patch_attention", "ViT-B/16")):
        component = COMPONENTS[name]
        built = _cuda(component, component.shapes[shape], component.make_naive(component.shapes[shape]), "cuda")
        assert any(n.startswith(f"attention: {expected}") for n in built.notes), built.notes


def test_every_level_names_source_files_that_exist() -> None:
    """The page shows each level's source: every path a level names is in the repository, and the L5 attention's
    list starts with the kernel it runs on Hopper (variants 7 and 8, attention_ws.cu)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    for component in COMPONENTS.values():
        for level in LEVELS.values():
            missing = [p for p in level.sources(component) if not (root / p).is_file()]
            assert not missing, f"{level.name} on {component.name}: {missing}"
    assert LEVELS["L5-cuda"].sources(COMPONENTS["causal_attention"])[0] == "csrc/levels/attention_ws.cu"
