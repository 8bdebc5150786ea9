"""Timing: run a callable, keep every sample, summarise with plainly named statistics.

Shaped like torch.utils.benchmark: `time_fn` (the Timer) returns a `Measurement` that holds all samples and the
first-call time separately, and `summarize` turns samples into statistics. On CUDA each iteration is bracketed by CUDA
events (device time of the enqueued work, no host sync inside the loop); on CPU by perf_counter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p10: float
    p90: float
    p25: float
    p75: float
    iqr: float
    mean: float
    std: float
    min: float
    max: float


def summarize(samples: list[float] | np.ndarray) -> Stats:
    """Statistics of raw samples (any unit). Percentiles use linear interpolation (numpy's default)."""
    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples to summarise")
    if not np.all(np.isfinite(a)):
        raise ValueError("samples contain NaN or inf")
    p10, p25, p50, p75, p90 = np.percentile(a, [10, 25, 50, 75, 90])
    return Stats(
        n=int(a.size), median=float(p50), p10=float(p10), p90=float(p90), p25=float(p25), p75=float(p75),
        iqr=float(p75 - p25), mean=float(a.mean()), std=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        min=float(a.min()), max=float(a.max()),
    )


@dataclass
class Measurement:
    samples_us: list[float]
    first_call_us: float
    device: str
    rounds: int = 1  # rounds of timed calls (time_adaptive takes more while the spread is wide)
    settled: bool = True  # False: the spread stayed wide through every round time_adaptive allowed

    @property
    def stats(self) -> Stats:
        return summarize(self.samples_us)


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def time_first_call(fn: Callable[[], object], device: str) -> float:
    """Wall time of one call including everything it triggers (tracing, compilation), in µs — less the time it waited
    for the device inside: in a worker beside its group (engine.runner.device_lock's phases) an autotuner's timings,
    or a
    compile's return to the device, wait for the other runs; the first call's cost is its own, not the queue's."""
    import torch

    from engine.runner import device_lock

    hold = device_lock.current()
    waited = hold.waited_s if hold else 0.0
    if _is_cuda(device):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if _is_cuda(device):
        torch.cuda.synchronize()
    us = (time.perf_counter() - start) * 1e6
    return us - ((hold.waited_s - waited) * 1e6 if hold else 0.0)


def time_events_each(fn: Callable[[], object], warmup: int, iters: int, before_each: Callable[[], object]
                     ) -> list[float]:
    """CUDA: `warmup` calls, then `iters` calls each between two events (µs per call), with `before_each()` queued
    untimed before each start event (an L2 flush, a lead of torch.cuda._sleep that keeps the device ahead)."""
    import torch

    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda.synchronize()
    for i in range(iters):
        before_each()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]


def time_fn(fn: Callable[[], object], device: str, *, warmup: int = 10, iters: int = 100,
            first_call: bool = True, on_iter: Callable[[int], None] | None = None) -> Measurement:
    """Time `fn` once cold (its first call), then `warmup` untimed calls, then `iters` timed calls."""
    import torch

    if iters < 1:
        raise ValueError("iters must be at least 1")
    first = time_first_call(fn, device) if first_call else float("nan")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    if _is_cuda(device):
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            fn()
            ends[i].record()
            if on_iter:
                on_iter(i)
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    else:
        for i in range(iters):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
            if on_iter:
                on_iter(i)
    return Measurement(samples_us=samples, first_call_us=first, device=device)


# time_adaptive's limits on extra rounds: at most this many rounds in all, and this much time for the extra ones.
ADAPT_MAX_ROUNDS = 8
ADAPT_BUDGET_S = 3.0
# Below this many calls a round is a quick look, not a measurement: the p10 and p90 of a handful of samples are
# nearly their min and max, too rough to decide on more rounds from.
ADAPT_MIN_ITERS = 20


def time_adaptive(fn: Callable[[], object], device: str, *, warmup: int = 10, iters: int = 100,
                  budget_s: float = ADAPT_BUDGET_S, max_rounds: int = ADAPT_MAX_ROUNDS,
                  on_iter: Callable[[int], None] | None = None) -> Measurement:
    """`time_fn` (no first call), then, while the samples' spread is wide (engine.measure.noise.settled), another
    round of `iters` calls — until it settles, `max_rounds` rounds in all, or the extra rounds took `budget_s` —
    as torch.utils.benchmark's adaptive_autorange keeps measuring until its estimate is good enough. A brief
    disturbance (another process's burst) is outweighed by the rounds after it; one that lasts stays in the spread,
    and the Measurement says it never settled (then the series is flagged: engine.measure.noise). Every sample of
    every round is kept. Fewer than ADAPT_MIN_ITERS calls a round: that one round."""
    from engine.measure.noise import settled

    m = time_fn(fn, device, warmup=warmup, iters=iters, first_call=False, on_iter=on_iter)
    deadline = time.perf_counter() + budget_s
    m.settled = settled(m.samples_us)
    if iters < ADAPT_MIN_ITERS:
        return m
    while not m.settled and m.rounds < max_rounds and time.perf_counter() < deadline:
        more = time_fn(fn, device, warmup=0, iters=iters, first_call=False)
        m.samples_us += more.samples_us
        m.rounds += 1
        m.settled = settled(m.samples_us)
    return m


def time_blocks(fn: Callable[[], object], device: str, *, block: int = 20, reps: int = 25) -> Measurement:
    """Per-call time over `reps` blocks of `block` back-to-back calls: one event pair (or clock pair) per block.

    `time_fn` brackets every call with its own events, so on a launch-bound step the host's cost of recording two
    events lands in every sample (about 10 µs on the H100 host). A training loop pays no such cost: once the host runs
    ahead, a step costs max(host time, device time). This is torch.utils.benchmark's convention (it times blocks of
    `number` runs); each sample is a block's time divided by `block`.
    """
    import torch

    if block < 1 or reps < 1:
        raise ValueError("block and reps must be at least 1")
    samples: list[float] = []
    if _is_cuda(device):
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            starts[r].record()
            for _ in range(block):
                fn()
            ends[r].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e3 / block for s, e in zip(starts, ends)]
    else:
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(block):
                fn()
            samples.append((time.perf_counter() - start) * 1e6 / block)
    return Measurement(samples_us=samples, first_call_us=float("nan"), device=device)


def reset_after_failed_capture() -> None:
    """A capture that fails (a host sync, an uncapturable op) ends before torch tells the CUDA generator the capture
    is over, and every later CUDA random op in the process then raises "Offset increment outside graph capture
    encountered unexpectedly" (seen on an H100, torch 2.11). One small capture that succeeds closes it again."""
    import torch

    torch.cuda.synchronize()
    x = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    torch.cuda.synchronize()


def copies_beyond_l2(nbytes: int, most: int = 16) -> int:
    """How many rotating copies of an `nbytes` operand time_in_graph's calls need so that together they hold about
    3× the device's L2 and each call reads from HBM (at least 2, at most `most`)."""
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size or (50 << 20)
    return max(2, min(most, int(3 * l2 // max(1, nbytes)) + 1))


def time_in_graph(calls: list[Callable[[], object]], *, replays: int = 20, warmup: int = 2) -> Measurement:
    """Device time per call of `calls`, captured back to back into one CUDA graph and replayed: no host launch cost,
    as inside a decode step's graph. Give calls that read different buffers (e.g. rotating copies of a weight, more
    bytes in all than L2 holds) to time reads from HBM rather than L2. Each sample = one replay / len(calls); the
    callables must already have run once outside capture (Triton autotuning, cuBLAS handles, lazy allocations)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for call in calls:
                call()
    except Exception:
        reset_after_failed_capture()
        raise
    graph.replay()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = [start.elapsed_time(end) * 1e3 / len(calls) for start, end in pairs]
    return Measurement(samples_us=samples, first_call_us=float("nan"), device="cuda")
