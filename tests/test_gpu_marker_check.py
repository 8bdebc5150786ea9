"""tests/conftest.py's check, run on a small suite of its own in a child pytest that sees no CUDA device: a test
skipped for a CUDA or GPU reason without the gpu marker is an error naming the marker; a marked one, one skipped for
another reason (a path such as /usr/local/cuda is not a reason) and an xfail stay as they are."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CASES = '''
import pytest


def test_unmarked_cuda():
    pytest.skip("needs a CUDA device")


@pytest.mark.gpu
def test_marked_cuda():
    pytest.skip("needs a CUDA device")


@pytest.mark.skipif(True, reason="the autotuner runs on a GPU only")
def test_unmarked_gpu_skipif():
    pass


def test_unmarked_other_reason():
    pytest.skip("nvcc not found (looked in /usr/local/cuda)")


@pytest.mark.xfail(reason="differs on GPUs")
def test_xfail_with_a_gpu_reason():
    assert False
'''


def test_a_test_skipped_for_a_gpu_reason_needs_the_gpu_marker(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "FAILED test_cases.py::test_unmarked_cuda" in out and "ERROR test_cases.py::test_unmarked_gpu_skipif" in out
    assert "is skipped here for a GPU reason (needs a CUDA device) but has no `gpu` marker" in out
    assert "1 failed, 2 skipped, 1 xfailed, 1 error" in out, out
