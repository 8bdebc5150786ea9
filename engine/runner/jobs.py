"""The job runner: every run executes in a worker process, watched by a supervisor that owns its record.

    dashboard / CLI ──create runs (queued)──▶ store
         │ submit(): detached supervisor          run_jobs(): the CLI itself supervises
         ▼
    supervisor ── takes the device lock ── starts a worker for the run ──────────── tails progress.jsonl
         │            (forked by the lane's fork server, engine.runner.forkserver,          writes progress to store
         │             or `python -m engine.runner.worker job.json`; own session, PDEATHSIG)
         └── exit 0 + result.json → record_result (one transaction, status ok)
             anything else (exception, signal, timeout) → status failed with the reason and the log's tail

A segfault, CUDA error, OOM kill or hang therefore only ends the worker; the dashboard never imports the code that
crashed. A run whose supervisor is killed (kill -9) stays 'running' until `Store.fail_stale_runs` sees its pid gone;
if its worker had finished, the result.json it left is recorded instead (ingest_left_results, before that check).
A store that another process keeps open delays a run's record (RECORD_WAIT_S), it does not lose it. Ctrl-C or SIGTERM
in a supervising CLI, or SIGTERM, SIGINT or SIGHUP to the detached supervisor, kills its workers and marks its
unfinished runs failed, "interrupted by SIGINT" (or SIGTERM, SIGHUP); a worker that had finished has its result
recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.runner import kinds
from engine.runner.cancel import CANCELLED, RUNNING_REASON, mark_cancelled
from engine.runner.cancel import clear as clear_cancel
from engine.runner.cancel import requested as cancel_requested
from engine.runner.device_lock import (  # noqa: F401 - the runner's lock, named here too
    WAITING_PREFIX,
    device_lock,
    lock_dir,
    lock_path,
)
from engine.runner.forkserver import ForkServer, ForkServerError
from engine.runner.forkserver import enabled as forkserver_enabled
from engine.runner.worker_env import with_libstdcxx_preloaded
from engine.store import settings
from engine.store.db import (
    REPO_ROOT,
    Artifact,
    RunResult,
    Store,
    StoreBusyError,
    StoreError,
    pid_alive,
    while_busy,
)

DEFAULT_TIMEOUT_S = 1800.0
# The detached supervisor `submit` starts: the group planner's entry point. Named, never imported: jobs knows nothing
# of how a group is planned.
SUPERVISOR = "engine.runner.plan"
OnProgress = Callable[[int, float, str], None]
# How long a supervisor keeps trying to record a run's end while another process holds the store (each try waits the
# store's own busy timeout): a reader that keeps the store open for minutes delays the record, it does not lose it.
# Past it the run stays as stored and a finished worker's result.json waits for the next command that opens the store
# (ingest_left_results).
RECORD_WAIT_S = 1800.0
# A progress line is worth little wait (run_one's progress Store).
PROGRESS_WAIT_S = 1.0


@dataclass
class JobSpec:
    kind: str
    workload: str
    mode: str
    device: str
    params: dict[str, Any] = field(default_factory=dict)
    target: str | None = None  # "module:function"; defaults to the registered kind's (engine.runner.kinds)
    timeout_s: float = DEFAULT_TIMEOUT_S


def artifacts_root(store: Store) -> Path:
    return settings.get("ARTIFACTS_DIR") or store.path.parent / "artifacts"


def create_runs(store: Store, specs: Sequence[JobSpec], group_id: str | None = None) -> list[int]:
    """Queue runs. Each stores its target and what the runner needs of its kind (engine.runner.kinds), so that any
    supervisor can run it from the store alone. A kind nobody registered needs a target and runs alone."""
    stored = [_stored(spec) for spec in specs]  # every spec checked before any run is stored
    store.init()
    ids = []
    for spec, (target, kind) in zip(specs, stored):
        params = {**spec.params, "_target": target, "_timeout_s": spec.timeout_s}
        if kind is not None:
            params["_kind"] = kind.to_json()
        ids.append(store.create_run(spec.kind, spec.workload, spec.mode, spec.device, params, group_id))
    return ids


def _stored(spec: JobSpec) -> tuple[str, kinds.StoredKind | None]:
    """(the target, what the run stores of its kind) for a spec; ValueError for a kind with no target."""
    kind = kinds.get(spec.kind)
    target = spec.target or (kind.target if kind else None)
    if not target:
        raise ValueError(f"run kind {spec.kind!r} names no target and none was given (registered kinds: "
                         f"{kinds.known()})")
    return target, kind.stored(spec.mode, spec.device) if kind else None


def _reap(proc: subprocess.Popen) -> None:
    threading.Thread(target=proc.wait, daemon=True).start()  # no zombies in a long-lived dashboard


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return with_libstdcxx_preloaded(env)  # AOTInductor models load in workers (see engine.runner.worker_env)


def submit(store: Store, specs: Sequence[JobSpec], group_id: str | None = None) -> list[int]:
    """Queue runs and return at once; a detached supervisor process (SUPERVISOR) plans the group and runs it."""
    ids = create_runs(store, specs, group_id)
    root = artifacts_root(store)
    root.mkdir(parents=True, exist_ok=True)
    try:
        with open(root / f"supervisor-{ids[0]}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", SUPERVISOR, "--db", str(store.path), *map(str, ids)],
                cwd=REPO_ROOT, env=_child_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C or reload of the dashboard does not kill running jobs
            )
    except BaseException as exc:
        # The runs are owned by this (live) process, so the stale check would never fail them: do it here.
        for run_id in ids:
            store.fail_run(run_id, f"could not start the supervisor process: {exc}")
        raise
    store.set_owner(ids, proc.pid)
    _reap(proc)
    return ids


def describe_exit(returncode: int, timed_out: bool, timeout_s: float) -> str:
    if timed_out:
        return f"timed out: no result after {timeout_s:g} s (hang?); the worker was killed"
    if returncode < 0:
        sig = signal.Signals(-returncode)
        why = {
            signal.SIGSEGV: "segmentation fault",
            signal.SIGKILL: "killed: out of memory (the kernel's OOM killer) or kill -9",
            signal.SIGABRT: "aborted (a C++ assertion or a CUDA error)",
            signal.SIGBUS: "bus error",
            signal.SIGFPE: "floating-point exception",
        }.get(sig, "terminated by a signal")
        return f"worker crashed with {sig.name}: {why}"
    return f"worker exited with code {returncode} without a result"


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    # faulthandler's one-line list of extension modules is noise next to the stack.
    kept = [line for line in text if not line.startswith("Extension modules:")]
    return "\n".join(kept[-lines:])


class _Tail:
    """New complete lines of a file another process appends to (a worker's progress.jsonl)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines if line.strip()]


class _FreshWorker:
    """`python -m engine.runner.worker job.json` in its own session: the fallback when no fork server serves."""

    def __init__(self, spec_file: Path, log_file: Path) -> None:
        with open(log_file, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "engine.runner.worker", str(spec_file)], cwd=REPO_ROOT,
                                         env=_child_env(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        os.killpg(self.pid, signal.SIGKILL)

    def wait_killed(self) -> int:
        return self.proc.wait()


class _ForkedWorker:
    """A child of the fork server (its own session too, so killpg reaches everything it started)."""

    def __init__(self, server: ForkServer, spec_file: Path, log_file: Path) -> None:
        self.server = server
        self.pid = server.spawn(spec_file, log_file)

    def poll(self) -> int | None:
        return self.server.exit_code(self.pid)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait_killed(self) -> int:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                code = self.poll()
            except ForkServerError:
                return -signal.SIGKILL
            if code is not None:
                return code
            time.sleep(0.02)
        return -signal.SIGKILL


# Imported once by the fork server so that no run pays for them: torch, dynamo, Inductor's config and Triton. Inductor's
# compiler (torch._inductor.compile_fx) only where there is no NVIDIA device: on a GPU machine importing it starts
# the CUDA driver (a "cuda…" thread), after which a forked child could not use CUDA; the server would refuse to serve.
PRELOAD = ("torch", "torch._dynamo", "torch._inductor.config", "triton")
PRELOAD_WITHOUT_GPU = ("torch._inductor.compile_fx",)


def default_preload() -> tuple[str, ...]:
    no_gpu = not any(Path("/dev").glob("nvidia*"))  # no device node: nothing can start the CUDA driver
    return PRELOAD + (PRELOAD_WITHOUT_GPU if no_gpu else ())


def preload_for(store: Store, run_ids: Sequence[int]) -> tuple[str, ...]:
    """What a lane's fork server may import for these runs: the longest start that the preloads of their stored kinds
    share (a kind's preload, engine.runner.kinds; default_preload() for the rest). The server imports in order, so a
    start of a run's own preload never imports what that run must not find imported."""
    runs = [run for run in (store.run(i) for i in run_ids) if run is not None]
    preloads = [kinds.StoredKind.of(r).preload or default_preload() for r in runs] or [default_preload()]
    shared = preloads[0]
    for preload in preloads[1:]:
        same = next((i for i, (a, b) in enumerate(zip(shared, preload)) if a != b), min(len(shared), len(preload)))
        shared = shared[:same]
    return tuple(shared)


class Launcher:
    """Starts the workers of one supervisor lane: forked by a fork server (engine.runner.forkserver) when it can, else a
    fresh `python -m engine.runner.worker`. Either way every run is its own process; the server only saves the
    imports."""

    def __init__(self, log_path: Path | None = None, preload: Sequence[str] | None = None) -> None:
        self.preload = list(default_preload() if preload is None else preload)
        self.log_path = log_path
        self.server: ForkServer | None = None
        self.why_not: str | None = None if forkserver_enabled() and log_path else "fork server off"
        self._lock = threading.Lock()

    def prestart(self) -> None:
        """Start the fork server's imports without waiting for them (they overlap whatever the caller does next)."""
        if self.server is not None or self.why_not:
            return
        try:
            self.server = ForkServer(self.preload, _child_env(), REPO_ROOT, self.log_path)
        except OSError as exc:
            self.why_not = f"fork server unavailable, workers start afresh: {exc}"

    def open(self) -> None:
        """Have a ready fork server (started outside any device lock); on failure, fall back to fresh workers."""
        self.prestart()
        if self.server is None:
            return
        try:
            self.server.wait_ready()
        except ForkServerError as exc:
            self.server = None
            self.why_not = f"fork server unavailable, workers start afresh: {exc}"
            print(self.why_not, file=sys.stderr)

    def start(self, spec_file: Path, log_file: Path) -> _FreshWorker | _ForkedWorker:
        with self._lock:  # runs that prepare side by side start their workers from several threads
            return self._start(spec_file, log_file)

    def _start(self, spec_file: Path, log_file: Path) -> _FreshWorker | _ForkedWorker:
        self.open()
        if self.server is not None and self.server.alive():
            try:
                return _ForkedWorker(self.server, spec_file, log_file)
            except ForkServerError as exc:  # a dead server costs a fresh one for the rest of the lane
                print(f"fork server failed ({exc}); starting a new one", file=sys.stderr)
                self.server.close()
                self.server = None
                self.open()
                if self.server is not None:
                    return _ForkedWorker(self.server, spec_file, log_file)
        return _FreshWorker(spec_file, log_file)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def new_launcher(store: Store, name: str = "lane", preload: Sequence[str] | None = None) -> Launcher:
    return Launcher(artifacts_root(store) / f"forkserver-{os.getpid()}-{name}.log", preload)


def lane_preload(kind: str, device_spec: str) -> tuple[str, ...] | None:
    """What a command's one lane of runs of `kind` preloads (the registered kind's preload, else the default); None
    for a sweep over several devices, whose lanes each start their own server."""
    if "," in device_spec or device_spec.endswith(":all"):
        return None
    registered = kinds.get(kind)
    return (registered.preload_for(device_spec) if registered else None) or default_preload()


@contextmanager
def prestarted_launcher(store: Store, preload: Sequence[str] | None) -> Iterator[Launcher | None]:
    """A lane's launcher whose fork server (importing `preload`) starts now, before the caller imports torch and
    checks its arguments: the server's imports (~10 s on the GPU machine) then overlap the caller's instead of
    following them. None where `preload` is None. Closed when the block ends."""
    if preload is None:
        yield None
        return
    launcher = new_launcher(store, preload=preload)
    launcher.prestart()
    try:
        yield launcher
    finally:
        launcher.close()


@contextmanager
def lane_launcher(store: Store, run_ids: Sequence[int], name: str = "lane",
                  launcher: Launcher | None = None) -> Iterator[Launcher]:
    """The lane's launcher (the given one, perhaps pre-started by the CLI, or a new one); closed at the end."""
    launcher = launcher or new_launcher(store, name, preload_for(store, run_ids))
    try:
        if len(run_ids) > 1:  # one run gains nothing from a server: it would import the same modules once anyway
            launcher.open()
        else:
            launcher.why_not = launcher.why_not or "a single run"
        yield launcher
    finally:
        launcher.close()


@dataclass
class _RunFiles:
    """What a run's worker reads and writes, all in the run's own artifacts folder."""
    workdir: Path

    @property
    def spec(self) -> Path:
        return self.workdir / "job.json"

    @property
    def result(self) -> Path:
        return self.workdir / "result.json"

    @property
    def log(self) -> Path:
        return self.workdir / "worker.log"

    @property
    def error(self) -> Path:
        return self.workdir / "error.json"

    @property
    def progress(self) -> Path:
        return self.workdir / "progress.jsonl"


@dataclass
class _Exit:
    """How a worker ended, as the supervisor saw it."""
    returncode: int | None = None
    timed_out: bool = False
    lost: str | None = None  # the fork server died with the worker in it
    cancelled: bool = False  # stopped on a cancel request (engine.runner.cancel)


def run_one(store: Store, run_id: int, on_progress: OnProgress | None = None,
            launcher: Launcher | None = None, group_size: int = 1) -> str:
    """Supervise one queued run to its end; returns the final status ('ok' or 'failed').

    group_size > 1 (a run of a phased kind, engine.runner.kinds, supervised beside up to group_size - 1 others of its
    group): the supervisor does not hold the device; the worker holds it shared while it prepares and exclusively
    while it times (engine.runner.device_lock), so the group's compiles overlap and its timings never do."""
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in {store.path}")
    if run["status"] != "queued":
        return str(run["status"])
    phased = group_size > 1
    if phased and not kinds.StoredKind.of(run).phased:
        raise ValueError(f"run {run_id} ({run['kind']}) does not mark its timed sections: it cannot share its device")

    def report(frac: float, message: str) -> None:
        if on_progress:
            on_progress(run_id, frac, message)

    # Progress goes through a Store that waits PROGRESS_WAIT_S at most: while the store is busy a line is kept for the
    # next try and the worker is watched on.
    quick = Store(store.path, busy_timeout_s=min(PROGRESS_WAIT_S, store.busy_timeout_s))

    def waiting(message: str) -> None:
        _try_progress(quick, run_id, 0.0, message)
        report(0.0, message)

    files = _RunFiles(artifacts_root(store) / f"run_{run_id}")
    timeout_s = _write_job(store, run_id, run, files, group_size if phased else 1)
    with (contextlib.nullcontext() if phased else device_lock(run["device"], on_wait=waiting)) as waited:
        if waited:  # the worker's timings record the wait before them (engine.measure.conditions)
            _note_wait(files, waited)
        now = store.run(run_id) or {}
        if now.get("status") != "queued":  # cancelled (engine.runner.cancel) while it waited for the device
            return str(now.get("status", "failed"))
        while_busy(lambda: store.start_run(run_id, "starting worker"), RECORD_WAIT_S)
        report(0.0, "starting worker")
        own_launcher = launcher is None
        launcher = launcher or Launcher()
        try:
            with _live(_key(store, run_id), launcher.start(files.spec, files.log)) as worker:
                outcome = _watch(quick, run_id, worker, files, timeout_s, report)
        finally:
            if own_launcher:
                launcher.close()
    status = _record(store, run_id, outcome, files, timeout_s)
    report(1.0, "done" if status == "ok" else status)
    return status


def _write_job(store: Store, run_id: int, run: dict[str, Any], files: _RunFiles, group_size: int) -> float:
    """The worker's job.json (target, params, where to write its result and progress), stale outputs cleared;
    returns the run's timeout in seconds."""
    params = dict(run["params"])
    target = params.pop("_target", None)
    if not target:
        raise ValueError(f"run {run_id} names no target (params['_target'])")
    target = kinds.current_target(target)
    params.pop("_kind", None)  # the supervisor's, not the worker's
    timeout_s = float(params.pop("_timeout_s", DEFAULT_TIMEOUT_S))
    files.workdir.mkdir(parents=True, exist_ok=True)
    params.setdefault("artifacts_dir", str(files.workdir))
    params.setdefault("db", str(store.path))
    for stale in (files.result, files.error, files.progress):
        stale.unlink(missing_ok=True)
    clear_cancel(files.workdir)
    files.log.write_bytes(b"")
    job = {"run_id": run_id, "target": target, "params": params, "result_file": str(files.result),
           "progress_file": str(files.progress), "supervisor_pid": os.getpid()}
    if group_size > 1:
        job["device_phases"] = {"device": run["device"], "group_size": group_size}
    files.spec.write_text(json.dumps(job))
    return timeout_s


def _note_wait(files: _RunFiles, waited_s: float) -> None:
    """Add the supervisor's wait for the device lock to the worker's job.json."""
    job = json.loads(files.spec.read_text())
    job["device_wait_s"] = round(float(waited_s), 3)
    files.spec.write_text(json.dumps(job))


def _watch(store: Store, run_id: int, worker: _FreshWorker | _ForkedWorker, files: _RunFiles, timeout_s: float,
           report: Callable[[float, str], None]) -> _Exit:
    """Tail the worker's progress into the store until it exits, dies with its fork server, or runs out of time."""
    progress_lines = _Tail(files.progress)
    deadline = time.monotonic() + timeout_s
    waiting_since: float | None = None  # the worker is waiting for its device (another run holds it): not its time
    last_write = 0.0
    pending: tuple[float, str] | None = None
    outcome = _Exit()
    while True:
        try:
            outcome.returncode = worker.poll()
        except ForkServerError as exc:  # the server died: its child (our run) died with it
            outcome.lost = str(exc)
        finished = outcome.returncode is not None or outcome.lost is not None
        for line in progress_lines.new_lines():
            try:
                msg = json.loads(line)
                pending = (float(msg["progress"]), str(msg["message"]))
                report(*pending)
                if pending[1].startswith(WAITING_PREFIX):
                    waiting_since = waiting_since or time.monotonic()
                elif waiting_since is not None:  # a run waiting behind a hung one is not blamed for the hang
                    deadline += time.monotonic() - waiting_since
                    waiting_since = None
            except (ValueError, KeyError, TypeError):
                continue
        # Throttled: the dashboard polls about once a second; more writes only contend for the file lock.
        if pending and time.monotonic() - last_write > 0.5 and _try_progress(store, run_id, *pending):
            last_write, pending = time.monotonic(), None
        if finished:
            return outcome
        if cancel_requested(files.workdir):  # the user cancelled it: stop the worker, nothing else
            worker.kill()
            return _Exit(worker.wait_killed(), cancelled=True)
        if time.monotonic() > deadline + (time.monotonic() - waiting_since if waiting_since else 0.0):
            worker.kill()
            return _Exit(worker.wait_killed(), timed_out=True)
        time.sleep(0.05)


def _try_progress(store: Store, run_id: int, frac: float, message: str) -> bool:
    """A progress line into the store; False while the store is busy (past the Store's busy timeout)."""
    try:
        store.update_progress(run_id, frac, message)
        return True
    except StoreBusyError:
        return False


# Workers running now, and why runs of this process were interrupted (Ctrl-C, SIGTERM), by (store file, run id):
# run_jobs kills the first and records the second for the runs it had not finished.
_LIVE: dict[tuple[str, int], _FreshWorker | _ForkedWorker] = {}
_INTERRUPTED: dict[tuple[str, int], str] = {}
_LIVE_GUARD = threading.Lock()


def _key(store: Store, run_id: int) -> tuple[str, int]:
    return os.path.realpath(store.path), int(run_id)


@contextmanager
def _live(key: tuple[str, int], worker: _FreshWorker | _ForkedWorker) -> Iterator[_FreshWorker | _ForkedWorker]:
    """The worker, known to run_jobs while it runs; killed if the block is interrupted (Ctrl-C in this thread)."""
    with _LIVE_GUARD:
        _LIVE[key] = worker
    try:
        yield worker
    except BaseException:
        worker.kill()
        raise
    finally:
        with _LIVE_GUARD:
            _LIVE.pop(key, None)


def _record(store: Store, run_id: int, outcome: _Exit, files: _RunFiles, timeout_s: float) -> str:
    """Store the worker's result (status ok) or why there is none (status failed, with the log's tail), waiting out a
    busy store for up to RECORD_WAIT_S. Past that nothing is written and the run stays as stored: a finished worker's
    result.json waits for the next command that opens the store (ingest_left_results)."""
    if outcome.cancelled:  # stopped on a cancel request: that is how it ended, whatever the worker left
        mark_cancelled(store, run_id, RUNNING_REASON)
        return CANCELLED
    try:
        return while_busy(lambda: _record_now(store, run_id, outcome, files, timeout_s), RECORD_WAIT_S)
    except StoreBusyError as exc:
        kept = (f"; its result stays in {files.result}, recorded by the next command that opens the store"
                if outcome.returncode == 0 and files.result.exists() else "")
        print(f"run {run_id}: not recorded, the store stayed busy for {RECORD_WAIT_S:.0f} s ({exc}){kept}",
              file=sys.stderr)
        return "failed"


def _result_of(files: _RunFiles) -> RunResult:
    """The result a worker wrote, with its log and progress timeline as artifacts; ValueError/TypeError if
    unreadable."""
    result = RunResult.from_json(files.result.read_text())
    result.artifacts.append(Artifact(kind="log", name="worker.log", path=str(files.log)))
    if files.progress.exists():  # the run's phases with their times (see engine.runner.worker)
        result.artifacts.append(Artifact(kind="log", name="progress.jsonl", path=str(files.progress)))
    return result


def _record_now(store: Store, run_id: int, outcome: _Exit, files: _RunFiles, timeout_s: float) -> str:
    if outcome.returncode == 0 and files.result.exists():
        try:
            result = _result_of(files)
        except (ValueError, TypeError) as exc:
            store.fail_run(run_id, f"worker wrote an unreadable result: {exc}")
            return "failed"
        store.record_result(run_id, result)
        return "ok"
    kept = _failed_artifacts(files)
    interrupted = _INTERRUPTED.get(_key(store, run_id))
    if interrupted:  # killed by run_jobs on Ctrl-C / SIGTERM: that is the reason, not the kill
        store.fail_run(run_id, interrupted, kept)
        return "failed"
    if outcome.lost is not None:
        tail = _tail(files.log)
        store.fail_run(run_id, outcome.lost + (f"\n--- last lines of {files.log} ---\n{tail}" if tail else ""),
                       kept)
        return "failed"
    store.fail_run(run_id, _failure(outcome, files, timeout_s), kept)
    return "failed"


def _failed_artifacts(files: _RunFiles) -> list[Artifact]:
    """A failed run's log and phase timeline, kept with it: where it was when it stopped (report.run_timeline)."""
    return [Artifact(kind="log", name=path.name, path=str(path)) for path in (files.log, files.progress)
            if path.exists()]


def ingest_left_results(store: Store) -> list[int]:
    """Record the result.json a finished worker left while its run is still queued or running on this host and the
    process that supervised it is gone (it gave up on a busy store, or was killed between its worker's end and the
    record). Called where a command opens the store, before the stale check would fail such a run. The run ids
    recorded."""
    if not store.path.exists():
        return []
    rows = store.query("SELECT id, pid FROM runs WHERE status IN ('queued', 'running') AND host = ?",
                       [socket.gethostname()])
    root, recorded = artifacts_root(store), []
    for run_id, pid in rows.itertuples(index=False) if not rows.empty else ():
        if pid_alive(_as_pid(pid)):
            continue
        result = _left_result(root, int(run_id))
        if result is None:
            continue  # none, or unreadable: the stale check fails the run with its reason
        result.notes.append("recorded from its result.json by a later command: the supervisor that ran it could not "
                            "record it (the store stayed busy, or it was stopped)")
        if store.record_result(int(run_id), result, only_if_active=True):
            recorded.append(int(run_id))
    return recorded


def _left_result(root: Path, run_id: int) -> RunResult | None:
    """The result a finished worker of this run left in its folder under root; None when there is none, it is
    unreadable, or the folder's job.json is another store's run of the same number."""
    files = _RunFiles(root / f"run_{run_id}")
    if not files.result.exists():
        return None
    try:
        if json.loads(files.spec.read_text()).get("run_id") != run_id:
            return None
        return _result_of(files)
    except (OSError, ValueError, TypeError):
        return None


def _as_pid(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):  # NULL: NaN or NA from the frame
        return None


def settle_stale_runs(store: Store) -> tuple[list[int], list[int]]:
    """(recorded, failed): the runs whose supervisor is gone, recorded from a finished worker's result.json
    (ingest_left_results), else marked failed (Store.fail_stale_runs)."""
    recorded = ingest_left_results(store)
    return recorded, store.fail_stale_runs()


def _fail_patiently(store: Store, run_id: int, error: str, wait_s: float = RECORD_WAIT_S) -> None:
    """fail_run, waiting out a busy store for up to wait_s; past it one line on stderr (the stale check fails the run
    once this process is gone)."""
    try:
        while_busy(lambda: store.fail_run(run_id, error), wait_s)
    except StoreBusyError as exc:
        print(f"run {run_id}: could not be marked failed ({error.splitlines()[0]}): {exc}", file=sys.stderr)


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM, SIGHUP) in a supervising process, raised in its main thread like Ctrl-C's
    KeyboardInterrupt."""


def signal_name(exc: KeyboardInterrupt) -> str:
    return str(exc.args[0]) if isinstance(exc, Interrupted) and exc.args else "SIGINT"


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """For the block, SIGTERM raises Interrupted("SIGTERM") in the main thread, so a supervising command marks its runs
    interrupted (as on Ctrl-C) instead of dying with them 'running'. Outside the main thread: nothing changes."""
    with interrupt_on(signal.SIGTERM):
        yield


# What ends a detached supervisor (engine.runner.plan): `kill`, Ctrl-C where it has a terminal, the terminal closing.
SUPERVISOR_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def interrupt_on(*signums: signal.Signals, once: bool = False) -> Iterator[None]:
    """For the block, each of these signals raises Interrupted(its name) in the main thread. once: only the first
    does; the ones after it are ignored, so a second `kill` does not cut short the marking of the runs the first one
    interrupted. Outside the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal raised
        if once and raised:
            return
        raised = True
        raise Interrupted(signal.Signals(signum).name)

    before = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


def interrupt_runs(store: Store, run_ids: Sequence[int], exc: KeyboardInterrupt) -> None:
    """A signal ended the supervisor of run_ids (engine.runner.plan's main): as _interrupt, for every run of them
    still queued or running."""
    _interrupt(store, run_ids, {}, exc)


def _interrupt(store: Store, run_ids: Sequence[int], statuses: dict[int, str], exc: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM while supervising run_ids: no further run starts, the live workers are killed, and every
    unfinished run is marked failed, "interrupted by SIG…" (waiting a few seconds at most for a busy store) — unless
    its worker had finished and left its result, which is recorded."""
    reason = f"interrupted by {signal_name(exc)}"
    unfinished = [_key(store, i) for i in run_ids if i not in statuses]
    with _LIVE_GUARD:
        for key in unfinished:
            _INTERRUPTED[key] = reason
        workers = [_LIVE[key] for key in unfinished if key in _LIVE]
    for worker in workers:
        worker.kill()
    active = Store(store.path, busy_timeout_s=min(10.0, store.busy_timeout_s))  # the user is waiting to get out
    for _, run_id in unfinished:
        try:
            run = active.run(run_id)
        except StoreError as err:
            print(f"run {run_id}: could not be marked {reason}: {err}", file=sys.stderr)
            continue
        if run is None or run["status"] not in ("queued", "running"):
            continue
        result = _left_result(artifacts_root(store), run_id) if run["status"] == "running" else None
        if result is None:
            _fail_patiently(active, run_id, reason, wait_s=10.0)
            continue
        result.notes.append(f"recorded after its supervisor was {reason}: the worker had finished")
        try:
            while_busy(lambda: active.record_result(run_id, result, only_if_active=True), 10.0)
        except StoreBusyError as err:  # the next command that opens the store records it (ingest_left_results)
            print(f"run {run_id}: its result stays in its result.json, the store is busy: {err}", file=sys.stderr)


def _failure(outcome: _Exit, files: _RunFiles, timeout_s: float) -> str:
    """Why a worker left no result: the exception it wrote down, else how it exited and its log's last lines."""
    error = describe_exit(outcome.returncode, outcome.timed_out, timeout_s)
    if files.error.exists() and not outcome.timed_out:  # the worker caught an exception and wrote it down
        try:
            caught = json.loads(files.error.read_text())
            return f"{caught['error']}\n--- traceback (full log: {files.log}) ---\n{caught.get('traceback', '')}"
        except (ValueError, KeyError, TypeError):
            pass
    tail = _tail(files.log)
    return error + (f"\n--- last lines of {files.log} ---\n{tail}" if tail else "")


def run_jobs(store: Store, run_ids: Sequence[int], on_progress: OnProgress | None = None,
             launcher: Launcher | None = None, prepare_parallel: int = 1, needs: Mapping[int, int] | None = None,
             budget: int | None = None) -> dict[int, str]:
    """Supervise runs in this process (the CLI's path; `submit` runs this detached): one after another, or with
    prepare_parallel > 1, up to that many at once, each preparing beside the others and timing alone (run_one's
    group_size; only for runs of a phased kind on one device). With `needs` (what each run holds, in any unit) and
    a `budget`, a run starts only while the needs of the runs under way and its own fit the budget, in the order
    given (the next waits for room; alone it always starts): the group planner's device-memory admission."""
    store.set_owner(run_ids, os.getpid())
    ingest_left_results(store)
    statuses: dict[int, str] = {}
    slots = min(prepare_parallel, len(run_ids))
    if slots > 1:
        runs = [store.run(i) for i in run_ids]
        if not all(kinds.StoredKind.of(r).phased for r in runs) or len({r["device"] for r in runs if r}) > 1:
            raise ValueError("only runs of a phased kind (whose workers mark their timed sections, engine.runner.kinds)"
                             " on one device prepare side by side")
    todo = list(run_ids)
    guard = threading.Condition()
    held = [0]  # the needs of the runs under way

    def admitted() -> tuple[int, int] | None:
        """The next run and its need once it fits beside the runs under way; None when nothing is left."""
        with guard:
            while todo:
                need = int((needs or {}).get(todo[0], 0))
                if budget is None or held[0] == 0 or held[0] + need <= budget:
                    held[0] += need
                    return todo.pop(0), need
                guard.wait(0.5)  # a run under way ends (notify) or the group is interrupted (todo cleared)
            return None

    def lane(launcher: Launcher) -> None:
        while (nxt := admitted()) is not None:
            run_id, need = nxt
            try:
                status = run_one(store, run_id, on_progress, launcher, group_size=slots)
            except Exception as exc:  # the supervisor must leave no run behind in 'running'
                _fail_patiently(store, run_id, f"supervisor error: {type(exc).__name__}: {exc}")
                status = "failed"
            with guard:
                statuses[run_id] = status
                held[0] -= need
                guard.notify_all()

    with lane_launcher(store, run_ids, launcher=launcher) as launcher:
        try:
            if slots <= 1:
                lane(launcher)  # in this thread, as always: Ctrl-C stops the supervisor where it is
            else:
                threads = [threading.Thread(target=lane, args=(launcher,), name=f"slot-{i}", daemon=True)
                           for i in range(slots)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    while thread.is_alive():  # join in slices, so Ctrl-C reaches this thread
                        thread.join(0.5)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM under interrupt_on_sigterm
            with guard:
                todo.clear()
            _interrupt(store, run_ids, statuses, exc)
            raise
    return {run_id: statuses.get(run_id, "failed") for run_id in run_ids}


def run_jobs_spread(store: Store, run_ids: Sequence[int], on_progress: OnProgress | None = None) -> dict[int, str]:
    """Supervise runs on several devices at once: one thread per device, each taking its device's runs in order.
    The per-device lock still holds, so two timing runs never share a device; runs on one device behave exactly as
    under run_jobs."""
    store.set_owner(run_ids, os.getpid())
    ingest_left_results(store)
    by_device: dict[str, list[int]] = {}
    for run_id in run_ids:
        run = store.run(run_id)
        by_device.setdefault(run["device"] if run else "?", []).append(run_id)
    statuses: dict[int, str] = {}
    lock = threading.Lock()

    def lane(device: str, ids: list[int]) -> None:
        with lane_launcher(store, ids, device.replace(":", "")) as launcher:
            for run_id in ids:
                if _key(store, run_id) in _INTERRUPTED:  # Ctrl-C / SIGTERM: marked already, start nothing more
                    continue
                try:
                    status = run_one(store, run_id, on_progress, launcher)
                except Exception as exc:  # the supervisor must leave no run behind in 'running'
                    _fail_patiently(store, run_id, f"supervisor error: {type(exc).__name__}: {exc}")
                    status = "failed"
                with lock:
                    statuses[run_id] = status

    threads = [threading.Thread(target=lane, args=(device, ids), name=f"lane-{device}")
               for device, ids in by_device.items()]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():  # join in slices, so Ctrl-C reaches this thread
                thread.join(0.5)
    except KeyboardInterrupt as exc:  # the lanes see their runs interrupted, end their workers' watch and stop
        _interrupt(store, run_ids, statuses, exc)
        raise
    return {run_id: statuses.get(run_id, "failed") for run_id in run_ids}


def spread(devices: Sequence[str], count: int) -> list[str]:
    """Round-robin device assignment for `count` runs of a sweep."""
    return [devices[i % len(devices)] for i in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    """Supervise queued runs one after another, in the order given (no planning: see engine.runner.plan)."""
    parser = argparse.ArgumentParser(prog="python -m engine.runner.jobs",
                                     description="Supervise queued runs (internal).")
    parser.add_argument("--db", required=True)
    parser.add_argument("run_ids", nargs="+", type=int)
    args = parser.parse_args(argv)
    statuses = run_jobs(Store(args.db), args.run_ids)
    print(json.dumps(statuses))
    return 0 if all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
