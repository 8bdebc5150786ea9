"""`python -m engine explain RUN_A RUN_B`: why one mode's step is slower than another's (engine.explain.why).

    python -m engine explain 12 15                      # bench and/or profile runs; the common phase and batch
    python -m engine explain 12 15 --phase infer --batch-size 64 [--json]
    python -m engine explain 12 15 --profile            # profile whichever side has no profile yet, then explain
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from engine.cli.args import CliError, open_store, positive_int


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("explain", help="why is mode X slower than mode Y: each step split into compute, launches, "
                       "framework overhead, guards and idle time, and its distance to the device's floor")
    p.add_argument("run_a", type=int, help="a bench or profile run")
    p.add_argument("run_b", type=int, help="another bench or profile run of the same workload")
    p.add_argument("--phase", choices=["train", "infer"], default=None,
                   help="default: train if both runs measured it, else infer")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: the common batch closest to 64")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--profile", action="store_true", help="where a side has no profile at that phase and batch, "
                   "profile it first (one worker run each), then explain")
    common(p)
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    from engine.explain.why import ExplainError, explain, render, to_json

    store = open_store(args)
    try:
        result = explain(store, args.run_a, args.run_b, args.phase, args.batch_size)
        missing = [s for s in (result.a, result.b) if s.partition is None]
        if args.profile and missing:
            _profile(store, missing)
            result = explain(store, args.run_a, args.run_b, result.a.phase, result.a.batch_size)
    except ExplainError as exc:
        raise CliError(str(exc)) from exc
    print(to_json(result) if args.json else render(result))
    return 0


def _profile(store, sides) -> None:
    """Run the profiles the explanation lacks (in worker processes, one at a time); a failed one is reported and
    the explanation goes on without it."""
    from engine.explain.why import profile_specs
    from engine.runner.jobs import create_runs, run_jobs

    ids = create_runs(store, profile_specs(sides))
    print(f"profiling {' and '.join(s.mode for s in sides)} (runs {', '.join(map(str, ids))}) …", file=sys.stderr)
    for run_id, status in run_jobs(store, ids).items():
        if status != "ok":
            print(f"profile run {run_id} failed: {store.run(run_id)['error'].splitlines()[0]}", file=sys.stderr)
