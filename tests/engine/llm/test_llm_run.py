"""Real LLM-lab runs of the tiny preset on the CPU, in every mode the CPU has: figures, samples, profiles, the check
against eager, the ceilings each percentage divides by, and the reports (written, readable, rebuilt from the store)."""

from __future__ import annotations

import json
import stat
import statistics
import sys
from pathlib import Path

import pytest
import torch

from engine.llm import metrics as M
from engine.llm import run as llm_run_module
from engine.llm.modes import MODES, availability, get_mode
from engine.llm.report import REPORT_FILES, from_result, from_store, render, report_files
from engine.llm.run import LLMConfig, llm_run, params_of
from engine.measure.ceilings import CEILINGS
from engine.measure.checks import ToleranceError
from engine.store.db import Metric, RunResult, Store
from engine.store.envinfo import capture_env
from engine.workloads.llama import preset
from tests.engine.llm.drift import drift_prefill

COPY_BW, MATMUL = 2.0e10, 5.0e10  # the fake ceilings this module stores (B/s, FLOP/s)


def metric(result: RunResult, name: str, phase: str | None = None) -> float:
    found = [m.value for m in result.metrics if m.name == name and m.phase == phase]
    assert found, f"no metric {name} ({phase})"
    return found[-1]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A store holding one ceilings measurement of this CPU (fixed values, so the percentages can be checked)."""
    store = Store(tmp_path_factory.mktemp("llm") / "r.duckdb")
    store.init()
    run_id = store.create_run("ceilings", "ceilings", "measure", "cpu", {"device": "cpu"})
    store.start_run(run_id)
    store.record_result(run_id, RunResult(env=capture_env("cpu"), metrics=[
        Metric("copy_bw", COPY_BW, CEILINGS["copy_bw"][0]), Metric("matmul_fp32", MATMUL, "FLOP/s")]))
    return store


@pytest.fixture(scope="module")
def eager(db: Store, tmp_path_factory: pytest.TempPathFactory) -> tuple[LLMConfig, RunResult]:
    cfg = LLMConfig(preset="tiny", prompt_len=12, new_tokens=5, batch=2, mode="eager", prefill_iters=3,
                    decode_passes=2, check_tokens=3, profile_decode_steps=3, ceilings="stored", db=str(db.path),
                    artifacts_dir=str(tmp_path_factory.mktemp("eager")))
    return cfg, llm_run(cfg)


def test_eager_run_times_both_phases_and_keeps_every_sample(eager) -> None:
    cfg, result = eager
    samples = {s.phase: s for s in result.samples}
    assert len(samples["prefill"].values) == 3
    assert len(samples["decode"].values) == 2 * 5  # two timed passes of N steps
    assert all(v > 0 for v in samples["decode"].values)
    tpot = metric(result, "tpot_median_us", "decode")
    assert tpot == pytest.approx(statistics.median(samples["decode"].values))  # every sample of every pass
    assert metric(result, "tokens_per_s", "decode") == pytest.approx(2 / (tpot * 1e-6))
    assert metric(result, "first_call_us", "prefill") > 0 and metric(result, "first_call_us", "decode") > 0
    # eager is the reference: its cache was checked against a full recompute, in float32 to 1e-4
    assert metric(result, "tolerance") == 1e-4
    assert metric(result, "cache_vs_recompute_rel_err") < 1e-4
    assert metric(result, "tokens_matched") == 4  # the prefill's token and 3 decode steps


def test_mfu_and_mbu_divide_by_the_stored_ceilings(eager) -> None:
    cfg, result = eager
    mc = preset("tiny")
    ttft_s = metric(result, "ttft_us", "prefill") * 1e-6
    flops = M.prefill_flops(mc, 2, 12)
    assert metric(result, "flops", "prefill") == flops
    assert metric(result, "mfu_pct", "prefill") == pytest.approx(100 * flops / ttft_s / MATMUL)
    tpot_s = metric(result, "tpot_median_us", "decode") * 1e-6
    moved = M.decode_counts(mc, 2, 12, 5, 4).bytes
    assert metric(result, "bytes", "decode") == pytest.approx(moved)
    assert metric(result, "mbu_pct", "decode") == pytest.approx(100 * moved / tpot_s / COPY_BW)
    assert metric(result, "ceiling_copy_bw") == COPY_BW and metric(result, "ceiling_matmul_fp32") == MATMUL
    assert any("MFU divides by the measured fp32 matmul rate" in n for n in result.notes)
    assert not [m for m in result.metrics if "datasheet" in m.name]  # no datasheet for a CPU: none claimed


def test_profiles_keep_prefill_and_decode_apart(eager) -> None:
    cfg, result = eager
    phases = {r["phase"] for r in result.op_stats}
    assert phases == {"prefill", "decode"}
    decode_ops = {r["name"] for r in result.op_stats if r["phase"] == "decode" and r["kind"] == "operator"}
    assert "aten::index_copy_" in decode_ops  # the cache write
    assert metric(result, "prof_steps", "decode") == 3 and metric(result, "prof_steps", "prefill") == 2
    traces = {a.name for a in result.artifacts if a.kind == "chrome_trace"}
    assert traces == {"trace-prefill.json.gz", "trace-decode.json.gz"}


def test_reports_are_written_and_readable(eager) -> None:
    cfg, result = eager
    files = {a.name: Path(a.path) for a in result.artifacts if a.kind == "report"}
    assert set(files) == set(REPORT_FILES)
    report = files["report.md"].read_text()
    assert "TTFT" in report and "TPOT" in report and "of the measured fp32 matmul rate" in report
    assert "Top operators, decode" in report and "-bound, so judged by" in report
    stored = json.loads(files["metrics.json"].read_text())
    assert any(m["name"] == "ttft_us" and m["phase"] == "prefill" for m in stored)
    inputs = json.loads(files["inputs.json"].read_text())
    assert inputs["params"]["prompt_len"] == 12 and inputs["model"]["dim"] == 64
    assumptions = files["assumptions.md"].read_text()
    assert "2·B·H·h·P·(P + 1)" in assumptions and f"{M.prefill_flops(preset('tiny'), 2, 12):,} FLOPs" in assumptions
    assert json.loads(files["env.json"].read_text())["torch"] == torch.__version__
    assert "aten::" in files["operators.md"].read_text()


def test_reports_rebuild_from_the_store(eager, db: Store, tmp_path: Path) -> None:
    cfg, result = eager
    run_id = db.create_run("llm", "llama-tiny", "eager", "cpu", params_of(cfg))
    db.start_run(run_id)
    db.record_result(run_id, result)
    view = from_store(db, run_id)
    assert view.get("ttft_us", "prefill") == metric(result, "ttft_us", "prefill")
    rebuilt = render(view)
    fresh = render(from_result(params_of(cfg), result, run_id))
    assert rebuilt["assumptions.md"] == fresh["assumptions.md"]
    assert rebuilt["report.md"].splitlines()[:12] == fresh["report.md"].splitlines()[:12]
    files = report_files(db, run_id, tmp_path / "out")
    assert all(files[name].parent == tmp_path / "out" and files[name].stat().st_size > 0 for name in REPORT_FILES)


@pytest.mark.parametrize("mode", ["sdpa-math", "sdpa-flash"])
def test_sdpa_backends_match_eager(mode: str, db: Store, tmp_path: Path) -> None:
    cfg = LLMConfig(preset="tiny", prompt_len=10, new_tokens=4, mode=mode, prefill_iters=2, decode_passes=1,
                    check_tokens=3, profile=False, ceilings="none", artifacts_dir=str(tmp_path))
    result = llm_run(cfg)
    assert metric(result, "max_rel_err", "prefill") < 1e-4
    assert metric(result, "max_rel_err", "decode") < 1e-4
    assert metric(result, "tokens_matched") == 4
    assert not [m for m in result.metrics if m.name in ("mfu_pct", "mbu_pct")]  # ceilings="none": no percentages


def test_modes_that_cannot_run_here_say_why() -> None:
    assert "CUDA graphs need a CUDA device" in availability(get_mode("compile-reduce-overhead"), "cpu", torch.float32)
    assert "CUDA" in availability(get_mode("sdpa-efficient"), "cpu", torch.float32)
    with pytest.raises(RuntimeError, match="compile-cudagraph is not available on cpu"):
        llm_run(LLMConfig(mode="compile-cudagraph", ceilings="none"))
    with pytest.raises(ValueError, match="unknown LLM mode"):
        LLMConfig(mode="turbo").validate()
    with pytest.raises(ValueError, match="no Llama preset"):
        LLMConfig(preset="70B").validate()


def test_a_mode_off_tolerance_fails_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A mode whose logits drift (here: a prefill that adds 1 % noise) fails with ToleranceError, before timing."""
    drift_prefill(monkeypatch, 1.01)
    with pytest.raises(ToleranceError, match="sdpa-math: prefill logits differ from eager's"):
        llm_run(LLMConfig(preset="tiny", prompt_len=8, new_tokens=2, mode="sdpa-math", profile=False,
                          ceilings="none", artifacts_dir=str(tmp_path)))


@pytest.mark.slow
def test_compile_mode_matches_eager_with_one_graph_per_phase(tmp_path: Path) -> None:
    """torch.compile of prefill and of the decode step (one layer, to keep the CPU compile short)."""
    assert availability(MODES["compile"], "cpu", torch.float32) is None
    cfg = LLMConfig(preset="tiny", layers=1, prompt_len=8, new_tokens=3, mode="compile", prefill_iters=2,
                    decode_passes=1, check_tokens=2, profile=False, ceilings="none", artifacts_dir=str(tmp_path))
    result = llm_run(cfg)
    assert metric(result, "graphs_compiled") == 2 and metric(result, "recompiles") == 0
    assert metric(result, "graph_breaks") == 0
    assert metric(result, "max_rel_err", "prefill") < 1e-4 and metric(result, "max_rel_err", "decode") < 1e-4
    assert metric(result, "tokens_matched") == 3
    # compilation happens in the first calls, timed on their own
    assert metric(result, "first_call_us", "decode") > 20 * metric(result, "tpot_median_us", "decode")


NCU_CSV = """==PROF== Connected to process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3","h","gemv2T_kernel_val","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","m","gpu__time_duration.sum","usecond","11.5"
"0","4242","python3","h","gemv2T_kernel_val","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","m","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","88.0"
"0","4242","python3","h","gemv2T_kernel_val","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0","m","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","21.0"
"""


def test_deep_runs_ncu_on_the_top_decode_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Nsight Compute plumbing with a stand-in `ncu` (it writes a CSV to --log-file and exits)."""
    from engine.profiling import ncu

    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
                    f"open(args[args.index('--log-file') + 1], 'w').write({NCU_CSV!r})\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(ncu, "ncu_path", lambda: str(fake))
    cfg = LLMConfig(preset="1B", prompt_len=512, new_tokens=128, mode="compile-cudagraph", device="cuda", top_k=2)
    rows = [{"kind": "kernel", "name": "void gemv2T_kernel_val<int, 128>(float)", "self_us": 90.0},
            {"kind": "kernel", "name": "triton_red_fused_add_mean_0", "self_us": 9.0},
            {"kind": "kernel", "name": "tiny_kernel", "self_us": 1.0},
            {"kind": "operator", "name": "aten::mm", "self_us": 500.0}]
    result = RunResult()
    llm_run_module._deep(cfg, rows, tmp_path, result)
    assert not result.notes, result.notes
    (row,) = result.kernel_metrics
    assert row["kernel"] == "gemv2T_kernel_val" and row["duration_us"] == 11.5 and row["phase"] == "decode"
    command = (tmp_path / "ncu-decode.log").read_text().splitlines()[0]
    assert "regex:gemv2T_kernel_val|triton_red_fused_add_mean_0" in command  # the top-2 kernels, by name
    assert "--launch-count" in command and "-m engine.llm.run --ncu-target --preset 1B --mode compile-cudagraph" \
        in command
    assert {a.kind for a in result.artifacts} == {"ncu_log", "ncu_csv"}
