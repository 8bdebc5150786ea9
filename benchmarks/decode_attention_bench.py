"""The decode step's fused attention (engine/kernels/triton/decode_attention.py: RoPE, the cache write and
flash-decoding from the qkv row) over a sweep of split-kernel tiles, per preset, at one decode position.

    python benchmarks/decode_attention_bench.py --preset 1B,7B [--pos 575] [--max-seq 640] [--top 6]   (CUDA only)

Each tile's output is checked against the module's default tile first (itself checked against float64 in
tests/engine/kernels/test_decode_attention.py; relative L2 ≤ 1e-2, bf16), then timed as the decode step runs it: calls
on rotating copies of the KV cache (more bytes in all than L2 holds) captured back to back in one CUDA graph
(engine.measure.timing.time_in_graph). GB/s = the cache bytes the call must read (K and V up to pos) / median time.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

# (SPLIT positions per program, BLOCK_S positions per inner step, num_warps): 39 tiles, ~1 minute per preset on an
# H100 (a sweep twice as wide, with 16-position splits and 1 warp, would not fit one 10-minute call for the 7B)
TILES = [(s, b, w) for s, b, w in itertools.product((32, 64, 128, 256), (16, 32, 64, 128), (2, 4, 8)) if b <= s]
# One split over the whole cache (SPLIT ≥ the cache's length): one program per kv head writes the output itself,
# no combine kernel (decode_attention._attend); long inner steps and many warps keep its loads in flight.
WHOLE = [(1024, b, w) for b, w in itertools.product((64, 128, 256, 512), (4, 8, 16))]


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
    args = parser.parse_args()
    if not 0 <= args.pos < args.max_seq:
        parser.error(f"--pos must be in [0, --max-seq), got {args.pos} with --max-seq {args.max_seq}")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
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
