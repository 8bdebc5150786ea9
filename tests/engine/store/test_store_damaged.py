"""A damaged results.duckdb (cut short, a corrupted block, not a database at all, empty) gives one clear message —
which file, that nothing was changed, what to do — from the Store, the CLI and the dashboard, and the file stays
byte-for-byte what it was."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.store.db import Metric, RunResult, Samples, Store, StoreDamagedError


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store with finished runs (nothing stale, so opening it has nothing to write), spread over blocks."""
    path = tmp_path_factory.mktemp("store") / "results.duckdb"
    store = Store(path)
    store.init()
    for i in range(10):
        run_id = store.create_run("bench", "house_price", "eager", "cpu", {"pad": "x" * 2000})
        store.start_run(run_id)
        store.record_result(run_id, RunResult(metrics=[Metric("median", 1.0 + i, "us", "infer", 1)],
                                              samples=[Samples("infer", [v * 0.37 for v in range(20_000)], "us", 1)]))
    assert store.status_counts()["ok"] == 10
    return path


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def bad_headers(data: bytes) -> bytes:
    damaged = bytearray(data)
    for header in (4096, 8192):  # both database headers: their checksums no longer match
        damaged[header + 8: header + 16] = b"\x07" * 8
    return bytes(damaged)


DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "truncated": (truncated, r"truncated: [\d,]+ bytes, but its tables use blocks up to byte"),
    "corrupted": (bad_headers, r"Corrupt database file|checksum"),
    "not a database": (lambda data: b"hello, not a database\n" * 50, r"not a valid DuckDB database file"),
    "empty": (lambda data: b"", r"the file is empty \(0 bytes\)"),
}


@pytest.fixture(params=list(DAMAGE))
def damaged(request, healthy: Path, tmp_path: Path) -> tuple[Path, str, str]:
    """(path of a damaged copy, the reason the message must give, its sha256)."""
    damage, reason = DAMAGE[request.param]
    path = tmp_path / "results.duckdb"
    path.write_bytes(damage(healthy.read_bytes()))
    return path, reason, sha(path)


def assert_message(text: str, path: Path, reason: str) -> None:
    assert f"cannot open the results store {path}: it is damaged" in text[0].lower() + text[1:]
    assert "nothing was changed" in text and "Move it aside" in text and "a fresh, empty store is created" in text
    assert f"mv {path} {path}.damaged" in text
    import re

    assert re.search(reason, text), text


def test_the_store_refuses_reads_and_writes(damaged) -> None:
    path, reason, digest = damaged
    store = Store(path, busy_timeout_s=2)
    for call in (store.init, lambda: store.query("SELECT count(*) FROM runs"), store.fail_stale_runs,
                 lambda: store.create_run("bench", "w", "eager", "cpu")):
        with pytest.raises(StoreDamagedError) as info:
            call()
        assert_message(str(info.value), path, reason)
        assert "\n" not in str(info.value)
    assert sha(path) == digest
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.duckdb"]  # no WAL, no replacement


def test_the_cli_says_it_in_one_line(damaged, capsys) -> None:
    path, reason, digest = damaged
    for args in (["runs", "--db", str(path)], ["sql", "SELECT 1 FROM runs", "--db", str(path)],
                 ["profile-show", "1", "--db", str(path)]):
        assert main(args) == 2
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
        assert "Traceback" not in captured.err
        assert_message(lines[0], path, reason)
    assert sha(path) == digest


def test_a_corrupted_data_block_is_found_by_the_read_that_needs_it(healthy: Path, tmp_path: Path, capsys) -> None:
    import duckdb

    with duckdb.connect(str(healthy), read_only=True) as con:
        block, size = con.execute("SELECT min(block_id), any_value(block_size) FROM pragma_storage_info('runs'), "
                                  "pragma_database_size() WHERE persistent AND block_id >= 0").fetchone()
    data = bytearray(healthy.read_bytes())
    start = 3 * 4096 + block * size + 100
    data[start:start + 64] = b"\xab" * 64
    path = tmp_path / "results.duckdb"
    path.write_bytes(bytes(data))
    digest = sha(path)
    assert main(["runs", "--db", str(path)]) == 2  # opening works; reading the runs table does not
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert_message(lines[0], path, r"Corrupt database file: computed checksum \d+ does not match")
    assert sha(path) == digest


def test_a_healthy_store_after_many_writes_is_not_flagged(healthy: Path, tmp_path: Path) -> None:
    # DuckDB trims free blocks at the end of a file on checkpoint; the truncation check must not mistake that.
    path = tmp_path / "busy.duckdb"
    path.write_bytes(healthy.read_bytes())
    store = Store(path)
    store.init()
    store.query("SELECT count(*) FROM samples")
    for run_id in range(1, 11):
        store.fail_run(run_id, "rewritten")
    fresh = Store(path)
    assert fresh.init() >= 1 and fresh.status_counts()["failed"] == 10


def test_the_dashboard_shows_it_and_keeps_the_file(damaged, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from streamlit.testing.v1 import AppTest

    path, reason, digest = damaged
    monkeypatch.setenv("RESULTS_DB", str(path))
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    root = Path(__file__).resolve().parents[3]
    at = AppTest.from_file(str(root / "app" / "Home.py"), default_timeout=60).run()
    assert not at.exception
    errors = [str(e.value) for e in at.error]
    assert len(errors) == 1, errors
    assert_message(errors[0], path, reason)
    assert sha(path) == digest
