"""Does prefetching the next products' weights into L2 during the decode attention shorten a decode step?

    python benchmarks/decode_prefetch_bench.py [--preset 1B] [--layers 16] [--pos 575] [--rounds 3]   (sm_90 only)

Why: in the 1B `triton-fused` step the GEMVs stream their weights at ~90 % of the copy bandwidth, but the decode
attention's two latency-bound kernels per layer (~94 µs a step on an H100, docs/figures.md "LLM decode") leave DRAM
idle. Here the split kernel's programs hand the TMA unit bulk prefetches (`cp.async.bulk.prefetch.L2`, one per
program and region, from thread 0: engine/kernels/triton/decode_attention.py, `_prefetch_l2`) of the layer's o and
gate_up weights, so those products may find part of their bytes in L2. (An earlier try, per-line `prefetch.global.L2`
from every thread, made the step slower: docs/figures.md.)

The step timed is the triton-fused layer loop without the LM head: per layer the qkv GEMV with its RMSNorm, the
decode attention from the qkv row (RoPE, cache write, split + combine), the o GEMV with the residual, gate_up with
the norm and SwiGLU, down with the residual — each layer its own random weights (more bytes than L2 holds), captured
in one CUDA graph (engine.timing.time_in_graph) per variant, the variants interleaved over rounds. Every variant's
output is compared with the plain step's first (the prefetch is a hint: equal, bit for bit). Bytes per step / time
gives GB/s against `python -m engine ceilings`' copy bandwidth.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def build(preset_name: str, layers: int, max_seq: int, gen: torch.Generator) -> tuple[list[dict], dict]:
    from engine.workloads.llama import preset, rope_tables

    c = preset(preset_name)
    d = c.dim // c.heads

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * shape[-1] ** -0.5).bfloat16()

    blocks = [dict(qkv=w((c.heads + 2 * c.kv_heads) * d, c.dim), o=w(c.dim, c.dim), gate_up=w(2 * c.ffn, c.dim),
                   down=w(c.dim, c.ffn), g1=torch.ones(c.dim, device="cuda", dtype=torch.bfloat16),
                   g2=torch.ones(c.dim, device="cuda", dtype=torch.bfloat16),
                   k=torch.randn(1, c.kv_heads, max_seq, d, device="cuda", generator=gen).bfloat16(),
                   v=torch.randn(1, c.kv_heads, max_seq, d, device="cuda", generator=gen).bfloat16())
              for _ in range(layers)]
    cos, sin = (t.to("cuda", torch.bfloat16) for t in rope_tables(c, max_seq))
    return blocks, dict(cos=cos, sin=sin, dim=c.dim)


def step_fn(blocks: list[dict], shared: dict, pos: torch.Tensor, x0: torch.Tensor, prefetches: list | None):
    from engine.kernels.triton.decode_attention import decode_attention_qkv_fwd
    from engine.kernels.triton.gemv import gemv

    def step() -> torch.Tensor:
        x = x0
        for i, blk in enumerate(blocks):
            qkv = gemv(x, blk["qkv"], norm_weight=blk["g1"], eps=1e-5)
            attn = decode_attention_qkv_fwd(qkv.view(1, 1, -1), shared["cos"], shared["sin"], blk["k"], blk["v"], pos,
                                            prefetch=prefetches[i] if prefetches else None)
            h = gemv(attn.reshape(1, -1), blk["o"], residual=x)
            gu = gemv(h, blk["gate_up"], norm_weight=blk["g2"], eps=1e-5, glu=True)
            x = gemv(gu, blk["down"], residual=h)
        return x

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1B")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--pos", type=int, default=575)
    parser.add_argument("--max-seq", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", default="8,24,40", help="bytes prefetched per layer (MB): o first, then gate_up")
    args = parser.parse_args()
    if not 0 <= args.pos < args.max_seq:
        parser.error(f"--pos must be in [0, --max-seq), got {args.pos}")
    if args.layers < 1 or args.rounds < 1:
        parser.error(f"--layers and --rounds take at least 1, got {args.layers} and {args.rounds}")
    try:
        sizes = [int(float(mb) * 2**20) for mb in args.mb.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        parser.error(f"--mb takes positive numbers separated by commas, got {args.mb!r}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("needs an sm_90 (Hopper) GPU: the bulk prefetch is a TMA instruction", file=sys.stderr)
        return 2
    from engine.kernels.triton.decode_attention import prefetch_table
    from engine.timing import time_in_graph

    gen = torch.Generator(device="cuda").manual_seed(0)
    blocks, shared = build(args.preset, args.layers, args.max_seq, gen)
    pos = torch.tensor([args.pos], device="cuda")
    x0 = torch.randn(1, shared["dim"], device="cuda", generator=gen).bfloat16()
    variants: dict[str, list | None] = {"off": None}
    for size in sizes:
        variants[f"early {size / 2**20:g} MB"] = [prefetch_table([b["o"], b["gate_up"]], size, early=True)
                                                 for b in blocks]
    variants[f"late {sizes[-1] / 2**20:g} MB"] = [prefetch_table([b["o"], b["gate_up"]], sizes[-1], early=False)
                                                  for b in blocks]
    steps = {name: step_fn(blocks, shared, pos, x0, pf) for name, pf in variants.items()}
    ref = steps["off"]().clone()  # also autotunes every GEMV outside any capture
    for name, step in steps.items():
        out = step()
        if not torch.equal(out, ref):
            print(f"{name}: output differs from the plain step ({(out.float() - ref.float()).abs().max():.3e})",
                  file=sys.stderr)
            return 1
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(time_in_graph([step], replays=10).stats.median)
    per_layer = sum(b[k].numel() * 2 for b in blocks[:1] for k in ("qkv", "o", "gate_up", "down"))
    kv = 2 * blocks[0]["k"][:, :, : args.pos + 1].numel() * 2
    step_bytes = args.layers * (per_layer + kv)
    print(f"{args.preset}, {args.layers} layers, position {args.pos}: {step_bytes / 1e6:.0f} MB a step "
          f"({torch.cuda.get_device_name()})")
    print(f"{'variant':<16}{'µs per step (each round)':>34}{'best':>9}{'GB/s':>7}")
    for name, ts in times.items():
        print(f"{name:<16}{'  '.join(f'{t:8.1f}' for t in ts):>34}{min(ts):9.1f}{step_bytes / min(ts) / 1e3:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
