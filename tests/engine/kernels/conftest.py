"""Run the Triton kernels under Triton's interpreter where there is no GPU.

Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before the kernel modules (and, to be
safe, triton itself) are imported: this conftest is imported by pytest before the test modules of this folder.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def aot_check_rows(tmp_path):
    """Runs benchmarks/triton_aot_check.py --arch 90 ARGS in a process without TRITON_INTERPRET, its Triton cache
    empty: its table's rows (one per kernel compiled for sm_90 with Triton's own ptxas); fails on a non-zero exit."""
    return lambda *args: _aot_check_rows(tmp_path, *args)


@pytest.fixture(scope="module")
def module_aot_check_rows(tmp_path_factory):
    """aot_check_rows for a module-scoped fixture: one run of the check, its rows shared by several tests."""
    return lambda *args: _aot_check_rows(tmp_path_factory.mktemp("aot"), *args)


def _aot_check_rows(tmp_path, *args: str) -> list[str]:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["PYTHONPATH"] = str(repo)
    done = subprocess.run([sys.executable, "benchmarks/triton_aot_check.py", "--arch", "90", *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines()[1:] if line.strip()]
