"""The quantized modes' prefill products: the weight dequantized, then one GEMM over the prompt's rows. Per weight
shape of a preset and scheme: the plain way's torch dequantization against the one-kernel Triton dequantization
(engine/kernels/triton/quant_gemv.py: dequantize_channel_fused for int8 / fp8, dequantize_int4_fused for int4) over
a sweep of tiles, and the GEMM after it (cuBLAS, bf16 weight, P rows).

    python benchmarks/prefill_dequant_bench.py [--preset 1B,7B] [--schemes int8-wo,fp8-wo,int4-wo] [--rows 512]
        [--top N]
    python benchmarks/prefill_dequant_bench.py --smoke     (CPU, TRITON_INTERPRET=1: the checks only, tiny shapes)

Every tile's weight is first checked equal, bit for bit, to the plain way's (torch.equal; the interpreter's bf16
rounds toward zero, so --smoke compares in fp32); a tile that differs is not timed. Then each is timed as the
decode benchmarks time (engine.measure.timing.time_in_graph): calls on rotating copies of the codes, 3× the L2 in all,
back
to back in one CUDA graph. GB/s = the bytes the dequantization must move (codes and scales read, the bf16 weight
written) / median time. The last table sums each tile over the preset's shapes: the best tile per scheme against
the one the module launches (TILE_DEQUANT_CHANNEL, TILE_DEQUANT), and the prefill's products with each way.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# int8 / fp8: (BLOCK_N, BLOCK_K, warps); int4: (BLOCK_N, groups of 64, warps)
CHANNEL_TILES = [(8, 256, 4), (16, 256, 4), (32, 256, 4), (16, 512, 4), (32, 512, 8), (64, 256, 8), (4, 1024, 4),
                 (8, 1024, 8), (16, 128, 4), (64, 128, 4)]
INT4_TILES = [(16, 8, 4), (32, 8, 4), (16, 16, 4), (32, 16, 8), (8, 32, 4), (64, 4, 4), (64, 8, 8), (8, 8, 4),
              (32, 4, 4), (128, 2, 8)]
SMOKE_SHAPES = [("qkv", 40, 130), ("down", 24, 200)]  # ragged: N and K off every tile, K off the int4 groups


def shapes(name: str) -> list[tuple[str, int, int]]:
    from engine.workloads.llama import preset

    c = preset(name)
    hd = c.dim // c.heads
    return [("qkv", (c.heads + 2 * c.kv_heads) * hd, c.dim), ("o", c.dim, c.heads * hd),
            ("gate_up", 2 * c.ffn, c.dim), ("down", c.dim, c.ffn), ("lm_head", c.vocab, c.dim)]


def dequantizers(scheme: str, k: int, dtype: torch.dtype, smoke: bool) -> dict:
    """{"plain": the plain way's torch form, tile: the one-kernel form at that tile} as fn(q, scales) -> W."""
    from engine.kernels.triton import quant_gemv as qg

    if scheme == "int4-wo":
        ways = {tile: (lambda q, s, t=tile: qg.dequantize_int4_fused(q, s, k, dtype, tile=t)) for tile in
                ([qg.INTERPRETER_TILE_DEQUANT] if smoke else INT4_TILES)}
        return {"plain": lambda q, s: qg.dequantize_int4(q, s, k, dtype), **ways}
    ways = {tile: (lambda q, s, t=tile: qg.dequantize_channel_fused(q, s, dtype, tile=t)) for tile in
            ([qg.INTERPRETER_TILE_DEQUANT_CHANNEL] if smoke else CHANNEL_TILES)}
    return {"plain": lambda q, s: qg.dequantize_channel(q, s, dtype), **ways}


def bench_shape(scheme: str, n: int, k: int, rows: int, smoke: bool) -> dict:
    """{"bytes": the one-kernel dequantization's bytes, "times": {way: µs}, "gemm_us": the product after it}; a way
    whose weight is not the plain way's, bit for bit, is reported and left out."""
    from engine.llm.quant import quantize

    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16  # the interpreter rounds bf16 toward zero (see the tests)
    gen = torch.Generator(device=device).manual_seed(n + k)
    w = (torch.randn(n, k, device=device, generator=gen) / k ** 0.5).to(dtype)
    qw = quantize(w, scheme)
    q, s = qw.q.to(device).contiguous(), qw.scales.to(device).contiguous()
    ways = dequantizers(scheme, k, dtype, smoke)
    want = ways["plain"](q, s)
    code_bytes = q.numel() * q.element_size() + s.numel() * s.element_size()
    result = {"bytes": code_bytes + n * k * want.element_size(), "times": {}, "gemm_us": float("nan")}
    checked, result["failed"] = {}, []
    for way, fn in ways.items():
        try:
            got = fn(q, s)
        except Exception as err:  # noqa: BLE001 - a tile that does not compile here is skipped with its reason
            print(f"  {scheme} {n}x{k} {way}: {type(err).__name__}: {str(err)[:80]}", file=sys.stderr)
            result["failed"].append(way)
            continue
        if not torch.equal(got, want):
            print(f"  {scheme} {n}x{k} {way}: not the plain weight, not timed", file=sys.stderr)
            result["failed"].append(way)
            continue
        checked[way] = fn
    if smoke:
        result["times"] = {way: float("nan") for way in checked}
        return result
    from engine.measure.timing import time_in_graph

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, min(16, int(3 * l2 // code_bytes) + 1))
    sets = [(q.clone(), s.clone()) for _ in range(copies)]
    for way, fn in checked.items():
        calls = [lambda qq=qq, ss=ss, fn=fn: fn(qq, ss) for qq, ss in sets]
        result["times"][way] = time_in_graph(calls, replays=10).stats.median
    x = torch.randn(rows, k, device=device, generator=gen).to(dtype)
    weights = [want.clone() for _ in range(max(2, min(8, int(3 * l2 // (n * k * 2)) + 1)))]
    result["gemm_us"] = time_in_graph([lambda ww=ww: F.linear(x, ww) for ww in weights], replays=10).stats.median
    return result


def smoke(schemes: list[str]) -> int:
    """Each scheme's one-kernel dequantization at its interpreter tile against the plain way, on ragged shapes;
    1 if any differs."""
    bad = 0
    for scheme in schemes:
        for what, n, k in SMOKE_SHAPES:
            r = bench_shape(scheme, n, k, 1, smoke=True)
            bad += len(r["failed"])
            print(f"{scheme:<8} {what:<5} {n}x{k}: " + ("equal to the plain weight bit for bit" if not r["failed"]
                                                         else f"{', '.join(map(_name, r['failed']))} differ"))
    return 1 if bad else 0


def _name(way: object) -> str:
    return way if isinstance(way, str) else "x".join(map(str, way))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1B,7B")
    parser.add_argument("--schemes", default="int8-wo,fp8-wo,int4-wo")
    parser.add_argument("--rows", type=int, default=512, help="the prompt's rows the GEMM multiplies (default 512)")
    parser.add_argument("--top", type=int, default=0, help="also list each shape's N fastest ways with their µs")
    parser.add_argument("--smoke", action="store_true", help="CPU, interpreted: each way's check on tiny shapes")
    args = parser.parse_args(argv)
    schemes = args.schemes.split(",")
    if unknown := [s for s in schemes if s not in ("int8-wo", "fp8-wo", "int4-wo")]:
        parser.error(f"unknown --schemes {unknown}: choose from int8-wo,fp8-wo,int4-wo")
    if args.rows < 1 or args.top < 0:
        parser.error("--rows must be >= 1 and --top >= 0")
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--smoke runs the kernels interpreted: set TRITON_INTERPRET=1")
    if not args.smoke and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    from engine.kernels.triton import quant_gemv as qg

    if args.smoke:
        return smoke(schemes)
    totals: dict[tuple[str, str], dict] = {}
    print(f"{'preset':<7}{'shape':<9}{'N':>7}{'K':>7}{'scheme':>9}{'MB':>8}{'plain µs':>10}{'best tile':>12}"
          f"{'µs':>8}{'GB/s':>7}{'default µs':>11}{'GEMM µs':>9}")
    for name in args.preset.split(","):
        for scheme in schemes:
            total = totals.setdefault((name, scheme), {})
            for what, n, k in shapes(name):
                r = bench_shape(scheme, n, k, args.rows, args.smoke)
                tiles = {w: t for w, t in r["times"].items() if w != "plain"}
                if not tiles:
                    print(f"{name:<7}{what:<9}{n:>7}{k:>7}{scheme:>9}  no tile passed its check")
                    continue
                best = min(tiles, key=tiles.get)
                default = qg.TILE_DEQUANT if scheme == "int4-wo" else qg.TILE_DEQUANT_CHANNEL
                for way, us in r["times"].items():
                    total[way] = total.get(way, 0.0) + us
                total["gemm"] = total.get("gemm", 0.0) + r["gemm_us"]
                t = tiles[best]
                print(f"{name:<7}{what:<9}{n:>7}{k:>7}{scheme:>9}{r['bytes'] / 1e6:>8.1f}"
                      f"{r['times'].get('plain', float('nan')):>10.1f}{_name(best):>12}{t:>8.1f}"
                      f"{r['bytes'] / t / 1e3:>7.0f}{tiles.get(default, float('nan')):>11.1f}{r['gemm_us']:>9.1f}")
                if args.top:
                    print("      " + "  ".join(f"{_name(w)} {tiles[w]:.1f}" for w in sorted(tiles, key=tiles.get)
                                               [:args.top]))
    print(f"\nper preset and scheme, summed over its shapes (µs; tile = BLOCK_N x BLOCK_K x warps, int4: BLOCK_N x "
          f"groups of 64 x warps; prefill products = dequantization + GEMM over {args.rows} rows):")
    print(f"{'preset':<7}{'scheme':>9}{'plain':>9}{'best tile':>12}{'µs':>8}{'default':>9}{'GEMM':>8}"
          f"{'products, plain':>17}{'products, default':>19}")
    for (name, scheme), total in totals.items():
        tiles = {w: t for w, t in total.items() if w not in ("plain", "gemm")}
        if not tiles:
            continue
        best = min(tiles, key=tiles.get)
        default = tiles.get(qg.TILE_DEQUANT if scheme == "int4-wo" else qg.TILE_DEQUANT_CHANNEL, float("nan"))
        plain, gemm = total.get("plain", float("nan")), total.get("gemm", float("nan"))
        print(f"{name:<7}{scheme:>9}{plain:>9.1f}{_name(best):>12}{tiles[best]:>8.1f}{default:>9.1f}{gemm:>8.1f}"
              f"{plain + gemm:>17.1f}{default + gemm:>19.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
