"""The cross-timer panel of a level (CUDA): CUDA events per call, the same calls in a CUDA graph, the profiler's
kernel time — and where they disagree beyond the stated bounds, a plain line saying so and why it may be.

    events_us   the per-call median between CUDA events around each Python call (engine.measure.timing.time_fn): the
                device time of what the call enqueued, including gaps while the device waits for the host
    graph_us    the same calls captured back to back in one CUDA graph and replayed
    (engine.measure.timing.time_in_graph):
                no host launch cost, but still the gaps between dependent kernels and each kernel's tail
    kernel_us   the profiler's device busy time per call: the union of the kernel, memcpy and memset intervals CUPTI
                saw over a few calls, divided by the calls — no gaps at all

Normally kernel busy ≤ graph ≤ events. The bounds below say how far they may stray before the page calls it out.
The CUDA path (profiler_kernel_us on a GPU) was written without a GPU and has not been run by its author.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.measure.op_stats import union_length

# Bounds. Each is a ratio plus an absolute floor in µs: medians of separate measurements differ by a few % from
# run to run, CUPTI's per-kernel timestamps and event resolution are good to ~1 µs, and a graph replay still pays
# ~1–2 µs between kernel nodes; the floors keep a few-µs kernel from being flagged for a difference of a launch.
HOST_RATIO, HOST_MIN_US = 1.5, 20.0  # events over kernel busy: a third of the call or more is gaps, and > 20 µs
GRAPH_GAP_RATIO, GRAPH_GAP_US = 1.2, 5.0  # graph over kernel busy: gaps that a graph cannot remove
OVER_RATIO, OVER_US = 1.1, 5.0  # a figure that should be the smaller one exceeding the larger: beyond noise

NOTE_PREFIX = "cross-timer: "  # every note of the panel starts so; the page picks them out by it
AGREE_NOTE = NOTE_PREFIX + "events, graph and profiler kernel time agree within the stated bounds"
NOT_MEASURED = NOTE_PREFIX + "profiler kernel time not measured"

# What the profiler reports on the device timeline that is work (kineto's activity names). Other CUDA-side events
# are not work and must not count: gpu_user_annotation spans a record_function range including its gaps, cuda_sync
# spans the time a stream or the host waited, cuda_profiler_range a whole profiled range.
_WORK_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_WORK_ACTIVITY_IDS = frozenset({3, 4, 5})  # libkineto's GPU_MEMCPY, GPU_MEMSET, CONCURRENT_KERNEL, if given as int
_NOT_WORK_NAMES = ("Sync", "Stream Wait Event")  # cuda_sync events' names, where activity_type is not exposed


@dataclass(frozen=True)
class CrossTimers:
    """One level's three per-call figures in µs; graph_us / kernel_us are None where not measured."""
    events_us: float
    graph_us: float | None
    kernel_us: float | None


def is_device_work(event) -> bool:
    """A profiler event (FunctionEvent) that is a kernel, memcpy or memset on a CUDA device."""
    from torch.autograd import DeviceType

    if event.device_type != DeviceType.CUDA:
        return False
    activity = getattr(event, "activity_type", None)  # a str in torch 2.13; absent in older releases
    if isinstance(activity, str) and activity:
        return activity in _WORK_ACTIVITIES
    if isinstance(activity, int):
        return activity in _WORK_ACTIVITY_IDS
    # Without the activity type: user annotations on the GPU timeline and sync waits are the non-work CUDA events.
    return not getattr(event, "is_user_annotation", False) and not str(event.name).endswith(_NOT_WORK_NAMES)


def profiler_kernel_us(call: Callable[[], object], calls: int) -> float | None:
    """Device busy time per call (µs) of `calls` calls of `call` under torch.profiler (CUDA activity only): the union
    of their kernel/memcpy/memset intervals / calls. None off CUDA; RuntimeError if the profiler saw no device work
    (CUPTI unavailable, or a call that enqueues nothing)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    work = [(e.time_range.start, e.time_range.end) for e in prof.events() if is_device_work(e)]
    if not work:
        raise RuntimeError("the profiler saw no kernel, memcpy or memset (CUPTI unavailable?)")
    return union_length(work) / calls


def disagreements(t: CrossTimers) -> list[str]:
    """Plain-language lines where the three figures disagree beyond the bounds; empty when they agree."""
    lines: list[str] = []
    events, graph, kernel = t.events_us, t.graph_us, t.kernel_us
    if kernel is not None and events > HOST_RATIO * kernel and events - kernel > HOST_MIN_US:
        removed = (f"the graph figure ({graph:.1f} µs) removes them" if graph is not None
                   else "a CUDA graph would remove them")
        lines.append(f"host/launch bound: events {events:.1f} µs per call against profiler kernel busy "
                     f"{kernel:.1f} µs — {events - kernel:.1f} µs of every call is gaps between kernels (Python, "
                     f"launches); {removed}")
    if kernel is not None and graph is not None and graph > GRAPH_GAP_RATIO * kernel + GRAPH_GAP_US:
        lines.append(f"gaps even inside a graph: graph {graph:.1f} µs per call against profiler kernel busy "
                     f"{kernel:.1f} µs — dependent small kernels, or each kernel's tail, leave the device idle")
    if kernel is not None and kernel > OVER_RATIO * events + OVER_US:
        lines.append(f"the device was busy longer than the events saw: profiler kernel busy {kernel:.1f} µs "
                     f"against events {events:.1f} µs per call — work on another stream, or work the events do not "
                     "bracket; the events figure is too low")
    if kernel is not None and graph is not None and kernel > OVER_RATIO * graph + OVER_US:
        lines.append(f"the profiled calls kept the device busier than the graph replay took: profiler kernel busy "
                     f"{kernel:.1f} µs against graph {graph:.1f} µs per call — the graph ran different kernels "
                     "(capture picks other paths), or the profiler slowed the kernels it timed")
    if graph is not None and graph > OVER_RATIO * events + OVER_US:
        lines.append(f"the graph replay is slower than per-call events: graph {graph:.1f} µs against events "
                     f"{events:.1f} µs per call — capture changed the work (e.g. allocations, different kernels)")
    return lines


def notes(t: CrossTimers) -> list[str]:
    """The run's cross-timer notes: each disagreement prefixed, or the one line saying they agree."""
    return [NOTE_PREFIX + line for line in disagreements(t)] or [AGREE_NOTE]
