"""benchmarks/gpu_check.sh without a GPU: every part it lists runs its steps through stand-ins for python3,
nvidia-smi and nvcc, so a step that cannot start (a shell function handed to `timeout`, a misspelt command) shows
here instead of in a device call's empty output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
STAND_IN = '#!/usr/bin/env bash\necho "{name} $*" >> "$CALLS"\necho "3 passed in 0.1s"\n'


def run(part: str, tmp_path: Path, stand_ins: bool = True, **extra: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python3", "nvidia-smi", "nvcc"):
        (bin_dir / name).write_text(STAND_IN.format(name=name))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "CALLS": str(tmp_path / "calls.log"), "SUITE_LIMIT": "20", **extra}
    if stand_ins:
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), part, str(tmp_path / "out")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def parts(tmp_path: Path) -> list[str]:
    listed = run("list", tmp_path).stdout.splitlines()
    return [line.split()[0] for line in listed if line and not line.startswith(" ")]


def test_every_part_starts_each_of_its_steps(tmp_path: Path) -> None:
    names = parts(tmp_path)
    assert {"env", "tests", "decode-path", "gluon-l4", "quant"} <= set(names), names
    for name in names:
        done = run(name, tmp_path)
        logs = "".join(p.read_text() for p in sorted((tmp_path / "out").glob("*.log")))  # the steps' own output
        output = done.stdout + done.stderr + logs
        for sign in ("rc 126", "rc 127", "command not found", "failed to run command", "unknown part"):
            assert sign not in output, (name, output)
        for log in (tmp_path / "out").glob("*.log"):
            log.unlink()
    calls = (tmp_path / "calls.log").read_text()
    # the steps that once could not start: `timeout` handed the shell functions llm and pytest_q
    assert "python3 -m engine llm --prompt-len 512 --new-tokens 128 --device cuda --preset 1B " in calls
    assert "python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_triton_kernels.py" in calls


def test_four_slices_cover_every_gpu_test_file_once(tmp_path: Path) -> None:
    """SLICES=four: four pytest runs whose paths, less their --ignores, hold every test file under tests/engine
    exactly once (the stand-in nvidia-smi lists one GPU, so they run one after another here)."""
    done = run("tests", tmp_path, SLICES="four")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line.split()[1:] for line in (tmp_path / "calls.log").read_text().splitlines()
            if line.startswith("python3 -m pytest")]
    assert len(runs) == 4 and [name for name in ("lv", "rest", "kc", "kt") if f"== {name}" in done.stdout] == [
        "lv", "rest", "kc", "kt"], done.stdout
    covered: list[Path] = []
    for args in runs:
        paths = [a for a in args if a.startswith("tests/")]
        ignored = {REPO / a.split("=", 1)[1] for a in args if a.startswith("--ignore=")}
        for path in paths:
            files = sorted((REPO / path).rglob("test_*.py")) if (REPO / path).is_dir() else [REPO / path]
            covered += [f for f in files if f not in ignored and not any(i in f.parents for i in ignored)]
    everything = sorted((REPO / "tests/engine").rglob("test_*.py"))
    assert sorted(covered) == everything and len(covered) == len(set(covered))
    # four-1 and four-2 (two GPUs, two calls): the same four pytest runs, two each
    halves = []
    for half in ("four-1", "four-2"):
        (tmp_path / "calls.log").unlink()
        done = run("tests", tmp_path, SLICES=half)
        assert done.returncode == 0, done.stdout + done.stderr
        halves += [line.split()[1:] for line in (tmp_path / "calls.log").read_text().splitlines()
                   if line.startswith("python3 -m pytest")]
    assert halves == runs


@pytest.mark.parametrize("part", ["nonsense", "prefetch"])
def test_an_unknown_part_is_refused_with_the_list(part: str, tmp_path: Path) -> None:
    done = run(part, tmp_path)
    assert done.returncode == 2 and f"unknown part '{part}'" in done.stdout and "decode-path " in done.stdout
