"""Both sides of engine/kernels/choice.py's thresholds, timed per (B, P) on a GPU: the decode step's products as the
fused Triton GEMVs ("gemv": the triton-fused custom ops) and as plain torch ops compiled by Inductor ("gemm": rms_norm
+ F.linear (cuBLAS) + SwiGLU / the residual add), and the decode attention at every power-of-two split count against
the one attention_splits picks. Prints each table and the crossovers, to set GEMV_MAX_BATCH, PROGRAMS_PER_SM and
MIN_SPLIT_POSITIONS from.

    python benchmarks/decode_envelope.py --preset 7B --batch 1,2,4,8,16,32 --prompt 512,2048,8192   (CUDA only)

Every figure is a median over calls captured back to back in one CUDA graph (engine.measure.timing.time_in_graph),
the weights or the cache in rotating copies larger than L2 together, so they come from HBM as in a decode step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.cli.args import positive_ints  # noqa: E402
from engine.measure.timing import copies_beyond_l2  # noqa: E402


def time_products(cfg, batch: int, choice_name: str) -> float:
    """µs per decoder layer's four products (qkv with its norm, o with the residual, gate_up with the norm and
    SwiGLU, down with the residual) at `batch` rows, the products forced to `choice_name`."""
    from engine.kernels import choice
    from engine.kernels.triton.gemv import FusedDecodeOps as Ops
    from engine.measure.timing import time_in_graph

    d, hd = cfg.dim, cfg.dim // cfg.heads
    lin = lambda n, k: torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    layer = lambda: (lin((cfg.heads + 2 * cfg.kv_heads) * hd, d), lin(d, cfg.heads * hd),  # noqa: E731
                     lin(2 * cfg.ffn, d), lin(d, cfg.ffn))
    nbytes = 2 * d * ((cfg.heads + 2 * cfg.kv_heads) * hd + cfg.heads * hd + 3 * cfg.ffn)  # a layer's bf16 weights
    layers = [layer() for _ in range(copies_beyond_l2(nbytes))]
    g = torch.ones(d, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, 1, d, device="cuda", dtype=torch.bfloat16)

    def step(x, qkv, o, gate_up, down):
        a = Ops.norm_linear(x, g, 1e-5, qkv)[..., :cfg.heads * hd]
        h = Ops.linear_add(a, o, x)
        return Ops.linear_add(Ops.norm_swiglu(h, g, 1e-5, gate_up), down, h)

    was = choice.GEMV_MAX_BATCH
    choice.GEMV_MAX_BATCH = 1 << 30 if choice_name == "gemv" else 0
    try:
        torch._dynamo.reset()
        compiled = torch.compile(step, dynamic=False, fullgraph=True)
        for lay in layers:
            compiled(x, *lay)  # compile and tune outside the capture
        calls = [lambda lay=lay: compiled(x, *lay) for lay in layers]
        return time_in_graph(calls, replays=10).stats.median
    finally:
        choice.GEMV_MAX_BATCH = was


def time_attention(cfg, batch: int, context: int, splits: int | None) -> tuple[float, int]:
    """(µs per call of the fused decode attention at the last position of a `context`-long cache, the split count
    that ran) with `splits` asked for (None: the kernel's own choice)."""
    from engine.kernels.triton import decode_attention as da
    from engine.measure.timing import time_in_graph
    from engine.workloads.llama import rope_tables

    hd = cfg.dim // cfg.heads
    qkv = torch.randn(batch, 1, (cfg.heads + 2 * cfg.kv_heads) * hd, device="cuda", dtype=torch.bfloat16)
    cos, sin = (t.to("cuda", torch.bfloat16) for t in rope_tables(cfg, context))
    shape = (batch, cfg.kv_heads, context, hd)
    caches = [(torch.randn(shape, device="cuda", dtype=torch.bfloat16), torch.randn(shape, device="cuda",
                                                                                     dtype=torch.bfloat16))
              for _ in range(copies_beyond_l2(4 * batch * cfg.kv_heads * context * hd))]
    pos = torch.tensor([context - 1], device="cuda")
    ran = da.split_plan(batch, cfg.kv_heads, cfg.heads // cfg.kv_heads, context, torch.bfloat16, "cuda", splits)[1]
    for k, v in caches:
        da.decode_attention_qkv_fwd(qkv, cos, sin, k, v, pos, splits=splits)
    calls = [lambda k=k, v=v: da.decode_attention_qkv_fwd(qkv, cos, sin, k, v, pos, splits=splits) for k, v in caches]
    return time_in_graph(calls, replays=10).stats.median, ran


@torch.no_grad()  # the weights are nn.Linear parameters; the custom ops have no autograd formula
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="7B")
    parser.add_argument("--batch", type=positive_ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--prompt", type=positive_ints, default=[512, 2048, 8192])
    parser.add_argument("--new-tokens", type=int, default=128, help="the cache holds P + N positions")
    parser.add_argument("--skip", choices=("products", "attention"), nargs="*", default=[],
                        help="leave out a table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("decode_envelope: needs a CUDA device", file=sys.stderr)
        return 2
    from engine.kernels.choice import decode_products
    from engine.measure.ceilings import measure
    from engine.workloads.llama import preset

    cfg = preset(args.preset)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_bw = measure("cuda")["copy_bw"]  # the ceiling every % here divides by, measured in this call
    hd = cfg.dim // cfg.heads
    layer_bytes = 2 * cfg.dim * ((cfg.heads + 2 * cfg.kv_heads) * hd + cfg.heads * hd + 3 * cfg.ffn)
    pct = lambda nbytes, us: 100 * nbytes / (us * 1e-6) / copy_bw  # noqa: E731
    print(f"copy bandwidth (this call): {copy_bw / 1e12:.2f} TB/s")
    if "products" not in args.skip:
        print(f"{args.preset}: products per layer (µs; % of the copy bandwidth on the layer's "
              f"{layer_bytes / 1e6:.1f} MB of weights)\n{'B':>4} {'gemv':>16} {'gemm':>16} {'faster':>7} {'rule':>5}")
        crossover = None
        for b in args.batch:
            gemv_us, gemm_us = time_products(cfg, b, "gemv"), time_products(cfg, b, "gemm")
            faster = "gemv" if gemv_us < gemm_us else "gemm"
            if faster == "gemm" and crossover is None:
                crossover = b
            print(f"{b:>4} {gemv_us:>8.1f} ({pct(layer_bytes, gemv_us):4.1f} %) {gemm_us:>8.1f} "
                  f"({pct(layer_bytes, gemm_us):4.1f} %) {faster:>7} {decode_products(b):>5}")
        print(f"crossover: the GEMM is faster from B={crossover} (GEMV_MAX_BATCH = the largest B below it)\n"
              if crossover else "crossover: the fused GEMV is faster at every B timed\n")
    if "attention" in args.skip:
        return 0
    print(f"{args.preset}: decode attention (µs) per split count asked for; * the fastest ({sms} SMs)")
    for b in args.batch:
        for p in args.prompt:
            context = 16 * -(-(p + args.new_tokens) // 16)
            counts = [1 << i for i in range(0, 12) if (1 << i) <= max(1, context // 16)]
            times = {s: time_attention(cfg, b, context, s) for s in counts}
            times["r"] = time_attention(cfg, b, context, None)  # the kernel's own choice (choice.attention_splits)
            best = min(times, key=lambda s: times[s][0])
            row = " ".join(f"{s}:{t:.1f}{'*' if s == best else ''}" for s, (t, _) in times.items() if s != "r")
            kv_bytes = 2 * 2 * b * cfg.kv_heads * context * hd  # K and V, bf16
            print(f"B={b:<3} P={p:<6} {row}   rule: {times['r'][1]} splits ran, {times['r'][0]:.1f} µs "
                  f"({pct(kv_bytes, times['r'][0]):.1f} % on {kv_bytes / 1e6:.0f} MB of cache), "
                  f"rule/best = {times['r'][0] / times[best][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
