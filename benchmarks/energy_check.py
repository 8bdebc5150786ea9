"""How far the GPU's energy figures can be trusted: NVML's total-energy counter against its power samples
integrated over a ~5 s matmul window, the counter's update interval and step, and the idle draw.

    python benchmarks/energy_check.py [--device cuda] [--seconds 5] [--size 8192]      (GPU only; ~15 s)

Prints the counter's joules, the integrated power samples' joules and their ratio (near 1 when both see the same
board energy), how often each figure changes, and the idle draw over a quiet window. docs/measurement.md quotes it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def change_intervals(read, seconds: float) -> tuple[list[float], list[float]]:
    """Poll `read` in a tight loop for `seconds`: the intervals between changes of its value and the changes."""
    last, t_last = read(), time.perf_counter()
    intervals, steps = [], []
    end = t_last + seconds
    while (now := time.perf_counter()) < end:
        value = read()
        if value != last:
            intervals.append(now - t_last)
            steps.append(value - last)
            last, t_last = value, now
    return intervals[1:], steps[1:]  # the first change is a partial interval


def integrate(samples) -> float:
    """Trapezoid integral of (t, watts) samples, joules."""
    return sum((b.t - a.t) * (a.power_w + b.power_w) / 2 for a, b in zip(samples, samples[1:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=8192)
    args = parser.parse_args()

    import torch

    from engine.measure.nvml import Sampler, nvml_index, open_device

    if not torch.cuda.is_available():
        print("energy_check: needs a CUDA GPU (this machine has none)")
        return 2
    device = torch.device(args.device)
    if device.index is not None:
        torch.cuda.set_device(device)
    reader, why = open_device(nvml_index(args.device))
    if reader is None:
        print(f"energy_check: NVML not available here ({why})")
        return 2
    print(f"device: {reader.name()}  (NVML index {reader.index})")
    if reader.energy_mj() is None:
        print("the total-energy counter is not supported on this GPU")
        return 1

    print("\nidle window (2 s, nothing queued):")
    torch.cuda.synchronize()
    time.sleep(0.5)
    e0_idle, t0 = reader.energy_mj(), time.perf_counter()
    time.sleep(2.0)
    e1_idle, t1 = reader.energy_mj(), time.perf_counter()
    idle_s = t1 - t0
    idle_w = (e1_idle - e0_idle) / 1000 / idle_s
    print(f"  idle draw from the counter: {idle_w:.1f} W   (power now {reader.power_w()} W, "
          f"SM clock {reader.sm_clock_mhz()} MHz, reasons {reader.clock_event_reasons()})")

    a = torch.randn(args.size, args.size, device=args.device, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=args.device, dtype=torch.bfloat16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()

    print(f"\nmatmul window ({args.seconds:.0f} s of {args.size}^3 bf16 products):")
    launched = [0]
    e0, t0 = reader.energy_mj(), time.perf_counter()
    with Sampler(reader, interval_s=0.01) as sampler:
        while time.perf_counter() - t0 < args.seconds:
            for _ in range(20):
                a @ b
            launched[0] += 20
            torch.cuda.synchronize()
    e1, t1 = reader.energy_mj(), time.perf_counter()
    counter_j = (e1 - e0) / 1000
    samples = [s for s in sampler.samples if s.power_w is not None]
    integrated_j = integrate(samples)
    seconds = t1 - t0
    clocks = [s.sm_clock_mhz for s in sampler.samples if s.sm_clock_mhz]
    reasons = sorted({r for s in sampler.samples for r in s.reasons})
    tflops = 2 * args.size ** 3 * launched[0] / seconds / 1e12
    print(f"  window {seconds:.2f} s, {launched[0]} products, {tflops:.0f} TFLOP/s")
    print(f"  counter:                 {counter_j:9.1f} J   ({counter_j / seconds:.1f} W average)")
    print(f"  integrated power ({len(samples)} samples at 10 ms): {integrated_j:9.1f} J   "
          f"({integrated_j / (samples[-1].t - samples[0].t):.1f} W average)")
    print(f"  ratio counter / integrated: {counter_j / integrated_j:.3f}")
    print(f"  SM clock min {min(clocks)} / median {statistics.median(clocks):.0f} MHz; reasons seen: {reasons}")
    print(f"  J per product: {counter_j / launched[0]:.3f}  ({launched[0] * 2 * args.size ** 3 / counter_j / 1e12:.2f}"
          " TFLOP/J)")

    print("\nupdate rates under load (2 s of polling each, matmuls queued):")
    for _ in range(400):
        a @ b  # ~4 s of queued work keeps the board busy while the host polls
    intervals, steps = change_intervals(reader.energy_mj, 2.0)
    if intervals:
        print(f"  energy counter: changes every {statistics.median(intervals) * 1e3:.1f} ms (median; min "
              f"{min(intervals) * 1e3:.1f}, max {max(intervals) * 1e3:.1f}), median step {statistics.median(steps):.0f}"
              f" mJ, smallest {min(steps)} mJ")
    else:
        print("  energy counter: did not change in 2 s")
    intervals, steps = change_intervals(reader.power_w, 2.0)
    if intervals:
        print(f"  power reading:  changes every {statistics.median(intervals) * 1e3:.1f} ms (median; min "
              f"{min(intervals) * 1e3:.1f}, max {max(intervals) * 1e3:.1f})")
    else:
        print("  power reading: did not change in 2 s")
    torch.cuda.synchronize()

    print("\nshort windows (0.3 s of products, 6 each; the lab's windows are read at the counter's steps):")
    try:
        from engine.measure.energy import NVML_ALIGN_S, Meter, measure
    except ImportError as e:  # engine.store needs duckdb
        print(f"  skipped ({e})")
        return 0

    def products() -> float:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.3:
            for _ in range(5):
                a @ b
            n += 5
            torch.cuda.synchronize()
        return n

    for label, align in (("read as is", 0.0), ("read at its steps", NVML_ALIGN_S)):
        meter = Meter(args.device, "nvml", reader=reader, idle_w=idle_w, min_window_s=0.0, align_s=align)
        per = []
        for _ in range(6):
            n, window = measure(meter, products, units=lambda n: n)
            per.append(window.joules / n)
        spread = (max(per) - min(per)) / statistics.median(per)
        print(f"  {label:<18} J per product: median {statistics.median(per):.3f}, spread (max-min)/median "
              f"{100 * spread:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
