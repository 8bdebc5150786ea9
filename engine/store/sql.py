"""A read-only SQL window on the store for people (`python -m engine sql`): one query, nothing else.

The statement is parsed first and must be one query: SELECT (WITH … SELECT, FROM-first, VALUES, DESCRIBE, SHOW,
SUMMARIZE parse as one) or EXPLAIN [ANALYZE] of one. The connection is opened read-only with DuckDB's external
access off (no file, URL or pandas frame outside the store: no COPY … TO, EXPORT, ATTACH, read_csv/read_text of
arbitrary files), no extension installed or loaded, a memory limit without spilling to disk, and the configuration
locked so a query cannot SET it back. Rows are fetched in chunks and at most `limit` are ever materialised; the
result says when there were more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import pandas as pd

from engine.store.db import Store, StoreError, is_damage_error

DEFAULT_LIMIT = 10_000
MEMORY_LIMIT = "2GB"  # what one query may hold; beyond it the query fails (nothing spills to a temporary file)
CHUNK_ROWS = 2048
# DuckDB settings of the window (names as duckdb_settings() lists them).
WINDOW_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "memory_limit": MEMORY_LIMIT,
    "temp_directory": "",
    "lock_configuration": True,
}
_QUERY_TYPES = {duckdb.StatementType.SELECT}
_EXPLAIN = re.compile(r"\s*explain\s+(?:analy[sz]e\s+)?(.*)", re.IGNORECASE | re.DOTALL)


class SqlRefused(StoreError):
    """The text is not one read-only query; nothing ran."""


@dataclass
class QueryResult:
    frame: pd.DataFrame
    truncated: bool  # the query had more rows than the limit; only the first `limit` were fetched
    limit: int


def one_line(exc: BaseException) -> str:
    """DuckDB's message on one line: its lines joined, the caret line under the query left out."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and set(line.strip()) != {"^"}]
    return " ".join(lines)[:500] or type(exc).__name__


def check_query(text: str) -> None:
    """SqlRefused (one line) unless text is exactly one read-only query."""
    if not text.strip():
        raise SqlRefused("the query is empty; give one SELECT, e.g. \"SELECT * FROM runs LIMIT 5\"")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as exc:
        raise SqlRefused(f"the query does not parse: {one_line(exc)}") from None
    if not statements:
        raise SqlRefused("the query holds no statement (only comments or semicolons); give one SELECT")
    if len(statements) > 1:
        raise SqlRefused(f"the text holds {len(statements)} statements; give one query (SELECT, WITH … SELECT, "
                         "DESCRIBE, SHOW, SUMMARIZE or EXPLAIN)")
    statement = statements[0]
    kind = statement.type
    if kind == duckdb.StatementType.EXPLAIN:
        inner = _EXPLAIN.match(statement.query)
        if inner:
            try:
                inside = duckdb.extract_statements(inner.group(1))
            except duckdb.Error:
                inside = []
            if len(inside) == 1 and inside[0].type in _QUERY_TYPES:
                return
        raise SqlRefused("EXPLAIN is allowed of one SELECT only; the store is read-only here")
    if kind not in _QUERY_TYPES:
        word = statement.query.split(None, 1)[0].upper() if statement.query.strip() else ""
        name = word if word.isalpha() and word != "WITH" else str(kind).split(".")[-1]  # INSTALL parses as LOAD
        raise SqlRefused(f"{name} statements are refused: this window is read-only (one SELECT, WITH … SELECT, "
                         "DESCRIBE, SHOW, SUMMARIZE or EXPLAIN; no COPY, EXPORT, ATTACH, INSTALL, LOAD, SET or writes)")


def read_only_query(store: Store, text: str, limit: int = DEFAULT_LIMIT) -> QueryResult:
    """Run one read-only query on the store, at most `limit` rows fetched. SqlRefused when it is not one query,
    StoreError (one line) when the store cannot be opened or DuckDB refuses the query."""
    if limit < 1:
        raise SqlRefused(f"the row limit must be at least 1 (got {limit})")
    check_query(text)
    if not store.path.exists():
        raise StoreError(f"no results database at {store.path} (it is created by the first run)")
    with store.connect(read_only=True, config=WINDOW_CONFIG) as con:
        try:
            cursor = con.execute(text)
            columns = [d[0] for d in cursor.description or []]
            rows: list[tuple] = []
            while len(rows) <= limit:
                chunk = cursor.fetchmany(min(CHUNK_ROWS, limit + 1 - len(rows)))
                if not chunk:
                    break
                rows.extend(chunk)
        except duckdb.Error as exc:
            if is_damage_error(exc):
                raise  # the store's own one-line message for a damaged file (Store.connect)
            if isinstance(exc, duckdb.OutOfMemoryException):  # DuckDB's hint (a temp directory) does not apply here
                raise StoreError(f"query failed: it needs more than the {MEMORY_LIMIT} a query may hold here "
                                 f"({str(exc).splitlines()[0]}); narrow it with WHERE, LIMIT or fewer columns") \
                    from None
            if isinstance(exc, duckdb.PermissionException):
                raise SqlRefused(f"refused: {one_line(exc)} (this window reads the store only)") from None
            raise StoreError(f"query failed: {one_line(exc)}") from None
    truncated = len(rows) > limit
    return QueryResult(frame=pd.DataFrame.from_records(rows[:limit], columns=columns), truncated=truncated,
                       limit=limit)
