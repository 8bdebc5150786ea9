"""A bf16 layer's products over a few rows (a decode step at 2 ≤ B ≤ 32), per weight shape of a preset: cuBLAS
(F.linear, what the decode step runs from B = 2) against the split-K rows kernel (engine/kernels/triton/gemv_rows.py,
a candidate) at each of its TILES and SPLITS. Prints each table, the kernel's best configuration per shape and B, and
a layer's four products both ways.

    python benchmarks/rows_gemm_bench.py --preset 7B --batch 2,4,8,16,32     (CUDA only)

Each configuration's output is checked against float64 first (relative L2 ≤ 8e-3), then timed as a decode step runs
it: calls over rotating copies of the weight, 3× the L2 in all so they stream from HBM, captured back to back in one
CUDA graph (engine.measure.timing.time_in_graph). % = the weight's bytes over the median time, of the copy bandwidth
measured in the same call.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.cli.args import positive_ints  # noqa: E402
from engine.measure.timing import copies_beyond_l2  # noqa: E402

TOL = 8e-3


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="7B")
    parser.add_argument("--batch", type=positive_ints, default=[2, 4, 8, 16, 32])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("rows_gemm_bench: needs a CUDA device", file=sys.stderr)
        return 2
    from quant_rows_bench import _timed, shapes  # the same shapes and the same timing as the int4 rows bench

    from engine.kernels.triton import gemv_rows as gr
    from engine.measure.ceilings import measure

    if max(args.batch) > gr.MAX_ROWS:
        parser.error(f"--batch takes at most {gr.MAX_ROWS} rows")
    copy_bw = measure("cuda")["copy_bw"]
    pct = lambda nbytes, us: 100 * nbytes / (us * 1e-6) / copy_bw  # noqa: E731
    print(f"copy bandwidth (this call): {copy_bw / 1e12:.2f} TB/s; µs per call (% of it on the weight's bytes)")
    configs = [(tile, split) for tile in gr.TILES for split in gr.SPLITS]
    totals: dict[tuple[int, str], float] = {}
    for name, (n, k) in shapes(args.preset).items():
        gen = torch.Generator().manual_seed(n + k)
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).to("cuda", torch.bfloat16)
        nbytes = w.numel() * 2
        weights = [(w.clone(),) for _ in range(copies_beyond_l2(nbytes))]
        print(f"\n{args.preset} {name} ({n} × {k}, {nbytes / 1e6:.1f} MB)")
        for b in args.batch:
            x = torch.randn(b, k, generator=gen).to("cuda", torch.bfloat16)
            ref = F.linear(x.double(), w.double())

            def check(out: torch.Tensor, ref: torch.Tensor = ref, b: int = b) -> None:
                err = float((out.double() - ref).norm() / ref.norm())
                if not err <= TOL:
                    raise SystemExit(f"{name} B={b}: relative error {err:.2e} > {TOL}")

            cublas = _timed(lambda x, w: F.linear(x, w), weights, x, check)
            times = {(tile, split): _timed(lambda x, w, tile=tile, split=split: gr.rows(x, w, split, tile), weights,
                                           x, check) for tile, split in configs}
            (tile, split), best = min(times.items(), key=lambda item: item[1])
            totals[b, "cuBLAS"] = totals.get((b, "cuBLAS"), 0.0) + cublas
            totals[b, "rows"] = totals.get((b, "rows"), 0.0) + best
            print(f"  B={b:<3} cuBLAS {cublas:7.1f} ({pct(nbytes, cublas):4.1f} %)   rows, best of {len(configs)}: "
                  f"{best:7.1f} ({pct(nbytes, best):4.1f} %) at tile {'x'.join(map(str, tile))}, {split} split"
                  f"{'s' * (split != 1)}   cuBLAS / rows {cublas / best:.2f}×")
    print(f"\n{args.preset}: a layer's four products (rows at its best configuration per shape), µs")
    for b in args.batch:
        cublas, rows = totals[b, "cuBLAS"], totals[b, "rows"]
        print(f"  B={b:<3} cuBLAS {cublas:7.1f}   rows {rows:7.1f}   cuBLAS / rows {cublas / rows:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
