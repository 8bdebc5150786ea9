"""`python -m engine llm` over two sweep axes: one run per (B, P) cell and mode, both swept values recorded, cells
that do not fit the device skipped with the reason before anything loads."""

from __future__ import annotations

import argparse

import pytest

from engine.cli import llm as cli_llm
from engine.cli.main import main
from engine.llm.report import llm_runs
from engine.store.db import Store


def test_two_axis_sweep_runs_every_cell_and_mode(store: Store, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the device's memory is what skips a cell on a GPU; here one cell is made not to fit
    monkeypatch.setattr(cli_llm, "_fits", lambda cfg: "needs 99 GiB" if (cfg.batch, cfg.prompt_len) == (2, 6) else None)
    code = main(["llm", "--preset", "tiny", "--new-tokens", "2", "--mode", "eager,sdpa-math", "--device", "cpu",
                 "--sweep", "prompt=4,6", "--sweep", "batch=1,2", "--prefill-iters", "1", "--decode-passes", "1",
                 "--check-tokens", "1", "--no-profile", "--db", str(store.path)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "skipped eager B=2 P=6: needs 99 GiB" in captured.err
    assert "skipped sdpa-math B=2 P=6: needs 99 GiB" in captured.err
    runs = llm_runs(store)
    cells = sorted(zip(runs["mode"], runs["batch"], runs["prompt_len"]))
    assert cells == sorted((m, b, p) for m in ("eager", "sdpa-math") for b, p in ((1, 4), (1, 6), (2, 4)))
    assert set(runs["sweep"]) == {"batch,prompt"} and runs["group_id"].nunique() == 1
    assert (runs["tpot_median_us"] > 0).all()
    # then the envelope: one line per cell that ran, its best mode among eager and sdpa-math
    table = captured.out[captured.out.index("envelope: the best mode"):].splitlines()[2:5]
    assert [line.split()[:2] for line in table] == [["1", "4"], ["1", "6"], ["2", "4"]]
    assert all(line.split()[2] in ("eager", "sdpa-math") for line in table), table


def test_sweep_points_are_the_cells_of_both_axes() -> None:
    assert cli_llm._sweep_points(None) == (None, [{}])
    assert cli_llm._sweep_points([("prompt", (4,))]) == ("prompt", [{"prompt": 4}])
    sweep, points = cli_llm._sweep_points([("prompt", (512, 8192)), ("batch", (1, 8, 32))])
    assert sweep == "batch,prompt" and len(points) == 6
    assert points[:2] == [{"batch": 1, "prompt": 512}, {"batch": 1, "prompt": 8192}]
    with pytest.raises(cli_llm.CliError, match="twice"):
        cli_llm._sweep_points([("batch", (1,)), ("batch", (2,))])


def test_a_cell_beyond_the_memory_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.llm import config

    monkeypatch.setattr(config, "device_budget", lambda cfg: (80 << 30, 80 << 30, ""))
    cell = lambda b, p: config.LLMConfig(preset="7B", batch=b, prompt_len=p, new_tokens=16,  # noqa: E731
                                         device="cuda", mode="compile-cudagraph")
    assert cli_llm._fits(cell(1, 512)) is None
    reason = cli_llm._fits(cell(32, 8192))
    assert reason and "8208 positions" in reason and "80.0 GiB free" in reason
    # On the CPU the cell is held to MemAvailable instead (engine.llm.config.check_host_memory)
    from engine.llm import hf

    monkeypatch.setattr(hf, "available_bytes", lambda device: 64 << 30)
    cpu = cli_llm._fits(config.LLMConfig(preset="7B", batch=32, prompt_len=8192, device="cpu"))
    assert cpu and "MemAvailable" in cpu and "64.0 GiB" in cpu
    assert cli_llm._fits(config.LLMConfig(preset="tiny", batch=32, prompt_len=8192, device="cpu")) is None


def test_two_axis_sweep_flags_parse() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", type=cli_llm._sweep, action="append")
    args = parser.parse_args(["--sweep", "batch=1,8,32", "--sweep", "prompt=512,8192"])
    assert args.sweep == [("batch", (1, 8, 32)), ("prompt", (512, 8192))]
