"""Fixtures for the engine tests: every test gets its own store, models, artifacts and lock folders under tmp_path,
exported through the environment so that worker and supervisor processes started by the test use them too."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.cli.kinds import KINDS  # noqa: F401 - every run kind registered, as the CLI and dashboard do
from engine.store.db import Store

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """RESULTS_DB, MODELS_DIR, ARTIFACTS_DIR and MODELAB_LOCK_DIR under tmp_path (also for child processes)."""
    env = {
        "RESULTS_DB": str(tmp_path / "results.duckdb"),
        "MODELS_DIR": str(tmp_path / "models"),
        "ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        "MODELAB_LOCK_DIR": str(tmp_path / "locks"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@contextmanager
def _module_lab(folder: Path) -> Iterator[tuple[Store, dict[str, str]]]:
    env = {"RESULTS_DB": str(folder / "results.duckdb"), "ARTIFACTS_DIR": str(folder / "artifacts"),
           "MODELS_DIR": str(folder / "models"), "MODELAB_LOCK_DIR": str(folder / "locks")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        store = Store(env["RESULTS_DB"])
        store.init()
        yield store, env


@pytest.fixture(scope="session")
def module_lab() -> Callable[[Path], contextlib.AbstractContextManager]:
    """For module-scoped fixtures of real runs: `with module_lab(folder) as (store, env):` gives a fresh store with
    RESULTS_DB, ARTIFACTS_DIR, MODELS_DIR and MODELAB_LOCK_DIR under folder, set in the environment (for the
    workers too) until the block ends."""
    return _module_lab


@pytest.fixture
def store(lab_env: dict[str, str]) -> Store:
    """A fresh, initialised store at RESULTS_DB."""
    s = Store(lab_env["RESULTS_DB"])
    s.init()
    return s


@pytest.fixture
def child_env(lab_env: dict[str, str]) -> dict[str, str]:
    """The environment for `python -m engine...` subprocesses: the test's folders, the repository importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env

