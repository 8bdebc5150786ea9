"""Check each L5 attention variant in its own process, so one that faults (illegal instruction, misaligned address,
hang) cannot hide the others' results; then time the ones that passed at the issue's shape.

    python3 scripts/attention_variant_probe.py [--variants 6,5,4] [--timeout 120]

Per variant: rel. L2 error against a float32 SDPA reference for bf16 (and fp16 where built), D=128, causal and not,
S in {1, 100, 128, 300, 1024}; then, if all passed, the median of 30 calls (CUDA events) at B=4 H=16 S=4096 causal
and its TFLOP/s beside SDPA's. Exit status 1 if any variant failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
from engine.kernels import cuda_levels as cl
var = {var}
torch.manual_seed(0)
worst = 0.0
if not torch.cuda.is_available() or var not in cl.attention_variants(torch.bfloat16, 128):
    print(f"v{{var}}: not built on this machine (needs CUDA; 4..6 need compute capability 9.0)")
    sys.exit(1)
for dtype in (torch.bfloat16, torch.float16):
    if var not in cl.attention_variants(dtype, 128):
        continue
    for S in (1, 100, 128, 300, 1024):
        for causal in (False, True):
            q, k, v = (torch.randn(2, 3, S, 128, device="cuda").to(dtype) for _ in range(3))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            out = cl._attention_variant(q, k, v, causal, None, var)
            torch.cuda.synchronize()
            err = cl._rel_l2(out, ref)
            worst = max(worst, err if err == err else float("inf"))
            if not err < 1.5e-2:
                print(f"v{{var}} {{dtype}} S={{S}} causal={{causal}}: rel L2 {{err:.3e}} FAILED", flush=True)
print(f"v{{var}} worst rel L2 {{worst:.3e}}", flush=True)
if worst >= 1.5e-2:
    sys.exit(1)
B, H, S, D = 4, 16, 4096, 128
q, k, v = (torch.randn(B, H, S, D, device="cuda").to(torch.bfloat16) for _ in range(3))
flops = 2 * B * H * S * S * D
def median_us(fn):
    for _ in range(5):
        fn()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]
t = median_us(lambda: cl._attention_variant(q, k, v, True, None, var))
ts = median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
print(f"v{{var}} S=4096 causal: {{t:.1f}} us {{flops / t / 1e6:.0f}} TFLOP/s; SDPA {{ts:.1f}} us "
      f"{{flops / ts / 1e6:.0f}} TFLOP/s; ratio {{ts / t:.3f}}", flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="6,5,4", help="comma list, run in this order")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per variant")
    args = parser.parse_args()
    try:
        variants = [int(v) for v in args.variants.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--variants must be a comma list of integers, got {args.variants!r}")
    failed = 0
    for var in variants:
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), var=var)], capture_output=True,
                                  text=True, timeout=args.timeout)
            text = (proc.stdout + proc.stderr).strip().splitlines()
            print("\n".join(text[-8:]) if proc.returncode else "\n".join(line for line in text if line.startswith("v")))
            failed += proc.returncode != 0
        except subprocess.TimeoutExpired:
            print(f"v{var}: no result in {args.timeout:.0f} s (hung)")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
