"""The worker process: runs one job's target function and hands back its result as a file.

Started by engine.runner.jobs for every run, either as `python -m engine.runner.worker job.json` or forked by
engine.runner.forkserver
(which has the imports done already). job.json names the progress file (JSON lines the supervisor tails) and the log;
everything the code prints goes to the log. The result, or the exception that stopped it, is written to result.json;
a crash writes nothing and the supervisor reports the signal and the log's tail (faulthandler puts the Python stack of
a segfault there). After a result is written the worker leaves with os._exit, skipping torch's slow interpreter
teardown (MODELAB_WORKER_FAST_EXIT=0 keeps the normal exit of a worker started afresh).
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from engine.store import settings


def die_with_parent() -> None:
    # If the supervisor (or fork server) is killed (kill -9), do not run on orphaned: Linux sends us SIGKILL.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def load_target(spec: str):
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"job target {spec!r} is not 'module:function'")
    return getattr(importlib.import_module(module_name), func_name)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "out of memory" in text.lower():
        return "out of memory: " + text
    if "cuda error" in text.lower() or "CUDA" in type(exc).__name__:
        return "CUDA error: " + text
    return text


def _flush_all(*streams) -> None:
    for stream in (*streams, sys.stdout, sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def share_compile_threads(group_size: int) -> None:
    """Inductor's parallel compile uses one worker per core in each process (torch._inductor.config.compile_threads,
    TORCHINDUCTOR_COMPILE_THREADS): runs preparing side by side split the cores between them instead of each
    starting a pool of all of them. A value the user set is kept."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // max(1, group_size))
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    config = sys.modules.get("torch._inductor.config")  # the fork server imported it already: set it there too
    if config is not None:
        config.compile_threads = threads


def run_job(job_path: str | Path) -> int:
    """Run the job described by job.json in this process; 0 when a result was written, 1 when an error was."""
    job = json.loads(Path(job_path).read_text())
    result_file = Path(job["result_file"])
    progress_out = open(job["progress_file"], "a", buffering=1)
    started = time.perf_counter()

    last: list = [0.0, ""]

    def progress(frac: float, message: str, **extra: str | None) -> None:
        last[:] = [frac, message]
        # "t" (seconds into the run) makes the file a timeline of the run's phases, kept as an artifact; "wall"
        # (epoch seconds) lines it up with the other runs of its group (engine.store.report.group_timeline).
        progress_out.write(json.dumps({"progress": float(frac), "message": str(message),
                                       "t": round(time.perf_counter() - started, 3),
                                       "wall": round(time.time(), 3), **extra}) + "\n")

    def hold_changed(state: str | None) -> None:  # "hold": how this worker holds its device from here on
        progress(last[0], last[1], hold=state or "none")

    try:
        # Compiled artifacts (Inductor's FX graph / AOTAutograd / autotune caches) persist under MODELAB_BUILD_DIR,
        # keyed by torch version, so the next run's first call is a cache hit instead of a compile.
        from engine.runner.worker_env import configure_compile_caches

        configure_compile_caches()
        if job.get("supervisor_pid"):  # the group's own processes on the device are not interference
            from engine.runner.device_lock import note_supervisor

            note_supervisor(job["supervisor_pid"])
        if job.get("device_wait_s"):  # how long the supervisor waited for the device before starting this run
            from engine.runner.device_lock import note_run_wait

            note_run_wait(job["device_wait_s"])
        if job.get("device_phases"):  # preparing beside other runs of its group: shared now, exclusive to time
            from engine.runner.device_lock import begin_phases

            phases = job["device_phases"]
            share_compile_threads(int(phases.get("group_size", 2)))
            begin_phases(phases["device"], on_wait=lambda message: progress(last[0], message),
                         group_size=int(phases.get("group_size", 2)), on_switch=hold_changed)
        from engine.runner.device_lock import released

        with released():  # importing the target is host-only: others of the group may time meanwhile
            target = load_target(job["target"])
        result = target(job["params"], progress)
        if job.get("device_phases"):  # done with the device: let the group's next run have it now
            from engine.runner.device_lock import end_phases

            end_phases()
        _write_atomic(result_file, result.to_json())
    except BaseException as exc:  # noqa: BLE001 - everything becomes a failed run with its reason
        traceback.print_exc()
        tb = "".join(traceback.format_exception(exc)[-6:])
        _write_atomic(result_file.with_name("error.json"), json.dumps({"error": classify(exc), "traceback": tb}))
        _flush_all(progress_out)
        return 1
    _flush_all(progress_out)
    return 0


def forked_main(job_path: str, log_file: str) -> None:
    """Entry of a child forked by engine.runner.forkserver: own session, output to the run's log, then run_job. Never
    returns (os._exit), so nothing of the server's loop runs on in the child."""
    code = 1
    try:
        os.setsid()  # its own process group: a timeout kills it and everything it started, never the server
        die_with_parent()
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the server's command pipe is not ours to read
        os.close(null)
        faulthandler.enable()
        print(f"worker pid {os.getpid()} forked by the fork server (pid {os.getppid()})", file=sys.stderr)
        code = run_job(job_path)
    except BaseException:  # noqa: BLE001 - a child must never fall back into the server's loop
        traceback.print_exc()
    finally:
        _flush_all()
        os._exit(code)


def main(argv: list[str]) -> int:
    die_with_parent()
    faulthandler.enable()
    sys.stdout = sys.stderr  # both go to the run's log; one stream keeps their order
    fast_exit = settings.get("MODELAB_WORKER_FAST_EXIT")  # read first: a bad value fails before the run starts
    code = run_job(argv[0])
    # The result is on disk and everything a run writes (traces, caches, packages) was written synchronously: skip
    # the interpreter's teardown of torch (1.5–3.5 s per worker on a 2-core CPU). Flush first: os._exit drops
    # buffered output.
    _flush_all()
    if code == 0 and fast_exit:
        os._exit(0)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
