"""A user's model runs only in child processes: whatever its module does at import (exit, raise SystemExit, crash,
hang) becomes one line from the CLI, which stays alive and stores nothing."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.workloads import user_model

MODULES = {
    "exits_zero": "import os\nos._exit(0)\n",
    "exits_three": "import sys\nsys.exit(3)\n",
    "crashes": "import ctypes\nctypes.string_at(0)\n",
    "hangs": "while True:\n    pass\n",
}
EXPECTED = {
    "exits_zero": "exited with code 0 before reporting",
    "exits_three": "exited with code 3 before reporting",
    "crashes": "was killed by signal 11",
    "hangs": "took more than 5 s",
}


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


# Every misbehaviour through bench; profile and ir (which checks without a forward) share the path, once each.
CASES = [(["bench", "--mode", "eager"], name) for name in sorted(MODULES)] + [
    (["profile", "--mode", "eager"], "crashes"), (["ir"], "hangs")]


@pytest.mark.parametrize("command, name", CASES)
def test_a_misbehaving_user_module_is_one_line(command, name, tmp_path, capsys, monkeypatch) -> None:
    if name == "crashes" and sys.platform != "linux":
        pytest.skip("SIGSEGV from a null read is what Linux does")
    # the child imports torch before the user's module: only the hang waits for the limit
    monkeypatch.setattr(user_model, "CHECK_TIMEOUT_S", 5.0 if name == "hangs" else 300.0)
    (tmp_path / f"{name}.py").write_text(MODULES[name])
    db = tmp_path / "results.duckdb"
    argv = [*command, "--model", f"{name}:make", "--model-path", str(tmp_path), "--db", str(db)]
    if command[0] != "ir":
        argv += ["--device", "cpu"]
    before = digest(db)
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert f"--model {name}:make" in err[0] and EXPECTED[name] in err[0], err[0]
    assert digest(db) == before  # nothing stored
