"""engine.bench.ahead: an autotuning run's later phases compile in helper processes; the run records the helper's
cold first call and its own load of it, and compiles a phase itself when its helper fails. engine.native.prebuild:
which native builds a group starts in the background, and where."""

from __future__ import annotations

import pytest

from engine.bench import ahead as bench_ahead
from engine.bench import run as bench
from engine.native import prebuild
from engine.runner import device_lock as dl


@pytest.fixture(autouse=True)
def own_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    yield
    dl.end_phases()


def test_only_an_autotuning_multi_phase_run_beside_a_gpu_group_compiles_ahead(monkeypatch):
    assert not bench_ahead.wanted(True, "cuda:0", 4)  # not beside a group
    monkeypatch.setattr(dl, "split_cores", lambda device: ({0}, {0}) if device.startswith("cuda") else None)
    dl.begin_phases("cuda:0", group_size=2)
    assert bench_ahead.wanted(True, "cuda:0", 4)
    assert not bench_ahead.wanted(False, "cuda:0", 4) and not bench_ahead.wanted(True, "cuda:0", 1)
    dl.end_phases()
    dl.begin_phases("cpu", group_size=2)  # a CPU device: waiting could not give the device up
    assert not bench_ahead.wanted(True, "cpu", 4)


def test_phases_compiled_ahead_record_the_helpers_first_call(monkeypatch):
    monkeypatch.setattr(bench_ahead, "wanted", lambda *args: True)
    cfg = bench.BenchConfig(mode="eager", device="cpu", batch_sizes=(1, 64), train_batch_sizes=(8,), iters=5,
                            warmup=1)
    result = bench.bench_mode(cfg)
    assert [(s.phase, s.batch_size) for s in result.samples] == [("train", 8), ("infer", 1), ("infer", 64)]
    firsts = {(m.phase, m.batch_size, m.name): m.value for m in result.metrics if m.name.startswith("first_call")}
    assert ("train", 8, "first_call_here") not in firsts  # the run's own phase: compiled here
    for phase, batch in (("infer", 1), ("infer", 64)):  # the helpers' phases: their first call, and this run's
        assert firsts[(phase, batch, "first_call")] > 0 and firsts[(phase, batch, "first_call_here")] > 0
        assert firsts[(phase, batch, "first_call")] != firsts[(phase, batch, "first_call_here")]
    assert any("compiled ahead" in note for note in result.notes)
    assert not any("failed" in note for note in result.notes)
    again = bench.bench_mode(cfg)  # the helpers' markers say the caches hold those phases: no helper this time
    assert not any(m.name == "first_call_here" for m in again.metrics)
    assert not any("compiled ahead" in note for note in again.notes)


def test_a_failed_helper_says_why_and_leaves_the_phase_to_the_run():
    ahead = bench_ahead.start({"mode": "no-such-mode", "device": "cpu"}, [("infer", 1), ("infer", 64)])
    assert list(ahead.helpers) == [("infer", 64)]
    first_us, why = ahead.wait("infer", 64)
    assert first_us is None and "no-such-mode" in why
    assert ahead.wait("infer", 1) == (None, None)  # no helper for the run's own phase


def test_native_builds_start_beside_a_gpu_group_only(monkeypatch):
    assert prebuild.needed(["eager", "cuda", "aoti", "L5-cuda", "custom_op", "cuda"]) == [
        "custom_ops", "mlp_step", "aoti_runner", "cuda_levels"]
    assert prebuild.needed(["eager", "compile"]) == []
    assert prebuild.start(["cuda", "aoti"], "cpu") == []  # beside CPU timings a build would take their cores
    monkeypatch.setattr(prebuild, "split_cores", lambda device: None)
    assert prebuild.start(["cuda"], "cuda:0") == []  # a GPU machine without cores to spare


def test_a_bad_timing_cores_setting_starts_no_build_and_reaches_the_runs(monkeypatch):
    """MODELAB_TIMING_CORES is read where a group starts: the supervisor starts no build and goes on; each run's
    worker meets the same clear error (engine.runner.device_lock.timing_cores)."""
    monkeypatch.setattr(dl.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("MODELAB_TIMING_CORES", "fast")
    assert prebuild.start(["cuda"], "cuda:0") == []
    with pytest.raises(ValueError, match="MODELAB_TIMING_CORES='fast': give core numbers"):
        dl.split_cores("cuda:0")


def test_a_phased_bench_run_lets_the_device_go_after_its_last_timing(monkeypatch):
    """Each phase times alone and goes back to preparing; the last one lets the device go, so the run's reports do
    not queue behind the group's next timings."""
    dl.begin_phases("cpu", group_size=2)
    blocks: list[bool] = []
    real = dl.exclusive

    def watched(final: bool = False):
        blocks.append(final)
        return real(final)

    monkeypatch.setattr(dl, "exclusive", watched)
    bench.bench_mode(bench.BenchConfig(mode="eager", device="cpu", batch_sizes=(1, 4), train_batch_sizes=(),
                                       phases=("infer",), iters=3, warmup=1))
    assert blocks == [False, True] and dl.current().state is None
