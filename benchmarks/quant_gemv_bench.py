"""Weight-only quantized GEMVs at B=1: the project's Triton kernels (engine/kernels/triton/quant_gemv.py) over a sweep
of tiles, beside cuBLAS on the bf16 weight, per weight shape of a preset.

    python benchmarks/quant_gemv_bench.py --preset 1B,7B [--schemes int8-wo,fp8-wo,int4-wo] [--top N] [--fused]
        [--shapes qkv,o,gate_up,down,lm_head]
    (CUDA only)

Each (shape, scheme): the weight quantized as the LLM modes do (engine.llm.quant.quantize), every tile's output
checked against float64 dequantize-then-matmul first (relative L2 ≤ 8e-3, bf16 outputs), then timed as a decode
step runs it: calls on rotating copies of the codes (3× the L2 in all, so they stream from HBM) captured back to
back in one CUDA graph (engine.measure.timing.time_in_graph). GB/s = the bytes the call must move (codes + scales + x
+ y)
/ median time. --fused launches each GEMV with what the decode step fuses into it (DECODE_FUSION), its reference
formed the same way in float64. The last table gives, per scheme, the tile with the best total time over the
preset's shapes and the total of the tiles the module launches (quant_gemv.channel_tile for int8 and fp8, by fusion
and size; int4: the tensor-core kernel (engine/kernels/cuda_quant.py, "cuda x warps along K x groups per bulk copy")
where it builds, at its untuned block — the decode step runs the block cuda_quant.tune keeps while it prepares —
else int4_tile).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# int8 / fp8: (BLOCK_N, BLOCK_K, warps, stages); int4: (BLOCK_N, GROUPS of 64 per tile, warps, stages)
TILES = [(bn, bk, w, st) for bn, bk, w, st in itertools.product((2, 4, 8, 16, 32, 64), (256, 512, 1024, 2048, 4096),
                                                                (4, 8), (1,))
         if bn * bk <= 16384]
INT4_TILES = [(bn, g, w, 1) for bn, g, w in ((16, 16, 4), (32, 8, 4), (32, 16, 4), (8, 32, 4), (16, 32, 4), (64, 8, 4),
                                             (32, 8, 8), (16, 16, 8), (64, 4, 4), (16, 8, 4), (8, 16, 4), (32, 32, 8),
                                             (64, 8, 8), (32, 4, 4), (64, 16, 8), (128, 4, 8))]


# What the triton-*-wo decode step fuses into each GEMV (engine.kernels.triton.gemv.FusedDecodeOps: norm_linear,
# norm_swiglu, linear_add): the RMSNorm into qkv, gate_up and lm_head, SwiGLU into gate_up's epilogue ("glu": its
# rows paired gate j, up j, half as many outputs), the residual into o and down.
DECODE_FUSION = {"qkv": "norm", "o": "add", "gate_up": "glu", "down": "add", "lm_head": "norm"}
EPS = 1e-5


def shapes(name: str) -> list[tuple[str, int, int]]:
    from engine.workloads.llama import preset

    c = preset(name)
    hd = c.dim // c.heads
    return [("qkv", (c.heads + 2 * c.kv_heads) * hd, c.dim), ("o", c.dim, c.heads * hd),
            ("gate_up", 2 * c.ffn, c.dim), ("down", c.dim, c.ffn), ("lm_head", c.vocab, c.dim)]


def launcher(scheme: str, tile: tuple[int, int, int, int], fusion: str = "", g: torch.Tensor | None = None,
             r: torch.Tensor | None = None):
    """A call of the scheme's kernel with this tile (the module's own launch, tile forced), with `fusion` ("norm":
    x RMS-normalised with weight g; "glu": the same, and silu(gate) · up of the row pairs stored; "add": r added)
    as the decode step fuses."""
    import triton

    from engine.kernels.triton import quant_gemv as qg
    from engine.kernels.triton._common import pdl_enabled

    if tile[0] == "cuda":  # the tensor-core int4 kernel (engine/kernels/cuda_quant.py): tile[1] warps along K,
        # tile[2] groups of 64 per bulk copy (the block cuda_quant.tune chooses among while the mode prepares)
        from engine.kernels import cuda_quant

        tiled: dict[int, cuda_quant.TileWeight] = {}  # the weight in the kernel's tile order, made once (not timed)

        def tensor_cores(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if q.data_ptr() not in tiled:
                tiled[q.data_ptr()] = cuda_quant.tile_major(q, s, x.numel(), glu=fusion == "glu")
            return cuda_quant.int4_gemv(x, tiled[q.data_ptr()], g if fusion in ("norm", "glu") else None, EPS,
                                        r if fusion == "add" else None, ks=tile[1], batch=tile[2])
        return tensor_cores
    bn, bk, warps, stages = tile
    flags = {"NORM": fusion in ("norm", "glu"), "ADD": fusion == "add", "GLU": fusion == "glu"}
    # as the decode step launches them: programmatic dependent launch on sm_90+ (the weight tile loaded before the
    # wait overlaps the kernel before it; here, the previous call in the graph)
    pdl = pdl_enabled(torch.device("cuda"))
    flags.update(PDL=pdl, launch_pdl=pdl)

    def words(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        w = q.view(torch.uint8).view(torch.int32)  # int8 or fp8 codes; the LLM shapes have K % 4 == 0
        qg._wo_word_kernel[(triton.cdiv(q.shape[0], bn),)](
            x, w, s, y, x if g is None else g, x if r is None else r, q.shape[0], q.shape[1], w.stride(0),
            EPS, BLOCK_N=bn, BLOCK_K=bk, **flags, ASM=True, FP8=scheme == "fp8-wo", num_warps=warps,
            num_stages=stages)
        return y

    def int4(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        words = q.view(torch.int32)  # bk is GROUPS here
        qg._wo_int4_kernel[(triton.cdiv(q.shape[0], bn),)](
            x, words, s, y, x if g is None else g, x if r is None else r, q.shape[0], x.numel(), words.stride(0),
            s.stride(0), EPS, BLOCK_N=bn, GROUPS=bk, **flags, ASM=True, num_warps=warps, num_stages=stages)
        return y

    return int4 if scheme == "int4-wo" else words


def int4_tiles() -> list[tuple]:
    """The Triton int4 tiles, then the tensor-core kernel at each of its blocks where it builds here
    (("cuda", warps along K, groups per bulk copy, 0))."""
    from engine.kernels import cuda_quant

    reason = cuda_quant.available()
    if reason:
        print(f"  tensor-core int4 GEMV not timed: {reason}", file=sys.stderr)
        return INT4_TILES
    return INT4_TILES + [("cuda", ks, batch, 0) for ks in cuda_quant.KSLICES for batch in cuda_quant.RING_BATCHES]


def bench_shape(scheme: str, n: int, k: int, fusion: str = "") -> dict:
    from engine.kernels.triton.quant_gemv import _reference_channel, _reference_int4
    from engine.llm.quant import quantize
    from engine.measure.timing import time_in_graph

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(k, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).bfloat16()
    g = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).bfloat16() if fusion in ("norm", "glu") else None
    r = torch.randn(n, device="cuda", generator=gen).bfloat16() if fusion == "add" else None
    n_out = n // 2 if fusion == "glu" else n
    qw = quantize(w, scheme)
    q, s = qw.q.contiguous(), qw.scales.contiguous()
    x_in = x.double()  # the GEMV's input as the decode step forms it, in float64
    if fusion in ("norm", "glu"):
        x_in = x_in * torch.rsqrt(x_in.pow(2).mean() + EPS) * g.double()
    ref = (_reference_int4 if scheme == "int4-wo" else _reference_channel)(x_in[None], q, s)[0]
    if r is not None:
        ref = ref + r.double()
    if fusion == "glu":
        ref = F.silu(ref[:n_out]) * ref[n_out:]
    nbytes = q.numel() * q.element_size() + s.numel() * s.element_size() + 2 * (x.numel() + n_out)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, min(32, int(3 * l2 // (q.numel() * q.element_size())) + 1))
    sets = [(q.clone(), s.clone()) for _ in range(copies)]
    y = torch.empty(n_out, device="cuda", dtype=torch.bfloat16)
    times = {}
    for tile in int4_tiles() if scheme == "int4-wo" else TILES:
        fn = launcher(scheme, tile, fusion, g, r)
        try:
            out = fn(x, q, s, y).double()
        except Exception as err:  # noqa: BLE001 - a tile that does not compile here is skipped with its reason
            print(f"  {scheme} {n}x{k} tile {tile}: {type(err).__name__}: {str(err)[:80]}", file=sys.stderr)
            continue
        err = float((out - ref).norm() / ref.norm())
        if err > 8e-3:  # outputs are bf16 (2^-9 relative rounding); gemv_bench.py uses the same bound
            print(f"  {scheme} {n}x{k} tile {tile}: off by {err:.2e}, not timed", file=sys.stderr)
            continue
        calls = [lambda qq=qq, ss=ss, fn=fn: fn(x, qq, ss, y) for qq, ss in sets]
        times[tile] = time_in_graph(calls, replays=10).stats.median
    wb = [w.clone() for _ in range(max(2, min(32, int(3 * l2 // (w.numel() * 2)) + 1)))]
    x_bf16 = x_in.to(torch.bfloat16)[None]  # cuBLAS multiplies the GEMV's input (fusions formed beforehand, untimed)
    cublas = time_in_graph([lambda ww=ww: F.linear(x_bf16, ww) for ww in wb], replays=10).stats.median
    return {"bytes": nbytes, "times": times, "cublas_bf16_us": cublas, "bf16_bytes": 2 * (n * k + k + n)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1B,7B")
    parser.add_argument("--schemes", default="int8-wo,fp8-wo,int4-wo")
    parser.add_argument("--shapes", default=",".join(DECODE_FUSION),
                        help=f"which of each preset's weights to time (default all: {','.join(DECODE_FUSION)})")
    parser.add_argument("--top", type=int, default=0, help="also list each shape's N fastest tiles with their µs")
    parser.add_argument("--fused", action="store_true",
                        help="each GEMV with what the decode step fuses into it (RMSNorm into qkv, gate_up, lm_head; "
                             "SwiGLU into gate_up's epilogue; the residual into o and down), as triton-*-wo runs it")
    args = parser.parse_args()
    if args.top < 0:
        parser.error(f"--top must be >= 0, got {args.top}")
    wanted = args.shapes.split(",")
    if unknown := [w for w in wanted if w not in DECODE_FUSION]:
        parser.error(f"unknown --shapes {unknown}: choose from {','.join(DECODE_FUSION)}")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    from engine.kernels import cuda_quant
    from engine.kernels.triton.quant_gemv import channel_tile, int4_tile

    totals: dict[tuple[str, str], dict] = {}
    launched: dict[tuple[str, str], float] = {}  # the tiles the module launches, summed over the shapes
    print(f"{'preset':<6}{'shape':<9}{'N':>7}{'K':>7}{'scheme':>9}{'MB':>8}{'best tile':>16}{'µs':>8}{'GB/s':>7}"
          f"{'default µs':>11}{'bf16 cuBLAS µs':>15}{'GB/s':>7}")
    for name in args.preset.split(","):
        for scheme in args.schemes.split(","):
            total = totals.setdefault((name, scheme), {})
            for what, n, k in shapes(name):
                if what not in wanted:
                    continue
                fusion = DECODE_FUSION[what] if args.fused else ""
                r = bench_shape(scheme, n, k, fusion)
                if not r["times"]:
                    continue
                best = min(r["times"], key=r["times"].get)
                norm, add = fusion in ("norm", "glu"), fusion == "add"  # glu launches at the norm's tile
                if scheme == "int4-wo" and cuda_quant.wanted() and cuda_quant.takes(k):
                    # the untuned block (the step launches the one cuda_quant.tune keeps while the mode prepares)
                    default = ("cuda", cuda_quant.kslices(k), 4, 0)
                else:
                    default = (*(int4_tile(n, norm, add, k=k) if scheme == "int4-wo"
                                 else channel_tile(n, norm, add, k=k, fp8=scheme == "fp8-wo")), 1)
                launched[(name, scheme)] = launched.get((name, scheme), 0.0) + r["times"].get(default, float("nan"))
                for tile, us in r["times"].items():
                    total[tile] = total.get(tile, 0.0) + us
                t = r["times"][best]
                print(f"{name:<6}{what:<9}{n:>7}{k:>7}{scheme:>9}{r['bytes'] / 1e6:>8.1f}"
                      f"{'x'.join(map(str, best)):>16}{t:>8.1f}{r['bytes'] / t / 1e3:>7.0f}"
                      f"{r['times'].get(default, float('nan')):>11.1f}{r['cublas_bf16_us']:>15.1f}"
                      f"{r['bf16_bytes'] / r['cublas_bf16_us'] / 1e3:>7.0f}")
                if args.top:
                    fastest = sorted(r["times"], key=r["times"].get)[:args.top]
                    print("      " + "  ".join(f"{'x'.join(map(str, t))} {r['times'][t]:.1f}" for t in fastest))
    print("\nper preset and scheme, summed over its shapes (tile = BLOCK_N x BLOCK_K x warps x stages; int4: BLOCK_N x "
          "groups of 64 x warps x stages):")
    print(f"{'preset':<6}{'scheme':>9}{'best tile':>16}{'µs':>9}{'default µs':>11}")
    for (name, scheme), total in totals.items():
        if total:
            ranked = sorted(total, key=total.get)
            runners_up = "  ".join(f"{'x'.join(map(str, t))} {total[t]:.1f}" for t in ranked[1:5])
            print(f"{name:<6}{scheme:>9}{'x'.join(map(str, ranked[0])):>16}{total[ranked[0]]:>9.1f}"
                  f"{launched[(name, scheme)]:>11.1f}   next: {runners_up}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
