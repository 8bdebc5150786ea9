"""Compile ahead: an autotuning mode's later phases compile in helper processes while its first phase runs.

compile-max-autotune's first call at one batch size is a whole compile with autotuning — tens of seconds on a GPU,
most of it Triton compiling coordinate-descent variants one after another in one process — and a bench run has four
such phases, so one run's compiles in a row would be the critical path of `bench --mode all`.

Beside its group (a phased worker on a GPU machine with cores to spare), such a run starts one helper per later
phase. A helper (`python -m engine.bench.run --first-call`) does what the run does for that phase up to the end of the
first call — the seeded model, the mode's prepare, the first call timed the same way, checked against eager — in its
own process, under the same device discipline (timings alone, compiles off the device), and writes the first call's
µs. Its compile lands in Inductor's caches (FX graph, AOTAutograd, autotune), so when the run reaches that phase its
own first call loads it: the phase's `first_call` is the helper's (the cold cost), `first_call_here` the run's own.
A helper that fails leaves the run to compile that phase itself, with the reason in a note. A helper that succeeds
leaves a marker beside Inductor's caches (`marker()`): while it is there those caches hold the phase, so the next run
loads it in about a second and starts no helper for it (a helper costs a Python start and torch's import).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.runner import device_lock

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Helper:
    proc: subprocess.Popen
    out: Path  # the helper's result: {"first_us": …} or {"error": …}
    log: Path


@dataclass
class Ahead:
    """The phase → helper table of one run; `wait` gives a phase's cold first call once its helper has finished."""
    helpers: dict[tuple[str, int], Helper]
    folder: Path

    def wait(self, phase: str, batch_size: int) -> tuple[float | None, str | None]:
        """(the helper's first-call µs, None) once it is done; (None, why) if it failed; (None, None) if the phase
        has no helper. Waiting is host-only: the device is left to the group meanwhile."""
        helper = self.helpers.pop((phase, batch_size), None)
        if helper is None:
            return None, None
        with device_lock.released():
            helper.proc.wait()
        try:
            result = json.loads(helper.out.read_text())
        except (OSError, ValueError):
            tail = helper.log.read_text(errors="replace").strip().splitlines()[-3:] if helper.log.exists() else []
            return None, f"exit {helper.proc.returncode}: {' | '.join(tail)[-400:] or 'no output'}"
        if "first_us" not in result:
            return None, str(result.get("error", "no result"))[-400:]
        return float(result["first_us"]), None

    def stop(self) -> None:
        for helper in self.helpers.values():
            if helper.proc.poll() is None:
                helper.proc.kill()
                helper.proc.wait()
        self.helpers.clear()


def wanted(autotunes: bool, device: str, phases: int) -> bool:
    """Whether a run compiles ahead: an autotuning mode with several phases, in a phased worker on a GPU whose hold can
    give the device up while it waits (without that a waiting run would hold its helpers' timings back)."""
    hold = device_lock.current()
    return autotunes and phases > 1 and device.startswith("cuda") and hold is not None and hold.cores is not None


def marker(params: dict, phase: str, batch_size: int) -> Path:
    """The file a helper leaves beside Inductor's caches once it compiled a phase (same folder: wiped with them)."""
    from engine.native.build import inductor_cache_dir

    key = {k: params.get(k) for k in ("workload", "mode", "device")}
    try:
        import torch

        key["gpu"] = torch.cuda.get_device_name() if str(params.get("device", "")).startswith("cuda") else "cpu"
    except (RuntimeError, AssertionError):
        key["gpu"] = "?"
    digest = hashlib.sha256(json.dumps([key, phase, batch_size], sort_keys=True).encode()).hexdigest()[:16]
    return inductor_cache_dir() / "compiled_ahead" / digest


def start(params: dict, plan: list[tuple[str, int]]) -> Ahead:
    """One helper per phase of `plan` after the first, each given the run's own parameters and its phase — except
    phases an earlier helper compiled into the caches still there."""
    folder = Path(tempfile.mkdtemp(prefix="modelab-ahead-"))
    hold = device_lock.current()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    # The helpers compile beside the run and its group: a share of the cores each for Inductor's compile pool.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // (4 * len(plan)))))
    helpers = {}
    for phase, batch_size in plan[1:]:
        if marker(params, phase, batch_size).exists():
            continue
        tag = f"{phase}-{batch_size}"
        spec = {"params": params, "phase": phase, "batch_size": batch_size,
                "group_size": hold.group_size if hold else 1, "out": str(folder / f"{tag}.json")}
        log = folder / f"{tag}.log"
        with open(log, "w") as stream:  # the child keeps its own descriptor
            proc = subprocess.Popen([sys.executable, "-m", "engine.bench.run", "--first-call", json.dumps(spec)],
                                    stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        helpers[(phase, batch_size)] = Helper(proc, folder / f"{tag}.json", log)
    return Ahead(helpers, folder)


def write_result(path: str, **result: object) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({**result, "t": time.time()}))
    os.replace(tmp, path)
