"""Native builds a group needs, started in the background as the group starts (engine.runner.plan), so the run that
needs
one finds it built (or waits on its build lock) instead of starting it when its turn comes.

    python -m engine.native.prebuild cuda_levels mlp_step   # what engine.runner.plan starts: one process per build

Only on a GPU machine with cores to spare (engine.runner.device_lock.split_cores): the builds run on the cores a
timing never
uses, with ninja's parallelism set to those cores (MAX_JOBS). On a CPU device a build beside a timing would take its
cores, so there the run builds when its turn comes. A build that fails here fails again in its run, which reports it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from engine.runner.device_lock import split_cores

REPO_ROOT = Path(__file__).resolve().parents[2]


def _custom_ops() -> object:
    from engine.native.build import load_custom_ops

    return load_custom_ops(with_cuda=True)


def _mlp_step() -> object:
    from engine.native import mlp_step

    return mlp_step.load()


def _aoti_runner() -> object:
    from engine.native.build import build_aoti_runner

    return build_aoti_runner()


def _cuda_levels() -> object:
    from engine.kernels import cuda_levels

    return cuda_levels.load()


BUILDS: dict[str, Callable[[], object]] = {"custom_ops": _custom_ops, "mlp_step": _mlp_step,
                                           "aoti_runner": _aoti_runner, "cuda_levels": _cuda_levels}
# The runs (bench modes, levels) that build each, by the name the store keeps in runs.mode.
NEEDED_BY = {"custom_op": "custom_ops", "cuda": "mlp_step", "aoti": "aoti_runner", "L5-cuda": "cuda_levels"}


def needed(modes: Iterable[str]) -> list[str]:
    """The builds a group of runs needs, each once, in BUILDS order."""
    wanted = {NEEDED_BY[m] for m in modes if m in NEEDED_BY}
    return [name for name in BUILDS if name in wanted]


def start_for_group(store: object, runs: list[dict]) -> list[subprocess.Popen]:
    """A group_start hook (engine.runner.kinds): start the builds the group's modes need, on its device."""
    return start([str(r["mode"]) for r in runs], str(runs[0]["device"]) if runs else "cpu")


def start(modes: Iterable[str], device: str) -> list[subprocess.Popen]:
    """Start the builds `modes` need, one background process each, where the machine can spare the cores. None
    where MODELAB_TIMING_CORES is bad: each run of the group then fails with that message, the supervisor goes on."""
    try:
        split = split_cores(device)
    except ValueError:
        return []
    builds = needed(modes)
    if split is None or not builds:
        return []
    _, build_cores = split
    env = dict(os.environ, MAX_JOBS=str(len(build_cores)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return [subprocess.Popen([sys.executable, "-m", "engine.native.prebuild", name], env=env, cwd=REPO_ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.sched_setaffinity(0, build_cores))
            for name in builds]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.native.prebuild",
                                     description="Build native code ahead of the runs that need it.")
    parser.add_argument("builds", nargs="+", choices=sorted(BUILDS))
    args = parser.parse_args(argv)
    status = 0
    for name in args.builds:
        start_s = time.perf_counter()
        try:
            BUILDS[name]()
            print(f"{name}: built or found in {time.perf_counter() - start_s:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - the run that needs it builds again and reports the error
            print(f"{name}: failed: {exc}", file=sys.stderr, flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
