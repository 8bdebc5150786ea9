"""`python -m engine ...` as a user runs it: help, one-line errors with exit code 2, and a real bench → runs → sql →
train → predict session on a temporary store. Each command's help, the argument refusals and, in the session, the
refusals, options and warnings after a command's first use run main() in this process (an interpreter start is ~2 s
of importing per case); the top-level help, two refusals (one of argparse's, one of a command's own) and each
command's first use in the session go through `python -m engine` itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.store.db import Store

REPO_ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ["bench", "train", "predict", "runs", "sql", "data", "env"]
FEATURES = ["--sqft", "2000", "--bedrooms", "3", "--bathrooms", "2", "--age-years", "10", "--distance-km", "5"]


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def in_process(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """main(args) in this process, as `cli` would report it: argparse's refusals and --help exit through
    SystemExit."""
    from engine.cli.main import main

    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "engine", *args], code, out, err)


def in_lab(lab: tuple, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
           *args: str) -> subprocess.CompletedProcess:
    """in_process with the CLI lab's store, models and artifacts (what `cli(env, ...)` gives a child)."""
    env, _ = lab
    for key in ("RESULTS_DB", "MODELS_DIR", "ARTIFACTS_DIR", "MODELAB_LOCK_DIR"):
        monkeypatch.setenv(key, env[key])
    return in_process(capsys, *args)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    return lines[0]


def test_top_level_help(child_env):
    proc = cli(child_env, "--help")
    assert proc.returncode == 0
    for command in COMMANDS:
        assert command in proc.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(capsys, command):
    proc = in_process(capsys, command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m engine {command}")


@pytest.mark.parametrize("args, message", [
    (["bench", "--mode", "nope"], r"error: unknown mode 'nope'; known modes: eager, fx, torchscript"),
    pytest.param(["bench", "--mode", "eager", "--device", "cuda"], r"error: --device cuda: .*sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")),
    (["bench", "--device", "gpu"], r"'gpu' is not a device; use cpu, cuda or cuda:N"),
    (["bench", "--batch-sizes", "0"], r"argument --batch-sizes: '0': batch sizes must be between 1 and"),
    (["bench", "--batch-sizes", "abc"], r"argument --batch-sizes: 'abc' is not a comma-separated list of integers"),
    (["bench", "--iters", "0"], r"argument --iters: '0' must be at least 1"),
    (["bench", "--phases", "infer,foo"], r"argument --phases: 'infer,foo': phases are infer and/or train"),
    (["bench", "--workload", "nope"], r"error: unknown workload 'nope'; known workloads: house_price"),
    (["bench", "--mode", "compile-reduce-overhead"],
     r"error: mode compile-reduce-overhead is not available on cpu: .*CUDA graphs"),
    (["train", "--mode", "compile-reduce-overhead"], r"error: mode compile-reduce-overhead is not available on cpu"),
    (["train", "--epochs", "-3"], r"argument --epochs: '-3' must be at least 1"),
    (["predict", "--mode", "eager", *FEATURES], r"error: no trained weights for mode 'eager' \(trained: none\)"),
    (["predict", "--sqft", "2000"], r"the following arguments are required: --bedrooms"),
    (["sql", "select 1"], r"error: no results database at"),
    (["nope"], r"invalid choice: 'nope'"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, lab_env, args, message):
    line = one_line_error(in_process(capsys, *args))
    assert re.search(message, line), line
    assert not Path(lab_env["RESULTS_DB"]).exists()  # refused before touching the store


@pytest.mark.parametrize("args, message", [
    (["nope"], r"invalid choice: 'nope'"),
    (["bench", "--mode", "nope"], r"error: unknown mode 'nope'; known modes: eager, fx, torchscript"),
])
def test_python_m_engine_refuses_bad_arguments_in_one_line(child_env, lab_env, args, message):
    line = one_line_error(cli(child_env, *args))
    assert re.search(message, line), line
    assert not Path(lab_env["RESULTS_DB"]).exists()


def test_train_with_a_bad_csv_is_refused_up_front(child_env, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("sqft,bedrooms\n1,2\n")
    line = one_line_error(cli(child_env, "train", "--csv", str(bad)))
    assert line.startswith(f"error: --csv {bad}: ")
    assert "missing column(s) bathrooms, age_years, distance_km, price" in line


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One store for the whole CLI session below, in the order a user would go."""
    import os

    tmp = tmp_path_factory.mktemp("cli")
    env = dict(os.environ)
    env.update(RESULTS_DB=str(tmp / "results.duckdb"), MODELS_DIR=str(tmp / "models"),
               ARTIFACTS_DIR=str(tmp / "artifacts"), MODELAB_LOCK_DIR=str(tmp / "locks"), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    return env, Store(tmp / "results.duckdb")


def test_bench_stores_an_ok_run(session):
    env, store = session
    proc = cli(env, "bench", "--mode", "eager", "--batch-sizes", "2", "--train-batch-sizes", "4", "--iters", "5",
               "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(table) if line.split()[:3] == ["mode", "phase", "batch"])
    rows = [line.split() for line in table[header + 1: header + 3]]
    assert [r[:3] for r in rows] == [["eager", "infer", "2"], ["eager", "train", "4"]]
    # speedup of eager against itself; in parentheses where the machine's load flagged the timing
    assert all(r[7] in ("1.00", "(1.00)") and r[8] in ("clean", "noisy", "interfered") for r in rows)
    assert f"stored in {store.path}" in proc.stdout
    assert "bench eager: done" in proc.stderr  # not a terminal: one line per finished run

    [run] = store.runs(kind="bench").to_dict("records")
    assert run["status"] == "ok" and run["mode"] == "eager" and run["device"] == "cpu"
    samples = store.samples([run["id"]])
    assert samples.groupby(["phase", "batch_size"]).size().to_dict() == {("infer", 2): 5, ("train", 4): 5}
    assert "worker.log" in set(store.artifacts(run["id"])["name"])
    assert store.environment(run["id"])["torch"].startswith("2.")


def test_runs_lists_it(session, capsys, monkeypatch):
    env, store = session
    proc = cli(env, "runs")
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.strip().splitlines()
    assert header.split()[:6] == ["id", "kind", "workload", "mode", "device", "status"]
    assert any(r.split()[1:6] == ["bench", "house_price", "eager", "cpu", "ok"] for r in rows)
    # its options through main() in this process (an interpreter start each)
    assert in_lab(session, capsys, monkeypatch, "runs", "--status", "failed").stdout.strip() == "no runs"
    lines = in_lab(session, capsys, monkeypatch, "runs", "--json").stdout.strip().splitlines()
    [run] = [json.loads(line) for line in lines]  # one object per line per run
    assert run["kind"] == "bench" and run["status"] == "ok" and run["state"] in ("clean", "noisy", "interfered")
    assert isinstance(run["flags"], list) and (run["flags"] == []) == (run["state"] == "clean")
    assert in_lab(session, capsys, monkeypatch, "runs", "--json", "--status", "failed").stdout == ""


def test_sql_works(session, capsys, monkeypatch):
    env, _ = session
    proc = cli(env, "sql", "select count(*) as n from runs")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["n", "1"]
    bad = in_lab(session, capsys, monkeypatch, "sql", "select nope from nowhere")
    # DuckDB's several lines (its hint and the query's line) joined into one.
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: query failed: Catalog Error: Table with name nowhere does not exist")
    assert len(bad.stderr.strip().splitlines()) == 1 and "LINE 1: select nope from nowhere" in bad.stderr


def test_train_then_predict(session, capsys, monkeypatch):
    env, store = session
    proc = cli(env, "train", "--mode", "eager", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"trained eager on cpu: 62 steps in [\d.]+ s, validation MAE \$[\d,]+", proc.stdout)
    weights = Path(env["MODELS_DIR"]) / "house_price-eager.pt"
    assert f"weights: {weights}" in proc.stdout and weights.exists()
    assert store.runs(kind="train")["status"].tolist() == ["ok"]

    proc = cli(env, "predict", "--mode", "eager", *FEATURES)
    assert proc.returncode == 0, proc.stderr
    match = re.fullmatch(r"\$(\d{1,3}(,\d{3})+)\n", proc.stdout)
    assert match, proc.stdout
    assert 100_000 < int(match.group(1).replace(",", "")) < 1_000_000
    assert proc.stderr == ""

    # the refusals and the warning through main() in this process (an interpreter start each)
    proc = in_lab(session, capsys, monkeypatch, "predict", "--mode", "eager", *FEATURES[:-1], "7000")
    assert "is not plausible" in one_line_error(proc)  # 7000 km from the centre: refused
    proc = in_lab(session, capsys, monkeypatch, "predict", "--mode", "eager", *FEATURES[:-1], "80")
    assert proc.returncode == 0 and proc.stdout.startswith("$")  # outside the training range: a warning
    assert proc.stderr.startswith("warning: Distance to city centre (km) = 80 is outside the training range")
    line = one_line_error(in_lab(session, capsys, monkeypatch, "predict", "--mode", "fx", *FEATURES))
    assert "no trained weights for mode 'fx' (trained: eager)" in line


def test_sql_is_read_only(session, capsys, monkeypatch):
    env, store = session
    before = len(store.runs())
    bad = in_lab(session, capsys, monkeypatch, "sql", "delete from runs")
    assert bad.returncode == 2 and "read-only" in bad.stderr
    assert len(store.runs()) == before > 0


def test_a_failed_run_exits_1_with_its_error(session):
    env, store = session
    proc = cli(env, "bench", "--mode", "eager", "--phases", "infer", "--batch-sizes", "2", "--iters", "2",
               "--timeout", "0.01")
    assert proc.returncode == 1
    run = store.runs(kind="bench", limit=1).iloc[0]
    assert run["status"] == "failed" and run["error"].startswith("timed out")
    assert f"run {run['id']} (eager) failed: timed out" in proc.stderr


@pytest.mark.parametrize("argv, module, check", [
    (["bench", "--mode", "eager", "--device", "cpu"], "engine.cli.main", "expand_devices"),
    (["levels", "--component", "mlp", "--level", "L1", "--device", "cpu"], "engine.cli.levels", "expand_devices"),
    (["llm", "--preset", "tiny", "--mode", "eager", "--device", "cpu"], "engine.cli.llm", "check_device"),
])
def test_the_fork_server_starts_before_the_command_imports_torch(argv, module, check, monkeypatch, tmp_path):
    """A group's fork server imports torch and Inductor (~10 s on the GPU machine): started first, those imports
    overlap the command's own (its device check imports torch) instead of following them."""
    import importlib

    from engine.cli.args import CliError
    from engine.cli.main import main
    from engine.runner.jobs import Launcher

    order: list[str] = []
    monkeypatch.setattr(Launcher, "prestart", lambda self: order.append("fork server"))

    def refuse(*args, **kwargs):
        order.append("device check")
        raise CliError("stop here")

    monkeypatch.setattr(importlib.import_module(module), check, refuse)
    db = tmp_path / "r.duckdb"
    assert main([*argv, "--db", str(db)]) == 2
    assert order == ["fork server", "device check"]
    assert not db.exists()  # a refused command still leaves no results file behind
