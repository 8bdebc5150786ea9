"""NVTX ranges so Nsight Systems timelines say which phase of which run a kernel belongs to.

Uses the `nvtx` package when installed (it is a no-op unless a profiler is attached); otherwise nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

try:
    import nvtx as _nvtx
except ImportError:  # optional dependency
    _nvtx = None

_enabled = _nvtx is not None and os.environ.get("MODELAB_NVTX", "1") != "0"


def enable(flag: bool) -> None:
    """Turn ranges on or off for this process (still off when the nvtx package or MODELAB_NVTX=0 says so)."""
    global _enabled
    _enabled = flag and _nvtx is not None and os.environ.get("MODELAB_NVTX", "1") != "0"


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def range(name: str) -> Iterator[None]:  # noqa: A001 - mirrors nvtx.annotate's role
    if not _enabled:
        yield
        return
    with _nvtx.annotate(name, domain="modelab"):
        yield
