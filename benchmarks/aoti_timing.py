"""Where an aoti prepare spends its time on this machine: export, the cached package, the crash check in a child
process, the in-process load and the first call, each timed twice (the second shows what a warm run pays).

    python benchmarks/aoti_timing.py [--device cuda] [--batch 1]        (a few minutes on the GPU machine)

The script re-executes itself with libstdc++ in LD_PRELOAD, as the engine starts its workers: without it the
in-process load segfaults on the GPU image (docs/aoti.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(label: str, fn, rows: list) -> object:
    start = time.perf_counter()
    out = fn()
    rows.append((label, time.perf_counter() - start))
    print(f"{label:<48} {rows[-1][1]:9.2f} s", flush=True)
    return out


def child(cmd: list[str], env: dict) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{cmd} failed ({done.returncode}): {done.stderr[-800:]}")
    return done.stdout.strip()[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    from engine.native.toolchain import with_libstdcxx_preloaded

    env = with_libstdcxx_preloaded(dict(os.environ))
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):  # load AOTInductor models as a worker does
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    rows: list = []
    import torch

    from engine.native import aoti
    from engine.workloads import house_price as hp

    for tag in ("1st", "2nd"):
        timed(f"{tag} child: import torch + cuda init", lambda: child(
            [sys.executable, "-c", f"import torch; torch.zeros(1, device='{args.device}')"], env), rows)
        timed(f"{tag} child: + import torch._inductor.package", lambda: child(
            [sys.executable, "-c", f"import torch; torch.zeros(1, device='{args.device}'); "
             "import torch._inductor.package"], env), rows)
    model = hp.make_model().eval().to(args.device)
    inputs, _ = hp.make_batch(args.batch, args.device)
    for tag in ("1st", "2nd"):
        pkg = timed(f"{tag} compile_package (export + cache)", lambda: aoti.compile_package(model, inputs), rows)
        print(f"    cache_hit={pkg.cache_hit} export_s={pkg.export_s:.2f} compile_s={pkg.compile_s:.2f}")
        with tempfile.TemporaryDirectory() as tmp:
            specs = [aoti.write_tensor(x, Path(tmp) / f"in{i}.bin") for i, x in enumerate(inputs)]
            cmd = [sys.executable, "-m", "engine.native.aoti", "check", "--package", str(pkg.path), "--device",
                   args.device] + [a for s in specs for a in ("--input", s)]
            out = timed(f"{tag} check_load_in_child (as a subprocess)", lambda: child(cmd, env), rows)
            print("    child says", out)
        loaded = timed(f"{tag} load in-process (engine.native.aoti.load)",
                       lambda: aoti.load(pkg.path, args.device), rows)
        timed(f"{tag} first call", lambda: (loaded(*inputs), torch.cuda.synchronize() if args.device == "cuda"
                                            else None), rows)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
