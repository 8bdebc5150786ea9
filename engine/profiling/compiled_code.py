"""What torch.compile produced for a step, written out by depyf: decompiled bytecode, guards, graphs, kernels.

depyf (pinned in requirements.txt; three small pure-Python packages) hooks dynamo's bytecode transform and Inductor's
code loading while a compile runs inside `depyf.prepare_debug(folder)`, and writes readable files there:
`full_code_for_*.py` (the transformed function with its guard function in Python), `__transformed_code_*`,
`__compiled_fn_*.{Captured_Graph,Forward_graph,Backward_graph,kernel_N}.py`.

The dump runs in a child process, after the profile: depyf loads the generated kernels its own way, and a process
that compiled under it runs the compiled CPU step dozens of times slower (the house-price inference at B=64), also
after leaving `prepare_debug`. A child keeps that away from every timed or profiled call.
The files become artifacts of kind `depyf` of the profile run; the explainer shows them beside a compiled mode.
Without depyf, or when the child fails, the profile runs on with a note.

    python -m engine.profiling.compiled_code --mode compile --device cpu --phase train --batch-size 64 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_FILES = 60  # a pathological graph-break storm must not flood the store with artifacts


def depyf_missing() -> str | None:
    try:
        import depyf  # noqa: F401
    except ImportError:
        return "depyf is not installed (pip install depyf; it is pinned in requirements.txt)"
    return None


@contextlib.contextmanager
def capture(folder: Path, notes: list[str]) -> Iterator[list[Path]]:
    """Run the body under depyf.prepare_debug(folder); the yielded list is filled with the files written.

    Only for a process that times nothing afterwards (see the module docstring): use dump_in_child.
    """
    files: list[Path] = []
    reason = depyf_missing()
    if reason:
        notes.append(f"no decompiled code: {reason}")
        yield files
        return
    import depyf

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    try:
        context = depyf.prepare_debug(str(folder))
        context.__enter__()
    except Exception as exc:  # noqa: BLE001 - an incompatible torch must not fail the profile
        notes.append(f"no decompiled code: depyf could not hook this torch ({type(exc).__name__}: {exc})")
        yield files
        return
    failed = None
    try:
        yield files
    finally:
        try:
            context.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - dumping is best effort, the profile itself is what matters
            failed = exc
    if failed is not None:
        notes.append(f"depyf failed while writing the decompiled code ({type(failed).__name__}: {failed})")
    found = sorted(p for p in folder.rglob("*.py") if p.is_file())
    if len(found) > MAX_FILES:
        notes.append(f"depyf wrote {len(found)} files; kept the first {MAX_FILES}")
    files.extend(found[:MAX_FILES])


def dump_in_child(workload: str, mode: str, device: str, phase: str, batch_size: int, folder: Path,
                  notes: list[str], timeout_s: float = 900.0) -> list[Path]:
    """Compile the step once more in a child process under depyf; returns the files it wrote (empty on failure,
    with a note saying why)."""
    reason = depyf_missing()
    if reason:
        notes.append(f"no decompiled code: {reason}")
        return []
    cmd = [sys.executable, "-m", "engine.profiling.compiled_code", "--workload", workload, "--mode", mode,
           "--device", device, "--phase", phase, "--batch-size", str(batch_size), "--out", str(folder)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        notes.append(f"no decompiled code for {phase}: the depyf child ran past {timeout_s:.0f} s")
        return []
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else {}
    except ValueError:
        reply = {}
    if done.returncode != 0 or "files" not in reply:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        notes.append(f"no decompiled code for {phase}: the depyf child failed (exit {done.returncode}): {tail}")
        return []
    notes.extend(n for n in reply.get("notes", []) if n not in notes)
    return [Path(p) for p in reply["files"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.profiling.compiled_code",
                                     description="Compile one step under depyf and write what torch.compile made.")
    parser.add_argument("--workload", default="house_price")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--phase", choices=["train", "infer"], required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import torch

    from engine.bench.run import build_step
    from engine.modes import get_mode
    from engine.workloads import get_workload

    workload = get_workload(args.workload)
    notes: list[str] = []
    base = workload.make_model().to(args.device)
    with torch.set_grad_enabled(args.phase == "train"):
        step, _ = build_step(workload, get_mode(args.mode), base, args.phase, args.batch_size, args.device)
        with capture(Path(args.out), notes) as files:
            step()
    print(json.dumps({"files": [str(p) for p in files], "notes": notes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
