"""A check of `python -m engine compare` on this machine, end to end: same-commit runs must come out "unchanged", runs
of a model with 10 % more identical layers "slower".

    python benchmarks/compare_check.py [--device cpu|cuda] [--runs 2] [--slowdown 0.10] [--threads N]
                                       [--iters 200] [--batch-sizes 64] [--keep-db PATH]
    python3 benchmarks/compare_check.py --device cuda          (the GPU machine)

35 s on the idle 2-core CPU, up to 60 s when other processes load it.

Everything goes through the real command line, in a temporary store (--db; ARTIFACTS_DIR and, unless set,
MODELAB_BUILD_DIR in the same temporary folder), with no hook in the product code:

1. The model is this file's `make_model`: an MLP of LAYERS identical Linear+ReLU blocks of width WIDTH, benched as
   your own model (`bench --model compare_check:make_model --model-path benchmarks --inputs 'float32[B,WIDTH]'`).
   The store names a user model's runs by the import path and the input spec only, so the slowed model must be the
   same factory: it reads MODELAB_CHECK_EXTRA_LAYERS and appends that many more identical blocks. 10 % more
   identical blocks is ~10 % more work whether a step is compute-bound (CPU) or launch-bound (a GPU at these sizes);
   the fixed cost of a call (Python, timing) makes the measured slowdown a little smaller than the added work.
2. Three sides, --runs bench processes each: A and B (the normal model, same commit) and C (the slowed one),
   interleaved round by round with the order rotated (A B C, B C A, C A B, …) so that a drift of the machine over
   the minute falls on every side alike.
3. Every call of the factory appends its depth and process id to a log (MODELAB_CHECK_LOG); after each bench process
   the script checks that the worker (a process other than the bench command itself, which also builds the model
   once to check it) built the depth that side asked for: the env var reaches the worker, or the check stops.
4. `compare --base ids:A --head ids:B` (expect unchanged) and `compare --base ids:A,B --head ids:C` (expect slower),
   each printed exactly as compare prints it, then a summary; exit 1 when a verdict is not the expected one (2 when
   a step failed).

Why several runs a side: run-to-run variation (another process on the machine, the clock, where the allocator put
things) is larger than the variation inside one run, and one run a side cannot show it: two processes of the same
code 3 % apart came out "significant" (0.971 [0.957, 0.990], unchanged only by the 5 % threshold), and on the loaded
dev machine with two threads same-commit pairs were called "slower" (1.150) and "faster" (0.779). With two or more
runs a side compare's cluster bootstrap draws runs first (docs/compare.md), so that spread widens the interval:
same-commit sides whose pooled medians were 5.3 % apart, one run of four being 9 % slow, stayed "unchanged" (1.053
[0.998, 1.097]). Two runs a side is still optimistic (the interval cannot be wider than the runs' spread), so the
threshold stays the gate. --runs 1 is the literal "two runs of the same commit"; it is allowed, and it is the
fragile variant.

Why one thread on the CPU (OMP_NUM_THREADS=1 by default there; --threads 0 for torch's default): with two intra-op
threads on a 2-core machine that other processes use too, an op waits for its slower thread, and a thread that lost
its core for a scheduler slice makes the step take milliseconds: on the shared dev machine (load 6-9) per-run medians
of the same model spanned up to ×137 (0.94-167 ms) with two threads and 1.26-1.30 ms with one. Such noise is the
machine's, not compare's, and no test over 2 runs a side sees +10 % through it; with --threads 0 the summary says so
(a note when the normal runs' medians span more than the added work). The runs record their thread count.

The reproduce command compare prints names the normal model and no thread count: the extra layers and
OMP_NUM_THREADS came from the environment (a run records its thread count, not the extra layers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
FACTORY = f"{Path(__file__).stem}:make_model"
ENV_LAYERS = "MODELAB_CHECK_LAYERS"
ENV_EXTRA = "MODELAB_CHECK_EXTRA_LAYERS"
ENV_WIDTH = "MODELAB_CHECK_WIDTH"
ENV_LOG = "MODELAB_CHECK_LOG"
DEFAULT_LAYERS, DEFAULT_WIDTH = 20, 256


# -- the model (imported by the bench workers) ---------------------------------------------------------------------
def make_model():
    """MLP of identical Linear+ReLU blocks: MODELAB_CHECK_LAYERS (20) + MODELAB_CHECK_EXTRA_LAYERS (0), width
    MODELAB_CHECK_WIDTH (256)."""
    from torch import nn

    from engine.store import settings

    layers, extra, width = (settings.get(name) for name in (ENV_LAYERS, ENV_EXTRA, ENV_WIDTH))
    blocks = []
    for _ in range(layers + extra):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*blocks)
    log_path = settings.get(ENV_LOG)
    if log_path:
        with open(log_path, "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "blocks": layers + extra,
                                  "params": sum(p.numel() for p in model.parameters())}) + "\n")
    return model


# -- the check -----------------------------------------------------------------------------------------------------
SIDES = ("A", "B", "C")
STORED_RE = re.compile(r"\(runs (\d+)\D(\d+)\)")


def fail(message: str) -> SystemExit:
    """A step that failed: the check cannot judge (exit code 2)."""
    print(f"compare_check: {message}", file=sys.stderr, flush=True)
    return SystemExit(2)


def bench_step(args, side: str, blocks: int, env: dict[str, str], log: Path) -> tuple[list[int], dict[str, float]]:
    """One `python -m engine bench` process of one side; returns its run ids and {series label: median µs}, after
    checking that its worker built `blocks` blocks."""
    before = log.read_text().splitlines() if log.exists() else []
    cmd = [sys.executable, "-m", "engine", "bench", "--model", FACTORY, "--model-path", str(HERE),
           "--inputs", f"float32[B,{args.width}]", "--mode", args.modes, "--device", args.device, "--phases", "infer",
           "--batch-sizes", args.batch_sizes, "--iters", str(args.iters), "--db", str(args.db)]
    env = {**env, ENV_EXTRA: str(blocks - args.layers)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    out, err = proc.communicate()
    if proc.returncode:
        raise fail(f"side {side}: bench exited {proc.returncode}:\n{err[-1500:]}\n{out[-1500:]}")
    found = STORED_RE.search(out)
    if not found:
        raise fail(f"side {side}: no '(runs X–Y)' in bench's output:\n{out[-1500:]}")
    ids = list(range(int(found.group(1)), int(found.group(2)) + 1))
    built = [json.loads(line) for line in log.read_text().splitlines()[len(before):]]
    workers = [b for b in built if b["pid"] != proc.pid]
    wrong = [b for b in built if b["blocks"] != blocks]
    if not workers or wrong:
        raise fail(f"side {side}: asked for {blocks} blocks; the factory built {built} (bench command pid "
                         f"{proc.pid}): {'a wrong depth' if wrong else 'no worker built the model'}")
    medians = {}
    for line in out.splitlines():  # bench's table: mode phase batch median_us …
        cells = line.split()
        if len(cells) > 4 and cells[0] in args.modes.split(",") and cells[2].isdigit():
            medians[f"{cells[0]} {cells[1]} B={cells[2]}"] = float(cells[3])
    return ids, medians


def run_compare(args, base: list[int], head: list[int], env: dict[str, str]) -> dict:
    """compare as a user runs it (printed verbatim), then again with --json for the summary (seeded: same result)."""
    cmd = [sys.executable, "-m", "engine", "compare", "--base", "ids:" + ",".join(map(str, base)),
           "--head", "ids:" + ",".join(map(str, head)), "--threshold", args.threshold, "--db", str(args.db)]
    print("$ python -m engine compare " + " ".join(cmd[4:-2]), flush=True)
    shown = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    print(shown.stdout.rstrip() + (f"\n{shown.stderr.rstrip()}" if shown.stderr.strip() else ""))
    print(f"(exit code {shown.returncode})\n", flush=True)
    data = subprocess.run([*cmd, "--json"], cwd=REPO, env=env, capture_output=True, text=True)
    if data.returncode not in (0, 1):
        raise fail(f"compare --json exited {data.returncode}: {data.stderr.strip()[-800:]}")
    result = json.loads(data.stdout)
    if result["only_base"] or result["only_head"]:  # the sides' series keys differ: the check cannot judge
        raise fail(f"series on one side only: base {result['only_base']}, head {result['only_head']}")
    return result


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--modes", default="eager", help="bench modes, a comma list (default eager)")
    p.add_argument("--runs", type=int, default=2, help="bench processes per side (default 2; 1: the fragile variant)")
    p.add_argument("--iters", type=int, default=200, help="timed calls per run (default 200)")
    p.add_argument("--batch-sizes", default="64", help="comma list (default 64)")
    p.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help=f"blocks of the normal model ({DEFAULT_LAYERS})")
    p.add_argument("--width", type=int, default=DEFAULT_WIDTH, help=f"width of each block ({DEFAULT_WIDTH})")
    p.add_argument("--slowdown", type=float, default=0.10,
                   help="work added to side C, as a fraction of the blocks (default 0.10: 20 → 22 blocks)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of the bench processes; 0: unset (torch's default, all cores). Default: 1 "
                        "on the CPU (see the module's docstring); on CUDA the environment's")
    p.add_argument("--threshold", default="5%", help="compare's --threshold (default 5%%)")
    p.add_argument("--keep-db", metavar="PATH", help="the store to write (kept); default: a temporary one")
    args = p.parse_args(argv)
    if args.runs < 1 or args.layers < 1:
        p.error("--runs and --layers are at least 1")
    args.extra = round(args.layers * args.slowdown)
    if args.extra < 1:
        p.error(f"--slowdown {args.slowdown} of {args.layers} blocks adds no block; raise --layers or --slowdown")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compare_check-") as tmp:
        args.db = Path(args.keep_db).resolve() if args.keep_db else Path(tmp) / "check.duckdb"
        log = Path(tmp) / "factory.jsonl"
        env = {**os.environ, "RESULTS_DB": str(args.db), "ARTIFACTS_DIR": str(Path(tmp) / "artifacts"),
               ENV_LAYERS: str(args.layers), ENV_WIDTH: str(args.width), ENV_LOG: str(log)}
        env.setdefault("MODELAB_BUILD_DIR", str(Path(tmp) / "build"))
        threads = args.threads if args.threads is not None else 1 if args.device == "cpu" else None
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        elif threads == 0:
            env.pop("OMP_NUM_THREADS", None)
        threads_text = f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}" if "OMP_NUM_THREADS" in env \
            else "torch's default threads"
        blocks = {"A": args.layers, "B": args.layers, "C": args.layers + args.extra}
        print(f"model {FACTORY} float32[B,{args.width}]: A, B {args.layers} blocks; C {blocks['C']} blocks "
              f"(+{100 * args.extra / args.layers:g} % work) · {args.runs} run(s) a side on {args.device}, "
              f"modes {args.modes}, B={args.batch_sizes}, {args.iters} iters, "
              f"{threads_text} · store {args.db}\n", flush=True)
        ids: dict[str, list[int]] = {s: [] for s in SIDES}
        medians: dict[str, dict[str, list[float]]] = {s: {} for s in SIDES}
        for r in range(args.runs):
            for side in SIDES[r % 3:] + SIDES[:r % 3]:
                t0 = time.perf_counter()
                run_ids, meds = bench_step(args, side, blocks[side], env, log)
                ids[side] += run_ids
                for series, value in meds.items():
                    medians[side].setdefault(series, []).append(value)
                print(f"bench {side}{r + 1}: runs {','.join(map(str, run_ids))}, worker built {blocks[side]} blocks, "
                      f"median µs {' '.join(f'{k} {v:.1f}' for k, v in meds.items())} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
        print()
        checks = [("same commit", ids["A"], ids["B"], "unchanged"),
                  (f"+{100 * args.extra / args.layers:g} % layers", ids["A"] + ids["B"], ids["C"], "slower")]
        results = [(name, exp, run_compare(args, base, head, env)) for name, base, head, exp in checks]

    rows = [(name, r["mode"] + f" B={r['batch_size']}", f"{len(r['runs_base'])}/{len(r['runs_head'])}", exp,
             r["verdict"], f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
             "ok" if r["verdict"] == exp else "WRONG")
            for name, exp, result in results for r in result["rows"]]
    head = ("check", "series", "runs b/h", "expected", "got", "ratio [95% CI]", "")
    widths = [max(len(str(x[i])) for x in (head, *rows)) for i in range(len(head))]
    added = args.extra / args.layers
    for series in medians["A"]:
        print(f"per-run medians, {series}: " + " | ".join(
            f"{s} {', '.join(f'{v:.1f}' for v in medians[s].get(series, []))}" for s in SIDES) + " µs")
        normal = medians["A"][series] + medians["B"].get(series, [])
        if max(normal) / min(normal) - 1 > added:
            print(f"note: the normal runs' medians span ×{max(normal) / min(normal):.2f} (max/min), more than the "
                  f"+{100 * added:g} % this check adds: on this machine run-to-run noise is larger than the effect, "
                  "and with few runs a side compare's cluster bootstrap is optimistic (docs/compare.md)")
    print()
    for row in (head, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
    failed = sum(row[-1] != "ok" for row in rows)
    print(f"\n{len(rows) - failed}/{len(rows)} verdicts as expected · {time.perf_counter() - started:.0f} s"
          + (f" · store kept: {args.db}" if args.keep_db else ""))
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
