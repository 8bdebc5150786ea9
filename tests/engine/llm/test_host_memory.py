"""The CPU's memory check for LLM runs (engine.llm.config.check_host_memory): a run whose weights, KV cache and float32
twin exceed the memory the machine has available is refused with one line, by the CLI before anything is queued and
by the run itself before it builds anything; a run that fits passes."""

from __future__ import annotations

import re

import pytest

from engine.cli.main import main
from engine.llm import hf
from engine.llm import run as llm_run_module
from engine.llm.config import LLMConfig, check_memory, memory_needed
from engine.store.db import Store

GiB = 1 << 30


def fake_available(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    """/proc/meminfo's MemAvailable as the checks read it (engine.llm.hf.available_bytes), for the CPU only."""
    real = hf.available_bytes
    monkeypatch.setattr(hf, "available_bytes", lambda device: available if device == "cpu" else real(device))


def test_the_cli_refuses_a_huge_cpu_batch_with_one_line_and_stores_nothing(
        store: Store, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELAB_FORKSERVER", "0")  # nothing is to run: no fork server to start
    fake_available(monkeypatch, 8 * GiB)
    code = main(["llm", "--preset", "1B", "--batch", "256", "--prompt-len", "1024", "--device", "cpu",
                 "--db", str(store.path)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    need = memory_needed(LLMConfig(preset="1B", batch=256, prompt_len=1024, device="cpu"))
    assert need > 8 * GiB  # the case is what it claims to be
    assert re.fullmatch(rf"error: 1B with B=256, \d+ cached positions needs {need:,} bytes \(.*GiB\) of weights and "
                        rf"KV cache \(the float32 twin that calibrates the check included\); this machine has "
                        rf"{8 * GiB:,} bytes \(8\.0 GiB\) available \(MemAvailable\)\. Use a smaller preset, batch "
                        r"or length\.", lines[0]), lines[0]
    assert store.query("SELECT count(*) AS n FROM runs")["n"].iloc[0] == 0


def test_a_cpu_sweep_skips_the_points_that_do_not_fit(store: Store, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELAB_FORKSERVER", "0")
    fake_available(monkeypatch, 1 * GiB)
    code = main(["llm", "--preset", "1B", "--prompt-len", "64", "--device", "cpu", "--sweep", "batch=512,1024",
                 "--db", str(store.path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("skipped eager B=") == 2 and "needs" in err and "MemAvailable" in err
    assert err.strip().splitlines()[-1] == "error: no sweep point fits the device: every (B, P) was skipped (see above)"
    assert store.query("SELECT count(*) AS n FROM runs")["n"].iloc[0] == 0


def test_the_check_counts_the_float32_twin_only_where_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = LLMConfig(preset="tiny", batch=4, prompt_len=64, dtype="bfloat16", device="cpu")
    with_twin, without = memory_needed(cfg, twin=True), memory_needed(cfg, twin=False)
    assert with_twin > without
    between = int((with_twin + without) / 2 / 0.95)  # fits without the twin, not with it
    fake_available(monkeypatch, between)
    check_memory(cfg, twin=False)
    with pytest.raises(MemoryError, match=f"needs {with_twin:,} bytes .* float32 twin"):
        check_memory(cfg, twin=True)
    fake_available(monkeypatch, None)  # MemAvailable unknown: no check
    check_memory(cfg)


def test_the_run_itself_refuses_before_it_builds_anything(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    cfg = LLMConfig(preset="tiny", prompt_len=8, new_tokens=3, mode="eager", ceilings="none", profile=False,
                    artifacts_dir=str(tmp_path / "run"))
    fake_available(monkeypatch, memory_needed(cfg) // 2)

    def build(*args, **kwargs):
        raise AssertionError("the model was built past the memory check")

    monkeypatch.setattr(llm_run_module, "build", build)
    with pytest.raises(MemoryError, match="MemAvailable"):
        llm_run_module.llm_run(cfg)


def test_a_tiny_cpu_run_fits_the_real_machine() -> None:
    check_memory(LLMConfig(preset="tiny", device="cpu"))  # reads this machine's MemAvailable
