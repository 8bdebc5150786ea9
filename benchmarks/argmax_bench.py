"""The decode step's next-token argmax over one row of logits: torch.argmax (eager), torch.argmax compiled by
Inductor (what the compiled decode step runs) and engine/kernels/triton/argmax.py, per vocabulary size.

    python benchmarks/argmax_bench.py [--vocab 32000,128256] [--batch 1]   (CUDA only)

Each is checked first against torch.argmax on rows with a planted maximum (and a tie after it), then timed as the
step runs it: 20 calls back to back in one CUDA graph (engine.measure.timing.time_in_graph), bf16 logits. The table
gives the median µs per call; the lab's Triton modes take their next token with the Triton kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def bench(vocab: int, batch: int) -> dict[str, float]:
    from engine.kernels.triton import argmax as am
    from engine.measure.timing import time_in_graph

    gen = torch.Generator(device="cuda").manual_seed(vocab)
    logits = torch.randn(batch, vocab, device="cuda", generator=gen).bfloat16()
    logits[:, vocab // 3] = 30.0
    logits[:, vocab - 1] = 30.0  # a tie after the first maximum: the first index must win
    want = torch.argmax(logits, dim=-1, keepdim=True)
    compiled = torch.compile(lambda x: torch.argmax(x, dim=-1, keepdim=True), fullgraph=True, dynamic=False)
    ways = {"torch eager": lambda: torch.argmax(logits, dim=-1, keepdim=True),
            "torch compiled (Inductor)": lambda: compiled(logits),
            "triton (engine.kernels.triton.argmax)": lambda: am.argmax_rows_fwd(logits)}
    times = {}
    for name, call in ways.items():
        got = call()
        if not torch.equal(got, want):
            print(f"  V={vocab} {name}: {got.flatten().tolist()[:4]} != {want.flatten().tolist()[:4]}, not timed",
                  file=sys.stderr)
            continue
        times[name] = time_in_graph([call] * 20, replays=20).stats.median
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="32000,128256", help="comma list of row lengths (default: the presets' "
                        "32000 and Llama 3's 128256)")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("argmax_bench.py needs a CUDA device", file=sys.stderr)
        return 2
    try:
        vocabs = [int(v) for v in args.vocab.split(",")]
    except ValueError:
        print(f"--vocab {args.vocab!r}: want a comma list of integers", file=sys.stderr)
        return 2
    if any(v < 2 for v in vocabs) or args.batch < 1:
        print("--vocab values must be at least 2 and --batch at least 1", file=sys.stderr)
        return 2
    rows = [(v, bench(v, args.batch)) for v in vocabs]
    print(f"{'vocab':>7}  {'way':40} {'µs/call':>8}")
    for vocab, times in rows:
        for name, us in times.items():
            print(f"{vocab:7d}  {name:40} {us:8.2f}")
    return 0 if all(len(t) == 3 for _, t in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
