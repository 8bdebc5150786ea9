"""An int4 layer's product over a few rows (a decode step at 2 ≤ B ≤ 16), both ways, per weight shape of a preset:
the rows kernel (engine/kernels/triton/quant_rows.py, at each tile of its AOT_TILES) against the weight dequantized
into a bf16 copy for cuBLAS (what engine.kernels.choice.quant_products sends rows to above QUANT_ROWS_MAX_BATCH),
beside cuBLAS on the unquantized bf16 weight, and the kernel's multiply-add form (a candidate, at its FMA_TILES).
Prints each table, the crossover that sets QUANT_ROWS_MAX_BATCH, and the fma form against the dot form and bf16.

    python benchmarks/quant_rows_bench.py --preset 7B --batch 2,4,8,16     (CUDA only)

Each form's output is checked against float64 dequantize-then-matmul first (relative L2 ≤ 8e-3), then timed as a
decode step runs it: calls over rotating copies of the codes (or weights), 3× the L2 in all so they stream from HBM,
captured back to back in one CUDA graph (engine.measure.timing.time_in_graph). % = the bytes the form must read
(codes and scales for int4, the bf16 weight for cuBLAS) over the median time, of the copy bandwidth measured in the
same call.
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


def shapes(preset_name: str) -> dict[str, tuple[int, int]]:
    """(N, K) of a decoder layer's four products."""
    from engine.workloads.llama import preset

    cfg = preset(preset_name)
    hd = cfg.dim // cfg.heads
    return {"qkv": ((cfg.heads + 2 * cfg.kv_heads) * hd, cfg.dim), "o": (cfg.dim, cfg.heads * hd),
            "gate_up": (2 * cfg.ffn, cfg.dim), "down": (cfg.dim, cfg.ffn)}


def _timed(form, copies: list, x: torch.Tensor, check) -> float:  # type: ignore[no-untyped-def]
    """µs per call of form(x, *copy), after its output on the first copy passed `check`."""
    from engine.measure.timing import time_in_graph

    check(form(x, *copies[0]))
    calls = [lambda c=c: form(x, *c) for c in copies]
    return time_in_graph(calls, replays=10).stats.median


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="7B")
    parser.add_argument("--batch", type=positive_ints, default=[2, 4, 8, 16])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("quant_rows_bench: needs a CUDA device", file=sys.stderr)
        return 2
    from engine.kernels.triton import quant_gemv as qg
    from engine.kernels.triton import quant_rows as qr
    from engine.llm import quant
    from engine.measure.ceilings import measure

    copy_bw = measure("cuda")["copy_bw"]
    print(f"copy bandwidth (this call): {copy_bw / 1e12:.2f} TB/s; µs per call (% of it on the bytes read)")
    # the dot form at tile_for's tile per shape (what the lab runs) and at each of its tiles; the multiply-add form
    # (a candidate) at each of its tiles, up to its FMA_MAX_ROWS rows
    tiles = {"rows tile_for": (None, "dot"), **{f"rows {n}x{g}g w{w}": ((n, g, w), "dot") for n, g, w in qr.AOT_TILES},
             **{f"fma {n}x{g}g w{w}": ((n, g, w), "fma") for n, g, w in qr.FMA_TILES}}
    totals: dict[tuple[int, str], float] = {}
    for name, (n, k) in shapes(args.preset).items():
        gen = torch.Generator().manual_seed(n + k)
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).to("cuda", torch.bfloat16)
        qw = quant.quantize(w.float(), "int4-wo").to("cuda")
        q, s = qw.q, qw.scales.to(torch.bfloat16)
        code_bytes = q.numel() + s.numel() * 2
        codes = [(q.clone(), s.clone()) for _ in range(copies_beyond_l2(code_bytes))]
        weights = [(w.clone(),) for _ in range(copies_beyond_l2(w.numel() * 2))]
        print(f"\n{args.preset} {name} ({n} × {k}): int4 {code_bytes / 1e6:.1f} MB, bf16 {w.numel() * 2 / 1e6:.1f} MB")
        print(f"{'B':>4} " + " ".join(f"{label:>22}" for label in ["bf16 cuBLAS", "int4 dequantize+cuBLAS",
                                                                    *tiles]))
        for b in args.batch:
            x = torch.randn(b, k, generator=gen).to("cuda", torch.bfloat16)
            ref = F.linear(x.double(), qg.dequantize_int4(q, s, k, torch.float64))

            def check(out: torch.Tensor, ref: torch.Tensor = ref) -> None:
                err = float((out.double() - ref).norm() / ref.norm())
                if not err <= TOL:
                    raise SystemExit(f"{name} B={b}: relative error {err:.2e} > {TOL}")

            row = {"bf16 cuBLAS": (_timed(lambda x, w: F.linear(x, w), weights, x, lambda out: None),
                                   w.numel() * 2),
                   "int4 dequantize+cuBLAS": (_timed(lambda x, q, s: F.linear(x, qg.dequantized_weight(
                       q, s, k, torch.bfloat16)), codes, x, check), code_bytes)}
            for label, (tile, form) in tiles.items():
                if form == "fma" and b > qr.FMA_MAX_ROWS:
                    row[label] = (float("nan"), code_bytes)
                    continue
                row[label] = (_timed(lambda x, q, s, tile=tile, form=form: qr.int4_rows(x, q, s, tile=tile,
                                                                                        form=form),
                                     codes, x, check), code_bytes)
            best_fma = min((row[label][0] for label in tiles if label.startswith("fma")), default=float("nan"))
            totals[b, "fma best per shape"] = totals.get((b, "fma best per shape"), 0.0) + best_fma
            for label, (us, _) in row.items():
                totals[b, label] = totals.get((b, label), 0.0) + us
            print(f"{b:>4} " + " ".join(f"{us:>13.1f} ({100 * nbytes / (us * 1e-6) / copy_bw:4.1f} %)"
                                        for us, nbytes in row.values()))
    print(f"\n{args.preset}: a layer's four products, µs")
    labels = ["bf16 cuBLAS", "int4 dequantize+cuBLAS", *tiles, "fma best per shape"]
    print(f"{'B':>4} " + " ".join(f"{label:>22}" for label in labels))
    for b in args.batch:
        print(f"{b:>4} " + " ".join(f"{totals[b, label]:>22.1f}" for label in labels))
    largest = 1
    for b in sorted(args.batch):
        if totals[b, "rows tile_for"] >= totals[b, "int4 dequantize+cuBLAS"]:
            break
        largest = b
    print(f"QUANT_ROWS_MAX_BATCH: {largest} (the largest B timed up to which the rows kernel at tile_for's tiles is "
          "faster than dequantize+cuBLAS at every B timed)")
    for b in args.batch:  # the candidate against what runs (nan: more rows than the fma form takes)
        fma, dot, bf16 = totals[b, "fma best per shape"], totals[b, "rows tile_for"], totals[b, "bf16 cuBLAS"]
        print(f"B={b}: the fma form at its best tile per shape {fma:.1f} µs against the dot form {dot:.1f} "
              f"({dot / fma:.2f}×) and bf16 cuBLAS {bf16:.1f} ({bf16 / fma:.2f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
