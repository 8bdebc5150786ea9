"""The cross-timer panel (engine/measure/kernel_timers.py): each disagreement on both sides of its bound, the agreeing
case,
the busy union of overlapping kernels, which profiler events count as device work, the profiler path on recorded
events, and how a levels run stores kernel_median and its notes (CPU: nothing; CUDA: in a test that skips without)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from engine.levels import run as level_run
from engine.measure import kernel_timers as timers
from engine.measure.kernel_timers import CrossTimers, disagreements, is_device_work, profiler_kernel_us
from engine.measure.op_stats import union_length
from engine.store.db import Metric, RunResult, Store

EPS = 0.01  # µs either side of a bound


def only(t: CrossTimers) -> str:
    """The single disagreement line of t (the cases below are built so exactly one bound is crossed)."""
    lines = disagreements(t)
    assert len(lines) == 1, lines
    return lines[0]


def test_agreeing_figures_give_no_line_and_the_agree_note() -> None:
    t = CrossTimers(events_us=110.0, graph_us=105.0, kernel_us=100.0)
    assert disagreements(t) == []
    assert timers.notes(t) == [timers.AGREE_NOTE] and timers.AGREE_NOTE.startswith("cross-timer: ")


def test_host_bound_needs_both_the_ratio_and_the_absolute_gap() -> None:
    ratio_bound = timers.HOST_RATIO * 100.0  # events 150 vs kernel 100: a 50 µs gap, the ratio decides
    assert disagreements(CrossTimers(ratio_bound - EPS, 100.0, 100.0)) == []
    assert disagreements(CrossTimers(ratio_bound, 100.0, 100.0)) == []  # "beyond": equal is within
    line = only(CrossTimers(ratio_bound + EPS, 100.0, 100.0))
    assert line.startswith("host/launch bound: events 150.0 µs per call against profiler kernel busy 100.0 µs")
    assert "50.0 µs of every call is gaps between kernels" in line and "the graph figure (100.0 µs) removes" in line
    # A tiny kernel: 3x the kernel time, but the gap is only the absolute floor (20 µs) — not flagged until beyond.
    gap_bound = 10.0 + timers.HOST_MIN_US
    assert disagreements(CrossTimers(gap_bound, 10.0, 10.0)) == []
    assert only(CrossTimers(gap_bound + EPS, 10.0, 10.0)).startswith("host/launch bound: events 30.0 µs")
    assert "a CUDA graph would remove them" in only(CrossTimers(gap_bound + EPS, None, 10.0))


def test_gaps_inside_a_graph() -> None:
    bound = timers.GRAPH_GAP_RATIO * 100.0 + timers.GRAPH_GAP_US  # 125 µs over a 100 µs kernel busy time
    assert disagreements(CrossTimers(130.0, bound - EPS, 100.0)) == []
    line = only(CrossTimers(130.0, bound + EPS, 100.0))
    assert line.startswith("gaps even inside a graph: graph 125.0 µs per call against profiler kernel busy 100.0 µs")


def test_kernel_busy_beyond_the_events_says_the_events_are_too_low() -> None:
    bound = timers.OVER_RATIO * 100.0 + timers.OVER_US  # 115 µs over 100 µs of events
    assert disagreements(CrossTimers(100.0, None, bound - EPS)) == []
    line = only(CrossTimers(100.0, None, bound + EPS))
    assert line.startswith("the device was busy longer than the events saw: profiler kernel busy 115.0 µs against "
                           "events 100.0 µs") and "work on another stream" in line and "too low" in line


def test_kernel_busy_beyond_the_graph() -> None:
    bound = timers.OVER_RATIO * 100.0 + timers.OVER_US
    assert disagreements(CrossTimers(110.0, 100.0, bound - EPS)) == []
    line = only(CrossTimers(110.0, 100.0, bound + EPS))
    assert "profiler kernel busy 115.0 µs against graph 100.0 µs" in line


def test_graph_slower_than_the_events() -> None:
    bound = timers.OVER_RATIO * 100.0 + timers.OVER_US
    assert disagreements(CrossTimers(100.0, bound - EPS, None)) == []
    line = only(CrossTimers(100.0, bound + EPS, None))
    assert line.startswith("the graph replay is slower than per-call events: graph 115.0 µs against events 100.0 µs")
    assert "capture changed the work" in line


def test_several_disagreements_each_get_a_prefixed_note() -> None:
    # Host-bound per call and gappy inside the graph too: both said, each as its own note.
    notes = timers.notes(CrossTimers(events_us=400.0, graph_us=200.0, kernel_us=100.0))
    assert [n.split(":", 2)[1].strip() for n in notes] == ["host/launch bound", "gaps even inside a graph"]
    assert all(n.startswith("cross-timer: ") for n in notes)


@pytest.mark.parametrize("intervals,busy", [
    ([], 0.0),
    ([(0.0, 10.0), (20.0, 25.0)], 15.0),  # disjoint: the sum
    ([(0.0, 10.0), (5.0, 15.0)], 15.0),  # overlapping (two streams): not 20
    ([(0.0, 100.0), (10.0, 20.0), (30.0, 40.0)], 100.0),  # nested: the outer one
    ([(30.0, 40.0), (0.0, 10.0), (10.0, 20.0)], 30.0),  # unsorted, touching
    ([(5.0, 5.0), (0.0, 2.0)], 2.0),  # an empty interval adds nothing
    ([(0.0, 10.0), (2.0, 4.0), (8.0, 12.0), (50.0, 51.0)], 13.0),
])
def test_busy_union_of_intervals(intervals: list[tuple[float, float]], busy: float) -> None:
    assert union_length(intervals) == pytest.approx(busy)


def event(name: str, start: float, end: float, device: DeviceType = DeviceType.CUDA, **extra) -> SimpleNamespace:
    """A stand-in for a profiler FunctionEvent: the attributes profiler_kernel_us reads."""
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), **extra)


def test_only_kernels_and_copies_count_as_device_work() -> None:
    assert is_device_work(event("flash_fwd", 0, 1, activity_type="kernel"))
    assert is_device_work(event("Memcpy DtoD", 0, 1, activity_type="gpu_memcpy"))
    assert is_device_work(event("Memset", 0, 1, activity_type="gpu_memset"))
    # CUDA-side, but not work: a stream wait, a record_function range over the GPU timeline.
    assert not is_device_work(event("Stream Sync", 0, 1, activity_type="cuda_sync"))
    assert not is_device_work(event("my_range", 0, 1, activity_type="gpu_user_annotation"))
    assert not is_device_work(event("aten::mm", 0, 1, device=DeviceType.CPU, activity_type="cpu_op"))
    assert is_device_work(event("k", 0, 1, activity_type=5)) and not is_device_work(event("s", 0, 1, activity_type=2))
    # Older torch without activity_type: annotations and sync waits are told apart by their flags and names.
    assert is_device_work(event("ampere_gemm", 0, 1))
    assert not is_device_work(event("Event Sync", 0, 1))
    assert not is_device_work(event("my_range", 0, 1, is_user_annotation=True))


class _FakeProfile:
    """torch.profiler.profile replaced: records the activities asked for, hands back the given events."""

    def __init__(self, events: list, seen: dict):
        self._events, self._seen = events, seen

    def __call__(self, activities):
        self._seen["activities"] = activities
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def events(self) -> list:
        return self._events


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, events: list) -> dict:
    seen: dict = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.profiler, "profile", _FakeProfile(events, seen))
    return seen


def test_profiler_kernel_us_is_none_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = []
    assert profiler_kernel_us(lambda: calls.append(1), calls=5) is None
    assert calls == []  # nothing is run for a figure that is not measured


def test_profiler_kernel_us_is_the_busy_union_of_device_work_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    events = [event("k1", 0.0, 30.0, activity_type="kernel"),
              event("side_stream_k", 10.0, 40.0, activity_type="kernel"),  # overlaps k1: counted once
              event("Memcpy DtoD", 50.0, 60.0, activity_type="gpu_memcpy"),
              event("Stream Sync", 0.0, 500.0, activity_type="cuda_sync"),  # a wait, not work
              event("cudaLaunchKernel", 0.0, 5.0, device=DeviceType.CPU, activity_type="cuda_runtime")]
    seen = _fake_cuda(monkeypatch, events)
    calls = []
    assert profiler_kernel_us(lambda: calls.append(1), calls=2) == pytest.approx((40.0 + 10.0) / 2)
    assert len(calls) == 2 and seen["activities"] == [torch.profiler.ProfilerActivity.CUDA]


def test_profiler_that_saw_no_device_work_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, [event("Stream Sync", 0.0, 5.0, activity_type="cuda_sync")])
    with pytest.raises(RuntimeError, match="no kernel, memcpy or memset"):
        profiler_kernel_us(lambda: None, calls=3)


def test_a_run_stores_kernel_median_and_the_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py's step after the CUDA graph, with the profiler's figure given: the metric, then the notes comparing
    it with the events median and the graph_median already stored."""
    monkeypatch.setattr(timers, "profiler_kernel_us", lambda call, calls: (call(), 100.0)[1])
    result = RunResult(metrics=[Metric("graph_median", 110.0, "us", phase="forward"),
                                Metric("graph_median", 40.0, "us", phase="patch_embed")])
    level_run._cross_timers(result, lambda x: x, [(torch.zeros(1),)], events_us=400.0, progress=lambda f, m: None)
    kernel = [m for m in result.metrics if m.name == "kernel_median"]
    assert [(m.value, m.unit, m.phase) for m in kernel] == [(100.0, "us", "forward")]
    assert len(result.notes) == 1 and result.notes[0].startswith("cross-timer: host/launch bound: events 400.0 µs")
    assert "the graph figure (110.0 µs)" in result.notes[0]  # the forward graph figure, not a stage's

    agreeing = RunResult(metrics=[Metric("graph_median", 105.0, "us", phase="forward")])
    level_run._cross_timers(agreeing, lambda x: x, [(torch.zeros(1),)], events_us=110.0, progress=lambda f, m: None)
    assert agreeing.notes == [timers.AGREE_NOTE]


def test_a_profiler_failure_is_a_note_never_a_failed_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cupti(call, calls):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED\nmore detail")

    monkeypatch.setattr(timers, "profiler_kernel_us", no_cupti)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    result = RunResult()
    level_run._cross_timers(result, lambda x: x, [(torch.zeros(1),)], events_us=100.0, progress=lambda f, m: None)
    assert not [m for m in result.metrics if m.name == "kernel_median"]
    assert result.notes == ["cross-timer: profiler kernel time not measured (RuntimeError: "
                            "CUPTI_ERROR_NOT_INITIALIZED)"]


def test_a_cpu_run_has_one_timer_and_no_cross_timer_note() -> None:
    result = level_run.run_level(level_run.LevelsConfig(component="causal_attention", shape="small",
                                                        level="L1-native", iters=2, warmup=0))
    names = {m.name for m in result.metrics}
    assert "median" in names and not names & {"kernel_median", "graph_median"}
    assert not [n for n in result.notes if n.startswith("cross-timer")]


def test_the_cli_table_shows_kernel_time_beside_the_graph_time(store: Store) -> None:
    from engine.cli.levels import levels_table

    ids = []
    for level, metrics in {"L4-triton": [("median", 270.0), ("graph_median", 60.0), ("kernel_median", 52.5)],
                           "L1-native": [("median", 500.0)]}.items():
        run_id = store.create_run("levels", "causal_attention", level, "cuda", params={"shape": "S=1024"})
        store.start_run(run_id)
        store.record_result(run_id, RunResult(metrics=[Metric(n, v, "us", phase="forward") for n, v in metrics]))
        ids.append(run_id)
    table = levels_table(store, ids)
    columns = list(table.columns)
    assert columns.index("kernel_us") == columns.index("in_graph_us") + 1
    assert list(table["in_graph_us"]) == ["60.0", ""] and list(table["kernel_us"]) == ["52.5", ""]


CUDA = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="the profiler's kernel time and the CUDA graph need a GPU")
def test_on_cuda_a_level_run_stores_the_profiler_kernel_time() -> None:
    result = level_run.run_level(level_run.LevelsConfig(component="causal_attention", shape="S=1024",
                                                        level="L1-native", device="cuda", iters=5, warmup=1))
    figures = {m.name: m.value for m in result.metrics if m.phase == "forward"}
    assert 0 < figures["kernel_median"] <= figures["median"] * 1.1, (figures, result.notes)
    assert [n for n in result.notes if n.startswith("cross-timer: ")], result.notes
