"""engine.store.db: schema and migrations, the run lifecycle, queries, stale runs, and several processes on one file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from engine.store.db import SCHEMA_VERSION, Artifact, Metric, RunResult, Samples, Store, StoreError, pid_alive
from engine.store.report import with_speedup

REPO_ROOT = Path(__file__).resolve().parents[3]
ALL_TABLES = {"schema_version", "runs", "metrics", "samples", "environments", "artifacts"}


def tables(path: Path) -> set[str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def columns(path: Path, table: str) -> list[str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [table]).fetchall()]


# -- schema ----------------------------------------------------------------------------------------------------------

def test_fresh_init_creates_every_table_at_the_current_version(tmp_path):
    store = Store(tmp_path / "sub" / "results.duckdb")
    assert store.init() == SCHEMA_VERSION
    assert store.schema_version() == SCHEMA_VERSION
    assert ALL_TABLES <= tables(store.path)
    assert "notes" in columns(store.path, "runs")
    versions = store.query("SELECT version FROM schema_version ORDER BY version")["version"].tolist()
    assert versions == list(range(1, SCHEMA_VERSION + 1))


def test_init_twice_is_idempotent(tmp_path):
    store = Store(tmp_path / "results.duckdb")
    store.init()
    run_id = store.create_run("bench", "house_price", "eager", "cpu")
    assert store.init() == SCHEMA_VERSION
    assert store.query("SELECT count(*) AS n FROM schema_version")["n"].iloc[0] == SCHEMA_VERSION
    assert store.run(run_id)["status"] == "queued"
    assert store.create_run("bench", "house_price", "eager", "cpu") == run_id + 1


def test_migration_from_v1_keeps_data_and_adds_the_new_schema(tmp_path):
    store = Store(tmp_path / "results.duckdb")
    assert store.init(upto=1) == 1
    assert store.schema_version() == 1
    assert "environments" not in tables(store.path) and "artifacts" not in tables(store.path)
    assert "notes" not in columns(store.path, "runs")
    # Rows as a v1 build of Mode Lab wrote them (SQL valid at v1 only: no notes column).
    with duckdb.connect(str(store.path)) as con:
        run_id = con.execute(
            "INSERT INTO runs (group_id, kind, workload, mode, device, status, params, progress, message, pid, host, "
            "created_at, started_at, finished_at) VALUES ('g1', 'bench', 'house_price', 'eager', 'cpu', 'ok', "
            "'{\"iters\": 5}', 1, 'done', 1, 'oldhost', now(), now(), now()) RETURNING id").fetchone()[0]
        con.execute("INSERT INTO metrics VALUES (?, 'infer', 1, 'median', 12.5, 'us'), "
                    "(?, 'infer', 1, 'p10', 10.0, 'us')", [run_id, run_id])
        con.execute("INSERT INTO samples VALUES (?, 'infer', 1, 0, 12.0, 'us'), (?, 'infer', 1, 1, 13.0, 'us')",
                    [run_id, run_id])

    assert store.init() == SCHEMA_VERSION
    assert store.schema_version() == SCHEMA_VERSION
    assert ALL_TABLES <= tables(store.path)
    assert "notes" in columns(store.path, "runs")
    run = store.run(run_id)
    assert run["status"] == "ok" and run["params"] == {"iters": 5} and run["host"] == "oldhost"
    assert run["notes"] == []
    metrics = store.metrics([run_id]).set_index("name")["value"]
    assert metrics.to_dict() == {"median": 12.5, "p10": 10.0}
    assert store.samples([run_id])["value"].tolist() == [12.0, 13.0]
    # The new schema is usable on the migrated file, and ids continue after the old ones.
    new_id = store.create_run("bench", "house_price", "fx", "cpu")
    assert new_id > run_id
    store.record_result(new_id, RunResult(env={"python": "3.x", "threads": 2}, notes=["hello"]))
    assert store.environment(new_id)["threads"] == 2
    assert store.run(new_id)["notes"] == ["hello"]


def test_migration_6_adds_the_op_spread_and_keeps_old_profiles_readable(tmp_path):
    store = Store(tmp_path / "results.duckdb")
    assert store.init(upto=5) == 5
    assert "self_p10_us" not in columns(store.path, "op_stats")
    run_id = store.create_run("profile", "house_price", "eager", "cpu")
    with duckdb.connect(str(store.path)) as con:  # an op_stats row as a v5 build wrote it: totals only
        con.execute("INSERT INTO op_stats VALUES (?, 'train', 'operator', 'cpu', 'aten::addmm', 9, 90.0, 120.0, "
                    "NULL, '[[64,5]]', NULL)", [run_id])

    assert store.init() == SCHEMA_VERSION
    assert columns(store.path, "op_stats")[-2:] == ["self_p10_us", "self_p90_us"]
    (old,) = store.op_stats([run_id]).to_dict("records")
    assert (old["name"], old["calls"], old["self_us"]) == ("aten::addmm", 9, 90.0)
    assert pd.isna(old["self_p10_us"]) and pd.isna(old["self_p90_us"])  # never measured: missing, not zero
    new_id = store.create_run("profile", "house_price", "fx", "cpu")
    store.record_result(new_id, RunResult(op_stats=[{
        "phase": "train", "kind": "operator", "device": "cpu", "name": "aten::mm", "calls": 3, "self_us": 30.0,
        "total_us": 30.0, "self_p10_us": 8.0, "self_p90_us": 12.0}]))
    (row,) = store.op_stats([new_id]).to_dict("records")
    assert (row["self_p10_us"], row["self_p90_us"]) == (8.0, 12.0)


def test_newer_schema_version_refuses_with_a_clear_message(tmp_path):
    store = Store(tmp_path / "results.duckdb")
    store.init()
    with duckdb.connect(str(store.path)) as con:
        con.execute("INSERT INTO schema_version VALUES (?, 'from the future', now())", [SCHEMA_VERSION + 1])
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than this code's "
                                         rf"{SCHEMA_VERSION}"):
        store.init()


def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path):
    path = tmp_path / "results.duckdb"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(StoreError, match="cannot open"):
        Store(path, busy_timeout_s=2).init()


def test_reads_of_a_missing_store(tmp_path):
    store = Store(tmp_path / "nothing.duckdb")
    assert store.query("SELECT 1").empty
    assert store.fail_stale_runs() == []
    with pytest.raises(StoreError, match="no results database"):
        with store.connect(read_only=True):
            pass
    assert not store.path.exists()


def test_default_db_path_follows_results_db(monkeypatch, tmp_path):
    monkeypatch.setenv("RESULTS_DB", str(tmp_path / "elsewhere.duckdb"))
    assert Store().path == tmp_path / "elsewhere.duckdb"


# -- run lifecycle ---------------------------------------------------------------------------------------------------

def test_run_lifecycle_round_trip(store, tmp_path):
    run_id = store.create_run("bench", "house_price", "fx", "cpu", {"iters": 3, "batch_sizes": [1, 4]},
                              group_id="grp")
    run = store.run(run_id)
    assert run["status"] == "queued" and run["progress"] == 0 and run["group_id"] == "grp"
    assert run["params"] == {"iters": 3, "batch_sizes": [1, 4]}
    assert run["pid"] == os.getpid()
    assert pd.isna(run["started_at"])

    store.start_run(run_id, "warming up")
    run = store.run(run_id)
    assert run["status"] == "running" and run["message"] == "warming up" and not pd.isna(run["started_at"])

    store.update_progress(run_id, 0.25, "a quarter")
    assert (store.run(run_id)["progress"], store.run(run_id)["message"]) == (0.25, "a quarter")
    store.update_progress(run_id, 7.0, "x" * 2000)  # clamped, and the message cut to 500 characters
    run = store.run(run_id)
    assert run["progress"] == 1.0 and len(run["message"]) == 500
    store.update_progress(run_id, -1.0, "back")
    assert store.run(run_id)["progress"] == 0.0

    artifact = tmp_path / "graph.py"
    artifact.write_text("def forward(x): return x\n")
    result = RunResult(
        metrics=[Metric("median", 11.0, "us", "infer", 4), Metric("p10", 9.0, "us", "infer", 4),
                 Metric("steps", 3.0, "")],
        samples=[Samples("infer", [10.0, 11.0, 12.0], "us", 4), Samples("loss", [0.9, 0.5], "mse"),
                 Samples("empty", [], "us")],
        artifacts=[Artifact("text", "graph.py", str(artifact)), Artifact("log", "gone.log", str(tmp_path / "no"))],
        env={"python": "3.12.0", "torch": "2.13.0", "threads": 2, "hostname": "box", "device_name": "CPU: test"},
        notes=["DeprecationWarning: something", "second note"],
    )
    store.record_result(run_id, result)

    run = store.run(run_id)
    assert run["status"] == "ok" and run["progress"] == 1.0 and run["message"] == "done"
    assert pd.isna(run["error"]) and not pd.isna(run["finished_at"])
    assert run["notes"] == ["DeprecationWarning: something", "second note"]

    metrics = store.metrics([run_id])
    assert len(metrics) == 3
    row = metrics[metrics["name"] == "median"].iloc[0]
    assert (row["phase"], row["batch_size"], row["value"], row["unit"]) == ("infer", 4, 11.0, "us")
    steps = metrics[metrics["name"] == "steps"].iloc[0]
    assert pd.isna(steps["phase"]) and pd.isna(steps["batch_size"])

    samples = store.samples([run_id])
    assert len(samples) == 5  # the empty series stores nothing
    infer = store.samples([run_id], phase="infer")
    assert infer["idx"].tolist() == [0, 1, 2] and infer["value"].tolist() == [10.0, 11.0, 12.0]
    assert set(infer["batch_size"]) == {4}
    loss = store.samples([run_id], phase="loss")
    assert loss["value"].tolist() == [0.9, 0.5] and loss["unit"].tolist() == ["mse", "mse"]

    artifacts = store.artifacts(run_id).set_index("name")
    assert artifacts.loc["graph.py", "bytes"] == artifact.stat().st_size
    assert artifacts.loc["graph.py", "path"] == str(artifact)
    assert pd.isna(artifacts.loc["gone.log", "bytes"])

    env = store.environment(run_id)
    assert env["python"] == "3.12.0" and env["threads"] == 2 and env["device_name"] == "CPU: test"
    assert env["cuda"] is None or pd.isna(env["cuda"])

    assert store.status_counts() == {"queued": 0, "running": 0, "ok": 1, "failed": 0}
    assert store.runs(status=["ok"])["id"].tolist() == [run_id]
    assert store.runs(kind="train").empty
    assert store.runs(run_ids=[]).empty


def test_fail_run_keeps_the_error_tail(store):
    run_id = store.create_run("train", "house_price", "eager", "cpu")
    store.start_run(run_id)
    store.fail_run(run_id, "head " + "x" * 9000 + " the actual reason")
    run = store.run(run_id)
    assert run["status"] == "failed" and run["message"] == "failed"
    assert len(run["error"]) == 8000 and run["error"].endswith("the actual reason")
    assert not pd.isna(run["finished_at"])
    assert store.status_counts()["failed"] == 1


def test_a_failing_record_result_leaves_nothing_behind(store):
    run_id = store.create_run("bench", "house_price", "eager", "cpu")
    store.start_run(run_id)
    bad = RunResult(metrics=[Metric("median", 1.0, "us", "infer", 1), Metric("broken", "not a number", "")])
    with pytest.raises(ValueError):
        store.record_result(run_id, bad)
    assert store.metrics([run_id]).empty
    assert store.run(run_id)["status"] == "running"


def test_run_result_json_round_trip():
    result = RunResult(metrics=[Metric("median", 1.5, "us", "infer", 8)], samples=[Samples("train", [1.0, 2.0])],
                       artifacts=[Artifact("text", "a.txt", "/tmp/a.txt")], env={"torch": "x"}, notes=["n"])
    assert RunResult.from_json(result.to_json()) == result


# -- queries ---------------------------------------------------------------------------------------------------------

def add_bench(store: Store, mode: str, medians: dict[tuple[str, int], float], *, status: str = "ok",
              device: str = "cpu") -> int:
    run_id = store.create_run("bench", "house_price", mode, device, {"mode": mode})
    store.start_run(run_id)
    metrics = []
    for (phase, batch), median in medians.items():
        metrics += [Metric("median", median, "us", phase, batch), Metric("p10", median * 0.9, "us", phase, batch),
                    Metric("p90", median * 1.2, "us", phase, batch), Metric("first_call", median * 100, "us", phase,
                                                                             batch),
                    Metric("max_abs_err", 1e-7, "", phase, batch)]
    if status == "ok":
        store.record_result(run_id, RunResult(metrics=metrics))
    else:
        store.fail_run(run_id, "boom")
    return run_id


def test_latency_summary_per_phase_and_batch(store):
    old_eager = add_bench(store, "eager", {("infer", 1): 100.0, ("infer", 64): 400.0, ("train", 64): 900.0})
    fx = add_bench(store, "fx", {("infer", 1): 50.0, ("infer", 64): 200.0, ("train", 64): 1800.0})
    new_eager = add_bench(store, "eager", {("infer", 1): 120.0, ("infer", 64): 480.0, ("train", 64): 960.0})
    add_bench(store, "compile", {("infer", 1): 1.0}, status="failed")
    store.create_run("train", "house_price", "eager", "cpu")  # another kind, not ok: never in the summary

    latest = store.latency_summary()
    assert sorted(latest["run_id"].unique()) == [fx, new_eager]  # newest run per mode, ok runs only
    assert len(latest) == 6
    row = latest[(latest["mode"] == "eager") & (latest["phase"] == "infer") & (latest["batch_size"] == 64)].iloc[0]
    assert row["median_us"] == 480.0
    assert row["p10_us"] == pytest.approx(432.0) and row["p90_us"] == pytest.approx(576.0)
    assert row["first_call_us"] == pytest.approx(48_000.0) and row["max_abs_err"] == pytest.approx(1e-7)
    assert pd.isna(row["recompiles"])

    everything = store.latency_summary(latest_only=False)
    assert sorted(everything["run_id"].unique()) == [old_eager, fx, new_eager]
    assert len(everything) == 9
    assert store.latency_summary(device="cuda").empty
    assert store.latency_summary(workload="other").empty


def test_latency_summary_latest_is_per_device(store):
    cpu = add_bench(store, "eager", {("infer", 1): 100.0})
    gpu = add_bench(store, "eager", {("infer", 1): 10.0}, device="cuda")
    assert sorted(store.latency_summary()["run_id"]) == [cpu, gpu]
    assert store.latency_summary(device="cpu")["run_id"].tolist() == [cpu]


def test_with_speedup_is_eager_over_mode(store):
    add_bench(store, "eager", {("infer", 1): 999.0})  # an older eager run: the latest one counts
    add_bench(store, "eager", {("infer", 1): 100.0, ("train", 64): 900.0})
    add_bench(store, "fx", {("infer", 1): 50.0, ("train", 64): 1800.0})
    add_bench(store, "torchscript", {("infer", 4): 10.0})  # no eager row at batch 4
    out = with_speedup(store.latency_summary()).set_index(["mode", "phase", "batch_size"])["speedup_vs_eager"]
    assert out[("eager", "infer", 1)] == pytest.approx(1.0)
    assert out[("fx", "infer", 1)] == pytest.approx(2.0)
    assert out[("fx", "train", 64)] == pytest.approx(0.5)
    assert np.isnan(out[("torchscript", "infer", 4)])
    # Over every run, eager's median is that of the newest eager run.
    everything = with_speedup(store.latency_summary(latest_only=False))
    fx_row = everything[(everything["mode"] == "fx") & (everything["phase"] == "infer")].iloc[0]
    assert fx_row["speedup_vs_eager"] == pytest.approx(2.0)


def test_with_speedup_of_an_empty_frame(store):
    out = with_speedup(store.latency_summary())
    assert out.empty and "speedup_vs_eager" in out.columns


# -- stale runs ------------------------------------------------------------------------------------------------------

def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


def test_fail_stale_runs_fails_runs_of_dead_owners_only(store):
    gone = dead_pid()
    running_dead = store.create_run("bench", "house_price", "eager", "cpu", pid=gone)
    store.start_run(running_dead)
    queued_dead = store.create_run("bench", "house_price", "fx", "cpu", pid=gone)
    running_alive = store.create_run("bench", "house_price", "eager", "cpu")  # owned by this (live) process
    store.start_run(running_alive)
    finished_dead = store.create_run("bench", "house_price", "eager", "cpu", pid=gone)
    store.record_result(finished_dead, RunResult())
    other_host = store.create_run("bench", "house_price", "eager", "cpu", pid=gone)
    store.start_run(other_host)
    with store.connect() as con:  # another machine's run: its pid means nothing here
        con.execute("UPDATE runs SET host = 'some-other-host' WHERE id = ?", [other_host])

    assert sorted(store.fail_stale_runs()) == [running_dead, queued_dead]
    for run_id in (running_dead, queued_dead):
        run = store.run(run_id)
        assert run["status"] == "failed"
        assert run["error"].startswith("interrupted") and f"pid {gone}" in run["error"]
    assert store.run(running_alive)["status"] == "running"
    assert store.run(finished_dead)["status"] == "ok"
    assert store.run(other_host)["status"] == "running"
    assert store.fail_stale_runs() == []  # nothing left to fail


def test_pid_alive():
    assert pid_alive(os.getpid())
    assert not pid_alive(None) and not pid_alive(0)
    assert not pid_alive(dead_pid())
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited but not yet reaped: a zombie owns nothing
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert not pid_alive(zombie.pid)
    zombie.wait()


def test_threads_of_one_process_wait_for_each_other(store):
    """The dashboard serves each browser session from its own thread: a write while another thread reads must wait
    for the read to finish, as it would for another process, not fail."""
    import threading

    holding, release = threading.Event(), threading.Event()

    def read_slowly():
        with store.connect(read_only=True) as con:
            con.execute("SELECT count(*) FROM runs").fetchone()
            holding.set()
            release.wait(10)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        assert holding.wait(10)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        run_id = store.create_run("bench", "house_price", "eager", "cpu")
        assert time.monotonic() - started >= 0.2  # it waited for the reader
    finally:
        release.set()
        reader.join()
    assert store.run(run_id)["status"] == "queued"


# -- several processes on one file -----------------------------------------------------------------------------------

# Every store call opens the file (~20 ms in DuckDB 2.0) and a run takes two calls, so 80 runs across two writers
# and a reader take about 9 s on two idle cores.
WRITES = {"a": 50, "b": 30}


def test_concurrent_writers_and_a_reader_lose_nothing(store, tmp_path, child_env):
    go, stop = tmp_path / "go", tmp_path / "stop"
    cmd = [sys.executable, "-m", "tests.engine.store.store_procs"]
    opts = dict(cwd=REPO_ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writers = {tag: subprocess.Popen([*cmd, "writer", str(store.path), str(go), tag, str(n)], **opts)
               for tag, n in WRITES.items()}
    reader = subprocess.Popen([*cmd, "reader", str(store.path), str(go), str(stop)], **opts)
    go.touch()
    outputs = {}
    try:
        for tag, proc in writers.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"writer {tag} failed:\n{err}"
            outputs[tag] = json.loads(out.strip().splitlines()[-1])
        stop.touch()
        out, err = reader.communicate(timeout=30)
        assert reader.returncode == 0, f"reader failed:\n{err}"
    finally:
        for proc in (*writers.values(), reader):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reads = json.loads(out.strip().splitlines()[-1])["reads"]

    total = sum(WRITES.values())
    all_ids = [i for o in outputs.values() for i in o["ids"]]
    assert len(all_ids) == len(set(all_ids)) == total
    for tag, n in WRITES.items():
        runs = store.query("SELECT id, status FROM runs WHERE group_id = ? ORDER BY id", [tag])
        assert runs["id"].tolist() == sorted(outputs[tag]["ids"])
        assert set(runs["status"]) == {"ok"}
        per_run = store.query("SELECT r.params, count(*) AS n, sum(m.value) AS total FROM runs r JOIN metrics m "
                              "ON m.run_id = r.id WHERE r.group_id = ? GROUP BY ALL", [tag])
        assert len(per_run) == n and set(per_run["n"]) == {2}
        assert sum(per_run["total"]) == pytest.approx(1.5 * sum(range(n)))
    assert store.query("SELECT count(*) AS n FROM metrics")["n"].iloc[0] == 2 * total
    assert store.query("SELECT count(*) AS n FROM samples")["n"].iloc[0] == 3 * total

    assert len(reads) >= 3, "the reader never got in while the writers ran"
    run_counts = [r[0] for r in reads]
    metric_counts = [r[1] for r in reads]
    assert run_counts == sorted(run_counts) and metric_counts == sorted(metric_counts)
    assert reads[-1] == [total, 2 * total]
    assert any(0 < r[0] < total for r in reads), "the reader saw no intermediate state: no real concurrency"


def test_threads_opening_and_closing_one_store_wait_for_each_other(tmp_path):
    """Two lanes of a sweep are threads of one process: while one detaches the file another may be attaching it,
    and DuckDB says "Unique file handle conflict" — as temporary as a lock, so it is waited out, never a failed run."""
    import threading

    store = Store(tmp_path / "r.duckdb")
    store.init()
    errors: list[str] = []

    def work(read_only: bool) -> None:
        for _ in range(150):
            try:
                with store.connect(read_only=read_only) as con:
                    con.execute("SELECT count(*) FROM runs").fetchone()
            except StoreError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=work, args=(ro,)) for ro in (False, False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_one_process_holds_one_connection_to_a_store_at_a_time(store):
    """DuckDB's lock between processes is an fcntl lock, owned by the process: a second instance of the file in this
    process (another thread's read while one writes) dropped the process's write lock when it closed, and a writer
    in another process then committed beside ours. So even two reads in two threads take turns."""
    import threading

    holding, release = threading.Event(), threading.Event()
    finished: list[float] = []

    def hold_a_read() -> None:
        with store.connect(read_only=True) as con:
            con.execute("SELECT count(*) FROM runs").fetchone()
            holding.set()
            release.wait(10)
            finished.append(time.monotonic())

    holder = threading.Thread(target=hold_a_read)
    holder.start()
    try:
        assert holding.wait(10)
        threading.Timer(0.3, release.set).start()
        assert store.query("SELECT count(*) AS n FROM runs")["n"].iloc[0] == 0
        read_at = time.monotonic()
    finally:
        release.set()
        holder.join()
    assert finished and read_at >= finished[0]  # the second read began only after the first connection closed


def test_a_forked_child_starts_with_no_turn_taken_at_the_store(store, tmp_path):
    """A thread holding its turn at fork() does not exist in the child: the child must not wait for it forever. (The
    child only takes the turn: DuckDB itself is not fork-safe while the parent has the file open.)"""
    import threading

    from engine.store import db as store_module

    holding, release = threading.Event(), threading.Event()

    def hold_a_read() -> None:
        with store.connect(read_only=True):
            holding.set()
            release.wait(20)

    holder = threading.Thread(target=hold_a_read)
    holder.start()
    assert holding.wait(10)
    out = tmp_path / "child.txt"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with store_module._one_thread_at_a_time(store.path, 2.0):
                out.write_text("took the turn")
            code = 0
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.WEXITSTATUS(status) == 0 and out.read_text() == "took the turn"


def test_a_reader_of_a_store_being_created_sees_no_runs_and_a_foreign_file_still_raises(tmp_path):
    """A reader can open the file between a first command's first statements (the file there, the runs table not
    yet): it reads an empty frame as before the file existed. A DuckDB file with other tables is no store: the
    missing table stays an error."""
    path = tmp_path / "results.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description VARCHAR, applied_at TIMESTAMP)")
    con.close()
    assert Store(path).runs(kind="bench").empty
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (a INTEGER)")
    con.close()
    with pytest.raises(duckdb.CatalogException):
        Store(path).runs()
