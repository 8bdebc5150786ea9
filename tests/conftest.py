"""Suite-wide checks. A test that is skipped on a machine without CUDA for a CUDA or GPU reason must carry the `gpu`
marker (pytest.ini): `make test-gpu` selects the GPU suite by that marker, so an unmarked one would never run
anywhere. Here such a skip is turned into an error that names the marker to add."""

from __future__ import annotations

import re
import sys

import pytest

# "CUDA" or "GPU(s)" as a word of the reason, not inside a path or a name such as /usr/local/cuda or L5-cuda
GPU_REASON = re.compile(r"(?<![/\w-])(cuda|gpus?)(?![/\w-])", re.IGNORECASE)


def _cuda_here() -> bool:
    """Whether torch, where a test imported it, sees a CUDA device (a test that checks for one has imported it)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available()


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("gpu") is None \
            and GPU_REASON.search(skip_reason(report)) and not _cuda_here():
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is skipped here for a GPU reason ({skip_reason(report)}) but has no "
                           "`gpu` marker: add @pytest.mark.gpu (or a module-level pytestmark) so that "
                           "`make test-gpu` runs it")
    return report
