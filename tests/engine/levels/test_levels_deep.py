"""`levels --deep`: Nsight Compute on a level's kernels. The target (engine.levels.deep) really builds, checks and
calls the level; `ncu` itself is a stand-in here (no GPU, no Nsight Compute): a script that runs the target command
it is given, as ncu does, and writes the CSV ncu would. On the GPU machine: `levels ... --device cuda --deep`."""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

import pytest
import torch

from engine.cli.main import main
from engine.levels.results import deep_table
from engine.levels.run import DEEP_METRICS, PIPE_METRICS, LevelsConfig, _deep_profile
from engine.store import settings
from engine.store.db import RunResult, Store

ROW = ('"{id}","4242","python3","host","{kernel}","1","7","(256, 1, 1)","(64, 16, 4)","0","9.0",'
       '"Command line profiler metrics","{metric}","{unit}","{value}"')
KERNEL = "_attn_fwd_kernel"
VALUES = {"gpu__time_duration.sum": ("usecond", "555.10"),
          "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "21.40"),
          "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "83.20"),
          "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "12.40"),
          "launch__registers_per_thread": ("register/thread", "188"),
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "47.50"),
          "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("", "1.25")}
CSV = "\n".join(['"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
                 '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"']
                + [ROW.format(id=i, kernel=KERNEL, metric=m, unit=u, value=v)
                   for i in (0, 1) for m, (u, v) in VALUES.items()]) + "\n"


def stand_in_ncu(folder: Path, knows: tuple[str, ...] | None = None) -> Path:
    """An `ncu` that runs the target command after its options (as ncu does) and writes CSV to --log-file. `knows`:
    the only metrics it accepts (else every one): asked for another, it fails before running anything."""
    fake = folder / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport subprocess, sys\nargs = sys.argv[1:]\n"
                    "log = args[args.index('--log-file') + 1]\n"
                    "target = args[args.index('--log-file') + 2:]\n"
                    "print('options:', ' '.join(args[:args.index('--log-file')]))\n"
                    f"knows = {knows!r}\n"
                    "asked = args[args.index('--metrics') + 1].split(',')\n"
                    "unknown = [m for m in asked if knows is not None and m not in knows]\n"
                    "if unknown:\n"
                    "    open(log, 'w').write(f'==ERROR== Failed to find metric {unknown[0]}\\n')\n"
                    "    sys.exit(1)\n"
                    "done = subprocess.run(target, capture_output=True, text=True)\n"
                    "print(done.stdout, done.stderr)\n"
                    f"open(log, 'w').write({CSV!r} if done.returncode == 0 else '==ERROR== the target failed')\n"
                    "sys.exit(done.returncode)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


def test_the_deep_profile_runs_the_checked_level_under_ncu_and_keeps_a_row_per_kernel(tmp_path: Path) -> None:
    cfg = LevelsConfig(component="causal_attention", shape="small", level="L1-naive", artifacts_dir=str(tmp_path))
    result = RunResult()
    _deep_profile(result, cfg, ncu_exe=str(stand_in_ncu(tmp_path)))
    assert not result.notes, result.notes
    (row,) = result.kernel_metrics
    assert (row["kernel"], row["launches"], row["phase"]) == (KERNEL, 2, "forward")
    assert (row["duration_us"], row["mem_throughput_pct"], row["sm_throughput_pct"]) == (555.1, 21.4, 83.2)
    assert {a.kind for a in result.artifacts} == {"ncu_log", "ncu_csv"}
    log = (tmp_path / "ncu-forward.log").read_text()
    assert "--profile-from-start off" in log and "--metrics " + ",".join(DEEP_METRICS + PIPE_METRICS) in log
    assert "-k " not in log  # every kernel of the measured calls, not a chosen few
    assert "L1-naive on causal_attention small: checked, 2 call(s)" in log  # the target really ran the level

    store = Store(tmp_path / "r.duckdb")
    store.init()
    run_id = store.create_run("levels", "causal_attention", "L1-naive", "cuda", {"shape": "small"})
    store.record_result(run_id, result)
    (shown,) = deep_table(store, [run_id]).to_dict("records")
    assert shown["level"] == "L1-naive" and shown["occupancy %"] == 12.4 and shown["regs/thread"] == 188
    assert shown["tensor pipe %"] == 47.5 and shown["stall barrier"] == 1.25
    assert "XU %" not in shown  # measured by no row: no column


def test_an_ncu_that_refuses_a_pipe_metric_still_gives_the_base_figures(tmp_path: Path) -> None:
    """Metric names vary by Nsight Compute version and GPU: where one of the pipe metrics is refused, the profile
    runs again with DEEP_METRICS alone, and a note says what was left out and why."""
    cfg = LevelsConfig(component="causal_attention", shape="small", level="L1-naive", artifacts_dir=str(tmp_path))
    result = RunResult()
    _deep_profile(result, cfg, ncu_exe=str(stand_in_ncu(tmp_path, knows=DEEP_METRICS)))
    (row,) = result.kernel_metrics
    assert (row["kernel"], row["duration_us"]) == (KERNEL, 555.1)
    (note,) = result.notes
    assert note.startswith("Nsight Compute: pipe and stall figures left out, one of their metrics refused (")
    assert f"Failed to find metric {PIPE_METRICS[0]}" in note
    assert "--metrics " + ",".join(DEEP_METRICS) + " " in (tmp_path / "ncu-forward.log").read_text()


def test_a_level_the_target_cannot_build_leaves_a_note_not_a_failure(tmp_path: Path) -> None:
    cfg = LevelsConfig(component="causal_attention", shape="small", level="L9-nothing", artifacts_dir=str(tmp_path))
    result = RunResult()
    _deep_profile(result, cfg, ncu_exe=str(stand_in_ncu(tmp_path)))
    assert not result.kernel_metrics
    (note,) = result.notes
    assert note.startswith("Nsight Compute measured 0 kernel(s) of forward (exit code 1)"), note


def test_the_target_refuses_a_bad_call_count(capsys: pytest.CaptureFixture) -> None:
    from engine.levels.deep import main as deep_main  # in this process: no interpreter start for a refusal

    with pytest.raises(SystemExit) as refused:
        deep_main(["--component", "causal_attention", "--shape", "small", "--level", "L1-naive", "--device", "cpu",
              "--calls", "0"])
    assert refused.value.code == 2 and "--calls must be at least 1" in capsys.readouterr().err


def test_levels_deep_without_ncu_times_the_level_and_says_why_there_are_no_kernel_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no ncu
    db = tmp_path / "r.duckdb"
    code = main(["levels", "--component", "causal_attention", "--shape", "small", "--level", "L1-naive",
                 "--device", "cpu", "--deep", "--iters", "3", "--warmup", "1", "--db", str(db)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "deep profile skipped: Nsight Compute (ncu) not found on PATH" in out
    assert Store(db).runs(kind="levels")["status"].tolist() == ["ok"]


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and settings.get("MODELAB_TEST_NCU") and shutil.which("ncu")),
                    reason="needs CUDA, ncu on PATH and MODELAB_TEST_NCU=1")
def test_real_ncu_measures_the_kernels_of_a_cuda_level(tmp_path: Path) -> None:
    cfg = LevelsConfig(component="causal_attention", shape="small", level="L1-native", device="cuda",
                       artifacts_dir=str(tmp_path))
    result = RunResult()
    _deep_profile(result, cfg)
    assert result.kernel_metrics, result.notes
    assert all(r["duration_us"] > 0 and r["launches"] >= 2 for r in result.kernel_metrics), result.kernel_metrics
