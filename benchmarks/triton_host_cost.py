"""Where the host time of a Triton level's call goes: per-call host time, then a cProfile of the same calls.

    python benchmarks/triton_host_cost.py [--calls 300] [--only mp]   (CUDA, under a minute)
    TRITON_INTERPRET=1 python benchmarks/triton_host_cost.py   (no GPU: interpreted, checks the script only)

A Triton level's per-call median can sit far above its in-graph (device) time — several times over for a kernel of
a few tens of µs — while Triton's own JIT dispatch is documented at ~10–20 µs. This
prints, per kernel: host µs per call (calls issued back to back, one sync at the end), the device time of one call
(CUDA events), and the 12 functions with the most own time under cProfile, to name the cost before changing code.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def cases(device: str) -> dict:
    from engine.kernels.triton.attention import attention
    from engine.kernels.triton.message_passing import csr_from_edges, message_passing
    from engine.kernels.triton.patch_embed import patch_embed

    gpu = device == "cuda"
    dt = torch.bfloat16 if gpu else torch.float32
    b, h, s, d = (4, 16, 1024, 128) if gpu else (1, 2, 64, 32)
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dt) for _ in range(3))
    nb, hw, e = (64, 224, 768) if gpu else (2, 32, 64)
    img = torch.randn(nb, 3, hw, hw, device=device, dtype=dt)
    w = torch.randn(e, 3, 16, 16, device=device, dtype=dt) * 0.02
    bias, cls = torch.randn(e, device=device, dtype=dt), torch.randn(e, device=device, dtype=dt)
    pos = torch.randn(1 + (hw // 16) ** 2, e, device=device, dtype=dt)
    n, ne, f = (100_000, 1_000_000, 128) if gpu else (50, 200, 16)  # Kernel Levels' message-passing shape
    x = torch.randn(n, f, device=device, dtype=dt)
    src, dst = torch.randint(0, n, (ne,), device=device), torch.randint(0, n, (ne,), device=device)
    ew = torch.rand(ne, device=device, dtype=dt)
    src_s, ew_s, rowptr = csr_from_edges(src, dst, ew, n)
    return {f"attention S={s}": lambda: attention(q, k, v, True),
            f"patch_embed B={nb}": lambda: patch_embed(img, w, bias, cls, pos, 16),
            "mp sorted": lambda: message_passing(x, src_s, dst, ew_s, n, rowptr=rowptr),
            "mp unsorted linked": lambda: message_passing(x, src, dst, ew, n)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--only", default="", help="run the cases whose name contains this (e.g. mp)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    calls = args.calls if device == "cuda" else 3
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cpu":
        print("no CUDA device: kernels run in Triton's interpreter; the figures below are not launch costs")
    rows = []
    for name, fn in cases(device).items():
        if args.only not in name:
            continue
        for _ in range(3):  # compile + autotune out of the way
            fn()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host_us = (time.perf_counter() - start) / calls * 1e6  # issue rate; the GPU may still be running
        sync()
        device_us = float("nan")
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            sync()
            device_us = a.elapsed_time(b) * 1e3
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        sync()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(f"\n== {name}: cProfile of {calls} calls (own time first)\n" + out.getvalue().split("\n\n", 2)[-1])
        rows.append((name, host_us, device_us))
    print(f"\n{'kernel':<22} {'host µs/call':>13} {'one call, events µs':>20}")
    for name, host_us, device_us in rows:
        print(f"{name:<22} {host_us:13.1f} {device_us:20.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
