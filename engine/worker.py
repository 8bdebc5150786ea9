"""The worker process: runs one job's target function and hands back its result as a file.

Started by engine.jobs with a job.json. Progress goes out as JSON lines on the original stdout (everything else the
code prints is moved to stderr, the run's log). The result, or the exception that stopped it, is written to
result.json; a crash writes nothing and the supervisor reports the signal and the log's tail (faulthandler puts the
Python stack of a segfault there). After a result is written the worker leaves with os._exit, skipping torch's slow
interpreter teardown (MODELAB_WORKER_FAST_EXIT=0 keeps the normal exit).
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path


def _die_with_parent() -> None:
    # If the supervisor is killed (kill -9), do not run on orphaned: Linux sends us SIGKILL.
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


def main(argv: list[str]) -> int:
    _die_with_parent()
    faulthandler.enable()
    progress_out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (ours, torch's, C++'s) go to the log, not into the progress channel
    sys.stdout = sys.stderr
    job = json.loads(Path(argv[0]).read_text())
    result_file = Path(job["result_file"])

    def progress(frac: float, message: str) -> None:
        progress_out.write(json.dumps({"progress": float(frac), "message": str(message)}) + "\n")

    try:
        # Compiled artifacts (Inductor's FX graph / AOTAutograd / autotune caches) persist under MODELAB_BUILD_DIR,
        # keyed by torch version, so the next run's first call is a cache hit instead of a compile.
        from engine.native.build import configure_compile_caches

        configure_compile_caches()
        target = load_target(job["target"])
        result = target(job["params"], progress)
        _write_atomic(result_file, result.to_json())
    except BaseException as exc:  # noqa: BLE001 - everything becomes a failed run with its reason
        traceback.print_exc()
        tb = "".join(traceback.format_exception(exc)[-6:])
        _write_atomic(result_file.with_name("error.json"), json.dumps({"error": classify(exc), "traceback": tb}))
        return 1
    # The result is on disk and everything a run writes (traces, caches, packages) was written synchronously: skip
    # the interpreter's teardown of torch (1.5–3.5 s per worker on a 2-core CPU, paid by every run of `bench --mode
    # all`). Flush first: os._exit drops buffered output.
    for stream in (progress_out, sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if os.environ.get("MODELAB_WORKER_FAST_EXIT", "1") != "0":
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
