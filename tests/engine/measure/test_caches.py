"""Compiled-artifact caches: where they live, that their keys change with torch, device and model, and what a first
call records about them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.measure import caches
from engine.native import aoti, build
from engine.store.db import Metric


# -- build folders and Inductor's cache dir -------------------------------------------------------------------------
def test_build_tag_changes_with_torch_python_and_cuda(monkeypatch: pytest.MonkeyPatch):
    base = build.build_tag()
    assert base.startswith(f"torch-{torch.__version__.replace('+', '_')}-py")
    monkeypatch.setattr(torch, "__version__", "2.99.0+cu130")  # not this machine's own version, CPU or GPU
    assert build.build_tag() != base and "2.99.0_cu130" in build.build_tag()
    # A source build does not spell CUDA in its version: the tag adds it.
    monkeypatch.setattr(torch, "__version__", "2.11.0a0")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert build.build_tag().endswith("-cu12.8")


def test_inductor_cache_dir_is_per_build_tag_and_respects_the_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path))
    assert build.inductor_cache_dir() == tmp_path / build.build_tag() / "inductor"
    env: dict[str, str] = {}
    applied = build.configure_compile_caches(env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / build.build_tag() / "inductor")
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    assert applied == env
    old_dir = env["TORCHINDUCTOR_CACHE_DIR"]
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert str(build.inductor_cache_dir()) != old_dir  # a torch upgrade gets a fresh folder
    mine = {"TORCHINDUCTOR_CACHE_DIR": "/somewhere/else"}
    assert "TORCHINDUCTOR_CACHE_DIR" not in build.configure_compile_caches(mine)
    assert mine["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"


def test_workers_use_the_persistent_inductor_cache(lab_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A job's worker sees TORCHINDUCTOR_CACHE_DIR under MODELAB_BUILD_DIR (checked by a target that reports it)."""
    from engine.runner import jobs
    from engine.store.db import Store

    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    store = Store(lab_env["RESULTS_DB"])
    ids = jobs.create_runs(store, [jobs.JobSpec("bench", "house_price", "env", "cpu", {},
                                                target="tests.engine.measure.test_caches:report_cache_dir")])
    assert jobs.run_jobs(store, ids)[ids[0]] == "ok", store.run(ids[0])["error"]
    notes = store.run(ids[0])["notes"]
    assert notes == [str(tmp_path / "build" / build.build_tag() / "inductor")]


def report_cache_dir(params: dict, progress) -> object:
    from engine.store.db import RunResult

    return RunResult(notes=[os.environ.get("TORCHINDUCTOR_CACHE_DIR", "unset")])


# -- the AOTInductor package key ------------------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self, hidden: int = 8, scale: float = 1.0) -> None:
        super().__init__()
        self.fc = nn.Linear(3, hidden)
        self.register_buffer("scale", torch.full((hidden,), scale), persistent=False)  # not in state_dict()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def digest(model: nn.Module, device: str = "cpu", options: dict | None = None) -> str:
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    ep, dynamic, _ = aoti.export(model.eval(), (x,))
    return aoti._digest(ep, model, (x,), torch.device(device), options or {}, dynamic)


def seeded(**kw) -> Net:
    torch.manual_seed(0)
    return Net(**kw)


def test_package_key_changes_with_model_torch_device_and_options(monkeypatch: pytest.MonkeyPatch):
    base = digest(seeded())
    assert digest(seeded()) == base  # deterministic
    assert digest(seeded(hidden=16)) != base  # structure
    changed = seeded()
    with torch.no_grad():
        changed.fc.weight[0, 0] += 1e-3
    assert digest(changed) != base  # weights
    assert digest(seeded(scale=2.0)) != base  # a non-persistent buffer the package bakes in
    assert digest(seeded(), options={"max_autotune": True}) != base
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    assert digest(seeded()) != base
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # where caches live changes no code
    assert digest(seeded()) == base
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert digest(seeded()) != base


def test_package_key_changes_with_the_gpu(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    h100 = digest(seeded(), device="cuda")
    assert h100 != digest(seeded())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    assert digest(seeded(), device="cuda") != h100
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert digest(seeded(), device="cuda") != h100


def test_compile_package_records_a_miss_then_a_hit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda ep, package_path, inductor_configs=None: (calls.append(1),
                                                                         Path(package_path).write_bytes(b"pt2")))
    build.take_build_events()
    x = torch.randn(4, 3)
    first = aoti.compile_package(seeded().eval(), (x,))
    second = aoti.compile_package(seeded().eval(), (x,))
    assert (first.cache_hit, second.cache_hit, len(calls)) == (False, True, 1)
    assert first.path == second.path and first.path.is_relative_to(tmp_path / build.build_tag())
    events = build.take_build_events()
    assert [(e["name"], e["cache_hit"]) for e in events] == [("aoti_package", False), ("aoti_package", True)]


def test_custom_op_library_hit_is_seen_by_its_mtime(tmp_path: Path):
    assert build._newest_library(tmp_path, "modelab_ops") is None
    lib = tmp_path / "modelab_ops.so"
    lib.write_bytes(b"x")
    first = build._newest_library(tmp_path, "modelab_ops")
    assert first is not None and build._newest_library(tmp_path, "modelab_ops") == first
    os.utime(lib, ns=(lib.stat().st_atime_ns, lib.stat().st_mtime_ns + 10**9))  # rebuilt
    assert build._newest_library(tmp_path, "modelab_ops") != first


# -- what a first call records ----------------------------------------------------------------------------------------
def test_cache_metrics_count_only_this_phase_and_name_every_build():
    before = {"cache_fxgraph_hit": 3, "cache_fxgraph_miss": 1}
    after = {"cache_fxgraph_hit": 5, "cache_fxgraph_miss": 1, "cache_aotautograd_hit": 1}
    builds = [{"name": "aoti_runner", "cache_hit": True, "seconds": 0.0},
              {"name": "aoti_package", "cache_hit": True, "seconds": 0.0},
              {"name": "aoti_package", "cache_hit": False, "seconds": 21.5}]
    got = {m.name: (m.value, m.unit) for m in caches.cache_metrics(before, after, builds)}
    assert got == {"cache_fxgraph_hit": (2.0, ""), "cache_aotautograd_hit": (1.0, ""),
                   "cache_aoti_runner_hit": (1.0, ""), "cache_aoti_package_hit": (0.0, ""),
                   "cache_aoti_package_build_s": (21.5, "s")}
    text = caches.describe({name: value for name, (value, _) in got.items()})
    assert text == ("Inductor FX graph cache: 2 hits, 0 misses · AOTAutograd cache: 1 hit, 0 misses · "
                    "AOTInductor .pt2 package: built (21.5 s) · AOTInductor runner build: cached")
    assert caches.describe({}) == ""


def test_counters_move_when_torch_compile_looks_up_its_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    before = caches.counter_snapshot()
    fn = torch.compile(lambda x: (x * 2).relu(), dynamic=False)
    fn(torch.randn(8))
    after = caches.counter_snapshot()
    got = {m.name: m.value for m in caches.cache_metrics(before, after)}
    assert got.get("cache_fxgraph_miss", 0) + got.get("cache_fxgraph_hit", 0) >= 1
    assert all(isinstance(m, Metric) for m in caches.cache_metrics(before, after))


@pytest.mark.parametrize("metrics, text", [
    ({"cache_fxgraph_miss": 1, "cache_autotune_benchmarked": 3},
     "max-autotune: 3 GEMM selections benchmarked (not in the autotune cache)"),
    ({"cache_fxgraph_hit": 1, "cache_autotune_benchmarked": 0},
     "max-autotune: the tuned graph came from the FX graph cache (nothing benchmarked)"),
    ({"cache_fxgraph_miss": 1, "cache_autotune_benchmarked": 0},
     "max-autotune: nothing benchmarked (no GEMM to tune here, or every choice from the autotune cache)"),
])
def test_what_max_autotune_found_in_the_caches(metrics, text):
    assert text in caches.describe(metrics)


def test_an_autotuning_mode_records_its_benchmark_count_even_at_zero():
    before = caches.counter_snapshot()
    assert "cache_autotune_benchmarked" in before
    assert {m.name for m in caches.cache_metrics(before, before)} == set()
    assert [(m.name, m.value) for m in caches.cache_metrics(before, before, autotunes=True)] == [
        ("cache_autotune_benchmarked", 0.0)]
