"""Where does loading a CUDA AOTInductor package crash? A diagnosis script for the GPU machine, each step in a child.

    python scripts/aoti_cuda_diag.py --out DIR          # prints a table; DIR gets the logs

Steps (house_price MLP, batch 64):
  cuda .pt2 load     aoti_load_package on a CUDA package (what the aoti mode does)
  backtrace          the same load under cuda-gdb (when on PATH): the native frames of the crash
  ldd                unresolved libraries of the package's model .so
  cuda .so (legacy)  torch._inductor.aot_compile → a bare .so loaded with AOTIModelContainerRunnerCuda (no package)
  cpu .pt2 load      a CPU package built and loaded on the same machine
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_COMMON = f"""
import sys, json, torch
sys.path.insert(0, {str(REPO)!r})
from engine.workloads import get_workload
w = get_workload("house_price")
def model_and_inputs(device):
    m = w.make_model().to(device).eval()
    (x,), _ = w.make_batch(64, device)
    return m, x
"""

COMPILE_PT2 = _COMMON + """
from engine.native import aoti
device = sys.argv[1]
m, x = model_and_inputs(device)
pkg = aoti.compile_package(m, (x,), use_cache=False)
print(json.dumps({"pt2": str(pkg.path)}))
"""

LOAD_PT2 = _COMMON + """
import faulthandler; faulthandler.enable()
device, pt2 = sys.argv[1], sys.argv[2]
m, x = model_and_inputs(device)
idx = 0 if device == "cuda" else -1
f = torch._inductor.aoti_load_package(pt2, device_index=idx)
with torch.no_grad():
    err = float((f(x) - m(x)).abs().max())
print(json.dumps({"max_abs_err": err}))
"""

LEGACY_SO = _COMMON + """
import faulthandler; faulthandler.enable()
m, x = model_and_inputs("cuda")
ep = torch.export.export(m, (x,))
so = torch._inductor.aot_compile(ep.module(), (x,), options={"aot_inductor.package": False})
print("compiled", so, flush=True)
runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, "cuda")
with torch.no_grad():
    out = runner.run([x])[0]
    err = float((out.reshape(m(x).shape) - m(x)).abs().max())
print(json.dumps({"so": so, "max_abs_err": err}))
"""


def child(code: str, args: list[str], timeout: float, log: Path, wrap: list[str] | None = None) -> tuple[str, str]:
    cmd = (wrap or []) + [sys.executable, "-c", code, *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s", ""
    log.write_text(f"$ {' '.join(cmd[:3])} …\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    if done.returncode < 0:
        return signal.Signals(-done.returncode).name, done.stdout
    if done.returncode:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
        return "failed: " + last[0][:160], done.stdout
    return "ok", done.stdout


def last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=240)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str]] = []

    status, out = child(COMPILE_PT2, ["cuda"], a.timeout, a.out / "compile_cuda.log")
    pt2 = last_json(out).get("pt2")
    rows.append(("cuda .pt2 compile", status, pt2 or ""))
    if pt2:
        status, out = child(LOAD_PT2, ["cuda", pt2], a.timeout, a.out / "load_cuda.log")
        rows.append(("cuda .pt2 load", status, json.dumps(last_json(out))))
        gdb = shutil.which("cuda-gdb")
        if gdb:
            wrap = [gdb, "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40", "-ex", "info sharedlibrary",
                    "--args"]
            status, out = child(LOAD_PT2, ["cuda", pt2], a.timeout, a.out / "backtrace.log", wrap)
            frames = [line for line in out.splitlines() if line.startswith("#")]
            rows.append(("backtrace (cuda-gdb)", status, " | ".join(f[:90] for f in frames[:6])))
        else:
            rows.append(("backtrace (cuda-gdb)", "skipped", "cuda-gdb not on PATH"))
        tmp = a.out / "unzipped"
        with zipfile.ZipFile(pt2) as z:
            sos = [n for n in z.namelist() if n.endswith(".so")]
            z.extractall(tmp, members=sos)
        for so in sos:
            done = subprocess.run(["ldd", str(tmp / so)], capture_output=True, text=True)
            missing = [line.strip() for line in done.stdout.splitlines() if "not found" in line]
            rows.append((f"ldd {Path(so).name}", "missing libs" if missing else "ok", "; ".join(missing)[:200]))
        shutil.rmtree(tmp, ignore_errors=True)

    status, out = child(LEGACY_SO, [], a.timeout, a.out / "legacy_so.log")
    rows.append(("cuda .so (legacy, no package)", status, json.dumps(last_json(out))))

    status, out = child(COMPILE_PT2, ["cpu"], a.timeout, a.out / "compile_cpu.log")
    cpt2 = last_json(out).get("pt2")
    if cpt2:
        status, out = child(LOAD_PT2, ["cpu", cpt2], a.timeout, a.out / "load_cpu.log")
    rows.append(("cpu .pt2 compile+load", status, json.dumps(last_json(out))))

    print("\n" + "\n".join(f"{name:32s} {status:28s} {detail}" for name, status, detail in rows))
    (a.out / "diag.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
