"""Building and loading the `cuda` mode's extension (csrc/mlp_step.cu + csrc/mlp_step_binding.cpp).

torch.utils.cpp_extension.load builds it with ninja; the result is cached under $MODELAB_BUILD_DIR (default .build/)
in a folder named by a key over the sources, the flags, torch's and CUDA's versions and the GPU architecture, and the
module name carries the key too: a changed source, torch, toolkit or GPU builds afresh and never loads a stale binary,
and two versions never collide in one process. The machine-wide build lock of engine.native.build keeps two processes
from building the same thing at once.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from types import ModuleType

import torch

from engine.native.build import (
    CSRC,
    NativeBuildError,
    _cuda_arch_tag,
    _ensure_ninja_on_path,
    _tail,
    build_lock,
    build_root,
    build_tag,
    compiler_missing,
    extension_compiler,
    nvcc_missing,
)
from engine.runner import device_lock

SOURCES = ("mlp_step_binding.cpp", "mlp_step.cu")
HEADERS = ("mlp_step.h",)
CFLAGS = ("-O3",)
CUDA_CFLAGS = ("-O3", "-lineinfo")

_loaded: dict[str, ModuleType] = {}


def missing(device: str) -> str | None:
    """Why the extension cannot be built or run for `device` (None: it can). Looks for tools; builds nothing."""
    if not device.startswith("cuda"):
        return "hand-written CUDA kernels need a CUDA device"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch on this machine"
    reason = compiler_missing() or nvcc_missing()
    if reason:
        return reason
    if _ensure_ninja_on_path() is None:
        return "ninja not found (pip install ninja — it is pinned in requirements.txt); cpp_extension builds with it"
    return None


def cache_key() -> str:
    """Sources + flags + torch + CUDA + GPU architecture: what decides whether a cached build may be reused."""
    h = hashlib.sha256()
    for name in HEADERS + SOURCES:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    h.update("\0".join((*CFLAGS, "|", *CUDA_CFLAGS, torch.__version__, str(torch.version.cuda),
                        _cuda_arch_tag())).encode())
    return h.hexdigest()[:16]


def build_dir(key: str | None = None) -> Path:
    return build_root() / build_tag() / f"mlp_step-{_cuda_arch_tag()}-{key or cache_key()}"


def load(verbose: bool = False) -> ModuleType:
    """Build (first time: about a minute) or reuse the cached extension and import it; returns the module."""
    key = cache_key()
    if key in _loaded:
        return _loaded[key]
    reason = missing("cuda")
    if reason:
        raise NativeBuildError(reason)
    from torch.utils import cpp_extension

    folder = build_dir(key)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"modelab_mlp_step_{key}"
    # host-only: others may time meanwhile; linked by a compiler that keeps libstdc++ out (toolchain.library_cxx)
    with device_lock.released(), build_lock(f"mlp_step-{key}"), extension_compiler():
        (folder / "lock").unlink(missing_ok=True)  # a killed build's baton; we hold the real lock
        try:
            module = cpp_extension.load(
                name=name, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=list(CFLAGS),
                extra_cuda_cflags=list(CUDA_CFLAGS), extra_include_paths=[str(CSRC)], build_directory=str(folder),
                with_cuda=True, is_python_module=True, verbose=verbose)
        except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError) as exc:
            raise NativeBuildError(f"building the cuda mode's extension ({', '.join(SOURCES)}) in {folder} failed:\n"
                                   f"{_tail(str(exc))}") from exc
    _loaded[key] = module
    return module
