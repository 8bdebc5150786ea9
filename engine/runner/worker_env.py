"""The environment a worker process runs in: the libstdc++ it preloads and the folder that keeps its compiled caches.

The supervisor starts every worker (and fork server) with `with_libstdcxx_preloaded` applied to its environment; the
worker (or the fork server, before it imports torch's compiler) calls `configure_compile_caches`. engine.native
builds under the same folder (`build_root() / build_tag()`) and imports these from here.

Light on purpose: the supervisor never loads torch (build_tag reads torch's version.py where torch is not imported),
and the fork server calls this before its preload, where nothing may start a thread (so no engine.store, whose
pandas starts one).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path

from engine.store import settings

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- the build folder and Inductor's caches --------------------------------------------------------------------------

def build_root() -> Path:
    """Where native builds and compiled caches live: $MODELAB_BUILD_DIR, else `.build/` in the repository."""
    return settings.get("MODELAB_BUILD_DIR") or REPO_ROOT / ".build"


def torch_versions() -> tuple[str, str | None]:
    """torch's version and the CUDA version it was built with: from torch where it is imported, else from its
    version.py alone (a file of constants), without importing torch — a second or more that a worker whose target
    never uses torch, or the supervisor, does not need to spend."""
    torch = sys.modules.get("torch")
    if torch is None:
        spec = importlib.util.find_spec("torch")  # a top-level package: found, not imported
        version_py = Path(spec.origin).with_name("version.py") if spec is not None and spec.origin else None
        if version_py is not None and version_py.is_file():
            constants: dict = {}
            exec(compile(version_py.read_text(), str(version_py), "exec"), constants)
            if isinstance(constants.get("__version__"), str):
                return constants["__version__"], constants.get("cuda")
        import torch
    return torch.__version__, torch.version.cuda


def build_tag() -> str:
    """One folder per torch + Python version (+ CUDA version): binaries never cross an upgrade."""
    version, cuda = torch_versions()
    tag = f"torch-{version}-py{sys.version_info.major}{sys.version_info.minor}"
    # Wheels spell the CUDA version in torch.__version__ (+cu130); a source build ("2.11.0a0") does not.
    if cuda and "cu" not in version.partition("+")[2]:
        tag += f"-cu{cuda}"
    return tag.replace("+", "_").replace("/", "_")


def inductor_cache_dir() -> Path:
    """Where workers keep Inductor's on-disk caches (FX graph, AOTAutograd, autotune, Triton kernels).

    Inductor keys every entry itself (graph, input metadata, configs, device properties and a hash of torch's own
    source), so one folder per build tag only adds a second line of defence and lets a user wipe one torch's caches.
    """
    return build_root() / build_tag() / "inductor"


def configure_compile_caches(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point Inductor's caches at inductor_cache_dir() (unless the user set their own) and turn them on explicitly:
    the default /tmp/torchinductor_$USER is shared by everyone on the machine and wiped on reboot. Returns what was set.
    """
    env = os.environ if env is None else env
    wanted = {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache_dir()),
              "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",  # on by default on 2.11–2.13; explicit so a changed default shows
              "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
              "TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE": "1"}
    applied = {}
    for key, value in wanted.items():
        if key not in env:
            env[key] = value
            applied[key] = value
    return applied


# -- libstdc++ first in LD_PRELOAD -----------------------------------------------------------------------------------

def find_cxx() -> str | None:
    """The C++ compiler cpp_extension will use: $CXX, else c++ (then g++, clang++) on PATH."""
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def compiler_libstdcxx(cxx: str) -> str | None:
    """The libstdc++.so.6 that `cxx` links against (resolved), or None if it names none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        out = subprocess.run([cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return str(Path(out).resolve()) if out and Path(out).is_absolute() and Path(out).is_file() else None


def loaded_libstdcxx() -> str | None:
    """The libstdc++ this process has loaded, resolved; None where /proc is missing."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libstdc++.so" in path:
            return str(Path(path).resolve())
    return None


@functools.lru_cache(maxsize=1)
def libstdcxx_to_preload() -> str | None:
    """The libstdc++ to preload: the one this process has loaded, else the compiler's (looked up once)."""
    cxx = find_cxx()
    return loaded_libstdcxx() or (compiler_libstdcxx(cxx) if cxx else None)


def with_libstdcxx_preloaded(env: dict[str, str]) -> dict[str, str]:
    """`env` with this process's libstdc++ first in LD_PRELOAD.

    Why: on the GPU image (torch 2.11+cu130) every AOTInductor model .so — CUDA and CPU — segfaulted in its
    constructor, inside std::regex (parse_device_str): a library loaded earlier in the Python process interposes some
    libstdc++ symbols. With libstdc++ preloaded the same package loads and runs (docs/aoti.md: exit 139 plain, 0
    preloaded). Preloading the library every C++ program loads anyway changes nothing elsewhere.
    """
    lib = libstdcxx_to_preload()
    if not lib:
        return env
    current = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    if lib not in current:
        env = {**env, "LD_PRELOAD": " ".join([lib, *current])}
    return env
