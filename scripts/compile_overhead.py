"""Cross-check of the engine's CUDA numbers with a bare loop: wall time per step (synchronize + perf_counter over
N steps), for eager, compile and compile reduce-overhead, training step and B=1 inference.

    TORCH_LOGS=perf_hints python scripts/compile_overhead.py --device cuda
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.workloads.house_price import WORKLOAD  # noqa: E402


def wall_us(fn, device: str, iters: int = 300, warmup: int = 30) -> float:
    for _ in range(warmup):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = args.device
    rows = []
    for label, mode in (("eager", None), ("compile", "default"), ("compile-reduce-overhead", "reduce-overhead")):
        torch._dynamo.reset()
        model = WORKLOAD.make_model().to(device)
        fn = model if mode is None else torch.compile(model, mode=mode, dynamic=False)
        (x,), y = WORKLOAD.make_batch(64, device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(fn(x), y)
            loss.backward()
            opt.step()

        train = wall_us(step, device)
        (x1,), _ = WORKLOAD.make_batch(1, device)
        with torch.no_grad():
            torch._dynamo.reset()
            fn1 = model if mode is None else torch.compile(model, mode=mode, dynamic=False)
            infer = wall_us(lambda: fn1(x1), device)
        rows.append((label, train, infer))
    print(f"{'mode':<26}{'train B=64 us':>16}{'infer B=1 us':>14}")
    for label, train, infer in rows:
        print(f"{label:<26}{train:>16.1f}{infer:>14.1f}")


if __name__ == "__main__":
    main()
