"""The target Nsight Compute runs for `levels --deep` (engine.levels.run._deep_profile starts it under ncu).

    python -m engine.levels.deep --component causal_attention --shape S=4096 --level L5-cuda --device cuda

It builds the level and checks it against the reference exactly as a levels run does (engine.levels.run.
prepare_level), calls it on two input sets so that compiles and autotuning happen outside the measured range, then
brackets `--calls` calls with cudaProfilerStart/Stop: ncu (started with --profile-from-start off) measures every
kernel those calls launch and nothing else. On the CPU it runs the same steps without a profiler range (what the
tests drive with a stand-in ncu).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from engine.levels.run import DEEP_CALLS, LevelsConfig, prepare_level


def measure(cfg: LevelsConfig, calls: int) -> int:
    """Warm the checked level, then run `calls` calls inside the profiler range; returns the calls made."""
    fn, sets = prepare_level(cfg)
    cuda = cfg.device.startswith("cuda")
    with torch.no_grad():
        for inputs in sets[:2]:  # compiles, autotuning, lazy initialisation: before the range
            fn(*inputs)
        if cuda:
            torch.cuda.synchronize(cfg.device)
            torch.cuda.profiler.start()  # ncu --profile-from-start off measures from here …
        for i in range(calls):
            fn(*sets[i % len(sets)])
        if cuda:
            torch.cuda.synchronize(cfg.device)
            torch.cuda.profiler.stop()  # … to here
    return calls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.levels.deep",
                                     description="Run one kernel level's calls inside a profiler range (for ncu).")
    parser.add_argument("--component", required=True)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--level", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=DEEP_CALLS)
    parser.add_argument("--impl-path", default=None)
    parser.add_argument("--component-path", default=None)
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    cfg = LevelsConfig(component=args.component, shape=args.shape, level=args.level, device=args.device,
                       seed=args.seed, impl_path=args.impl_path, component_path=args.component_path)
    made = measure(cfg, args.calls)
    where = "in the profiler range" if cfg.device.startswith("cuda") else "(no profiler range off CUDA)"
    print(f"{cfg.level} on {cfg.component} {cfg.shape}: checked, {made} call(s) {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
