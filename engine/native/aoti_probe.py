"""Which AOTInductor build options load and run on this machine? Every step in its own process, so a crash is data.

    python -m engine.native.aoti_probe --device cuda            # all variants, a table at the end
    python -m engine.native.aoti_probe --device cuda --variants default,embed_kernel_binary --json out.json

For each variant (a set of Inductor options, dynamic or static batch) on the house_price model:

  compile+load  one process exports, compiles the .pt2 and loads it with aoti_load_package (what the aoti mode does)
  fresh load    a new process loads the same .pt2 and calls it (python -m engine.native.aoti check)
  native        csrc/aoti_runner.cpp loads and times it (libtorch AOTIModelPackageLoader, no Python)

Each cell is ok, failed (an exception) or the signal that killed the process (e.g. SIGSEGV). Written for the
segfault seen in `_load_aoti` on a CUDA image (torch 2.11+cu130): it tells whether another option, a fresh process or
the native runner avoids it. The aoti mode takes extra options from $MODELAB_AOTI_OPTIONS (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS: dict[str, tuple[dict, bool]] = {
    "default": ({}, True),
    "static_shapes": ({}, False),
    "embed_kernel_binary": ({"aot_inductor.embed_kernel_binary": True}, True),
    "multi_arch_kernel": ({"aot_inductor.emit_multi_arch_kernel": True}, True),
    "no_consts_asm": ({"aot_inductor.use_consts_asm_build": False}, True),
    "no_precompiled_headers": ({"aot_inductor.precompile_headers": False}, True),
}


def _outcome(returncode: int, stderr: str) -> str:
    if returncode == 0:
        return "ok"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return "failed: " + (lines[-1][:200] if lines else f"exit {returncode}")


def _child_env() -> dict[str, str]:
    from engine.native.build import REPO_ROOT
    from engine.native.toolchain import with_libstdcxx_preloaded

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    # libstdc++ preloaded, as in every worker (engine.runner.worker_env says why)
    return with_libstdcxx_preloaded(env)


def compile_and_load(device: str, options: dict, dynamic: bool, batch: int, out: Path) -> int:
    """Child: export + compile + load + call in one process; writes the .pt2 path and the input spec to out."""
    import faulthandler

    import torch

    from engine.native import aoti
    from engine.workloads import get_workload

    faulthandler.enable()
    workload = get_workload("house_price")
    model = workload.make_model().to(device).eval()
    inputs, _ = workload.make_batch(batch, device)
    start = time.perf_counter()
    pkg = aoti.compile_package(model, inputs, options=options, dynamic_batch=dynamic, use_cache=False)
    compile_s = time.perf_counter() - start
    specs = [aoti.write_tensor(x, out / f"input_{i}.bin") for i, x in enumerate(inputs)]
    (out / "compiled.json").write_text(json.dumps({"pt2": str(pkg.path), "inputs": specs, "compile_s": compile_s}))
    compiled = aoti.load(pkg.path, device)
    with torch.no_grad():
        got = compiled(*inputs)
        want = model(*inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    err = float((got - want).abs().max())
    (out / "loaded.json").write_text(json.dumps({"max_abs_err": err}))
    print(json.dumps({"ok": True, "compile_s": compile_s, "max_abs_err": err}))
    return 0


def probe_variant(name: str, device: str, batch: int, timeout_s: float, workdir: Path) -> dict:
    options, dynamic = VARIANTS[name]
    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    row: dict = {"variant": name, "options": options, "dynamic_batch": dynamic}
    cmd = [sys.executable, "-m", "engine.native.aoti_probe", "_compile", "--device", device, "--batch", str(batch),
           "--options", json.dumps(options), "--dynamic", str(int(dynamic)), "--out", str(out)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
        row["compile+load"] = _outcome(done.returncode, done.stderr)
        if done.returncode:
            row["compile+load_log"] = done.stderr.strip()[-3000:]
    except subprocess.TimeoutExpired:
        row["compile+load"] = f"timed out after {timeout_s:.0f} s"
    compiled = out / "compiled.json"
    if not compiled.exists():
        row["fresh load"] = row["native"] = "skipped (no package)"
        return row
    info = json.loads(compiled.read_text())
    row["compile_s"] = round(info["compile_s"], 1)
    if (out / "loaded.json").exists():
        row["max_abs_err"] = json.loads((out / "loaded.json").read_text())["max_abs_err"]
    cmd = [sys.executable, "-m", "engine.native.aoti", "check", "--package", info["pt2"], "--device", device]
    for spec in info["inputs"]:
        cmd += ["--input", spec]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
        row["fresh load"] = _outcome(done.returncode, done.stderr)
        if done.returncode:
            row["fresh_load_log"] = done.stderr.strip()[-3000:]
    except subprocess.TimeoutExpired:
        row["fresh load"] = f"timed out after {timeout_s:.0f} s"
    try:
        from engine.native.aoti import NativeRunError, read_tensor, run_native
        from engine.native.build import NativeBuildError, build_aoti_runner

        runner = build_aoti_runner()
        inputs = []
        for spec in info["inputs"]:
            path, dtype, dims = spec.rsplit(":", 2)
            inputs.append(read_tensor(path, dtype, [int(d) for d in dims.split(",") if d]))
        result = run_native(runner, Path(info["pt2"]), tuple(inputs), device, warmup=3, iters=20,
                            timeout_s=timeout_s)
        import statistics

        row["native"] = "ok"
        row["native_median_us"] = round(statistics.median(result["samples_us"]), 1)
        row["native_peak_device_bytes"] = result.get("peak_device_bytes")
    except (NativeBuildError, NativeRunError) as exc:
        text = str(exc)
        row["native"] = next((s for s in ("SIGSEGV", "SIGABRT", "SIGBUS") if s in text), "failed")
        row["native_log"] = text[-3000:]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.native.aoti_probe", description=__doc__.split("\n")[0])
    parser.add_argument("cmd", nargs="?", default="probe", choices=["probe", "_compile"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of: {', '.join(VARIANTS)}")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", default=None, help="also write the rows (with logs) to this file")
    parser.add_argument("--options", default="{}")  # _compile only
    parser.add_argument("--dynamic", default="1")  # _compile only
    parser.add_argument("--out", default=None)  # _compile only
    args = parser.parse_args(argv)
    if args.cmd == "_compile":
        return compile_and_load(args.device, json.loads(args.options), args.dynamic == "1", args.batch,
                                Path(args.out))
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    import torch

    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") and torch.cuda.is_available()
             else ""), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="aoti-probe-") as tmp:
        for name in names:
            row = probe_variant(name, args.device, args.batch, args.timeout, Path(tmp))
            rows.append(row)
            cells = [f"{k}={row.get(k)}" for k in ("compile+load", "fresh load", "native", "compile_s",
                                                    "max_abs_err", "native_median_us") if k in row]
            print(f"{name:24s} " + "  ".join(cells), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
