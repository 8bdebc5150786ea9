"""Every environment variable Mode Lab reads, in one registry: its name, default, parser, what it is for and one line
of doc. Code reads a variable only through `get` (parsed; a bad value is one ValueError line naming the variable and
what it takes), and docs/architecture.md's environment table is rendered from here (`markdown_table`).

    python -m engine.store.settings               prints the table
    python -m engine.store.settings --write-docs  writes it into docs/architecture.md

What a variable is for:
- config: a user's configuration (where things live, which kernel a mode runs);
- diagnosis: a switch kept to measure or diagnose the lab itself (on by default; 0 shows what the thing saves);
- test: read by a test or a benchmark's own target, never by the product;
- internal: set by the lab for its own child processes.

This module is part of the lowest layer (engine.store), so every layer may use it; it imports nothing of the engine.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "architecture.md"
DOC_BEGIN = "<!-- environment table: rendered from engine/store/settings.py -->"
DOC_END = "<!-- end of the environment table -->"
WRITE_DOCS = "python -m engine.store.settings --write-docs"
PURPOSES = ("config", "diagnosis", "test", "internal")


# -- parsers: raw text (stripped, never empty) → value; ValueError with what is accepted ----------------------------
def text(raw: str) -> str:
    return raw


def path(raw: str) -> Path:
    return Path(raw).expanduser()


def flag(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("want 1 or 0")


def positive_int(raw: str) -> int:
    return _whole(raw, 1)


def whole_number(raw: str) -> int:
    return _whole(raw, 0)


def _whole(raw: str, least: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"want a whole number of at least {least}")
    return value


def json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise ValueError(f"want a JSON object, got {type(value).__name__}")
    return value


def core_list(raw: str) -> tuple[int, ...]:
    try:
        cores = tuple(int(part) for part in raw.split(",") if part.strip())  # "6,7," is 6 and 7
    except ValueError:
        raise ValueError("give core numbers, e.g. 6,7") from None
    if not cores or any(core < 0 for core in cores):
        raise ValueError("give core numbers, e.g. 6,7")
    return cores


def choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.lower()
        if value not in options:
            raise ValueError(f"choose one of {', '.join(options)}")
        return value

    return parse


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None  # raw text, parsed like a set value; None: unset (the reader decides, `shown` says what)
    parse: Callable[[str], Any]
    purpose: str  # one of PURPOSES
    doc: str  # one line
    shown: str = ""  # the default as the table shows it (else `default` in backticks, or "unset")

    def shown_default(self) -> str:
        if self.shown:
            return self.shown
        return f"`{self.default}`" if self.default is not None else "unset"


_SETTINGS = (
    Setting("RESULTS_DB", None, path, "config", "the store", "`./results.duckdb`"),
    Setting("MODELS_DIR", None, path, "config",
            "trained weights (`house_price-<mode>.pt`, `weights_only=True`)", "`models/` beside the store"),
    Setting("ARTIFACTS_DIR", None, path, "config", "run artifacts and worker logs", "`artifacts/` beside the store"),
    Setting("MODELAB_LOCK_DIR", None, path, "config", "where the per-device locks live", "the system temp dir"),
    Setting("MODELAB_BUILD_DIR", None, path, "config",
            "native builds and Inductor's caches, a folder per torch/Python/CUDA version", "`.build/`"),
    Setting("MODELAB_TIMING_CORES", None, core_list, "config",
            "the cores a timing holds (e.g. `6,7`): a proper subset of the process's cores",
            "the last physical cores"),
    Setting("MODELAB_INT4_GEMV", "auto", choice("auto", "cuda", "triton"), "config",
            "which int4 GEMV `triton-int4-wo`'s decode step runs: `auto` (the tensor-core kernel on sm_90 for "
            "K ≥ 2048, Triton's else), `cuda`, `triton` ([quantization.md](quantization.md))"),
    Setting("MODELAB_AOTI_OPTIONS", None, json_object, "config", "extra Inductor options for `aoti` packages (JSON)"),
    Setting("MODELAB_IR_VERIFY_MAX_BYTES", str(2 * 2**30), positive_int, "config",
            "the largest model *Verify* materialises, in bytes", "2 GiB"),
    Setting("CXX", None, text, "config",
            "the compiler for native builds (the runner falls back to another if this one leaks `std::` code)",
            "`c++`"),
    Setting("MODELAB_CXX_STD", "c++20", text, "config", "the C++ standard the native AOTInductor runner builds with"),
    Setting("MODELAB_NVTX", "1", flag, "diagnosis", "`0` drops NVTX ranges on CUDA runs"),
    Setting("MODELAB_ENERGY", "1", flag, "diagnosis", "`0` turns the energy meter off (no joules in the runs)"),
    Setting("MODELAB_FORKSERVER", "1", flag, "diagnosis",
            "`0`: every worker starts as a fresh `python -m engine.runner.worker`"),
    Setting("MODELAB_FAST_EXIT", "1", flag, "diagnosis",
            "`0`: `bench`, `train` and `ceilings` keep torch's interpreter teardown"),
    Setting("MODELAB_WORKER_FAST_EXIT", "1", flag, "diagnosis",
            "`0`: a worker started afresh keeps the normal exit after writing its result"),
    Setting("MODELAB_AOTI_CHECK_IN_CHILD", None, flag, "diagnosis",
            "`0` skips loading a CUDA `aoti` package in a child first, `1` forces it on CPU", "CUDA only"),
    Setting("MODELAB_USER_MODEL", None, json_object, "internal",
            "the user model's spec a worker runs, for its child processes (Nsight Compute, depyf) to rebuild"),
    Setting("MODELAB_CHILD_HOLDS_DEVICE", None, text, "internal",
            "the device an `aoti` check's child takes a shared hold on while its phased parent gave it up"),
    Setting("MODELAB_TEST_NCU", "0", flag, "test", "`1` runs the tests that profile under Nsight Compute"),
    Setting("MODELAB_SCREENSHOTS", None, path, "test",
            "tests/e2e/test_browser.py keeps a 1400×1000 PNG of every page in this folder"),
    Setting("MODELAB_CHECK_LAYERS", "20", positive_int, "test",
            "benchmarks/compare_check.py's model: its identical blocks"),
    Setting("MODELAB_CHECK_EXTRA_LAYERS", "0", whole_number, "test",
            "benchmarks/compare_check.py's model: blocks added to make a run slower on purpose"),
    Setting("MODELAB_CHECK_WIDTH", "256", positive_int, "test", "benchmarks/compare_check.py's model: its width"),
    Setting("MODELAB_CHECK_LOG", None, path, "test",
            "benchmarks/compare_check.py: the file each build of its model appends its depth and process id to"),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _SETTINGS}


def get(name: str) -> Any:
    """The parsed value of environment variable `name` (unset or blank: its parsed default, or None where it has
    none). ValueError in one line naming the variable, its value and what it takes; KeyError for a name not in
    the registry."""
    setting = SETTINGS.get(name)
    if setting is None:
        raise KeyError(f"{name} is not a registered setting: add it to engine/store/settings.py")
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None if setting.default is None else setting.parse(setting.default)
    try:
        return setting.parse(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: {exc}") from None


def markdown_table() -> str:
    """docs/architecture.md's environment table: every registered variable in the registry's order."""
    lines = ["| variable | default | for | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{s.name}` | {s.shown_default()} | {s.purpose} | {s.doc} |" for s in _SETTINGS]
    return "\n".join(lines)


def doc_table(doc: str) -> str | None:
    """The table between the markers of `doc`'s text, None where the markers are missing."""
    start, end = doc.find(DOC_BEGIN), doc.find(DOC_END)
    if start < 0 or end < start:
        return None
    return doc[start + len(DOC_BEGIN):end].strip("\n")


def with_table(doc: str) -> str:
    """`doc` with the table between its markers rendered afresh (ValueError where the markers are missing)."""
    start, end = doc.find(DOC_BEGIN), doc.find(DOC_END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC}: no {DOC_BEGIN!r} … {DOC_END!r} markers")
    return doc[:start + len(DOC_BEGIN)] + "\n" + markdown_table() + "\n" + doc[end:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write-docs"]:
        DOC.write_text(with_table(DOC.read_text()))
        print(f"wrote the environment table into {DOC.relative_to(REPO_ROOT)}")
        return 0
    if args:
        print(f"unknown arguments {' '.join(args)!r}: none prints the table, --write-docs writes it into "
              f"{DOC.relative_to(REPO_ROOT)}", file=sys.stderr)
        return 2
    print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
