"""Timing on the device: calls bracketed by CUDA events (perf_counter on the CPU), and decode passes with one event
between consecutive steps and no host sync inside the loop. Used by engine.llm.run and engine.llm.tp_rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from engine.llm.generate import Decoder


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA; the CPU runs synchronously)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_calls(fn: Callable[[], object], n: int, device: str,
                before: Callable[[], object] | None = None) -> list[float]:
    """µs per call; on CUDA a pair of events per call, on CPU perf_counter. `before` runs untimed ahead of each
    call (tensor-parallel ranks pass a barrier, so every rank starts together)."""
    out = []
    for _ in range(n):
        sync(device)
        if before is not None:
            before()
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
    return out


def decode_pass(decoder: Decoder, token: torch.Tensor, start: int, steps: int, device: str,
                before: Callable[[], object] | None = None) -> list[float]:
    """µs per decode step over `steps` steps: one event between consecutive steps on CUDA (no host sync inside the
    loop), perf_counter on the CPU. `before` runs once ahead of the pass (a barrier across tensor-parallel ranks)."""
    decoder.reset(token, start)
    sync(device)
    if before is not None:
        before()
    if device.startswith("cuda"):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        events[0].record()
        for i in range(steps):
            decoder.step()
            events[i + 1].record()
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(steps)]
    times, t0 = [], time.perf_counter()
    for _ in range(steps):
        decoder.step()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e6)
        t0 = t1
    return times
