"""Every bad input to `python -m engine` is one line on stderr, exit code 2, and leaves the store byte for byte as it
was: numbers out of range (NaN, inf, negative, huge), folders where files go, empty strings, missing or damaged
files, malformed stores, configs and weights files — and `sql` is a read-only window that runs one query, refuses
everything else and never fetches more rows than its limit."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import torch

from engine.cli.main import main
from engine.housing.train import CHECKPOINT_FORMAT
from engine.store.db import Metric, RunResult, Samples, Store
from engine.workloads.house_price import HousePriceNN
from engine.workloads.housing_data import FEATURE_NAMES, Normalizer, generate_housing

HUGE = str(10**30)
FEATURES = ["--sqft", "2000", "--bedrooms", "3", "--bathrooms", "2", "--age-years", "10", "--distance-km", "5"]
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "vocab_size": 96, "intermediate_size": 112}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _store_copy(source: Path, target: Path, *statements: str) -> None:
    """A copy of the store with these statements applied (a malformed store no Mode Lab code writes)."""
    target.write_bytes(source.read_bytes())
    con = duckdb.connect(str(target))
    for sql in statements:
        con.execute(sql)
    con.close()


def _weights(folder: Path, **fields) -> None:
    """house_price-eager.pt in folder: a valid checkpoint with `fields` replaced."""
    folder.mkdir(parents=True)
    ckpt = {"format": CHECKPOINT_FORMAT, "workload": "house_price", "mode": "eager", "device": "cpu",
            "features": list(FEATURE_NAMES), "state_dict": HousePriceNN().state_dict(),
            "normalizer": Normalizer.fit(generate_housing(200)).to_dict(), "metrics": {"val_mae_usd": 1.0},
            "epochs": 3, "dataset": "x.csv", "created_at": "2000-01-01T00:00:00"}
    torch.save({**ckpt, **fields}, folder / "house_price-eager.pt")


def _config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(text)
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The store (finished runs only: opening it has nothing to write) and every bad file the cases name."""
    root = tmp_path_factory.mktemp("bad")
    store = Store(root / "results.duckdb")
    store.init()
    for i in range(4):
        run_id = store.create_run("bench", "house_price", "eager", "cpu", {"pad": "x" * 2000})
        store.start_run(run_id)
        store.record_result(run_id, RunResult(metrics=[Metric("median", 1.0 + i, "us", "infer", 1)],
                                              samples=[Samples("infer", [v * 0.5 for v in range(20_000)], "us", 1)]))
    data = store.path.read_bytes()
    files = {"db": store.path, "tmp": root, "folder": root / "a-folder"}
    files["folder"].mkdir()
    (root / "truncated.duckdb").write_bytes(data[: len(data) // 2])
    (root / "good.duckdb").write_bytes(data)
    con = duckdb.connect(str(root / "not-a-lab.duckdb"))
    con.execute("CREATE TABLE t (a INTEGER)")
    con.close()
    _store_copy(store.path, root / "null-kind.duckdb", "DROP INDEX runs_status_idx",
                "ALTER TABLE runs ALTER COLUMN kind DROP NOT NULL", "UPDATE runs SET kind = NULL WHERE id = 2")
    _store_copy(store.path, root / "string-id.duckdb", "DROP INDEX runs_status_idx",
                "CREATE TABLE runs2 AS SELECT CAST(id AS VARCHAR) || 'a' AS id, * EXCLUDE (id) FROM runs",
                "DROP TABLE runs", "ALTER TABLE runs2 RENAME TO runs")
    _store_copy(store.path, root / "twice.duckdb", "DROP INDEX runs_status_idx",
                "CREATE TABLE runs2 AS SELECT * FROM runs UNION ALL SELECT * FROM runs WHERE id = 1",
                "DROP TABLE runs", "ALTER TABLE runs2 RENAME TO runs")
    lite = sqlite3.connect(root / "store.sqlite")  # DuckDB would fetch its sqlite extension to open it
    lite.execute("CREATE TABLE runs (id INTEGER)")
    lite.commit()
    lite.close()
    _config(root / "deep", '{"architectures": ["LlamaForCausalLM"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _config(root / "zero-heads", json.dumps({**LLAMA, "num_attention_heads": 0}))
    _config(root / "string-width", json.dumps({**LLAMA, "hidden_size": "64"}))
    _config(root / "odd-heads", json.dumps({**LLAMA, "num_attention_heads": 5}))
    _config(root / "negative-eps", json.dumps({**LLAMA, "rms_norm_eps": -1}))
    _weights(root / "w-good")
    _weights(root / "w-epochs", epochs="thirty")
    _weights(root / "w-metrics", metrics=7)
    _weights(root / "w-metric", metrics={"val_mae_usd": "low"})
    _weights(root / "w-mode", mode=["eager"])
    return files


# (id, argv with {db} {tmp} {folder} placed, MODELS_DIR under tmp or None, a pattern the line must match)
CASES = [
    # merge: each malformed source refused before this store is opened for writing
    ("merge-truncated", ["merge", "{tmp}/truncated.duckdb"], None, r"cannot merge .*: it is damaged \(truncated"),
    ("merge-not-a-lab-store", ["merge", "{tmp}/not-a-lab.duckdb"], None, r"no runs table: not a Mode Lab store"),
    ("merge-null-kind", ["merge", "{tmp}/null-kind.duckdb"], None, r"1 row\(s\) with no kind \(NULL\)"),
    ("merge-string-id", ["merge", "{tmp}/string-id.duckdb"], None, r"runs\.id is VARCHAR, where a Mode Lab store "
                                                                     r"has BIGINT"),
    ("merge-id-twice", ["merge", "{tmp}/twice.duckdb"], None, r"names 1 id\(s\) more than once"),
    ("merge-sqlite", ["merge", "{tmp}/store.sqlite"], None, r"not a valid DuckDB database file"),
    ("merge-folder", ["merge", "{folder}"], None, r"is a folder; give a file path"),
    ("merge-missing", ["merge", "{tmp}/nowhere.duckdb"], None, r"no such file"),
    ("merge-itself", ["merge", "{db}"], None, r"is the store itself"),
    ("merge-good-then-bad", ["merge", "{tmp}/good.duckdb", "{tmp}/truncated.duckdb"], None, r"cannot merge .*trunc"),
    # llm --hf / --hf-config: the config's fields and types
    ("llm-deep-config", ["llm", "--hf", "{tmp}/deep"], None, r"nests too deeply"),
    ("llm-zero-heads", ["llm", "--hf", "{tmp}/zero-heads"], None, r"num_attention_heads is 0; it must be a whole"),
    ("llm-config-zero-heads", ["llm", "--hf-config", "{tmp}/zero-heads"], None, r"num_attention_heads is 0"),
    ("llm-string-width", ["llm", "--hf-config", "{tmp}/string-width"], None, r"hidden_size is \"64\""),
    ("llm-odd-heads", ["llm", "--hf-config", "{tmp}/odd-heads"], None, r"not a multiple of num_attention_heads 5"),
    ("llm-negative-eps", ["llm", "--hf-config", "{tmp}/negative-eps"], None, r"rms_norm_eps is -1"),
    ("llm-empty-hf", ["llm", "--hf", ""], None, r"argument --hf: '' is empty"),
    ("llm-seed-negative", ["llm", "--seed", "-1"], None, r"--seed: '-1' must be at least 0"),
    ("llm-seed-huge", ["llm", "--seed", HUGE], None, r"--seed: .* must be at most 4,294,967,295"),
    ("llm-check-tokens", ["llm", "--check-tokens", "-1"], None, r"--check-tokens: '-1' must be at least 0"),
    # a value argparse takes for an option: the line names it and the form that passes it
    ("llm-device-memory-dash", ["llm", "--device-memory", "-5GB"], None,
     r"expected one argument \('-5GB' is read as an option: write --device-memory=-5GB\)"),
    ("llm-device-memory-negative", ["llm", "--device-memory=-5GB"], None, r"'-5GB' is not a memory size"),
    ("llm-prompts-empty", ["llm", "--prompts", ""], None, r"--prompts: '' is empty"),
    ("llm-prompts-folder", ["llm", "--prompts", "{folder}"], None, r"--prompts: .* is a folder"),
    ("llm-sweep-huge", ["llm", "--sweep", f"batch={HUGE}"], None, r"sweep values must be between 1 and"),
    ("llm-timeout-nan", ["llm", "--timeout", "nan"], None, r"--timeout: 'nan' is not a finite number"),
    ("llm-layers-huge", ["llm", "--layers", "2147483647"], None, r"--layers: .* must be at most 4,096"),
    ("llm-batch-huge", ["llm", "--batch", "2147483647"], None, r"--batch: .* must be at most 1,048,576"),
    ("llm-report-zero", ["llm-report", "0"], None, r"run_id: '0' must be at least 1"),
    ("llm-report-huge", ["llm-report", HUGE], None, r"must be at most"),
    # predict: the weights file's metadata
    ("predict-epochs-string", ["predict", *FEATURES], "w-epochs", r"not a Mode Lab weights file: its epochs is "
                                                                  r"'thirty'"),
    ("predict-metrics-int", ["predict", *FEATURES], "w-metrics", r"not a Mode Lab weights file: its metrics is int"),
    ("predict-metric-string", ["predict", *FEATURES], "w-metric", r"its metric 'val_mae_usd' is 'low'"),
    ("predict-mode-list", ["predict", *FEATURES], "w-mode", r"its mode is list, not a string"),
    ("predict-nan", ["predict", *FEATURES[:-1], "nan"], "w-good", r"Distance to city centre \(km\) is NaN"),
    # ir
    ("ir-out-folder", ["ir", "--workload", "skip", "--out", "{folder}"], None, r"--out: .* is a folder"),
    ("ir-mermaid-folder", ["ir", "--workload", "skip", "--mermaid", "{folder}"], None, r"--mermaid: .* is a folder"),
    ("ir-out-under-a-file", ["ir", "--workload", "skip", "--out", "{db}/ir.json"], None, r"is a file, not a folder"),
    ("ir-rtol-nan", ["ir", "--workload", "skip", "--verify", "--rtol", "nan"], None, r"--rtol: 'nan' is not a "
                                                                                     r"finite number"),
    ("ir-atol-negative", ["ir", "--workload", "skip", "--verify", "--atol", "-1"], None, r"--atol: '-1' must be 0"),
    ("ir-seed-negative", ["ir", "--workload", "skip", "--seed", "-3"], None, r"--seed: '-3' must be at least 0"),
    ("ir-depth-huge", ["ir", "--workload", "skip", "--depth", HUGE], None, r"--depth: .* must be at most"),
    # data
    ("data-out-folder", ["data", "--out", "{folder}"], None, r"--out: .* is a folder"),
    ("data-seed-negative", ["data", "--seed", "-1"], None, r"--seed: '-1' must be at least 0"),
    ("data-rows-huge", ["data", "--rows", "1000000000000"], None, r"--rows: .* must be at most 10,000,000"),
    ("data-rows-zero", ["data", "--rows", "0"], None, r"--rows: '0' must be at least 1"),
    ("data-out-empty", ["data", "--out", ""], None, r"--out: '' is empty"),
    ("data-out-under-a-file", ["data", "--rows", "5", "--out", "{db}/x.csv"], None, r"is a file, not a folder"),
    ("data-out-unwritable", ["data", "--rows", "5", "--out", "/proc/nonexistent/x.csv"], None,
     r"cannot write|permission denied"),
    # runs and --db
    ("runs-limit-huge", ["runs", "--limit", HUGE], None, r"--limit: .* must be at most 2,147,483,647"),
    ("runs-limit-zero", ["runs", "--limit", "0"], None, r"--limit: '0' must be at least 1"),
    ("runs-kind-misspelt", ["runs", "--kind", "level"], None, r"--kind 'level': no run of that kind .* levels"),
    ("db-under-proc", ["runs", "--db", "/proc/nonexistent/x.duckdb"], None, r"cannot create the folder"),
    ("db-5000-character-name", ["runs", "--db", "{tmp}/" + "a" * 5000], None, r"is 5,\d{3} bytes long; a path has"),
    ("db-name-too-long", ["runs", "--db", "{tmp}/" + "a" * 300], None, r"has a name of 300 bytes"),
    ("sql-db-name-too-long", ["sql", "SELECT 1", "--db", "{tmp}/" + "a" * 5000], None, r"bytes long"),
    ("db-folder", ["runs", "--db", "{folder}"], None, r"--db: .* is a folder"),
    ("db-empty", ["runs", "--db", ""], None, r"--db: '' is empty"),
    ("db-sqlite", ["runs", "--db", "{tmp}/store.sqlite"], None, r"not a valid DuckDB database file"),
    # ceilings, bench, train, profile, levels, compare, explain
    ("ceilings-timeout-half", ["ceilings", "--timeout", "0.5"], None, r"--timeout: '0.5' must be between 10 and"),
    ("ceilings-timeout-nan", ["ceilings", "--timeout", "nan"], None, r"--timeout: 'nan' is not a finite number"),
    ("bench-iters-huge", ["bench", "--iters", HUGE], None, r"--iters: .* must be at most"),
    ("bench-timeout-inf", ["bench", "--timeout", "inf"], None, r"--timeout: 'inf' is not a finite number"),
    ("bench-timeout-negative", ["bench", "--timeout", "-1"], None, r"--timeout: '-1' must be greater than 0"),
    ("bench-model-empty", ["bench", "--model", ""], None, r"--model: an empty value"),
    ("bench-workload-empty", ["bench", "--workload", ""], None, r"--workload: an empty value"),
    ("bench-seed-negative", ["bench", "--seed", "-1"], None, r"--seed: '-1' must be at least 0"),
    ("train-lr-nan", ["train", "--lr", "nan"], None, r"--lr: 'nan' is not a finite number"),
    ("train-lr-inf", ["train", "--lr", "inf"], None, r"--lr: 'inf' is not a finite number"),
    ("train-csv-empty", ["train", "--csv", ""], None, r"--csv: '' is empty"),
    ("train-csv-folder", ["train", "--csv", "{folder}"], None, r"--csv: .* is a folder"),
    ("train-epochs-huge", ["train", "--epochs", HUGE], None, r"--epochs: .* must be at most"),
    ("profile-workload-empty", ["profile", "--workload", ""], None, r"--workload: an empty value"),
    ("profile-batch-huge", ["profile", "--batch-size", HUGE], None, r"--batch-size: .* must be at most"),
    ("levels-shape-empty", ["levels", "--shape", ""], None, r"--shape: '' names nothing"),
    ("levels-iters-huge", ["levels", "--iters", HUGE], None, r"--iters: .* must be at most"),
    ("compare-seed-negative", ["compare", "--base", "latest", "--head", "latest", "--seed", "-1"], None,
     r"--seed: '-1' must be at least 0"),
    ("compare-resamples-huge", ["compare", "--base", "latest", "--head", "latest", "--resamples", HUGE], None,
     r"--resamples: .* must be at most 1,000,000"),
    ("explain-batch-huge", ["explain", "1", "2", "--batch-size", HUGE], None, r"--batch-size: .* must be at most"),
    # sql: one read-only query
    ("sql-empty", ["sql", ""], None, r"the query is empty"),
    ("sql-only-a-comment", ["sql", "-- nothing"], None, r"holds no statement"),
    ("sql-two-statements", ["sql", "SELECT 1; SELECT 2"], None, r"holds 2 statements; give one query"),
    ("sql-copy-onto-the-store", ["sql", "COPY (SELECT 1 AS x) TO '{db}' (FORMAT csv)"], None, r"COPY statements are "
                                                                                              r"refused"),
    ("sql-copy-to-a-file", ["sql", "COPY runs TO '{tmp}/leak.csv'"], None, r"COPY statements are refused"),
    ("sql-export", ["sql", "EXPORT DATABASE '{tmp}/exported'"], None, r"EXPORT statements are refused"),
    ("sql-attach", ["sql", "ATTACH '{tmp}/attached.duckdb' AS other"], None, r"ATTACH statements are refused"),
    ("sql-install", ["sql", "INSTALL httpfs"], None, r"INSTALL statements are refused"),
    ("sql-load", ["sql", "LOAD httpfs"], None, r"LOAD statements are refused"),
    ("sql-set", ["sql", "SET enable_external_access = true"], None, r"SET statements are refused"),
    ("sql-delete", ["sql", "DELETE FROM runs"], None, r"DELETE statements are refused: this window is read-only"),
    ("sql-with-delete", ["sql", "WITH a AS (SELECT 1) DELETE FROM runs"], None, r"DELETE statements are refused"),
    ("sql-explain-analyze-copy", ["sql", "EXPLAIN ANALYZE COPY runs TO '{tmp}/leak.csv'"], None,
     r"EXPLAIN is allowed of one SELECT only"),
    ("sql-read-text", ["sql", "SELECT * FROM read_text('/etc/hostname')"], None, r"refused: Permission Error"),
    ("sql-read-csv", ["sql", "SELECT * FROM read_csv('{tmp}/x.csv')"], None, r"refused: Permission Error"),
    ("sql-glob", ["sql", "SELECT * FROM glob('{tmp}/*')"], None, r"refused: Permission Error"),
    ("sql-syntax", ["sql", "SELEC 1"], None, r"does not parse: Parser Error"),
    ("sql-limit-zero", ["sql", "SELECT 1", "--limit", "0"], None, r"--limit: '0' must be at least 1"),
    ("sql-sqlite-db", ["sql", "SELECT 1", "--db", "{tmp}/store.sqlite"], None, r"not a valid DuckDB database file"),
]


def _fill(argv: list[str], lab: dict[str, Path]) -> list[str]:
    return [a.format(db=lab["db"], tmp=lab["tmp"], folder=lab["folder"]) for a in argv]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """main(argv) in this process: (exit code, stdout, stderr); argparse's refusals exit through SystemExit."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def env(lab: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    for key, value in (("RESULTS_DB", lab["db"]), ("MODELS_DIR", tmp_path / "models"),
                       ("ARTIFACTS_DIR", tmp_path / "artifacts"), ("MODELAB_LOCK_DIR", tmp_path / "locks")):
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("MODELAB_FAST_EXIT", "0")
    return lab


@pytest.mark.parametrize("argv, models, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(argv, models, pattern, env, monkeypatch, capsys):
    if models:
        monkeypatch.setenv("MODELS_DIR", str(env["tmp"] / models))
    before = sha(env["db"])
    entries = sorted(p.name for p in env["tmp"].iterdir())
    code, out, err = run_cli(_fill(argv, env), capsys)
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err and out == ""
    assert re.search(pattern, lines[0]), lines[0]
    assert sha(env["db"]) == before  # the store, byte for byte
    assert sorted(p.name for p in env["tmp"].iterdir()) == entries  # nothing written beside it (COPY, EXPORT …)


def test_a_bad_merge_source_creates_no_store(env, tmp_path, capsys):
    new = tmp_path / "new.duckdb"
    code, _, err = run_cli(["merge", str(env["tmp"] / "null-kind.duckdb"), "--db", str(new)], capsys)
    assert code == 2 and "no kind (NULL)" in err
    assert not new.exists()


def test_a_good_merge_still_merges(env, tmp_path, capsys):
    target = tmp_path / "target.duckdb"
    code, out, err = run_cli(["merge", str(env["db"]), "--db", str(target)], capsys)
    assert code == 0, err
    assert out.startswith(f"merged 4 run(s) from {env['db']}")
    assert len(Store(target).runs()) == 4


def test_sql_prints_at_most_limit_rows_and_says_it_cut(env, capsys):
    before = sha(env["db"])
    code, out, err = run_cli(["sql", "SELECT range AS n FROM range(50000)", "--limit", "100"], capsys)
    assert code == 0, err
    header, *rows = out.strip().splitlines()
    assert header.split() == ["n"] and [int(r) for r in rows] == list(range(100))
    assert err.strip() == "(the first 100 rows; the query returns more: --limit raises the cap)"
    code, out, err = run_cli(["sql", "SELECT range AS n FROM range(100)", "--limit", "100"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 101 and err == ""  # exactly the limit: nothing cut
    assert sha(env["db"]) == before


def test_sql_default_limit_is_10000_and_a_huge_range_stays_small(env, capsys):
    """range(200,000,000) would be ~1.6 GB as a result; only the first 10,001 rows are ever fetched."""
    import resource

    start = time.perf_counter()
    code, out, err = run_cli(["sql", "SELECT range AS n FROM range(200000000)"], capsys)
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1 + 10_000 and "first 10,000 rows" in err
    assert time.perf_counter() - start < 60
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # KiB: the process stays under 4 GiB


def test_sql_reads_the_store(env, capsys):
    code, out, _ = run_cli(["sql", "WITH r AS (SELECT * FROM runs) SELECT count(*) AS n FROM r"], capsys)
    assert code == 0 and out.split() == ["n", "4"]
    for query in ("DESCRIBE runs", "SHOW TABLES", "SUMMARIZE metrics", "EXPLAIN SELECT * FROM runs", "FROM runs"):
        code, out, err = run_cli(["sql", query], capsys)
        assert code == 0 and out.strip() and err == "", (query, err)


def test_sql_waits_for_a_writer_then_reads(env, capsys):
    """Another process holding the store read-write: the read-only open retries until it lets go."""
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time\n"
                               f"con = duckdb.connect({str(env['db'])!r})\nprint('held', flush=True)\n"
                               "time.sleep(2)\ncon.close()"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, err = run_cli(["sql", "SELECT count(*) AS n FROM runs"], capsys)
    finally:
        holder.wait(timeout=60)
    assert code == 0, err
    assert out.split() == ["n", "4"]
