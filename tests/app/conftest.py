"""Fixtures for the dashboard's AppTests: an isolated store, models and artifacts folder per test, and helpers that
write realistic results straight into the store (no benchmark runs, so the tests stay fast)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.cli.kinds import KINDS  # noqa: F401 - every run kind registered, as app/common.py does
from engine.store.db import Metric, RunResult, Samples, Store

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"home": "app/Home.py", "benchmark": "app/pages/1_Benchmark.py", "predict": "app/pages/2_Predict.py"}


def open_page(page: str) -> AppTest:
    # AppTest resolves relative paths against the calling file, so pass absolute ones.
    return AppTest.from_file(str(ROOT / PAGES[page]), default_timeout=60)


@pytest.fixture
def page():
    """page("home" | "benchmark" | "predict") -> an AppTest of that page (helpers are fixtures: conftest is not
    importable under every pytest import mode)."""
    return open_page


@pytest.fixture
def bench_run():
    return add_bench_run


@pytest.fixture
def failed_run():
    return add_failed_run


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A fresh store at RESULTS_DB, with MODELS_DIR, ARTIFACTS_DIR and device locks under tmp_path."""
    monkeypatch.setenv("RESULTS_DB", str(tmp_path / "results.duckdb"))
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    store = Store(tmp_path / "results.duckdb")
    store.init()
    return store


def add_bench_run(store: Store, mode: str, median_us: float, *, device: str = "cpu",
                  points: Sequence[tuple[str, int]] = (("infer", 1), ("infer", 64), ("infer", 1024), ("train", 64)),
                  notes: Sequence[str] = (), n_samples: int = 50, seed: int = 0,
                  native_fraction: float | None = None) -> int:
    """An ok bench run with every metric a real one records, and raw samples around the median."""
    run_id = store.create_run("bench", "house_price", mode, device, {"mode": mode, "device": device})
    store.start_run(run_id)
    rng = np.random.default_rng(seed + run_id)
    result = RunResult(env={"python": "3.11.0", "torch": "2.13.0", "device_name": "CPU: test", "cpu_model": "test",
                            "threads": 4, "git_commit": "abc123", "hostname": "test", "platform": "Linux"},
                       notes=list(notes))
    for phase, batch in points:
        median = median_us * (1 + batch / 512) * (3 if phase == "train" else 1)
        values = list(median * rng.uniform(0.9, 1.25, n_samples))
        stats = {"median": median, "p10": median * 0.93, "p90": median * 1.2, "p25": median * 0.96,
                 "p75": median * 1.1, "iqr": median * 0.14, "mean": median * 1.05, "std": median * 0.1,
                 "min": median * 0.9, "max": median * 1.25, "first_call": median * (400 if "compile" in mode else 3)}
        result.metrics += [Metric(name, value, "us", phase, batch) for name, value in stats.items()]
        result.metrics += [Metric("max_abs_err", 1e-7, "", phase, batch),
                           Metric("max_rel_err", 1e-6, "", phase, batch),
                           Metric("throughput", batch / (median * 1e-6), "samples/s", phase, batch)]
        if native_fraction is not None:  # aoti's native-runner timing of the same package
            native = median * native_fraction
            result.metrics += [Metric("native_median", native, "us", phase, batch),
                               Metric("native_p10", native * 0.95, "us", phase, batch),
                               Metric("native_p90", native * 1.1, "us", phase, batch)]
        if "compile" in mode:
            result.metrics += [Metric(name, value, "", phase, batch)
                               for name, value in (("graphs_compiled", 1), ("recompiles", 0), ("graph_breaks", 0))]
        result.samples.append(Samples(phase=phase, batch_size=batch, values=values))
    store.record_result(run_id, result)
    return run_id


def add_failed_run(store: Store, mode: str, error: str, kind: str = "bench") -> int:
    run_id = store.create_run(kind, "house_price", mode, "cpu", {})
    store.start_run(run_id)
    store.fail_run(run_id, error)
    return run_id


@pytest.fixture(scope="session")
def filled_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """filled's store, written once per session (nine runs through the Store's writes take seconds)."""
    store = Store(tmp_path_factory.mktemp("filled") / "results.duckdb")
    store.init()
    for round_ in range(2):
        add_bench_run(store, "eager", 100.0 - round_)
        add_bench_run(store, "fx", 95.0)
        add_bench_run(store, "torchscript", 110.0, notes=["FutureWarning: torch.jit.script is deprecated"])
        add_bench_run(store, "compile", 60.0, notes=["UserWarning: one", "UserWarning: two"])
    add_failed_run(store, "compile-max-autotune",
                   "ToleranceError: compile-max-autotune inference at batch 64: differs from eager\n"
                   "--- traceback ---\nFile bench.py, line 1")
    return store.path


@pytest.fixture
def filled(lab: Store, filled_file: Path) -> Store:
    """Two rounds of eager, fx, torchscript and compile results, plus one failed run: a copy of filled_file at
    RESULTS_DB, this test's own to change."""
    shutil.copy(filled_file, lab.path)
    wal = filled_file.with_name(filled_file.name + ".wal")
    if wal.exists():
        shutil.copy(wal, lab.path.with_name(lab.path.name + ".wal"))
    return Store(lab.path)


@pytest.fixture(scope="session")
def trained_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real eager model, trained for 2 epochs once per session (a few seconds)."""
    from engine.housing.train import TrainConfig, train_model

    folder = tmp_path_factory.mktemp("trained")
    _, path = train_model(TrainConfig(epochs=2, models_dir=str(folder / "models"), db=str(folder / "r.duckdb")))
    return path


@pytest.fixture
def with_model(lab: Store, trained_weights: Path, tmp_path: Path) -> Path:
    """The session's trained weights copied into this test's MODELS_DIR."""
    target = tmp_path / "models" / trained_weights.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(trained_weights, target)
    return target
