"""The C++ toolchain as seen from this machine: which compiler, which libstdc++, and what a built executable exports.

No torch import here. What a worker's environment needs (which compiler, which libstdc++ to preload) lives in
engine.runner.worker_env, whose supervisor applies it to every worker it starts without loading torch; it is named
here too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from engine.runner.worker_env import (  # noqa: F401 - a worker's environment is the runner's; named here too
    find_cxx,
    libstdcxx_to_preload,
    loaded_libstdcxx,
    with_libstdcxx_preloaded,
)


def runner_cxx_candidates() -> list[str]:
    """Compilers to try for the runner: $CXX first if set, then c++, g++, g++-N, <machine>-linux-gnu-g++[-N],
    clang++."""
    machine = platform.machine()
    versions = range(20, 8, -1)
    names = ["c++", "g++", *(f"g++-{v}" for v in versions), f"{machine}-linux-gnu-g++",
             *(f"{machine}-linux-gnu-g++-{v}" for v in versions), "clang++"]
    found = [shutil.which(n) for n in names]
    return [p for p in dict.fromkeys([find_cxx() if os.environ.get("CXX") else None, *found]) if p]


def exported_std_code(exe: Path) -> list[str]:
    """Functions of namespace std that `exe` defines and exports (nm -D): runtime code a toolchain linked in.

    Why it matters: the dynamic linker binds libtorch's own calls to such copies first. On the GPU image `c++` is a
    separate GCC build (/opt/gcc) that links pieces of its newer runtime into executables (std::locale and codecvt
    members); libtorch then segfaulted inside std::regex while loading any AOTInductor package. The system compiler
    (/usr/bin/c++ there) builds a runner that exports none and works.
    """
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", str(exe)], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    symbols = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T" and parts[2].startswith(("_ZNSt", "_ZNKSt", "_ZSt")) and \
                not parts[2].startswith(("_ZNSt3__1", "_ZNKSt3__1")):
            symbols.append(parts[2])
    return symbols


# A shared library that calls into libstdc++ (a TORCH_CHECK's message, a throw): enough to see whether a compiler links
# the runtime in and exports it.
_PROBE_SOURCE = """#include <stdexcept>
#include <string>
void modelab_probe(int n) { if (n) throw std::runtime_error("probe " + std::to_string(n)); }
"""


def shared_library_exports_std(cxx: str) -> bool | None:
    """Whether a shared library linked by `cxx` defines and exports std:: functions (None: the probe did not build).

    Why it matters for the CUDA/C++ extension libraries: a library that exports its own copy of libstdc++'s code
    interposes it for the whole process. On the GPU image `$CXX` (/opt/gcc/bin/g++) links libstdc++ statically into
    shared objects (such a library exports hundreds of std:: functions and needs no libstdc++.so): a TORCH_CHECK
    thrown from it kills the process with SIGSEGV instead of raising its RuntimeError (docs/aoti.md). Here, g++
    -static-libstdc++ does the same and a throw's message loses its formatted numbers."""
    with tempfile.TemporaryDirectory(prefix="modelab-cxx-probe-") as tmp:
        src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        src.write_text(_PROBE_SOURCE)
        try:
            done = subprocess.run([cxx, "-shared", "-fPIC", "-O1", str(src), "-o", str(lib)], capture_output=True,
                                  text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0 or not lib.is_file():
            return None
        return bool(exported_std_code(lib))


def _exports_std_cached(cxx: str, cache: Path | None) -> bool | None:
    """shared_library_exports_std(cxx), remembered in the JSON file `cache` (keyed by the compiler's resolved path,
    size and mtime), so that every worker that loads a library does not probe again (~0.5–1 s a compiler)."""
    if cache is None:
        return shared_library_exports_std(cxx)
    try:
        real = Path(shutil.which(cxx) or cxx).resolve()
        st = real.stat()
    except OSError:
        return shared_library_exports_std(cxx)
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(key), bool):
        return known[key]
    found = shared_library_exports_std(cxx)
    if found is not None:
        try:  # each writer its own temporary file, renamed (atomic): a reader never sees half a file
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**known, key: found}))
            tmp.replace(cache)
        except OSError:
            pass
    return found


@functools.lru_cache(maxsize=4)
def library_cxx(cache: Path | None = None) -> str | None:
    """The C++ compiler the extension libraries are linked with: the first of `runner_cxx_candidates()` ($CXX first,
    then c++, g++ …) whose shared libraries export no std:: code; the first candidate if none qualifies (or none
    probes), None without any compiler. Looked up once per process; `cache` (a JSON file) keeps each compiler's
    probe across processes."""
    candidates = runner_cxx_candidates()
    for cxx in candidates:
        if _exports_std_cached(cxx, cache) is False:
            return cxx
    return candidates[0] if candidates else None


@contextlib.contextmanager
def library_compiler(cache: Path | None = None) -> Iterator[str | None]:
    """$CXX set to `library_cxx(cache)` while a torch.utils.cpp_extension build runs (it reads $CXX for the compile
    and link steps of its ninja file, so a changed choice rebuilds), restored after. Yields the compiler."""
    cxx = library_cxx(cache)
    before = os.environ.get("CXX")
    if cxx is not None:
        os.environ["CXX"] = cxx
    try:
        yield cxx
    finally:
        if before is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = before
