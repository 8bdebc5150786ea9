"""Bring your own component: `--component pkg.mod:spec` (a Component with its reference module, shapes, FLOP and
byte formulas) runs L1-naive, L2 TorchScript and L3 compile on its reference through the CLI and the workers; a bad
spec gets one line and exit code 2 before anything is queued; L1-native / L4 / L5 are refused with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.levels import get_component
from engine.levels.results import level_results
from engine.levels.yours import check_component
from engine.store.db import Store

KERNELS = str(Path(__file__).resolve().parent / "user_kernels")
SPEC = "user_rowsum:rowsum"


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "levels", "--component", SPEC, "--impl-path", KERNELS,
                           *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_user_component_runs_naive_torchscript_and_compile_via_the_cli(store: Store,
                                                                        child_env: dict[str, str]) -> None:
    ran = _cli("--level", "L1-naive,L2-torchscript,L3-compile", "--iters", "3", "--warmup", "1", env=child_env)
    assert ran.returncode == 0, ran.stderr
    frame = level_results(store, component=SPEC)
    rows = {r["mode"]: r for r in frame.to_dict("records")}
    assert set(rows) == {"L1-naive", "L2-torchscript", "L3-compile"}
    for level, row in rows.items():
        assert row["status"] == "ok", (level, row.get("error"))
        assert row["median_us"] > 0 and row["rel_l2_err"] <= row["tolerance"] == 2e-3  # checked and timed
        assert row["flops_per_s"] == pytest.approx(2.0 * 64 * 96 / (row["median_us"] * 1e-6))
    assert "L3-compile" in ran.stdout and "user_rowsum:rowsum" in ran.stdout


def test_levels_it_does_not_provide_are_refused_with_the_reason(lab_env: dict[str, str],
                                                                 capsys: pytest.CaptureFixture) -> None:
    """Through main() in this process (the CLI checks the spec in a child of its own either way)."""
    from engine.cli.main import main

    assert main(["levels", "--component", SPEC, "--impl-path", KERNELS, "--level", "L1-native"]) == 2
    assert "level L1-native is not available: user_rowsum:rowsum provides no idiomatic native op (make_native)" \
        in capsys.readouterr().err
    assert main(["levels", "--component", "user_rowsum:FLOPS_ZERO", "--impl-path", KERNELS]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "user_rowsum:FLOPS_ZERO: flops returned 0 on shape small; it must be a positive number")


@pytest.mark.parametrize("spec,error", [
    ("user_rowsum:NOT_A_COMPONENT", "user_rowsum:NOT_A_COMPONENT is a dict without name, shapes, make_inputs, "
                                    "make_naive, flops, min_bytes"),
    ("user_rowsum:INCOMPLETE", "user_rowsum:INCOMPLETE is a _Incomplete without make_inputs, make_naive, flops"),
    ("user_rowsum:RAISING_REFERENCE", "user_rowsum:RAISING_REFERENCE: the reference module raised on shape small: "
                                      "TypeError"),
    ("user_rowsum:WRONG_ARITY", "the reference's forward(x) does not take the 2 inputs make_inputs returns"),
    ("user_rowsum:GPU_ONLY", "user_rowsum:GPU_ONLY: no shape is meant for cpu (shapes: big on cuda)"),
    ("user_rowsum:raising_factory", "user_rowsum:raising_factory() raised: RuntimeError: no config file"),
    ("user_rowsum:nope", "module 'user_rowsum'"),
    ("user_nothere:spec", "cannot import 'user_nothere'"),
    ("not a spec", "expected a built-in name or module.path:spec"),
])
def test_a_bad_spec_gets_one_line(spec: str, error: str) -> None:
    report = check_component(spec, KERNELS)
    assert not report.ok and error in report.error and "\n" not in report.error


def test_a_good_spec_and_the_lookup_the_workers_use() -> None:
    report = check_component(SPEC, KERNELS)
    assert report.ok and report.name == "scaled_rowsum" and not report.native and report.kernels == []
    assert report.shape_objects()["big"].devices == ("cuda",)
    assert get_component(SPEC, KERNELS).name == "scaled_rowsum"  # what a worker resolves from its job params
    assert get_component("causal_attention").name == "causal_attention"  # built-in names keep working
