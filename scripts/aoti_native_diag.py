"""Why does the native AOTInductor runner crash on a device? Builds the runner and one package per device, runs the
runner plainly (libstdc++ preloaded, as the engine does) and, where cuda-gdb is on PATH, under it for a backtrace.

    python scripts/aoti_native_diag.py --devices cpu,cuda --out DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.native import aoti  # noqa: E402
from engine.native.build import build_aoti_runner  # noqa: E402
from engine.native.toolchain import with_libstdcxx_preloaded  # noqa: E402
from engine.workloads import get_workload  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", default="cpu,cuda")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runner = build_aoti_runner()
    w = get_workload("house_price")
    for device in a.devices.split(","):
        dev = "cuda:0" if device == "cuda" else device
        model = w.make_model().to(dev).eval()
        (x,), _ = w.make_batch(64, dev)
        pkg = aoti.compile_package(model, (x,))
        spec = aoti.write_tensor(x, a.out / f"in-{device}.bin")
        cmd = [str(runner), "--package", str(pkg.path), "--device", dev, "--warmup", "1", "--iters", "3",
               "--output-dir", str(a.out), "--input", spec]
        env = with_libstdcxx_preloaded(dict(os.environ))
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        print(f"{device}: native runner exit {done.returncode}; stdout tail {done.stdout.strip()[-200:]!r}; "
              f"stderr tail {done.stderr.strip()[-300:]!r}")
        gdb = shutil.which("cuda-gdb")
        if done.returncode != 0 and gdb:
            bt = subprocess.run([gdb, "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 25", "--args",
                                 *cmd], capture_output=True, text=True, env=env, timeout=300)
            (a.out / f"bt-{device}.log").write_text(bt.stdout + bt.stderr)
            frames = [line[:160] for line in bt.stdout.splitlines() if line.startswith("#")]
            print("\n".join(frames[:25]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
