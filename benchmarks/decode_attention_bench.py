"""The decode step's fused attention (engine/kernels/triton/decode_attention.py: RoPE, the cache write and
flash-decoding from the qkv row) over a sweep of split-kernel tiles, per preset, at one decode position.

    python benchmarks/decode_attention_bench.py --preset 1B,7B [--pos 575] [--max-seq 640] [--top 6]   (CUDA only)
    python benchmarks/decode_attention_bench.py --long --preset 1B,7B --batch 1,8 --context 8320,32896

--long sweeps the rest of the tile at the split count the rule picks (SPLIT 0, engine.kernels.choice.attention_splits)
for a batch of sequences at the last position of long caches: BLOCK_S × num_warps, then the best tile at half and
twice the rule's split count. % = of the copy bandwidth measured in the same call.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.cli.args import positive_ints  # noqa: E402

# (SPLIT positions per program, BLOCK_S positions per inner step, num_warps): 39 tiles, ~1 minute per preset on an
# H100 (a sweep twice as wide, with 16-position splits and 1 warp, would not fit one 10-minute call for the 7B)
TILES = [(s, b, w) for s, b, w in itertools.product((32, 64, 128, 256), (16, 32, 64, 128), (2, 4, 8)) if b <= s]
# One split over the whole cache (SPLIT ≥ the cache's length): one program per kv head writes the output itself,
# no combine kernel (decode_attention._attend); long inner steps and many warps keep its loads in flight.
WHOLE = [(1024, b, w) for b, w in itertools.product((64, 128, 256, 512), (4, 8, 16))]
# --long: (0 = the rule's split count, BLOCK_S, num_warps)
# (one warp, and 128 positions on 2 warps, are left out: a sweep with them finished no 7B cell in 200 s on the H200)
LONG = [(0, b, w) for b, w in itertools.product((16, 32, 64, 128), (2, 4, 8)) if b * w <= 512 and (b, w) != (128, 2)]

def bench_long(name: str, batch: int, context: int, copy_bw: float, top: int) -> None:
    """The LONG tiles for `batch` sequences at the last position of a `context`-long cache, checked against the
    default tile, timed; then the best at half and twice the rule's split count."""
    from engine.kernels.triton import decode_attention as da
    from engine.measure.timing import copies_beyond_l2, time_in_graph
    from engine.workloads.llama import preset, rope_tables

    c = preset(name)
    d = c.dim // c.heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(batch, 1, (c.heads + 2 * c.kv_heads) * d, device="cuda", generator=gen).bfloat16()
    cos, sin = (t.to("cuda", torch.bfloat16) for t in rope_tables(c, context))
    shape = (batch, c.kv_heads, context, d)
    kv_bytes = 2 * 2 * batch * c.kv_heads * context * d
    caches = [(torch.randn(shape, device="cuda", generator=gen).bfloat16(),
               torch.randn(shape, device="cuda", generator=gen).bfloat16()) for _ in range(copies_beyond_l2(kv_bytes))]
    input_pos = torch.tensor([context - 1], device="cuda")
    ref = da.decode_attention_qkv_fwd(qkv, cos, sin, *[t.clone() for t in caches[0]], input_pos).double()

    def run(tile, splits=None):  # type: ignore[no-untyped-def]
        k, v = (t.clone() for t in caches[0])
        out = da.decode_attention_qkv_fwd(qkv, cos, sin, k, v, input_pos, tile=tile, splits=splits).double()
        err = float((out - ref).norm() / ref.norm())
        if err > 1e-2:
            raise ValueError(f"off by {err:.2e}")
        calls = [lambda k=k, v=v: da.decode_attention_qkv_fwd(qkv, cos, sin, k, v, input_pos, tile=tile,
                                                              splits=splits) for k, v in caches]
        return time_in_graph(calls, replays=10).stats.median

    rep = c.heads // c.kv_heads
    default = da.split_plan(batch, c.kv_heads, rep, context, torch.bfloat16, "cuda")
    times: dict[tuple, float] = {}
    for tile in [None] + LONG:
        try:
            times[tile or "default"] = run(tile)
        except Exception as err:  # noqa: BLE001 - a tile that does not compile or check here is skipped, with why
            print(f"  {name} B={batch} tile {tile}: {type(err).__name__}: {str(err)[:80]}", file=sys.stderr)
    if not times:
        return
    pct = lambda us: 100 * kv_bytes / (us * 1e-6) / copy_bw  # noqa: E731
    ranked = sorted(times, key=times.get)
    label = lambda t: t if isinstance(t, str) else "x".join(map(str, t[1:]))  # noqa: E731
    print(f"{name} B={batch} P={context}: {kv_bytes / 1e6:.0f} MB of cache, rule {default[1]} splits; default "
          f"{times.get('default', float('nan')):.1f} µs ({pct(times.get('default', float('inf'))):.1f} %)")
    print("   best (BLOCK_S x warps): " + "  ".join(
        f"{label(t)} {times[t]:.1f} ({pct(times[t]):.0f} %)" for t in ranked[:top]))
    best = next((t for t in ranked if t != "default"), None)
    if best is not None:
        row = []
        for factor in (0.5, 2):
            splits = max(1, int(default[1] * factor))
            try:
                row.append(f"{splits} splits {run(best, splits):.1f}")
            except Exception as err:  # noqa: BLE001
                row.append(f"{splits} splits: {type(err).__name__}")
        print(f"   {label(best)} at other split counts: " + ", ".join(row))


def bench_preset(name: str, pos: int, max_seq: int) -> tuple[dict, int, tuple]:
    from engine.kernels.triton import decode_attention as da
    from engine.measure.timing import time_in_graph
    from engine.workloads.llama import preset, rope_tables

    c = preset(name)
    d = c.dim // c.heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(1, 1, (c.heads + 2 * c.kv_heads) * d, device="cuda", generator=gen).bfloat16()
    cos, sin = (t.to("cuda", torch.bfloat16) for t in rope_tables(c, max_seq))
    cache_bytes = 2 * c.kv_heads * max_seq * d * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, min(32, int(3 * l2 // cache_bytes) + 1))
    caches = [(torch.randn(1, c.kv_heads, max_seq, d, device="cuda", generator=gen).bfloat16(),
               torch.randn(1, c.kv_heads, max_seq, d, device="cuda", generator=gen).bfloat16()) for _ in range(copies)]
    input_pos = torch.tensor([pos], device="cuda")
    ref = da.decode_attention_qkv_fwd(qkv, cos, sin, *caches[0], input_pos).double()
    times: dict[tuple, float] = {}
    for tile in TILES + [t for t in WHOLE if t[0] >= max_seq]:
        try:
            out = da.decode_attention_qkv_fwd(qkv, cos, sin, *caches[0], input_pos, tile=tile).double()
        except Exception as err:  # noqa: BLE001 - a tile that does not compile here is skipped with its reason
            print(f"  {name} tile {tile}: {type(err).__name__}: {str(err)[:80]}", file=sys.stderr)
            continue
        err = float((out - ref).norm() / ref.norm())
        if err > 1e-2:
            print(f"  {name} tile {tile}: off by {err:.2e}, not timed", file=sys.stderr)
            continue
        calls = [lambda k=k, v=v, tile=tile: da.decode_attention_qkv_fwd(qkv, cos, sin, k, v, input_pos, tile=tile)
                 for k, v in caches]
        times[tile] = time_in_graph(calls, replays=10).stats.median
    read = 2 * c.kv_heads * (pos + 1) * d * 2
    default = da.TILE_DOT if c.heads > c.kv_heads else da.TILE_ROWS
    return times, read, default


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1B,7B")
    parser.add_argument("--pos", type=int, default=575, help="the decode position (P=512, N=128: mid-decode)")
    parser.add_argument("--max-seq", type=int, default=640, help="the static cache's length (P + N)")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--long", action="store_true", help="sweep the LONG tiles per --batch × --context instead")
    parser.add_argument("--batch", type=positive_ints, default=[1, 8])
    parser.add_argument("--context", type=positive_ints, default=[8320])
    args = parser.parse_args()
    if not 0 <= args.pos < args.max_seq:
        parser.error(f"--pos must be in [0, --max-seq), got {args.pos} with --max-seq {args.max_seq}")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    if args.long:
        from engine.measure.ceilings import measure

        copy_bw = measure("cuda")["copy_bw"]
        print(f"copy bandwidth (this call): {copy_bw / 1e12:.2f} TB/s")
        for name in args.preset.split(","):
            for batch in args.batch:
                for context in args.context:
                    bench_long(name, batch, context, copy_bw, args.top)
        return 0
    print(f"{'preset':<7}{'KV MB':>7}{'default tile':>14}{'µs':>7}{'GB/s':>6}{'best tile':>12}{'µs':>7}{'GB/s':>6}")
    for name in args.preset.split(","):
        times, read, default = bench_preset(name, args.pos, args.max_seq)
        if not times:
            continue
        ranked = sorted(times, key=times.get)
        best, d_us = ranked[0], times.get(default, float("nan"))
        print(f"{name:<7}{read / 1e6:>7.1f}{'x'.join(map(str, default)):>14}{d_us:>7.2f}{read / d_us / 1e3:>6.0f}"
              f"{'x'.join(map(str, best)):>12}{times[best]:>7.2f}{read / times[best] / 1e3:>6.0f}")
        print("       " + "  ".join(f"{'x'.join(map(str, t))} {times[t]:.2f}" for t in ranked[:args.top]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
