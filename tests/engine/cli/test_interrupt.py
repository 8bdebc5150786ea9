"""Ctrl-C (SIGINT) or SIGTERM to a CLI that supervises runs: its workers are killed and its unfinished runs are marked
failed, "interrupted by SIGINT" (or SIGTERM), before it exits with 130, instead of staying 'running' until a later
stale check."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.store.db import Store, StoreDamagedError, pid_alive
from tests.engine.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[3]




def _worker_pids(run_dir: Path) -> set[int]:
    """The run's worker: a fresh one names its job.json on its command line, a forked one its pid in worker.log."""
    pids = {int(p) for p in re.findall(r"worker pid (\d+)", (run_dir / "worker.log").read_text(errors="replace"))
            } if (run_dir / "worker.log").exists() else set()
    job = str(run_dir / "job.json").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if job in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def _as_a_terminal_would() -> None:
    """The CLI starts as a shell's foreground command does: SIGINT and SIGTERM at their defaults. A process started
    while its parent ignores SIGINT inherits that (a background job's convention, which Python keeps) and Ctrl-C
    could not reach it; a pytest worker can be in that state while another test's code runs beside it."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _under_way(store: Store) -> bool:
    """A run whose worker has reported progress (beyond the supervisor's own 'starting worker')."""
    if not store.path.exists():
        return False
    try:
        runs = store.runs(kind="bench")
    except StoreDamagedError:  # the CLI is still creating the file (0 bytes so far): not under way yet
        return False
    return bool(((runs["status"] == "running") & (runs["progress"] > 0)).any()) if not runs.empty else False


@pytest.mark.parametrize("sig, modes", [(signal.SIGINT, "eager"), (signal.SIGTERM, "eager,fx")])
def test_an_interrupted_cli_marks_its_runs_interrupted_and_ends_their_workers(sig, modes, child_env, lab_env):
    store = Store(lab_env["RESULTS_DB"])
    cli = subprocess.Popen([sys.executable, "-m", "engine", "bench", "--workload", "house_price", "--mode", modes,
                            "--device", "cpu", "--iters", "1000000", "--warmup", "0", "--db", str(store.path)],
                           cwd=REPO_ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_as_a_terminal_would)
    workers: set[int] = set()
    try:
        wait_until(lambda: _under_way(store), 180, "a bench run under way")
        ids = [int(i) for i in store.runs(kind="bench")["id"]]
        workers = set().union(*(_worker_pids(Path(lab_env["ARTIFACTS_DIR"]) / f"run_{i}") for i in ids))
        assert workers, "no worker found"
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130, err
    assert "Traceback" not in err
    runs = store.runs(kind="bench")
    assert len(runs) == len(modes.split(","))
    assert set(runs["status"]) == {"failed"}, runs[["id", "status", "error"]]
    assert set(runs["error"]) == {f"interrupted by {sig.name}"}
    wait_until(lambda: not any(pid_alive(p) for p in workers), 10, "the workers to end")
    for pid in workers:  # leave nothing behind if the check above failed
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
