"""Your own model on the pages: the import-path field of the Benchmark, Profiler and IR Explorer pages, validated in a
subprocess (an error shows its one-line reason and turns runs off), and the jobs it queues (the worker imports the
model from the user's folder; the dashboard never does)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.ir.runs import EXTRACT_TARGET
from engine.runner import jobs
from engine.store.db import Store
from engine.workloads import user_model
from engine.workloads.user_model import BENCH_TARGET, PROFILE_TARGET, CheckReport

ROOT = Path(__file__).resolve().parents[2]
MODULE = '''
import torch
from torch import nn


def make_net():
    """A 16-4 linear layer."""
    return nn.Linear(16, 4)


def make_inputs(batch_size):
    return torch.randn(batch_size, 16)
'''


def open_page(name: str) -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "pages" / name), default_timeout=90)


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.fixture
def user_dir(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "my_models"
    folder.mkdir()
    name = f"usermod_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(MODULE)
    return folder, name


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list:
    """The subprocess check replaced by a canned verdict (the real one is tested once, below): 'bad' in the path
    fails, anything else passes."""
    seen = []

    def fake(spec, timeout_s: float = 180.0) -> CheckReport:
        seen.append(spec)
        if "bad" in spec.model:
            return CheckReport(ok=False, error=f"cannot import {spec.model.split(':')[0]!r}: ModuleNotFoundError: "
                                               "No module named 'bad'")
        return CheckReport(ok=True, name=spec.name, description=f"{spec.model}: a test model", batch_sizes=[1, 8],
                           train_batch_sizes=[8], output="float32[1, 4]")

    monkeypatch.setattr(user_model, "check_in_subprocess", fake)
    return seen


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list:
    """jobs.submit records its specs and queues the runs, without starting a supervisor."""
    calls = []

    def fake_submit(store, specs, group_id=None):
        calls.append(list(specs))
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    return calls


def type_model(at: AppTest, key: str, model: str, folder: Path) -> AppTest:
    at.text_input(key=f"{key}-model").set_value(model).run()
    at.text_input(key=f"{key}-path").set_value(str(folder)).run()
    return at


def test_benchmark_runs_your_model(lab: Store, user_dir, checks, submitted) -> None:
    folder, name = user_dir
    at = open_page("1_Benchmark.py").run()
    assert at.text_input(key="bench-model").value == ""  # empty: the lab's house-price model, as before
    model = f"{name}:make_net:make_inputs"
    type_model(at, "bench", model, folder)
    assert not at.exception and not at.error
    assert checks[-1].model == model and checks[-1].path == str(folder)
    assert at.text_input(key=f"batch_text-{model}").value == "1, 8"  # the model's own default batch sizes
    assert f"{model}: a test model" in texts(at.caption)
    at.button(key="run-eager").click().run()
    (spec,) = submitted[-1]
    assert spec.target == BENCH_TARGET and spec.workload == model and spec.kind == "bench"
    assert spec.params["model"] == model and spec.params["model_path"] == str(folder)
    assert spec.params["batch_sizes"] == [1, 8]
    assert lab.runs(kind="bench")["workload"].tolist() == [model]


def test_benchmark_shows_a_bad_model_in_one_line(lab: Store, user_dir, checks, submitted) -> None:
    folder, _ = user_dir
    at = type_model(open_page("1_Benchmark.py").run(), "bench", "bad_pkg:make", folder)
    assert not at.exception
    errors = [str(e.value) for e in at.error]
    assert "cannot import 'bad_pkg': ModuleNotFoundError: No module named 'bad'" in errors
    assert all("\n" not in e for e in errors)
    assert at.button(key="run-eager").disabled and at.button(key="run-all").disabled
    assert not submitted


def test_profiler_queues_your_model(lab: Store, user_dir, checks, submitted) -> None:
    folder, name = user_dir
    model = f"{name}:make_net:make_inputs"
    at = type_model(open_page("4_Profiler.py").run(), "profile", model, folder)
    assert not at.exception and not at.error
    at.button(key="profile-run").click().run()
    (spec,) = submitted[-1]
    assert spec.target == PROFILE_TARGET and spec.workload == model and spec.params["model_path"] == str(folder)
    type_model(at, "profile", "bad_pkg:make", folder)
    assert "No module named 'bad'" in texts(at.error) and at.button(key="profile-run").disabled


def test_ir_explorer_extracts_your_model_in_a_worker(lab: Store, user_dir, checks, submitted) -> None:
    folder, name = user_dir
    model = f"{name}:make_net:make_inputs"
    at = type_model(open_page("3_IR_Explorer.py").run(), "ir", model, folder)
    assert not at.exception and not at.error
    at.button(key="extract").click().run()
    (spec,) = submitted[-1]
    assert (spec.kind, spec.mode, spec.device, spec.target) == ("ir", "export", "meta", EXTRACT_TARGET)
    assert spec.params["model"] == model and spec.params["model_path"] == str(folder)
    assert "queued" in texts(at.success)
    assert name not in sys.modules  # the dashboard process never imported the user's code
    type_model(at, "ir", "bad_pkg:make", folder)
    at.button(key="extract").click().run()
    assert "Cannot extract bad_pkg:make: cannot import 'bad_pkg'" in texts(at.error)
    assert len(submitted) == 1


@pytest.mark.slow
def test_the_real_check_runs_in_a_subprocess(lab: Store, user_dir) -> None:
    folder, name = user_dir
    at = type_model(open_page("1_Benchmark.py").run(), "bench", f"{name}:make_nope", folder)
    assert not at.exception
    assert f"module '{name}' ({folder / name}.py) has no attribute 'make_nope' (the factory)" in texts(at.error)
    at.text_input(key="bench-model").set_value(f"{name}:make_net:make_inputs").run()
    assert not at.error and "A 16-4 linear layer." in texts(at.caption)
    assert name not in sys.modules
