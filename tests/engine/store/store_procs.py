"""Processes for the store's concurrency test: `python -m tests.engine.store.store_procs writer|reader DB GO STOP ...`.

Each waits for the GO file so that all of them hammer the database at the same time, then prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from engine.store.db import Metric, RunResult, Samples, Store


def _wait_for(path: Path, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def writer(db: str, go: str, tag: str, n: int) -> dict:
    store = Store(db)
    _wait_for(Path(go))
    ids = []
    for i in range(n):
        run_id = store.create_run("bench", "house_price", f"mode-{tag}", "cpu", {"i": i}, group_id=tag)
        store.record_result(run_id, RunResult(
            metrics=[Metric("median", float(i), "us", "infer", 1), Metric("p10", float(i) / 2, "us", "infer", 1)],
            samples=[Samples("infer", [float(i), float(i) + 1, float(i) + 2], "us", 1)],
        ))
        ids.append(run_id)
    return {"tag": tag, "ids": ids}


def reader(db: str, go: str, stop: str) -> dict:
    store = Store(db)
    _wait_for(Path(go))
    seen = []
    while True:
        last = Path(stop).exists()  # one more read after the writers are done
        frame = store.query("SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM metrics) AS metrics")
        seen.append([int(frame["runs"].iloc[0]), int(frame["metrics"].iloc[0])])
        if last:
            break
        time.sleep(0.01)
    return {"reads": seen}


def main(argv: list[str]) -> int:
    role, db, go = argv[0], argv[1], argv[2]
    if role == "writer":
        out = writer(db, go, argv[3], int(argv[4]))
    elif role == "reader":
        out = reader(db, go, argv[3])
    else:
        raise SystemExit(f"unknown role {role!r}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
