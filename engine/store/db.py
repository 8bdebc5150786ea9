"""The results store: one DuckDB file, a versioned schema, and short-lived connections.

DuckDB lets one process hold a database file for writing, and no other process may open it (even read-only) while
that lasts. The dashboard reads, workers' supervisors write, and a CLI may run beside both, so nobody keeps a
connection open: every call opens, does its work in one transaction, and closes, retrying while another process
holds the lock. Writes are small and fast (a run's results land in one transaction), so waits stay short.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pandas as pd

from engine.store import settings

REPO_ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("queued", "running", "ok", "failed")


def default_db_path() -> Path:
    """`RESULTS_DB` if set, else results.duckdb in the repository root."""
    return settings.get("RESULTS_DB") or REPO_ROOT / "results.duckdb"


class StoreError(RuntimeError):
    pass


class StoreBusyError(StoreError):
    """Another process held the database past our patience."""


T = TypeVar("T")


def while_busy(action: Callable[[], T], wait_s: float, on_busy: Callable[[StoreBusyError], None] | None = None) -> T:
    """action(), tried again while the store stays busy (each try already waits the Store's busy_timeout_s) until
    wait_s have passed in all; then the last StoreBusyError. For writes that must not be lost to a long reader (a
    finished run's result), where one busy timeout is too little patience. on_busy hears each busy try."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return action()
        except StoreBusyError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if on_busy:
                on_busy(exc)
            time.sleep(min(1.0, left))


class StoreDamagedError(StoreError):
    """The database file is truncated or corrupted. Nothing was written to it: the message says what to do."""


# What DuckDB says about a file it cannot trust (its wording in duckdb 1.x/2.x), lower-cased.
_DAMAGE_SIGNS = ("not a valid duckdb database file", "could not read enough bytes", "corrupt database file",
                 "does not match stored checksum", "failed to deserialize", "database has been invalidated")
_HEADER_BYTES = 3 * 4096  # DuckDB's main header, then two database headers (the newer one is live)


def is_damage_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(sign in text for sign in _DAMAGE_SIGNS)


def damaged_message(path: Path, reason: str) -> str:
    """One line: which file, that nothing was changed, and what to do."""
    reason = next((line.strip() for line in reason.splitlines() if line.strip()), "unreadable")[:200]
    return (f"cannot open the results store {path}: it is damaged ({reason}); nothing was changed — it is left "
            "exactly as it is. "
            f"Move it aside (e.g. mv {path} {path}.damaged) and start again: a fresh, empty store is created on the "
            "next start")


def file_damage(path: Path) -> str | None:
    """What is wrong with the file before DuckDB is asked to open it (empty, or no DuckDB header: another kind of file,
    which DuckDB would otherwise try to open with an extension it downloads, e.g. SQLite's), or None."""
    try:
        with path.open("rb") as f:
            head = f.read(12)
    except OSError:
        return None
    if not head:
        return "the file is empty (0 bytes)"
    if head[8:12] != b"DUCK":  # DuckDB's main header: an 8-byte checksum, then its magic bytes
        return "not a valid DuckDB database file (no DuckDB header)"
    return None


def missing_blocks(con: duckdb.DuckDBPyConnection, path: Path) -> str | None:
    """Truncation check on a read-only connection: every data block the tables use must lie inside the file.

    Metadata only (pragma_storage_info), no data is read. DuckDB opens a truncated file happily and fails only on the
    first read of a missing block, which could come after a write connection was opened; this finds it first."""
    block_size = con.execute("SELECT block_size FROM pragma_database_size() LIMIT 1").fetchone()[0]
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()]
    highest = -1
    for table in tables:
        row = con.execute(
            "SELECT max(block_id), max(list_max(additional_block_ids)) FROM pragma_storage_info(?) "
            "WHERE persistent AND block_id >= 0 AND block_id < 4611686018427387904", [table]).fetchone()
        highest = max([highest, *(int(v) for v in row if v is not None)])
    if highest < 0 or not block_size:
        return None
    size, needed = path.stat().st_size, _HEADER_BYTES + (highest + 1) * int(block_size)
    if size < needed:
        return f"truncated: {size:,} bytes, but its tables use blocks up to byte {needed:,}"
    return None


# Each migration is applied once, in order, inside one transaction; never edit a released one, append a new one.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "runs, metrics and raw samples", [
        "CREATE SEQUENCE run_id_seq START 1",
        """CREATE TABLE runs (
            id BIGINT PRIMARY KEY DEFAULT nextval('run_id_seq'),
            group_id VARCHAR,
            kind VARCHAR NOT NULL,
            workload VARCHAR NOT NULL,
            mode VARCHAR NOT NULL,
            device VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            error VARCHAR,
            params VARCHAR,
            progress DOUBLE DEFAULT 0,
            message VARCHAR,
            pid INTEGER,
            host VARCHAR,
            created_at TIMESTAMP NOT NULL,
            started_at TIMESTAMP,
            finished_at TIMESTAMP
        )""",
        """CREATE TABLE metrics (
            run_id BIGINT NOT NULL,
            phase VARCHAR,
            batch_size INTEGER,
            name VARCHAR NOT NULL,
            value DOUBLE,
            unit VARCHAR
        )""",
        """CREATE TABLE samples (
            run_id BIGINT NOT NULL,
            phase VARCHAR NOT NULL,
            batch_size INTEGER,
            idx INTEGER NOT NULL,
            value DOUBLE NOT NULL,
            unit VARCHAR
        )""",
    ]),
    (2, "environment per run, artifacts, notes, indexes", [
        """CREATE TABLE environments (
            run_id BIGINT PRIMARY KEY,
            python VARCHAR, torch VARCHAR, triton VARCHAR, cuda VARCHAR,
            device_name VARCHAR, cpu_model VARCHAR, threads INTEGER,
            git_commit VARCHAR, hostname VARCHAR, platform VARCHAR
        )""",
        """CREATE TABLE artifacts (
            run_id BIGINT NOT NULL,
            kind VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            path VARCHAR NOT NULL,
            bytes BIGINT,
            created_at TIMESTAMP
        )""",
        "ALTER TABLE runs ADD COLUMN notes VARCHAR",
        "CREATE INDEX runs_status_idx ON runs(status)",
        "CREATE INDEX metrics_run_idx ON metrics(run_id)",
        "CREATE INDEX samples_run_idx ON samples(run_id)",
    ]),
    (3, "profiler op/kernel statistics and Nsight Compute kernel metrics", [
        # One row per (run, phase, kind, device, name): operators and runtime calls on the host, kernels and copies
        # on the device; times summed over the profiled (active) steps, in µs.
        """CREATE TABLE op_stats (
            run_id BIGINT NOT NULL,
            phase VARCHAR,
            kind VARCHAR NOT NULL,
            device VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            calls BIGINT,
            self_us DOUBLE,
            total_us DOUBLE,
            device_us DOUBLE,
            input_shapes VARCHAR,
            parent VARCHAR
        )""",
        """CREATE TABLE ncu_kernel_metrics (
            run_id BIGINT NOT NULL,
            phase VARCHAR,
            kernel VARCHAR NOT NULL,
            launches INTEGER,
            duration_us DOUBLE,
            mem_throughput_pct DOUBLE,
            sm_throughput_pct DOUBLE,
            metrics VARCHAR
        )""",
        "CREATE INDEX op_stats_run_idx ON op_stats(run_id)",
        "CREATE INDEX ncu_kernel_metrics_run_idx ON ncu_kernel_metrics(run_id)",
    ]),
    (4, "provenance of runs merged in from other stores", [
        # One row per copied run: where it came from, so merging the same store twice copies nothing new.
        """CREATE TABLE merged_runs (
            run_id BIGINT PRIMARY KEY,
            source VARCHAR,
            source_host VARCHAR,
            source_run_id BIGINT,
            source_created_at TIMESTAMP,
            merged_at TIMESTAMP
        )""",
    ]),
    (5, "the conditions a run was timed under and its noise judgement", [
        # JSON (engine.measure.noise.record): {"state": clean|noisy|interfered, "flags": [...], "series": [...]}
        "ALTER TABLE runs ADD COLUMN conditions VARCHAR",
    ]),
    (6, "the spread of each profiled operator's self time over the steps", [
        # Per op_stats row: the 10th and 90th percentile of its self time per profiled step, in µs (NULL for rows
        # stored before: they kept only the totals).
        "ALTER TABLE op_stats ADD COLUMN self_p10_us DOUBLE",
        "ALTER TABLE op_stats ADD COLUMN self_p90_us DOUBLE",
    ]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
OP_STATS_COLUMNS = ("phase", "kind", "device", "name", "calls", "self_us", "total_us", "device_us", "input_shapes",
                    "parent", "self_p10_us", "self_p90_us")
KERNEL_METRICS_COLUMNS = ("phase", "kernel", "launches", "duration_us", "mem_throughput_pct", "sm_throughput_pct",
                          "metrics")


@dataclass
class Metric:
    name: str
    value: float
    unit: str = ""
    phase: str | None = None
    batch_size: int | None = None


@dataclass
class Samples:
    """Every raw sample of one series (latencies in µs, or a loss per step)."""
    phase: str
    values: list[float]
    unit: str = "us"
    batch_size: int | None = None


@dataclass
class Artifact:
    kind: str
    name: str
    path: str


@dataclass
class RunResult:
    """What a worker hands back: everything a run produced, persisted in one transaction."""
    metrics: list[Metric] = field(default_factory=list)
    samples: list[Samples] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Profiles: rows for the op_stats and ncu_kernel_metrics tables (dicts keyed by column name, run_id left out).
    op_stats: list[dict[str, Any]] = field(default_factory=list)
    kernel_metrics: list[dict[str, Any]] = field(default_factory=list)
    # The timing conditions and noise judgement (engine.measure.noise.record): stored in runs.conditions.
    conditions: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps({
            "metrics": [m.__dict__ for m in self.metrics],
            "samples": [s.__dict__ for s in self.samples],
            "artifacts": [a.__dict__ for a in self.artifacts],
            "env": self.env,
            "notes": self.notes,
            "op_stats": self.op_stats,
            "kernel_metrics": self.kernel_metrics,
            "conditions": self.conditions,
        })

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        d = json.loads(text)
        return cls(
            metrics=[Metric(**m) for m in d.get("metrics", [])],
            samples=[Samples(**s) for s in d.get("samples", [])],
            artifacts=[Artifact(**a) for a in d.get("artifacts", [])],
            env=d.get("env", {}),
            notes=d.get("notes", []),
            op_stats=d.get("op_stats", []),
            kernel_metrics=d.get("kernel_metrics", []),
            conditions=d.get("conditions"),
        )


def _insert_artifacts(con: duckdb.DuckDBPyConnection, run_id: int, artifacts: Sequence[Artifact]) -> None:
    """A run's files, each with its size when it exists (inside the caller's transaction)."""
    for a in artifacts:
        size = Path(a.path).stat().st_size if Path(a.path).exists() else None
        con.execute("INSERT INTO artifacts VALUES (?, ?, ?, ?, ?, ?)", [run_id, a.kind, a.name, a.path, size, _now()])


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# The error classes a busy file shows up as (ResourceInUseException: DuckDB >= 1.1, where it exists).
_BUSY_ERRORS: tuple[type[Exception], ...] = tuple(
    c for c in (duckdb.IOException, duckdb.ConnectionException, getattr(duckdb, "ResourceInUseException", None))
    if c is not None)


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    # "different configuration" / "unique file handle conflict": DuckDB's refusals when one process opens a file it
    # already has open. Store's own connections no longer overlap within a process (_one_thread_at_a_time), but other
    # DuckDB users of the file in this process (an ATTACH) can still cause them, and they are as temporary as
    # another process's lock.
    return "lock" in text or "conflicting" in text or "different configuration" in text \
        or "unique file handle conflict" in text


# DuckDB's lock between processes is an fcntl lock, which belongs to the process: when a second DuckDB instance of the
# same file in this process (another thread opening it read-only while one writes) closes its file, the process's
# write lock goes with it, and a writer in another process then commits beside ours (seen as "Conflicting lock ...
# .wal" at commit, and as a reader finding blocks past the end of the file). So within one process a store file has
# one connection at a time: threads take turns here, and DuckDB's lock keeps working between processes.
_FILE_TURNS: dict[str, threading.RLock] = {}
_FILE_TURNS_GUARD = threading.Lock()


def _forget_turns_after_fork() -> None:
    # A thread that held a turn at fork() does not exist in the child: start the child with no turns taken.
    global _FILE_TURNS_GUARD
    _FILE_TURNS.clear()
    _FILE_TURNS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forget_turns_after_fork)


@contextmanager
def _one_thread_at_a_time(path: Path, timeout_s: float) -> Iterator[None]:
    """This thread's turn at the file (re-entrant: a connection may open its read-only probe inside its turn)."""
    key = os.path.realpath(path)
    with _FILE_TURNS_GUARD:
        turn = _FILE_TURNS.setdefault(key, threading.RLock())
    if not turn.acquire(timeout=timeout_s):
        raise StoreBusyError(f"{path} stayed in use by another thread of this process for {timeout_s:.0f} s")
    try:
        yield
    finally:
        turn.release()


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0) but will never write again.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class Store:
    """All reads and writes of the results database. Cheap to construct; holds no connection."""

    def __init__(self, path: str | os.PathLike[str] | None = None, busy_timeout_s: float = 60.0):
        self.path = Path(path) if path is not None else default_db_path()
        self.busy_timeout_s = busy_timeout_s
        self._checked = False  # the file passed the read-only damage check (done before this Store first writes)

    # -- connections -------------------------------------------------------------------------------------------
    @contextmanager
    def connect(self, read_only: bool = False, config: dict[str, Any] | None = None
                ) -> Iterator[duckdb.DuckDBPyConnection]:
        """Open, yield, close; retry with backoff while another process holds the file. config: DuckDB settings the
        connection opens with (engine.store.sql's locked read-only window).

        A truncated or corrupted file raises StoreDamagedError (one line: which file, nothing changed, what to do),
        whether it shows on open or in a later read; the file is never written to, moved or replaced. Threads of one
        process take turns (_one_thread_at_a_time)."""
        with _one_thread_at_a_time(self.path, self.busy_timeout_s):
            with self._connect(read_only, config) as con:
                yield con

    @contextmanager
    def _connect(self, read_only: bool, config: dict[str, Any] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a results database file")
        if read_only and not self.path.exists():
            raise StoreError(f"no results database at {self.path} (it is created by the first run)")
        if self.path.exists():
            damage = file_damage(self.path)
            if damage:
                raise StoreDamagedError(damaged_message(self.path, damage))
            if not read_only and not self._checked:
                # A write connection may checkpoint into the file: look at a damaged one read-only first, never write.
                with self.connect(read_only=True) as probe:
                    damage = missing_blocks(probe, self.path)
                if damage:
                    raise StoreDamagedError(damaged_message(self.path, damage))
                self._checked = True
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only, config=dict(config or {}))
                break
            except duckdb.Error as exc:
                if is_damage_error(exc):
                    raise StoreDamagedError(damaged_message(self.path, str(exc))) from exc
                if not isinstance(exc, _BUSY_ERRORS) or not _is_lock_error(exc):
                    raise StoreError(f"cannot open {self.path}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise StoreBusyError(
                        f"{self.path} stayed locked by another process for {self.busy_timeout_s:.0f} s: {exc}"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        try:
            if read_only and not self._checked:  # the same truncation check as before a first write, on this one
                damage = missing_blocks(con, self.path)
                if damage:
                    raise StoreDamagedError(damaged_message(self.path, damage))
                self._checked = True
            yield con
        except duckdb.Error as exc:
            if is_damage_error(exc):  # damage in a block that only a query reads
                raise StoreDamagedError(damaged_message(self.path, str(exc))) from exc
            raise
        finally:
            con.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    # -- schema ------------------------------------------------------------------------------------------------
    def init(self, upto: int | None = None) -> int:
        """Create the database if needed and apply pending migrations (up to `upto`, for tests). Returns the version."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder of the results database {self.path}: "
                             f"{exc.strerror or exc}") from None
        target = SCHEMA_VERSION if upto is None else upto
        with self.connect() as con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, description VARCHAR, "
                "applied_at TIMESTAMP)"
            )
            current = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {current}, newer than this code's {SCHEMA_VERSION}; "
                    "update Mode Lab or point RESULTS_DB elsewhere"
                )
            for version, description, statements in MIGRATIONS:
                if current < version <= target:
                    con.execute("BEGIN TRANSACTION")
                    try:
                        for sql in statements:
                            con.execute(sql)
                        con.execute("INSERT INTO schema_version VALUES (?, ?, ?)", [version, description, _now()])
                    except BaseException:
                        con.execute("ROLLBACK")
                        raise
                    con.execute("COMMIT")
                    current = version
        return current

    def schema_version(self) -> int:
        with self.connect(read_only=True) as con:
            return con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]

    # -- run lifecycle -----------------------------------------------------------------------------------------
    def create_run(self, kind: str, workload: str, mode: str, device: str, params: dict[str, Any] | None = None,
                   group_id: str | None = None, pid: int | None = None) -> int:
        with self.connect() as con:
            row = con.execute(
                "INSERT INTO runs (group_id, kind, workload, mode, device, status, params, message, pid, host, "
                "created_at) VALUES (?, ?, ?, ?, ?, 'queued', ?, 'queued', ?, ?, ?) RETURNING id",
                [group_id, kind, workload, mode, device, json.dumps(params or {}), pid or os.getpid(),
                 socket.gethostname(), _now()],
            ).fetchone()
        return int(row[0])

    def set_owner(self, run_ids: Sequence[int], pid: int) -> None:
        """Record which process is responsible for these runs (for the stale-run check)."""
        with self.connect() as con:
            con.execute(f"UPDATE runs SET pid = ? WHERE id IN ({','.join('?' * len(run_ids))})", [pid, *run_ids])

    def start_run(self, run_id: int, message: str = "starting") -> None:
        with self.connect() as con:
            con.execute(
                "UPDATE runs SET status = 'running', started_at = ?, progress = 0, message = ? WHERE id = ?",
                [_now(), message, run_id],
            )

    def update_progress(self, run_id: int, progress: float, message: str) -> None:
        with self.connect() as con:
            con.execute("UPDATE runs SET progress = ?, message = ? WHERE id = ?",
                        [max(0.0, min(1.0, progress)), message[:500], run_id])

    def fail_run(self, run_id: int, error: str, artifacts: Sequence[Artifact] = ()) -> None:
        """Mark the run failed with its reason; `artifacts` (its log, its phase timeline) are kept with it."""
        with self.transaction() as con:
            con.execute(
                "UPDATE runs SET status = 'failed', error = ?, message = 'failed', finished_at = ? WHERE id = ?",
                [error[-8000:], _now(), run_id],
            )
            _insert_artifacts(con, run_id, artifacts)

    def record_result(self, run_id: int, result: RunResult, only_if_active: bool = False) -> bool:
        """Persist everything a run produced and mark it ok, atomically. only_if_active: only while the run is still
        queued or running (checked inside the transaction, so of two processes recording the same result one does);
        False when it was not."""
        with self.transaction() as con:
            if only_if_active:
                row = con.execute("SELECT status FROM runs WHERE id = ?", [run_id]).fetchone()
                if row is None or row[0] not in ("queued", "running"):
                    return False
            if result.metrics:
                con.executemany(
                    "INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)",
                    [[run_id, m.phase, m.batch_size, m.name, float(m.value), m.unit] for m in result.metrics],
                )
            for s in result.samples:
                if s.values:
                    frame = pd.DataFrame({
                        "run_id": run_id, "phase": s.phase, "batch_size": s.batch_size,
                        "idx": range(len(s.values)), "value": s.values, "unit": s.unit,
                    })
                    con.register("new_samples", frame)
                    con.execute("INSERT INTO samples SELECT run_id, phase, batch_size, idx, value, unit "
                                "FROM new_samples")
                    con.unregister("new_samples")
            _insert_artifacts(con, run_id, result.artifacts)
            env = result.env
            if env:
                con.execute(
                    "INSERT OR REPLACE INTO environments VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [run_id, env.get("python"), env.get("torch"), env.get("triton"), env.get("cuda"),
                     env.get("device_name"), env.get("cpu_model"), env.get("threads"), env.get("git_commit"),
                     env.get("hostname"), env.get("platform")],
                )
            for table, columns, rows in (("op_stats", OP_STATS_COLUMNS, result.op_stats),
                                         ("ncu_kernel_metrics", KERNEL_METRICS_COLUMNS, result.kernel_metrics)):
                if rows:
                    marks = ", ".join("?" * (len(columns) + 1))
                    con.executemany(f"INSERT INTO {table} (run_id, {', '.join(columns)}) VALUES ({marks})",
                                    [[run_id, *(row.get(c) for c in columns)] for row in rows])
            con.execute(
                "UPDATE runs SET status = 'ok', progress = 1, message = 'done', error = NULL, notes = ?, "
                "conditions = ?, finished_at = ? WHERE id = ?",
                [json.dumps(result.notes) if result.notes else None,
                 json.dumps(result.conditions) if result.conditions else None, _now(), run_id],
            )
        return True

    def fail_stale_runs(self) -> list[int]:
        """Mark failed the queued/running runs of this host whose owning process is gone (kill -9, reboot)."""
        if not self.path.exists():
            return []
        host = socket.gethostname()
        with self.connect(read_only=True) as con:
            rows = con.execute(
                "SELECT id, pid FROM runs WHERE status IN ('queued', 'running') AND host = ?", [host]
            ).fetchall()
        stale = [(rid, pid) for rid, pid in rows if not pid_alive(pid)]
        for rid, pid in stale:
            self.fail_run(rid, f"interrupted: the process that ran it (pid {pid}) is gone — killed or the machine "
                               "restarted before it finished")
        return [rid for rid, _ in stale]

    # -- queries -----------------------------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        """Read-only SQL for pages and users; an empty frame when the store does not exist yet, or exists without its
        tables yet (a first command is creating it: a reader can open the file between its first statements)."""
        if not self.path.exists():
            return pd.DataFrame()
        with self.connect(read_only=True) as con:
            try:
                return con.execute(sql, list(params or [])).df()
            except duckdb.CatalogException:
                tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
                if tables <= {"schema_version"}:  # being created; a file with other tables is not a store: raise
                    return pd.DataFrame()
                raise

    def run(self, run_id: int) -> dict[str, Any] | None:
        frame = self.query("SELECT * FROM runs WHERE id = ?", [run_id])
        if frame.empty:
            return None
        row = frame.iloc[0].to_dict()
        row["params"] = json.loads(row["params"]) if row.get("params") else {}
        row["notes"] = json.loads(row["notes"]) if row.get("notes") else []
        row["conditions"] = json.loads(row["conditions"]) if row.get("conditions") else None
        return row

    def runs(self, *, kind: str | None = None, workload: str | None = None, device: str | None = None,
             status: Sequence[str] | None = None, run_ids: Sequence[int] | None = None,
             limit: int = 200) -> pd.DataFrame:
        where, args = [], []
        for column, value in (("kind", kind), ("workload", workload), ("device", device)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if status:
            where.append(f"status IN ({','.join('?' * len(status))})")
            args.extend(status)
        if run_ids is not None:
            if not run_ids:
                return pd.DataFrame()
            where.append(f"id IN ({','.join('?' * len(run_ids))})")
            args.extend(int(r) for r in run_ids)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        return self.query(f"SELECT * FROM runs {clause} ORDER BY id DESC LIMIT {int(limit)}", args)

    def metrics(self, run_ids: Sequence[int]) -> pd.DataFrame:
        if not run_ids:
            return pd.DataFrame()
        marks = ",".join("?" * len(run_ids))
        return self.query(f"SELECT * FROM metrics WHERE run_id IN ({marks})", [int(r) for r in run_ids])

    def samples(self, run_ids: Sequence[int], phase: str | None = None) -> pd.DataFrame:
        if not run_ids:
            return pd.DataFrame()
        marks = ",".join("?" * len(run_ids))
        args: list[Any] = [int(r) for r in run_ids]
        extra = ""
        if phase is not None:
            extra = " AND phase = ?"
            args.append(phase)
        return self.query(f"SELECT * FROM samples WHERE run_id IN ({marks}){extra} ORDER BY run_id, idx", args)

    def artifacts(self, run_id: int) -> pd.DataFrame:
        return self.query("SELECT * FROM artifacts WHERE run_id = ? ORDER BY name", [run_id])

    def environment(self, run_id: int) -> dict[str, Any] | None:
        frame = self.query("SELECT * FROM environments WHERE run_id = ?", [run_id])
        return None if frame.empty else frame.iloc[0].to_dict()

    def status_counts(self) -> dict[str, int]:
        frame = self.query("SELECT status, count(*) AS n FROM runs GROUP BY status")
        counts = {s: 0 for s in STATUSES}
        for status, n in zip(frame.get("status", []), frame.get("n", [])):
            counts[str(status)] = int(n)
        return counts

    def latency_summary(self, *, kind: str = "bench", workload: str | None = None, device: str | None = None,
                        latest_only: bool = True) -> pd.DataFrame:
        """One row per (run, phase, batch size) with the latency statistics of ok runs; the latest run per mode by
        default."""
        where = ["r.kind = ?", "r.status = 'ok'"]
        args: list[Any] = [kind]
        if workload:
            where.append("r.workload = ?")
            args.append(workload)
        if device:
            where.append("r.device = ?")
            args.append(device)
        latest = ""
        if latest_only:
            latest = ("AND r.id IN (SELECT max(id) FROM runs WHERE kind = ? AND status = 'ok' "
                      "GROUP BY workload, mode, device)")
            args.append(kind)
        sql = f"""
            SELECT r.id AS run_id, r.workload, r.mode, r.device, r.finished_at, m.phase, m.batch_size,
                   max(CASE WHEN m.name = 'median' THEN m.value END) AS median_us,
                   max(CASE WHEN m.name = 'p10' THEN m.value END) AS p10_us,
                   max(CASE WHEN m.name = 'p90' THEN m.value END) AS p90_us,
                   max(CASE WHEN m.name = 'iqr' THEN m.value END) AS iqr_us,
                   max(CASE WHEN m.name = 'first_call' THEN m.value END) AS first_call_us,
                   max(CASE WHEN m.name = 'max_abs_err' THEN m.value END) AS max_abs_err,
                   max(CASE WHEN m.name = 'recompiles' THEN m.value END) AS recompiles,
                   max(CASE WHEN m.name = 'graph_breaks' THEN m.value END) AS graph_breaks
            FROM runs r JOIN metrics m ON m.run_id = r.id
            WHERE {' AND '.join(where)} AND m.phase IS NOT NULL {latest}
            GROUP BY ALL ORDER BY r.id, m.phase, m.batch_size
        """
        return self.query(sql, args)

    # -- profiles ----------------------------------------------------------------------------------------------
    def op_stats(self, run_ids: Sequence[int], phase: str | None = None) -> pd.DataFrame:
        """op_stats rows of these runs (largest self time first)."""
        if not run_ids:
            return pd.DataFrame()
        args: list[Any] = [int(r) for r in run_ids]
        extra = ""
        if phase is not None:
            extra = " AND phase = ?"
            args.append(phase)
        return self.query(f"SELECT * FROM op_stats WHERE run_id IN ({','.join('?' * len(run_ids))}){extra} "
                          "ORDER BY run_id, self_us DESC", args)

    def kernel_metrics(self, run_ids: Sequence[int]) -> pd.DataFrame:
        """Nsight Compute per-kernel metrics of these runs (longest kernels first)."""
        if not run_ids:
            return pd.DataFrame()
        return self.query(f"SELECT * FROM ncu_kernel_metrics WHERE run_id IN ({','.join('?' * len(run_ids))}) "
                          "ORDER BY run_id, duration_us DESC NULLS LAST", [int(r) for r in run_ids])
