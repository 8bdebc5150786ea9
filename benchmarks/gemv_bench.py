"""Decode-step GEMVs at B=1: cuBLAS (F.linear) against the project's Triton GEMV, per weight shape of a preset.

    python benchmarks/gemv_bench.py --preset 1B,7B          (CUDA only)

Each shape: both outputs checked against float64 F.linear first (relative L2 ≤ 8e-3, bf16 outputs), then timed as the
decode step runs them (engine.kernels.triton.gemv.time_choice, the same timing the `triton-gemv` mode uses to pick an
implementation per shape): calls on rotating copies of W (3× the L2 size in all, so W streams from HBM) captured back to
back in one CUDA graph (no launch cost). Bandwidth = weight + x + y bytes / median time per call. Prints one table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def shapes(name: str) -> list[tuple[str, int, int]]:
    from engine.workloads.llama import preset

    c = preset(name)
    hd = c.dim // c.heads
    return [("qkv", (c.heads + 2 * c.kv_heads) * hd, c.dim), ("o", c.dim, c.heads * hd),
            ("gate_up", 2 * c.ffn, c.dim), ("down", c.dim, c.ffn), ("lm_head", c.vocab, c.dim)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1B,7B")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    from engine.kernels.triton.gemv import _gemv_tuned, _reference, gemv, time_choice

    rows = []
    for name in args.preset.split(","):
        for what, n, k in shapes(name):
            gen = torch.Generator(device="cuda").manual_seed(n + k)
            x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
            w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).bfloat16()
            ref = _reference(x, w)
            errs = {}
            for impl, fn in (("cublas", lambda: F.linear(x, w)), ("triton", lambda: gemv(x, w))):
                out = fn().double()
                errs[impl] = float((out - ref).norm() / ref.norm())
                if errs[impl] > 8e-3:
                    print(f"{name} {what}: {impl} is off by {errs[impl]:.2e}", file=sys.stderr)
                    return 1
            nbytes = (n * k + k + n) * 2
            times = time_choice(x, w)
            t_cublas, t_triton = times["cublas_us"], times["triton_us"]
            cfg = _gemv_tuned.best_config
            rows.append((name, what, n, k, nbytes / 1e6, t_cublas, nbytes / t_cublas / 1e6, t_triton,
                         nbytes / t_triton / 1e6, f"{cfg.kwargs['BLOCK_N']}x{cfg.kwargs['BLOCK_K']}/w{cfg.num_warps}",
                         max(errs.values())))
    print(f"{'preset':6} {'linear':8} {'N':>6} {'K':>6} {'MB':>7} {'cuBLAS us':>9} {'TB/s':>5} {'Triton us':>9} "
          f"{'TB/s':>5} {'tile':>10} {'rel err':>8}")
    for r in rows:
        print(f"{r[0]:6} {r[1]:8} {r[2]:6d} {r[3]:6d} {r[4]:7.1f} {r[5]:9.1f} {r[6]:5.2f} {r[7]:9.1f} {r[8]:5.2f} "
              f"{r[9]:>10} {r[10]:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
