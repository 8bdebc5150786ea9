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


def test_the_build_tag_is_read_without_importing_torch_and_matches_the_imported_one() -> None:
    """A worker whose target never uses torch (and the supervisor) names the build folder from torch's version.py
    alone; the name is the one torch itself gives."""
    import torch  # noqa: F401 - this process's tag comes from the imported torch

    code = ("import sys; from engine.runner.worker_env import build_tag, configure_compile_caches; "
            "configure_compile_caches({}); print(build_tag(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=worker_env.REPO_ROOT).stdout.split()
    assert out == [worker_env.build_tag(), "False"]
