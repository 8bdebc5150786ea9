"""engine.measure.inductor_timing: Inductor's timings of candidate kernels run with the device held alone in a phased
worker, and pass straight through elsewhere; bench's first-call cost leaves the wait for the device out."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types

import pytest

from engine.bench import run as bench
from engine.measure import inductor_timing
from engine.measure.timing import time_first_call
from engine.runner import device_lock as dl


@pytest.fixture(autouse=True)
def own_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    yield
    dl.end_phases()


@pytest.fixture
def fake_inductor(monkeypatch):
    """Two classes standing in for Inductor's, whose timing methods record how the worker held its device."""
    seen: list[str | None] = []

    class Selector:
        def benchmark(self, choices):
            hold = dl.current()
            seen.append(hold.state if hold else None)
            return {c: 1.0 for c in choices}

    class Autotuner:
        def benchmark_all_configs(self, *args, **kwargs):
            hold = dl.current()
            seen.append(hold.state if hold else None)
            return {"cfg": 1.0}

    module = types.ModuleType("fake_inductor_timing")
    module.Selector, module.Autotuner = Selector, Autotuner
    monkeypatch.setitem(sys.modules, "fake_inductor_timing", module)
    monkeypatch.setattr(inductor_timing, "TIMED", (("fake_inductor_timing", "Selector", "benchmark"),
                                                   ("fake_inductor_timing", "Autotuner", "benchmark_all_configs")))
    return module, seen


def test_timings_take_the_device_alone_in_a_phased_worker_only(fake_inductor) -> None:
    module, seen = fake_inductor
    assert not inductor_timing.installed()
    assert inductor_timing.time_candidates_alone() and inductor_timing.installed()
    first = module.Selector.benchmark
    inductor_timing.time_candidates_alone()
    assert module.Selector.benchmark is first  # wrapped once, however often a mode prepares
    assert module.Selector().benchmark(["a", "b"]) == {"a": 1.0, "b": 1.0}  # an ordinary worker: no hold at all
    hold = dl.begin_phases("cpu", group_size=2)
    module.Selector().benchmark(["a"])
    module.Autotuner().benchmark_all_configs()
    assert seen == [None, "exclusive", "exclusive"] and hold.state == "shared"  # back to preparing afterwards


def test_max_autotune_holds_the_device_for_its_whole_first_call_only_where_timings_cannot_be_singled_out(
        fake_inductor, monkeypatch) -> None:
    autotune, compile_default = bench.get_mode("compile-max-autotune"), bench.get_mode("compile")
    inductor_timing.time_candidates_alone()
    assert isinstance(bench._tuning(autotune), contextlib.nullcontext)  # only the timings take the device
    monkeypatch.setattr(inductor_timing, "TIMED", (("no_such_module_here", "X", "benchmark"),))
    assert inductor_timing.time_candidates_alone() is False and not inductor_timing.installed()
    assert not isinstance(bench._tuning(autotune), contextlib.nullcontext)  # the whole first call alone
    assert isinstance(bench._tuning(compile_default), contextlib.nullcontext)


def test_the_first_call_cost_leaves_the_wait_for_the_device_out() -> None:
    hold = dl.begin_phases("cpu", group_size=2)
    other = dl.PhaseHold("cpu", poll_s=0.01)
    other.shared()  # another run of the group is preparing
    threading.Timer(0.3, other.close).start()

    def first_call() -> None:
        with dl.exclusive():  # e.g. Inductor timing its candidates: waits ~0.3 s for the other run
            time.sleep(0.05)

    us = time_first_call(first_call, "cpu")
    assert hold.waited_s >= 0.25
    assert 0.04e6 <= us <= 0.2e6, us  # the 50 ms of work, not the 300 ms queue


def test_a_benchmark_inside_a_released_block_takes_the_device_alone_and_stays_shared_otherwise(monkeypatch):
    monkeypatch.setattr(dl, "split_cores", lambda device: ({0}, {0}) if device.startswith("cuda") else None)
    seen: list[str | None] = []

    class Benchmarker:
        def benchmark_gpu(self, fn):
            seen.append(dl.current().state)
            return 1.0

    module = types.ModuleType("fake_benchmarking")
    module.Benchmarker = Benchmarker
    monkeypatch.setitem(sys.modules, "fake_benchmarking", module)
    monkeypatch.setattr(inductor_timing, "TIMED", ())
    monkeypatch.setattr(inductor_timing, "BENCHMARKERS", (("fake_benchmarking", "Benchmarker", "benchmark_gpu"),))
    inductor_timing.time_candidates_alone()
    dl.begin_phases("cuda:0", group_size=2)
    Benchmarker().benchmark_gpu(None)  # coordinate descent's way: beside preparations, as the device is held
    with dl.released():  # e.g. an epilogue-fusion benchmark during code generation
        Benchmarker().benchmark_gpu(None)
        assert dl.current().state is None
    assert seen == ["shared", "exclusive"]
