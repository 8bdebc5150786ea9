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

from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from engine.store.db import Store, StoreError

CHILD_TABLES = ("metrics", "samples", "environments", "artifacts", "op_stats", "ncu_kernel_metrics")


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


def merge_store(target: Store, other: str | Path) -> MergeReport:
    other = Path(other)
    if not other.exists():
        raise StoreError(f"{other}: no such file")
    if other.resolve() == target.path.resolve():
        raise StoreError(f"{other} is the store itself; name another store to merge")
    target.init()
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
