"""benchmarks/prefill_dequant_bench.py without a GPU: --smoke checks each scheme's one-kernel dequantization against
the plain way on ragged shapes, interpreted, through the script's own code (what a device call would run first);
bad arguments are refused with a message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "prefill_dequant_bench.py"


def run(*args: str, interpret: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret else "0"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_smoke_checks_every_scheme_on_ragged_shapes() -> None:
    done = run("--smoke")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.endswith("equal to the plain weight bit for bit") for line in lines), lines
    assert {line.split()[0] for line in lines} == {"int8-wo", "fp8-wo", "int4-wo"}


def test_bad_arguments_are_refused_with_a_message() -> None:
    done = run("--schemes", "int8-wo,int3-wo")
    assert done.returncode == 2 and "unknown --schemes ['int3-wo']" in done.stderr
    done = run("--smoke", interpret=False)
    assert done.returncode == 2 and "TRITON_INTERPRET=1" in done.stderr
