"""A fork server for workers: one process per supervisor lane that has imported torch and the engine once, and forks
a fresh child for every run.

Why: a worker spends ~3 s (2-core CPU) to ~8 s (GPU machine) importing torch, Inductor and the engine before it runs
anything, and `bench --mode all` starts 7–11 of them. The server pays that once. Each run is still its own process
(own session, own CUDA context, its own crash): the server never touches a device, starts no thread and runs no
torch op, so a child begins with no device state, no thread pools and no compiled code of an earlier run; only the
imported modules are shared. The server refuses to serve (and the supervisor starts workers afresh) if its preload
started a thread beyond the one torch's import starts (numpy's OpenBLAS server, fork-safe by design), since forking a
threaded process is unsafe. That is why the engine's own modules are not preloaded: engine.store.db imports pandas,
whose
pyarrow starts jemalloc's background thread; a child imports them itself (~0.5 s). Nor, on a GPU machine, anything
that starts the CUDA driver (engine.runner.jobs.default_preload says which).

Protocol, JSON lines. Supervisor → server (stdin): {"job": job.json, "log": worker.log}.
Server → supervisor (stdout): {"ready": true, "preloaded": [...], "seconds": s} once, or {"ready": false, "why": ...};
then per job {"started": job, "pid": pid} and later {"exited": pid, "code": c} (c < 0: killed by signal -c).
The server leaves when its stdin closes, after its children end; it dies with its supervisor (PR_SET_PDEATHSIG),
and its children die with it.
MODELAB_FORKSERVER=0 turns it off.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from engine.store import settings

ENV_SWITCH = "MODELAB_FORKSERVER"
READY_TIMEOUT_S = 180.0


def enabled() -> bool:
    return bool(settings.get(ENV_SWITCH))


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# -- the server ------------------------------------------------------------------------------------------------------

def serve(preload: Sequence[str]) -> int:
    from engine.runner.worker import die_with_parent, forked_main

    die_with_parent()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of imported modules go to the server's log
    started = time.perf_counter()
    from engine.runner.worker_env import configure_compile_caches

    configure_compile_caches()  # before the preload imports Inductor, which reads some of these at import time
    # torch (through numpy) starts OpenBLAS's thread server, which is fork-safe by design (pthread_atfork; torch's
    # DataLoader forks such processes all the time). Anything after it must start no thread at all.
    import torch  # noqa: F401

    baseline = _thread_count()
    loaded, skipped = [], []
    for name in preload:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a module the child needs will fail there, with its reason
            skipped.append(f"{name}: {type(exc).__name__}: {exc}")
    threads = _thread_count()
    if threads > baseline or threading.active_count() > 1:
        out.write(json.dumps({"ready": False, "why": f"{threads} threads after importing {', '.join(loaded)} "
                                                     f"({baseline} after torch); forking a threaded process is "
                                                     "unsafe"}) + "\n")
        return 1
    out.write(json.dumps({"ready": True, "preloaded": loaded, "skipped": skipped,
                          "seconds": round(time.perf_counter() - started, 3)}) + "\n")

    children: set[int] = set()
    buffer = b""
    stdin_open = True
    while stdin_open or children:
        for pid in list(children):  # reap and report every child that ended
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                out.write(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
        if not stdin_open:
            time.sleep(0.02)
            continue
        ready, _, _ = select.select([0], [], [], 0.02)
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            stdin_open = False
            continue
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                request = json.loads(line)
                job, log = str(request["job"]), str(request["log"])
            except (ValueError, KeyError, TypeError):
                continue
            out.flush()
            pid = os.fork()
            if pid == 0:
                os.close(out.fileno())  # the child must not hold the server's report pipe open
                forked_main(job, log)  # never returns
            children.add(pid)
            out.write(json.dumps({"started": job, "pid": pid}) + "\n")
    return 0


# -- the supervisor's side -------------------------------------------------------------------------------------------

class ForkServerError(RuntimeError):
    pass


class ForkServer:
    """A running fork server, owned by one supervisor thread (one lane): spawn() a job, then poll its child."""

    def __init__(self, preload: Sequence[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "engine.runner.forkserver", *preload], cwd=cwd, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, text=True, bufsize=1)
        self._events: queue.Queue[dict] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = False
        self.preloaded: list[str] = []
        self.preload_s = 0.0

    def wait_ready(self) -> None:
        """Block until the server has done its imports; raises ForkServerError (and stops it) if it refused."""
        if self.ready:
            return
        hello = self._next_event(READY_TIMEOUT_S, "ready")
        if not hello.get("ready"):
            self.close()
            raise ForkServerError(hello.get("why") or "the fork server did not become ready")
        self.ready = True
        self.preloaded = hello.get("preloaded", [])
        self.preload_s = float(hello.get("seconds", 0.0))

    def _read(self) -> None:
        # Exits go straight to their table: the threads that poll exit_code() and the one waiting in spawn() for its
        # 'started' never take each other's events (a 'started' lost that way once cost a 30 s wait and the server).
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "exited" in event:
                self._exits[int(event["exited"])] = int(event["code"])
            else:
                self._events.put(event)
        self._eof = True
        self._events.put({"eof": True})

    def _next_event(self, timeout_s: float, what: str) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                event = self._events.get(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise ForkServerError(f"the fork server sent no '{what}' in {timeout_s:.0f} s") from None
                continue
            if event.get("eof"):
                self._events.put(event)  # stays visible to later calls
                raise ForkServerError(f"the fork server ended (exit {self.proc.poll()}); its log: {self.log_path}")
            return event

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, job_file: Path, log_file: Path) -> int:
        self.wait_ready()
        if not self.alive():
            raise ForkServerError(f"the fork server is gone (exit {self.proc.poll()})")
        self.proc.stdin.write(json.dumps({"job": str(job_file), "log": str(log_file)}) + "\n")
        self.proc.stdin.flush()
        event = self._next_event(30.0, "started")
        return int(event["pid"])

    def exit_code(self, pid: int) -> int | None:
        """The child's exit code once the server reported it; None while it runs. Raises if the server died first."""
        if pid in self._exits:
            return self._exits.pop(pid)
        if self._eof or not self.alive():
            deadline = time.monotonic() + 2.0
            while not self._eof and time.monotonic() < deadline:  # the reader may still hold the last lines
                time.sleep(0.02)
            if pid in self._exits:
                return self._exits.pop(pid)
            raise ForkServerError(f"the fork server died (exit {self.proc.poll()}) while the run was running; "
                                  f"the run's process died with it. Server log: {self.log_path}")
        return None

    def close(self) -> None:
        if not self.ready and self.proc.poll() is None:  # still importing (or refused): nothing to wait for
            self.proc.kill()
            self.proc.wait()
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
