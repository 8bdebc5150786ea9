"""Merge another Mode Lab store into this one, so a team compares H100, H200 and CPU results on one page.

    python -m engine merge OTHER.duckdb [--db results.duckdb]

Every finished run of the other store (ok or failed; queued/running ones belong to a live process elsewhere and are
skipped) is copied with a new id from this store's sequence, and every row that names it — metrics, samples,
environment, artifacts, op_stats, Nsight Compute metrics — follows with the id remapped. The environment of each run
travels with it, so pages still say which machine measured what. `merged_runs` remembers where each copy came from
(host, original id, creation time), so merging the same file twice copies nothing the second time. The other file is
opened read-only and never changed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from engine.store.db import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Store,
    StoreError,
    file_damage,
    is_damage_error,
    missing_blocks,
)

CHILD_TABLES = ("metrics", "samples", "environments", "artifacts", "op_stats", "ncu_kernel_metrics")
# Tables whose key must be unique in the other store: each run once, each run's environment once.
UNIQUE_KEYS = {"runs": "id", "environments": "run_id"}
# How the other store is opened to be checked: read-only, nothing outside the file, no extension fetched.
SOURCE_CONFIG = {"enable_external_access": False, "autoinstall_known_extensions": False,
                 "autoload_known_extensions": False}


@dataclass
class MergeReport:
    source: str
    runs_copied: int = 0
    runs_already_there: int = 0
    runs_skipped_active: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    id_map: dict[int, int] = field(default_factory=dict)

    def summary(self) -> str:
        rows = ", ".join(f"{n} {t}" for t, n in self.rows.items() if n)
        return (f"merged {self.runs_copied} run(s) from {self.source}"
                + (f" ({rows})" if rows else "")
                + (f"; {self.runs_already_there} already merged earlier" if self.runs_already_there else "")
                + (f"; {self.runs_skipped_active} queued/running skipped" if self.runs_skipped_active else ""))


def _columns(con: duckdb.DuckDBPyConnection, catalog: str, table: str) -> list[str]:
    rows = con.execute("SELECT column_name FROM information_schema.columns WHERE table_catalog = ? AND "
                       "table_name = ? ORDER BY ordinal_position", [catalog, table]).fetchall()
    return [r[0] for r in rows]


@functools.cache
def expected_columns() -> dict[str, dict[str, tuple[str, bool]]]:
    """table -> column -> (DuckDB type, NOT NULL) of this code's schema (MIGRATIONS applied to an empty database)."""
    con = duckdb.connect(":memory:")
    try:
        for _, _, statements in MIGRATIONS:
            for sql in statements:
                con.execute(sql)
        rows = con.execute("SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
                           "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position").fetchall()
    finally:
        con.close()
    schema: dict[str, dict[str, tuple[str, bool]]] = {}
    for table, column, kind, nullable in rows:
        schema.setdefault(table, {})[column] = (kind, nullable == "NO")
    return schema


def _one_line(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip() and set(line.strip()) != {"^"})[:300]


def check_source(other: str | Path, target: Path | None = None) -> None:
    """StoreError (one line, ending in "nothing was changed") unless `other` is a readable, whole Mode Lab store this
    code can merge: a DuckDB file, not truncated, with a runs table, a schema no newer than this code's, the column
    types of this schema, no NULL where this schema requires a value and no run id twice. Only reads the file
    (read-only, no extension loaded), and runs before the merge opens this store for writing."""
    other = Path(other)
    refuse = f"cannot merge {other}:"
    if not other.exists():
        raise StoreError(f"{other}: no such file")
    if other.is_dir():
        raise StoreError(f"{refuse} it is a folder, not a results .duckdb file (nothing was changed)")
    if target is not None and target.exists() and other.resolve() == target.resolve():
        raise StoreError(f"{other} is the store itself; name another store to merge")
    if not os.access(other, os.R_OK):
        raise StoreError(f"{refuse} permission denied reading it (nothing was changed)")
    damage = file_damage(other)
    if damage:
        raise StoreError(f"{refuse} {damage}: not a Mode Lab store (nothing was changed)")
    try:
        con = duckdb.connect(str(other), read_only=True, config=dict(SOURCE_CONFIG))
    except duckdb.Error as exc:
        text = _one_line(exc)
        if is_damage_error(exc):
            raise StoreError(f"{refuse} it is damaged ({text}) (nothing was changed)") from None
        if "lock" in text.lower():
            raise StoreError(f"{refuse} another process has it open for writing; merge it when that is done "
                             "(nothing was changed)") from None
        raise StoreError(f"{refuse} {text} (nothing was changed)") from None
    try:
        problem = _source_problem(con, other)
    except duckdb.Error as exc:
        problem = f"it is damaged ({_one_line(exc)})" if is_damage_error(exc) else f"unreadable ({_one_line(exc)})"
    finally:
        con.close()
    if problem:
        raise StoreError(f"{refuse} {problem} (nothing was changed)")


def _source_problem(con: duckdb.DuckDBPyConnection, path: Path) -> str | None:
    """What makes the opened store unmergeable, or None."""
    truncated = missing_blocks(con, path)
    if truncated:
        return f"it is damaged ({truncated})"
    theirs: dict[str, dict[str, tuple[str, bool]]] = {}
    for table, column, kind, nullable in con.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position").fetchall():
        theirs.setdefault(table, {})[column] = (kind, nullable == "NO")
    if "runs" not in theirs:
        return "it has no runs table: not a Mode Lab store"
    version = 0
    if "schema_version" in theirs:
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        version = row[0] if row and row[0] is not None else 0
        if not isinstance(version, int):
            return f"its schema_version holds {version!r}, not a version number: not a Mode Lab store"
    if version > SCHEMA_VERSION:
        return (f"it has schema version {version}, newer than this code's {SCHEMA_VERSION}; update Mode Lab "
                "before merging")
    ours = expected_columns()
    for table in ("runs", *CHILD_TABLES):
        if table not in theirs:
            continue
        for column, (kind, required) in ours[table].items():
            if column not in theirs[table]:
                if required:
                    return f"its {table} table lacks the column {column}: not a Mode Lab store"
                continue
            their_kind = theirs[table][column][0]
            if their_kind != kind:
                return f"its {table}.{column} is {their_kind}, where a Mode Lab store has {kind}"
            if required:
                nulls = con.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" IS NULL').fetchone()[0]
                if nulls:
                    return f"its {table} table has {nulls} row(s) with no {column} (NULL), which a Mode Lab store " \
                           "never has"
        key = UNIQUE_KEYS.get(table)
        if key:
            twice = con.execute(f'SELECT count(*) - count(DISTINCT "{key}") FROM "{table}"').fetchone()[0]
            if twice:
                return f"its {table} table names {twice} {key}(s) more than once, which a Mode Lab store never does"
    return None


def merge_store(target: Store, other: str | Path) -> MergeReport:
    other = Path(other)
    check_source(other, target.path)  # a bad file is refused before this store is opened for writing
    target.init()
    try:
        return _merge(target, other)
    except duckdb.Error as exc:  # the transaction was rolled back
        raise StoreError(f"cannot merge {other}: {_one_line(exc)} (nothing was changed)") from None


def _merge(target: Store, other: Path) -> MergeReport:
    report = MergeReport(source=str(other))
    with target.transaction() as con:
        try:
            con.execute(f"ATTACH '{str(other).replace(chr(39), chr(39) * 2)}' AS src (READ_ONLY)")
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {other} as a Mode Lab store (nothing was changed): {exc}") from exc
        try:
            tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                                "table_catalog = 'src'").fetchall()}
            if "runs" not in tables:
                raise StoreError(f"{other} has no runs table: not a Mode Lab store (nothing was changed)")
            version = con.execute("SELECT coalesce(max(version), 0) FROM src.schema_version").fetchone()[0] \
                if "schema_version" in tables else 0
            ours = con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            if version > ours:
                raise StoreError(f"{other} has schema version {version}, newer than this code's {ours}; update "
                                 "Mode Lab before merging (nothing was changed)")
            report.runs_skipped_active = con.execute(
                "SELECT count(*) FROM src.runs WHERE status IN ('queued', 'running')").fetchone()[0]
            con.execute("""
                CREATE TEMP TABLE merge_candidates AS
                SELECT s.id AS old_id, s.host, s.created_at FROM src.runs s
                WHERE s.status IN ('ok', 'failed')
                  AND NOT EXISTS (SELECT 1 FROM merged_runs m WHERE m.source_host IS NOT DISTINCT FROM s.host
                                  AND m.source_run_id = s.id AND m.source_created_at = s.created_at)
                  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.host IS NOT DISTINCT FROM s.host AND r.id = s.id
                                  AND r.created_at = s.created_at)
                ORDER BY s.id""")
            finished = con.execute("SELECT count(*) FROM src.runs WHERE status IN ('ok', 'failed')").fetchone()[0]
            con.execute("CREATE TEMP TABLE merge_map AS SELECT old_id, nextval('run_id_seq') AS new_id, host, "
                        "created_at FROM merge_candidates ORDER BY old_id")
            report.id_map = {int(a): int(b) for a, b in con.execute("SELECT old_id, new_id FROM merge_map").fetchall()}
            report.runs_copied = len(report.id_map)
            report.runs_already_there = finished - report.runs_copied
            for table in ("runs", *CHILD_TABLES):
                if table not in tables:
                    continue
                ours_cols = _columns(con, con.execute("SELECT current_database()").fetchone()[0], table)
                theirs = set(_columns(con, "src", table))
                key = "id" if table == "runs" else "run_id"
                select = ", ".join("m.new_id" if c == key else (f"s.{c}" if c in theirs else "NULL")
                                   for c in ours_cols)
                n = con.execute(f"INSERT INTO {table} ({', '.join(ours_cols)}) SELECT {select} FROM src.{table} s "
                                f"JOIN merge_map m ON m.old_id = s.{key}").fetchone()
                report.rows[table] = int(n[0]) if n else 0
            con.execute("INSERT INTO merged_runs SELECT new_id, ?, host, old_id, created_at, now() FROM merge_map",
                        [str(other.resolve())])
        finally:
            con.execute("DROP TABLE IF EXISTS merge_candidates")
            con.execute("DROP TABLE IF EXISTS merge_map")
    return report
