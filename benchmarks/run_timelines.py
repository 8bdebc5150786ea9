"""Print the timeline of every stored run of a kind: when each phase began and how long it took (from the run's
progress.jsonl, engine.store.report.run_timeline), then the seconds per phase summed over the runs.

    python benchmarks/run_timelines.py --kind llm [--db results.duckdb]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="bench")
    parser.add_argument("--db", default=None)
    args = parser.parse_args()
    import pandas as pd

    from engine.store.db import Store
    from engine.store.report import run_timeline

    store = Store(args.db)
    runs = store.query("SELECT id, mode, status, round(epoch(finished_at) - epoch(started_at), 1) AS seconds "
                       "FROM runs WHERE kind = ? ORDER BY id", [args.kind])
    if runs.empty:
        print(f"no {args.kind} runs in {store.path}")
        return 1
    frames = []
    for _, run in runs.iterrows():
        timeline = run_timeline(store, int(run["id"]))
        print(f"\nrun {run['id']} {run['mode']} ({run['status']}, {run['seconds']} s)")
        print(timeline.to_string(index=False) if not timeline.empty else "  (no timeline stored)")
        if not timeline.empty:
            # the phase without its "MODE: " prefix, so the same phase of different modes adds up ("comparing with
            # eager" keeps its last word)
            frames.append(timeline.assign(step=timeline["step"].str.removeprefix(f"{run['mode']}: ")))
    if frames:
        total = pd.concat(frames).groupby("step")["seconds"].sum().sort_values(ascending=False)
        print("\nseconds per phase, all runs:")
        print(total.round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
