"""Benchmark: server-side render time of the Home page with N runs in the store.

    python benchmarks/home_render_bench.py --runs 10000 [--repeats 5]

Fills a fresh temporary store with N bench runs (metrics + samples, a few failed) in bulk, then renders app/Home.py
with Streamlit's AppTest (the same script run a server does, without the browser) and reports each render's time.
The first render pays imports and cache fills; a running server pays that once, so the steady-state figure is the
median of the later renders.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.store.db import Store  # noqa: E402

MODES = ["eager", "fx", "torchscript", "compile", "compile-max-autotune"]


def fill(store: Store, n_runs: int) -> None:
    """Bulk insert n_runs bench runs with realistic metrics and 100 samples per (phase, batch)."""
    store.init()
    rng = np.random.default_rng(0)
    ids = np.arange(1, n_runs + 1)
    now = pd.Timestamp.now().floor("s")
    status = np.where(rng.random(n_runs) < 0.03, "failed", "ok")
    runs = pd.DataFrame({
        "id": ids, "group_id": None, "kind": "bench", "workload": "house_price",
        "mode": [MODES[i % len(MODES)] for i in range(n_runs)], "device": "cpu", "status": status,
        "error": np.where(status == "failed", "ToleranceError: differs from eager", None), "params": "{}",
        "progress": 1.0, "message": "done", "pid": 1, "host": "bench", "created_at": now, "started_at": now,
        "finished_at": now, "notes": None,
    })
    metric_rows, sample_rows = [], []
    for phase, batch in (("infer", 1), ("infer", 64), ("infer", 1024), ("train", 64)):
        base = rng.uniform(20, 400, n_runs)
        for name, factor in (("median", 1.0), ("p10", 0.9), ("p90", 1.2), ("iqr", 0.1), ("first_call", 50.0),
                             ("max_abs_err", 1e-7)):
            metric_rows.append(pd.DataFrame({"run_id": ids, "phase": phase, "batch_size": batch, "name": name,
                                             "value": base * factor, "unit": "us"}))
        sample_rows.append(pd.DataFrame({
            "run_id": np.repeat(ids, 100), "phase": phase, "batch_size": batch, "idx": np.tile(np.arange(100), n_runs),
            "value": np.repeat(base, 100) * rng.uniform(0.9, 1.2, n_runs * 100), "unit": "us"}))
    metrics = pd.concat(metric_rows)
    samples = pd.concat(sample_rows)
    with store.transaction() as con:
        # Runs take their ids from the sequence (1..n in a fresh store), so later runs never collide with them.
        for table, frame, exclude in (("runs", runs, "EXCLUDE (id)"), ("metrics", metrics, ""),
                                      ("samples", samples, "")):
            con.register("frame", frame)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * {exclude} FROM frame")
            con.unregister("frame")
    print(f"filled {store.path}: {n_runs} runs, {len(metrics)} metrics, {len(samples)} samples")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "results.duckdb"
        os.environ["RESULTS_DB"] = str(db)
        os.environ["MODELS_DIR"] = str(Path(tmp) / "models")
        fill(Store(db), args.runs)
        from streamlit.testing.v1 import AppTest

        times = []
        for i in range(args.repeats):
            at = AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=60)
            start = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - start)
            if at.exception:
                print("Home raised:", at.exception[0].message)
                return 1
            print(f"render {i + 1}: {times[-1] * 1e3:.0f} ms")
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    print(f"\nHome with {args.runs} runs: first render {times[0] * 1e3:.0f} ms, "
          f"steady-state median {steady * 1e3:.0f} ms (target ≤ 1500 ms)")
    return 0 if steady <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
