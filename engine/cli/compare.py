"""`python -m engine compare --base SPEC --head SPEC`: did it get slower? (engine.compare.verdict)

    python -m engine compare --base commit:abc123 --head latest    # exit 1 when a series regressed, 3 cannot tell
    python -m engine compare --base ids:12 --head ids:15 --threshold 10% --json
    python -m engine compare --base device:H100 --head device:H200 --kind llm
    python -m engine compare --base commit:abc123 --head latest --metric energy    # exit 1 when it takes more energy
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from engine.cli.args import CliError, int_at_least, open_store, seed_arg

GRAMMAR = """\
SPEC: clauses separated by spaces, ANDed (a key given twice ORs its values); quote values with spaces.
  ids:12,15,20-24         these runs
  commit:abc123           the recorded git commit starts with this
  torch:2.11.0+cu130      this torch version (torch:2.11 = 2.11.x)
  device:"NVIDIA H100"    the recorded device name contains this, or the run's device is it (cpu, cuda:0)
  host:NAME               recorded on this host
  merged:other.duckdb     copied in by `merge` from that store (path or file name); merged:none = made here
  kind:bench,levels,llm   also workload:NAME,… and mode:NAME,…
  latest | latest:N       of what the other clauses select, the newest (N) run(s) of each series
  12 | 12,15,20-24        a bare run id (list) is ids:…
A run (series) selected by both sides stays on the head side only.

Test, per series: the ratio of medians head/base of the raw samples with a hierarchical-bootstrap CI (B
resamples, seeded): a side's processes (runs; `bench --repeat N` makes N per mode) drawn first, then samples within
them, widened for few processes; the Mann-Whitney U p-value for reference.
  slower       the whole (1 - alpha) CI lies above 1 AND the ratio >= 1 + threshold
  faster       the whole CI lies below 1 AND the ratio <= 1 / (1 + threshold)
  unchanged    otherwise
  cannot tell  a side has fewer than 2 processes and no process-to-process noise was measured for the series on
               its machine (earlier repeat groups), or every run of a side is flagged; says the repeats it needs
  'too few samples' under --min-samples on a side
Runs flagged noisy or interfered (engine.measure.noise) are left out unless --include-flagged.
--metric energy judges the runs' energy figures instead (J per step, token or prefill: whole board or CPU package,
the share above the idle draw beside it), one per run, with a bootstrap over the runs: 'more energy' and 'less
energy' in place of slower and faster, the same rules, 'cannot tell' and exit codes.
Exit code: 1 when any series is slower (more energy), else 3 when any cannot be told, else 0; 2 for bad arguments
(a SPEC that matches no run, a bad threshold: write 5% or 0.05; runs with no energy figure under --metric energy).
See docs/compare.md."""


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: alpha lies between 0 and 1, e.g. 0.05")
    return value


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from engine.compare.verdict import ALPHA, KINDS, METRICS, MIN_SAMPLES, RESAMPLES

    p = sub.add_parser("compare", help="did it get slower? two sets of runs (commits, torch versions, devices, "
                       "merged stores, run ids) compared per series with a bootstrap CI over processes; exit 1 on a "
                       "regression, 3 when it cannot tell",
                       description=__doc__.split("\n\n")[0] + "\n\n" + GRAMMAR,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, metavar="SPEC", help="the reference runs, e.g. commit:abc123")
    p.add_argument("--head", required=True, metavar="SPEC", help="the runs judged against it, e.g. latest")
    p.add_argument("--threshold", default="5%", help="smallest slowdown that counts: 5%% or 0.05 (default 5%%)")
    p.add_argument("--kind", choices=KINDS, default=None, help="only this kind of run (default: all three)")
    p.add_argument("--metric", choices=METRICS, default="time",
                   help="what is judged: the time samples (default) or the runs' energy figures (J per step, token, "
                        "prefill)")
    p.add_argument("--alpha", type=_alpha, default=ALPHA, help=f"significance level (default {ALPHA})")
    p.add_argument("--resamples", type=int_at_least(100, 1_000_000), default=RESAMPLES,  # arrays of B floats
                   help=f"bootstrap resamples B (default {RESAMPLES})")
    p.add_argument("--seed", type=seed_arg, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--min-samples", type=int_at_least(2), default=MIN_SAMPLES,
                   help=f"fewer samples on a side: 'too few samples' (default {MIN_SAMPLES})")
    p.add_argument("--include-flagged", action="store_true",
                   help="count runs flagged noisy or interfered in the verdicts (default: left out, and said so)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    common(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from engine.compare.verdict import (
        KINDS,
        CompareError,
        Options,
        compare,
        parse_spec,
        parse_threshold,
        render,
        to_json,
    )

    try:
        options = Options(threshold=parse_threshold(args.threshold), alpha=args.alpha, resamples=args.resamples,
                          seed=args.seed, min_samples=args.min_samples,
                          kinds=(args.kind,) if args.kind else KINDS, include_flagged=args.include_flagged,
                          metric=args.metric)
        base, head = parse_spec(args.base), parse_spec(args.head)
        result = compare(open_store(args), base, head, options)
    except CompareError as exc:
        raise CliError(str(exc)) from exc
    print(to_json(result) if args.json else render(result))
    return result.exit_code
