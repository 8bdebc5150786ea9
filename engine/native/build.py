"""Building the native code in csrc/ against the installed torch: the custom-op library and the AOTInductor runner.

Everything lands under one cache folder, `.build/` in the repository (or $MODELAB_BUILD_DIR), in a subfolder per torch
and Python version, so a torch upgrade never loads a stale binary. Builds are cached: the custom ops by
torch.utils.cpp_extension (it rebuilds when a source or a flag changes), the runner by a hash of its source, flags and
torch version. A machine-wide file lock (flock: the kernel drops it if the holder dies) keeps two processes from
building the same thing at once; cpp_extension's own "baton" file would be left behind by a killed build and make the
next one wait forever, so it is cleared while we hold the lock.

Workers also keep Inductor's caches (FX graph, AOTAutograd, autotune, Triton) under the same folder
(`configure_compile_caches`; the folder and the worker's environment are engine.runner.worker_env's), and every build
or package records whether it was a cache hit (`record_build`), which bench stores as `cache_*` metrics of the phase
(engine.measure.caches).

Nothing here is imported by the dashboard: availability checks (`custom_ops_missing`, `compiler_missing`) only look
for tools and never build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch

from engine.native.toolchain import exported_std_code, find_cxx, library_compiler, runner_cxx_candidates
from engine.runner import device_lock
from engine.runner.worker_env import (  # noqa: F401 - the build folder is the worker's; named here too
    build_root,
    build_tag,
    configure_compile_caches,
    inductor_cache_dir,
)
from engine.store import settings

REPO_ROOT = Path(__file__).resolve().parents[2]
CSRC = REPO_ROOT / "csrc"
OPS_SOURCES = ("modelab_ops.cpp",)
OPS_CUDA_SOURCES = ("modelab_ops_cuda.cu",)
RUNNER_SOURCE = "aoti_runner.cpp"

_loaded_ops: str | None = None  # path of the custom-op library loaded into this process


class NativeBuildError(RuntimeError):
    """A native build could not run or failed; the message says why and what to install."""


def extension_compiler() -> AbstractContextManager[str | None]:
    """$CXX set, for a cpp_extension build, to a compiler that keeps libstdc++ out of the library
    (toolchain.library_compiler; its probe remembered under the build root)."""
    return library_compiler(build_root() / "cxx_probe.json")


# Native builds and packages done (or found cached) in this process since the last take_build_events(): bench stores
# them as `cache_<name>_hit` metrics, so a run's first-use cost says which artifact was rebuilt.
_build_events: list[dict] = []


def record_build(name: str, cache_hit: bool, seconds: float) -> None:
    _build_events.append({"name": name, "cache_hit": bool(cache_hit), "seconds": float(seconds)})


def take_build_events() -> list[dict]:
    events = list(_build_events)
    _build_events.clear()
    return events


def _ensure_ninja_on_path() -> str | None:
    """cpp_extension runs `ninja` from PATH; the pip package's copy sits beside this Python, often not on PATH."""
    found = shutil.which("ninja")
    if found:
        return found
    candidates = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    try:
        import ninja  # the PyPI package (requirements.txt)

        candidates.insert(0, Path(ninja.BIN_DIR))
    except (ImportError, AttributeError):
        pass
    for folder in candidates:
        if (folder / "ninja").is_file():
            os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
            return str(folder / "ninja")
    return None


def compiler_missing() -> str | None:
    """Why a C++ build cannot run here (None: it can). Cheap: looks for tools, builds nothing."""
    if find_cxx() is None:
        return "no C++ compiler found (install g++, e.g. `apt-get install g++`, or point $CXX at one)"
    return None


def nvcc_missing() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    if CUDA_HOME is None or not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return "nvcc not found (install the CUDA toolkit and set CUDA_HOME) — needed for the op's CUDA kernel"
    return None


def custom_ops_missing(device: str = "cpu") -> str | None:
    """Why the custom-op library cannot be built for `device` (None: it can)."""
    reason = compiler_missing()
    if reason:
        return reason
    if _ensure_ninja_on_path() is None:
        return "ninja not found (pip install ninja — it is pinned in requirements.txt); cpp_extension builds with it"
    if device.startswith("cuda"):
        if _loaded_ops is not None and not _loaded_ops_has_cuda():
            return "the custom ops were already loaded without CUDA kernels in this process"
        return nvcc_missing()
    return None


def _loaded_ops_has_cuda() -> bool:
    return _loaded_ops is not None and Path(_loaded_ops).stem.endswith("_cuda")


@contextmanager
def build_lock(name: str) -> Iterator[None]:
    """Exclusive, machine-wide lock for building `name` (one lock file per build tag and target)."""
    folder = build_root() / build_tag()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{name}.lock", os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _cuda_arch_tag() -> str:
    if not torch.cuda.is_available():
        return "nogpu"
    archs = sorted({"sm{}{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())})
    return "-".join(archs)


def load_custom_ops(with_cuda: bool | None = None, verbose: bool = False) -> str:
    """Build (first time: about a minute) and load the `modelab` ops into this process; returns the library's path.

    Idempotent. `with_cuda` defaults to: torch sees a GPU and nvcc is found. The Python side (fake kernels for
    torch.compile / torch.export) is engine.native.ops's: call `ops.load()`, which loads through here and adds it.
    """
    global _loaded_ops
    if _loaded_ops is not None:
        return _loaded_ops
    reason = compiler_missing()
    if reason:
        raise NativeBuildError(reason)
    if _ensure_ninja_on_path() is None:
        raise NativeBuildError("ninja not found (pip install ninja — it is pinned in requirements.txt)")
    if with_cuda is None:
        with_cuda = torch.cuda.is_available() and nvcc_missing() is None
    elif with_cuda:
        reason = nvcc_missing()
        if reason:
            raise NativeBuildError(reason)

    from torch.utils import cpp_extension

    name = "modelab_ops_cuda" if with_cuda else "modelab_ops"
    sources = [str(CSRC / s) for s in OPS_SOURCES + (OPS_CUDA_SOURCES if with_cuda else ())]
    build_dir = build_root() / build_tag() / (f"{name}-{_cuda_arch_tag()}" if with_cuda else name)
    build_dir.mkdir(parents=True, exist_ok=True)
    # host-only: other runs of a group may time meanwhile; linked by a compiler that keeps libstdc++ out of the
    # library (toolchain.library_cxx)
    with device_lock.released(), build_lock(name), extension_compiler():
        (build_dir / "lock").unlink(missing_ok=True)  # a killed build's baton; we hold the real lock
        before = _newest_library(build_dir, name)
        start = time.perf_counter()
        try:
            path = cpp_extension.load(
                name=name, sources=sources, extra_cflags=["-O3"], extra_cuda_cflags=["-O3"],
                build_directory=str(build_dir), is_python_module=False, with_cuda=with_cuda, verbose=verbose)
        except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError) as exc:
            raise NativeBuildError(f"building the modelab custom ops ({', '.join(Path(s).name for s in sources)}) "
                                   f"in {build_dir} failed:\n{_tail(str(exc))}") from exc
        # cpp_extension rebuilds when a source or flag changed (and bumps name_v1, name_v2 …): a hit leaves the newest
        # library as it was.
        record_build(name, before is not None and before == _newest_library(build_dir, name),
                     time.perf_counter() - start)
    _loaded_ops = str(path)
    return _loaded_ops


def _newest_library(build_dir: Path, name: str) -> tuple[str, int] | None:
    found = [(p.stat().st_mtime_ns, p.name) for p in build_dir.glob(f"{name}*.so")]
    return (max(found)[1], max(found)[0]) if found else None


def _lib_dir() -> Path:
    from torch.utils.cpp_extension import library_paths

    return Path(library_paths()[0])


def runner_link_cuda() -> bool:
    """Link the runner against libtorch_cuda when this torch has it (so it can run CUDA packages)."""
    return (_lib_dir() / "libtorch_cuda.so").exists()


def runner_command(output: Path, cxx: str | None = None) -> list[str]:
    """The compiler command that builds csrc/aoti_runner.cpp against this torch's libtorch."""
    from torch.utils.cpp_extension import include_paths

    cxx = cxx or find_cxx() or "c++"
    lib = _lib_dir()
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    cmd = [cxx, "-O2", f"-std={settings.get('MODELAB_CXX_STD')}", "-pthread",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-DMODELAB_TORCH_VERSION_MAJOR={major}", f"-DMODELAB_TORCH_VERSION_MINOR={minor}"]
    cmd += [f"-I{p}" for p in include_paths()]
    cmd += [str(CSRC / RUNNER_SOURCE), "-o", str(output), f"-L{lib}", f"-Wl,-rpath,{lib}",
            "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10"]
    if runner_link_cuda():
        cmd += ["-ltorch_cuda", "-lc10_cuda"]
    # libtorch_cuda finds its CUDA libraries (pip's nvidia-* wheels) through its own RUNPATH at run time; the linker
    # need not resolve them now.
    cmd += ["-Wl,--as-needed", "-Wl,--allow-shlib-undefined"]
    return cmd


def build_aoti_runner(verbose: bool = False) -> Path:
    """Compile csrc/aoti_runner.cpp into an executable (cached by source + flags + torch version); returns its path.

    Tries the candidate compilers in turn and keeps the first runner that exports no std code of its own (see
    exported_std_code); if every one does, the last build is used and its crash, if any, is reported by the run.
    """
    reason = compiler_missing()
    if reason:
        raise NativeBuildError(reason)
    exe = None
    candidates = runner_cxx_candidates() or [None]
    for i, cxx in enumerate(candidates):
        exe = _build_runner_with(cxx, verbose)
        leaked = exported_std_code(exe)
        if not leaked or i == len(candidates) - 1:
            return exe
        if verbose:
            print(f"aoti_runner built with {cxx} exports {len(leaked)} std function(s) ({leaked[0]}, …); "
                  f"trying {candidates[i + 1]}", file=sys.stderr)
    assert exe is not None
    return exe


def _build_runner_with(cxx: str | None, verbose: bool) -> Path:
    source = (CSRC / RUNNER_SOURCE).read_bytes()
    probe_cmd = runner_command(Path("OUT"), cxx)
    key = hashlib.sha256(source + torch.__version__.encode() + "\0".join(probe_cmd).encode()).hexdigest()[:16]
    folder = build_root() / build_tag() / f"aoti_runner-{key}"
    exe = folder / "aoti_runner"
    if exe.is_file() and os.access(exe, os.X_OK):
        record_build("aoti_runner", True, 0.0)
        return exe
    with device_lock.released(), build_lock("aoti_runner"):  # host-only: others may time meanwhile
        if exe.is_file():
            record_build("aoti_runner", True, 0.0)
            return exe
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"aoti_runner.tmp{os.getpid()}"
        cmd = runner_command(tmp, cxx)
        start = time.monotonic()
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NativeBuildError(f"could not run the compiler for the AOTInductor runner: {exc}") from exc
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise NativeBuildError(f"building the AOTInductor runner failed (exit {done.returncode}):\n"
                                   f"{' '.join(cmd)}\n{_tail(done.stderr or done.stdout)}")
        (folder / "build_command.txt").write_text(" ".join(cmd) + f"\n# {time.monotonic() - start:.1f} s\n")
        os.replace(tmp, exe)
        record_build("aoti_runner", False, time.monotonic() - start)
    return exe
