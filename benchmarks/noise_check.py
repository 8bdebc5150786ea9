"""Numbers you can trust on a busy machine, checked end to end: how often runs get flagged quiet and beside a CPU
hog, and what `compare` says of two repeat-3 measurements of one configuration and of one doing 25 % more work.

    python benchmarks/noise_check.py [--tries 10] [--repeat 3] [--iters 200] [--threads 0] [--keep-db PATH]
                                     [--parts quiet,hog,same,more]

Slow: 10 tries of each part are ~80 `bench` invocations of 3 worker processes each (25-60 minutes on a loaded
2-core CPU). Everything goes through the real command line in a temporary store (--db; ARTIFACTS_DIR,
MODELAB_LOCK_DIR and, unless set, MODELAB_BUILD_DIR in the same temporary folder), with no hook in the product code.

1. quiet: `bench --mode eager --repeat 3 --phases infer --batch-sizes 64` (the lab's house-price model), --tries
   times; from `runs --json`, how many invocations (and processes) were flagged noisy or interfered, and the other
   processes' load each saw. "Quiet" means nothing this script started: other users of the machine still count.
2. hog: the same beside a hog (one Python process spinning per core, started before and stopped after the part).
3. same: two repeat-3 measurements of one configuration, then `compare --base ids:A --head ids:B`, --tries times.
4. more: a repeat-3 measurement against one of a model doing 25 % more work (benchmarks/compare_check.py's model:
   20 identical Linear+ReLU blocks of width 256, and the same factory with 5 more blocks through
   MODELAB_CHECK_EXTRA_LAYERS, so both are one series), `compare --base ids:A --head ids:C`, --tries times; the A and
   B of part 3 come from that model too, each try running A, B and C in turn.

Verdicts are counted as compare gives them (flagged processes left out), and again with --include-flagged. Torch's
default threads unless --threads N (OMP_NUM_THREADS) — the issue's runs used the default.
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
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))  # engine.store, to read each run's recorded conditions
STORED_RE = re.compile(r"\(runs (\d+)\D(\d+)\)")
PARTS = ("quiet", "hog", "same", "more")
WIDTH, LAYERS, EXTRA = 256, 20, 5  # compare_check's model; 5 more blocks of 20 is 25 % more work


def run(cmd: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and done.returncode not in (0, 1, 3):
        sys.exit(f"noise_check: {' '.join(cmd[2:5])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def bench(args: argparse.Namespace, env: dict[str, str], *, model: bool = False, extra: int = 0) -> list[int]:
    """One `bench --repeat N` invocation; its run ids."""
    what = (["--model", "compare_check:make_model", "--model-path", str(HERE), "--inputs", f"float32[B,{WIDTH}]"]
            if model else [])
    cmd = [sys.executable, "-m", "engine", "bench", *what, "--mode", "eager", "--repeat", str(args.repeat),
           "--phases", "infer", "--batch-sizes", "64", "--iters", str(args.iters), "--db", str(args.db)]
    done = run(cmd, {**env, "MODELAB_CHECK_EXTRA_LAYERS": str(extra), "MODELAB_CHECK_LAYERS": str(LAYERS),
                     "MODELAB_CHECK_WIDTH": str(WIDTH)})
    found = STORED_RE.search(done.stdout)
    if done.returncode or not found:
        sys.exit(f"noise_check: bench failed ({done.returncode}):\n{done.stderr[-2000:]}\n{done.stdout[-1000:]}")
    return list(range(int(found.group(1)), int(found.group(2)) + 1))


def judged(args: argparse.Namespace, env: dict[str, str], ids: list[int]) -> list[dict]:
    """`runs --json` rows of these runs, each with the other processes' load its series saw (the worst one)."""
    done = run([sys.executable, "-m", "engine", "runs", "--json", "--limit", "100000", "--db", str(args.db)], env)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if r["id"] in ids]
    from engine.store.db import Store

    store = Store(args.db)
    for row in rows:
        record = store.run(row["id"])["conditions"] or {}
        others = [(s.get("conditions") or {}).get("other_cores") for s in record.get("series", [])]
        row["other_cores"] = max((o for o in others if o is not None), default=None)
    return sorted(rows, key=lambda r: r["id"])


@contextmanager
def hog(seconds: float) -> Iterator[int]:
    """One spinning Python process per core this script may use, stopped (by pid) when the block ends."""
    cores = len(os.sched_getaffinity(0))
    spin = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    try:
        time.sleep(0.5)
        yield cores
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def flag_part(args: argparse.Namespace, env: dict[str, str], title: str) -> None:
    invocations = flagged = 0
    processes, states, loads = 0, Counter(), []
    for i in range(args.tries):
        rows = judged(args, env, bench(args, env))
        invocations += 1
        flagged += any(r["flags"] for r in rows)
        processes += len(rows)
        states.update(r["state"] or "unjudged" for r in rows)
        loads += [r["other_cores"] for r in rows if r["other_cores"] is not None]
        print(f"  {title} {i + 1}/{args.tries}: runs {rows[0]['id']}-{rows[-1]['id']}: "
              + ", ".join(f"{r['state']}" + (f" ({r['flags'][0]})" if r["flags"] else "") for r in rows), flush=True)
    middle = sorted(loads)[len(loads) // 2] if loads else None
    load = (f"other processes' load {min(loads):.2f}-{max(loads):.2f} cores (median {middle:.2f})" if loads
            else "no load figures")
    print(f"{title}: {flagged} of {invocations} invocations flagged; processes: "
          + ", ".join(f"{n} {s}" for s, n in states.most_common()) + f"; {load}", flush=True)


def compare(args: argparse.Namespace, env: dict[str, str], base: list[int], head: list[int],
            include_flagged: bool) -> tuple[str, str, int]:
    """(verdict, verdict with its ratio and CI, exit code) of `compare --base ids:… --head ids:…`."""
    cmd = [sys.executable, "-m", "engine", "compare", "--base", ",".join(map(str, base)), "--head",
           ",".join(map(str, head)), "--json", "--db", str(args.db)] + (["--include-flagged"] if include_flagged
                                                                        else [])
    done = run(cmd, env)
    data = json.loads(done.stdout)
    row = data["rows"][0]
    ratio = ("" if row["ratio"] != row["ratio"] else
             f" {row['ratio']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]")
    return row["verdict"], f"{row['verdict']}{ratio}", done.returncode


def compare_parts(args: argparse.Namespace, env: dict[str, str], parts: list[str]) -> None:
    verdicts: dict[str, Counter] = {p: Counter() for p in ("same", "more", "same+flagged", "more+flagged")}
    codes: dict[str, Counter] = {p: Counter() for p in ("same", "more")}
    for i in range(args.tries):
        a = bench(args, env, model=True)
        b = bench(args, env, model=True) if "same" in parts else None
        c = bench(args, env, model=True, extra=EXTRA) if "more" in parts else None
        line = [f"  try {i + 1}/{args.tries}: A {a[0]}-{a[-1]}"]
        for part, head in (("same", b), ("more", c)):
            if head is None:
                continue
            (judged_as, text, code), (judged_all, text_all, _) = (compare(args, env, a, head, False),
                                                                  compare(args, env, a, head, True))
            verdicts[part][judged_as] += 1
            verdicts[f"{part}+flagged"][judged_all] += 1
            codes[part][code] += 1
            line.append(f"{part}: {text} (exit {code}; with flagged: {text_all})")
        print(" · ".join(line), flush=True)
    for part, what in (("same", f"two repeat-{args.repeat} runs of one configuration"),
                       ("more", f"repeat-{args.repeat} against {100 * EXTRA // LAYERS} % more work")):
        if part in parts:
            print(f"compare {what}: " + ", ".join(f"{n} {v}" for v, n in verdicts[part].most_common())
                  + f" over {args.tries} (exit codes "
                  + ", ".join(f"{c}×{n}" for c, n in sorted(codes[part].items()))
                  + "); with flagged runs counted: "
                  + ", ".join(f"{n} {v}" for v, n in verdicts[f"{part}+flagged"].most_common()), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the runs (0: torch's default)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"a comma list of {', '.join(PARTS)}")
    parser.add_argument("--keep-db", default=None, help="keep the store here instead of a temporary folder")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS) or args.tries < 1 or args.repeat < 1:
        parser.error(f"--parts takes {', '.join(PARTS)}; --tries and --repeat at least 1")
    with tempfile.TemporaryDirectory(prefix="noise_check-") as tmp:
        args.db = Path(args.keep_db or Path(tmp) / "results.duckdb").resolve()
        env = {**os.environ, "ARTIFACTS_DIR": str(Path(tmp) / "artifacts"),
               "MODELAB_LOCK_DIR": str(Path(tmp) / "locks"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        env.setdefault("MODELAB_BUILD_DIR", str(Path(tmp) / "build"))
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        started = time.time()
        print(f"noise_check: {args.tries} tries, bench --repeat {args.repeat}, {args.iters} calls a round, "
              f"{len(os.sched_getaffinity(0))} cores, threads {args.threads or 'default'}; store {args.db}",
              flush=True)
        if "quiet" in parts:
            flag_part(args, env, "quiet")
        if "hog" in parts:
            with hog(24 * 3600) as cores:
                print(f"  (a hog spinning on {cores} cores)", flush=True)
                flag_part(args, env, "beside a CPU hog")
        if {"same", "more"} & set(parts):
            compare_parts(args, env, parts)
        print(f"noise_check: {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
