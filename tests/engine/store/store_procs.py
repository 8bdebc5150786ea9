"""Processes for the store's concurrency tests: `python -m tests.engine.store.store_procs writer|reader DB GO STOP ...`
(each waits for the GO file so that all of them hammer the database at the same time) and `... hold DB GO SECONDS DONE`
(once GO appears, keeps the database open read-only for SECONDS, as a long reader does, then writes the time it let go
to DONE). Each prints one JSON line.
"""

from __future__ import annotations

import json
import os
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


def hold(db: str, go: str, seconds: float, done: str) -> dict:
    import duckdb  # before GO: the hold starts the moment GO appears

    _wait_for(Path(go), limit_s=120.0)
    deadline = time.monotonic() + 60
    while True:  # a writer may hold it this instant
        try:
            con = duckdb.connect(db, read_only=True)
            break
        except duckdb.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    held_at = time.time()
    time.sleep(seconds)
    con.close()
    released_at = time.time()
    tmp = Path(done).with_suffix(".tmp")
    tmp.write_text(json.dumps({"held_at": held_at, "released_at": released_at}))
    os.replace(tmp, done)
    return {"held_at": held_at, "released_at": released_at}


def main(argv: list[str]) -> int:
    role, db, go = argv[0], argv[1], argv[2]
    if role == "writer":
        out = writer(db, go, argv[3], int(argv[4]))
    elif role == "reader":
        out = reader(db, go, argv[3])
    elif role == "hold":
        out = hold(db, go, float(argv[3]), argv[4])
    else:
        raise SystemExit(f"unknown role {role!r}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
