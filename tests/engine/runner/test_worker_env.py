"""engine.runner.worker_env: the libstdc++ a worker preloads, and where its compiled caches go — set up without the
supervisor importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.runner import worker_env


def test_preload_puts_the_loaded_libstdcxx_first_once() -> None:
    lib = worker_env.libstdcxx_to_preload()
    if lib is None:
        pytest.skip("no libstdc++ found (not Linux, or no compiler)")
    assert Path(lib).is_file() and "libstdc++" in lib
    env = worker_env.with_libstdcxx_preloaded({"LD_PRELOAD": "/opt/other.so"})
    assert env["LD_PRELOAD"].split() == [lib, "/opt/other.so"]
    assert worker_env.with_libstdcxx_preloaded(env) == env  # idempotent: a worker's child does not add it twice


def test_a_supervisor_builds_a_workers_environment_without_torch() -> None:
    code = ("import sys, os; from engine.runner import jobs; env = jobs._child_env(); "
            "print('torch' in sys.modules, 'PYTHONPATH' in env)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=worker_env.REPO_ROOT).stdout.split()
    assert out == ["False", "True"]
