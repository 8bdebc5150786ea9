"""The decode step's int4 MLP at B = 1 on the tensor cores: the two products the step runs now (gate_up with the
RMSNorm and SwiGLU, then down with the residual: engine/kernels/cuda_quant.py's int4_gemv, each at its tuned block)
against the MLP in one kernel (cuda_quant.int4_mlp: down's products added into an fp32 accumulator from the block
that formed their 64 SwiGLU features) at each of its blocks, down's group staged in shared memory while gate_up
runs (sm_90, where it fits) or read from global memory after it, per preset.

    python benchmarks/int4_mlp_bench.py [--preset 1B,7B] [--replays 10]
    (CUDA, compute capability 8.0+; the kernel library builds on first use, ~30 s)

Each way is checked first: the one kernel's output (x + the MLP, bf16) against the pair's (relative L2 ≤ 1e-2: both
round to bf16, their fp32 sums in other orders). Then timed as a decode step runs it (engine.timing.time_in_graph):
calls on rotating copies of the weights (3× the L2 in all, so they stream from HBM) back to back in one CUDA graph;
µs per MLP, each with its residual (the one kernel's last block adds it and zeroes its accumulator). Nothing here is
wired into the decode step: this says whether it would pay (docs/quantization.md, session 28).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def weights(dim: int, ffn: int, gen: torch.Generator):
    """Random gate_up and down quantized as the int4 mode quantizes, in the kernels' layouts: gate_up in tile order
    with glu, down in tile order (the pair) and in group order (the one kernel)."""
    from engine.kernels import cuda_quant
    from engine.llm.quant import quantize

    gu = quantize((torch.randn(2 * ffn, dim, device="cuda", generator=gen) / dim ** 0.5).bfloat16(), "int4-wo")
    dw = quantize((torch.randn(dim, ffn, device="cuda", generator=gen) / ffn ** 0.5).bfloat16(), "int4-wo")
    return (cuda_quant.tile_major(gu.q, gu.scales, dim, glu=True), cuda_quant.tile_major(dw.q, dw.scales, ffn),
            cuda_quant.group_major(dw.q, dw.scales, ffn))


def bench_preset(name: str, replays: int) -> dict:
    from engine.kernels import cuda_quant
    from engine.timing import time_in_graph
    from engine.workloads.llama import preset

    c = preset(name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(c.dim, device="cuda", generator=gen).bfloat16()
    g = (1 + 0.1 * torch.randn(c.dim, device="cuda", generator=gen)).bfloat16()
    gate_up, down_tiles, down_groups = weights(c.dim, c.ffn, gen)
    tuned = cuda_quant.tune([gate_up, down_tiles])  # the blocks the step would run (as the mode prepares)

    def pair(gu, dt):  # the step's MLP: its input x is also its residual
        h = cuda_quant.int4_gemv(x, gu, g, 1e-5)
        return cuda_quant.int4_gemv(h, dt, None, 0.0, x)

    want = pair(gate_up, down_tiles).double()
    nbytes = sum(t.numel() * t.element_size() for t in (gate_up.q, gate_up.s, down_tiles.q, down_tiles.s))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, min(16, int(3 * l2 // nbytes) + 1))
    sets = [(gate_up, down_tiles, down_groups)] + [
        (cuda_quant.TileWeight(gate_up.q.clone(), gate_up.s.clone(), gate_up.n, gate_up.k, True),
         cuda_quant.TileWeight(down_tiles.q.clone(), down_tiles.s.clone(), down_tiles.n, down_tiles.k, False),
         cuda_quant.TileWeight(down_groups.q.clone(), down_groups.s.clone(), down_groups.n, down_groups.k, False,
                               True)) for _ in range(copies - 1)]
    times = {"pair": time_in_graph([lambda s=s: pair(s[0], s[1]) for s in sets], replays=replays).stats.median}
    errors = {}
    for ks in cuda_quant.MLP_KSLICES:
        for batch in cuda_quant.RING_BATCHES:
            for stage in (True, False):
                way = (ks, batch, "staged" if stage else "global")
                scratch = cuda_quant.mlp_scratch(c.dim, "cuda")
                y = cuda_quant.int4_mlp(x, gate_up, down_groups, g, 1e-5, scratch, ks=ks, batch=batch, stage=stage)
                err = float((y.double() - want).norm() / want.norm())
                errors[way] = err
                if not err <= 1e-2:
                    print(f"  {name} one kernel {way}: off the pair by {err:.2e}, not timed", file=sys.stderr)
                    continue
                calls = [lambda s=s, ks=ks, batch=batch, stage=stage: cuda_quant.int4_mlp(
                    x, s[0], s[2], g, 1e-5, scratch, ks=ks, batch=batch, stage=stage) for s in sets]
                times[way] = time_in_graph(calls, replays=replays).stats.median
    return {"times": times, "errors": errors, "tuned": tuned, "bytes": nbytes, "dim": c.dim, "ffn": c.ffn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1B,7B")
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args(argv)
    if args.replays < 1:
        parser.error("--replays must be >= 1")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    from engine.kernels import cuda_quant

    reason = cuda_quant.available()
    if reason:
        print(f"the tensor-core int4 kernels are not available here: {reason}", file=sys.stderr)
        return 2
    results = {name: bench_preset(name, args.replays) for name in args.preset.split(",")}
    print(f"{torch.cuda.get_device_name()}; µs per MLP (block = warps x groups per bulk copy), weights from HBM")
    print(f"{'preset':<7}{'dim':>6}{'ffn':>7}{'MB':>7}{'pair':>8}  one kernel by block and where down's group is read "
          "from (rel. error vs the pair)")
    for name, res in results.items():
        blocks = "  ".join(f"{ks}x{b} {where} {res['times'][(ks, b, where)]:.2f} ({res['errors'][(ks, b, where)]:.0e})"
                           if (ks, b, where) in res["times"] else
                           f"{ks}x{b} {where} off ({res['errors'][(ks, b, where)]:.0e})"
                           for ks, b, where in res["errors"])
        print(f"{name:<7}{res['dim']:>6}{res['ffn']:>7}{res['bytes'] / 1e6:>7.1f}{res['times']['pair']:>8.2f}  "
              f"{blocks}")
        for line in res["tuned"]:
            print(f"        pair's tuned block: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
