"""`python -m engine llm` and `llm-report`: a sweep through the job runner (worker processes), the table it prints,
the stored runs and their reports, and one-line errors for bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.llm.quant import GATES
from engine.llm.report import REPORT_FILES, llm_runs
from engine.store.db import Store


def test_prompt_sweep_runs_grouped_and_reports(store: Store, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code = main(["llm", "--preset", "tiny", "--prompt-len", "8", "--new-tokens", "3", "--mode", "eager",
                 "--device", "cpu", "--sweep", "prompt=4,6", "--prefill-iters", "2", "--decode-passes", "1",
                 "--no-profile", "--db", str(store.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    runs = llm_runs(store)
    assert sorted(runs["prompt_len"]) == [4, 6] and set(runs["sweep"]) == {"prompt"}
    assert runs["group_id"].nunique() == 1 and runs["group_id"].notna().all()
    assert set(runs["mode"]) == {"eager"} and (runs["ttft_us"] > 0).all() and (runs["tpot_median_us"] > 0).all()
    for run_id in runs["id"]:
        assert f"{run_id:>5} eager" in out  # one table row per run
    # The worker measured this CPU's ceilings on the way (auto), so every run names its MBU denominator.
    assert runs["mbu_pct"].notna().all() and runs["ceiling_copy_bw"].notna().all()

    run_id = int(runs["id"].iloc[0])
    assert main(["llm-report", str(run_id), "--db", str(store.path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"# LLM run #{run_id}: tiny · eager")
    assert "report.md" in captured.err and "assumptions.md" in captured.err
    assert main(["llm-report", str(run_id), "--out", str(tmp_path / "copy"), "--db", str(store.path)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == sorted(REPORT_FILES)
    assert json.loads((tmp_path / "copy" / "inputs.json").read_text())["run_id"] == run_id


def test_modes_prepare_side_by_side_and_time_alone(store: Store, capsys: pytest.CaptureFixture) -> None:
    code = main(["llm", "--preset", "tiny", "--prompt-len", "8", "--new-tokens", "3", "--mode", "eager,sdpa-math",
                 "--device", "cpu", "--prepare-parallel", "2", "--prefill-iters", "2", "--decode-passes", "1",
                 "--no-profile", "--db", str(store.path)])
    captured = capsys.readouterr()
    assert code == 0, captured.out
    assert "2 runs; preparing --prepare-parallel 2; timing one at a time" in captured.err
    runs = llm_runs(store)
    assert set(runs["mode"]) == {"eager", "sdpa-math"} and (runs["tpot_median_us"] > 0).all()
    metrics = store.metrics(list(runs["id"]))
    alongside = metrics[metrics.name == "prepared_alongside"].set_index("run_id")["value"]
    assert sorted(alongside.index) == sorted(runs["id"]) and set(alongside) == {1.0}
    for run_id in runs["id"]:
        assert any(n.startswith("prepared beside up to 1 other run") for n in store.run(int(run_id))["notes"])


def test_a_quantized_mode_prints_bytes_per_token_and_its_gate(store: Store, capsys: pytest.CaptureFixture) -> None:
    code = main(["llm", "--preset", "tiny", "--prompt-len", "8", "--new-tokens", "3", "--mode", "eager,int8-wo",
                 "--device", "cpu", "--prefill-iters", "1", "--decode-passes", "1", "--no-profile", "--serial",
                 "--db", str(store.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    header = next(line for line in out.splitlines() if "bytes / token" in line)
    assert all(col in header for col in ("vs unquantized", "vs plain", "accuracy"))
    int8 = next(line for line in out.splitlines() if " int8-wo " in line and "× fewer" in line)
    assert "int8-wo (plain)" in int8 and "top-1 " in int8 and f"(≥ {GATES['int8-wo'].min_top1:g})" in int8, out


def test_prepare_slots_say_why() -> None:
    from engine.llm.group import prepare_slots
    from engine.llm.run import LLMConfig

    cpu = [LLMConfig(preset="tiny", mode=m) for m in ("eager", "compile", "sdpa-math")]
    assert prepare_slots("auto", cpu, serial=False) == (1, "one run at a time on the CPU (the compiles would take "
                                                        "the cores the timings need)")
    assert prepare_slots(5, cpu, serial=False) == (3, "--prepare-parallel 5")  # never more slots than runs
    assert prepare_slots(5, cpu, serial=True)[0] == 1
    assert prepare_slots(5, cpu[:1], serial=False)[0] == 1
    tuned = [LLMConfig(preset="tiny", mode=m, autotune=True) for m in ("eager", "compile")]
    assert prepare_slots(2, tuned, serial=False) == (1, "one run at a time: --autotune times candidate kernels "
                                                     "while it compiles")


def test_plan_group_starts_eager_and_the_modes_that_compile_nothing_first_and_leaves_other_kinds_alone(
        store: Store) -> None:
    from engine.llm.group import plan_group
    from engine.llm.run import LLMConfig, params_of
    from engine.runner.jobs import JobSpec, create_runs

    ids = create_runs(store, [JobSpec("llm", "llama-tiny", m, "cpu", params_of(LLMConfig(preset="tiny", mode=m)))
                              for m in ("eager", "compile", "sdpa-math")])
    assert plan_group(store, ids) == (1, [ids[0], ids[2], ids[1]], "one run at a time on the CPU (the compiles "
                                      "would take the cores the timings need)")
    other = create_runs(store, [JobSpec("bench", "house_price", "eager", "cpu", {})])
    assert plan_group(store, [*ids, *other], requested=3) == (1, [*ids, *other],
                                                              "one run at a time (not one device's LLM runs)")
    assert {r["kind"] for r in (store.run(i) for i in range(1, max(other) + 1)) if r} == {"llm", "bench"}


def test_the_dashboards_supervisor_plans_an_llm_group(store: Store, capsys: pytest.CaptureFixture) -> None:
    """`python -m engine.runner.plan` (what the LLM page's Run starts, detached) plans a group of LLM runs as the CLI
    does."""
    from engine.llm.run import LLMConfig, params_of
    from engine.runner import plan
    from engine.runner.jobs import JobSpec, create_runs

    small = dict(preset="tiny", prompt_len=8, new_tokens=3, prefill_iters=2, decode_passes=1, profile=False)
    ids = create_runs(store, [JobSpec("llm", "llama-tiny", m, "cpu", params_of(LLMConfig(mode=m, **small)))
                              for m in ("eager", "sdpa-math")])
    assert plan.main(["--db", str(store.path), *map(str, ids)]) == 0
    assert "2 LLM runs; preparing one run at a time on the CPU" in capsys.readouterr().out
    assert {store.run(i)["status"] for i in ids} == {"ok"}


@pytest.mark.parametrize("argv, message", [
    (["--prepare-parallel", "0"], "'0' must be at least 1"),
    (["--prepare-parallel", "many"], "'many' is not an integer"),
    (["--mode", "turbo"], "unknown LLM mode(s) turbo"),
    (["--mode", "compile-cudagraph"], "compile-cudagraph is not available on cpu: CUDA graphs need a CUDA device"),
    (["--sweep", "batch=1,x"], "sweep values must be whole numbers"),
    (["--sweep", "layers=1,2"], "write batch=1,2,4 or prompt=128"),
    (["--preset", "70B"], "invalid choice: '70B'"),
    (["--prompt-len", "0"], "must be at least 1"),
])
def test_bad_arguments_exit_2_with_one_line(store: Store, capsys: pytest.CaptureFixture, argv: list[str],
                                           message: str) -> None:
    try:  # argparse's errors exit; the command's own checks return 2
        code = main(["llm", "--device", "cpu", *argv, "--db", str(store.path)])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert llm_runs(store).empty  # nothing was queued


def test_report_of_a_missing_or_other_run_is_a_clear_error(store: Store, capsys: pytest.CaptureFixture) -> None:
    assert main(["llm-report", "999", "--db", str(store.path)]) == 2
    assert "no run 999" in capsys.readouterr().err
    other = store.create_run("bench", "house_price", "eager", "cpu", {})
    assert main(["llm-report", str(other), "--db", str(store.path)]) == 2
    assert "not an LLM run" in capsys.readouterr().err


def test_list_names_every_mode_and_why_some_cannot_run(capsys: pytest.CaptureFixture) -> None:
    assert main(["llm", "--list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in ("eager", "sdpa-flash", "sdpa-efficient", "sdpa-math", "compile", "compile-reduce-overhead",
                 "compile-cudagraph", "triton-gemv", "triton-decode", "triton-fused"):
        assert name in out
    assert "unavailable: CUDA graphs need a CUDA device" in out


def test_off_a_terminal_each_run_ends_in_one_line(capsys) -> None:
    """The worker's "done" and the supervisor's end both report 100 %: one line per run, a second only when the end
    says something new (a run recorded failed after its worker finished)."""
    from engine.cli.args import Bars

    bars = Bars({1: "eager B=1 P=32", 2: "compile B=1 P=32"})
    for run_id, frac, message in ((1, 0.5, "timing"), (1, 1.0, "done"), (1, 1.0, "done"), (2, 1.0, "done"),
                                  (2, 1.0, "done"), (2, 1.0, "failed")):
        bars(run_id, frac, message)
    assert capsys.readouterr().err.splitlines() == ["eager B=1 P=32: done", "compile B=1 P=32: done",
                                                    "compile B=1 P=32: failed"]
