"""Argument helpers every command shares: one-line errors, number and device parsers, the store a command opens,
the group and model arguments, and the progress bars."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass

from engine.store.db import Store, StoreError, default_db_path


class CliError(Exception):
    """A bad argument or state, reported as one line and exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (what is wrong, where to look) rather than the whole usage block."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        self._argv = list(sys.argv[1:] if args is None else args)  # for error's hint on option-like values
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}{self._dash_value_hint(message)} (see {self.prog} --help)\n")

    def _dash_value_hint(self, message: str) -> str:
        """argparse reads a value that starts with '-' (--device-memory -5GB) as the next option and says only
        "expected one argument": name the value and the form it takes."""
        m = re.fullmatch(r"argument (\S+): expected one argument", message)
        argv = getattr(self, "_argv", [])
        for name in m.group(1).split("/") if m else ():
            at = [i for i, a in enumerate(argv[:-1]) if a == name]
            if at and argv[at[-1] + 1].startswith("-"):
                value = argv[at[-1] + 1]
                return f" ({shown(value)} is read as an option: write {name}={value if len(value) <= 60 else 'VALUE'})"
        return ""


def positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(v) for v in text.split(",") if v.strip()))  # each once, in order
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 or v > 1 << 20 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes must be between 1 and {1 << 20}")
    return values


# The largest count any argument takes: DuckDB's INTEGER columns and the C ints of torch's and numpy's calls hold it,
# and no count of iterations, rows or tokens beyond it finishes.
INT_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1  # numpy's seeds are non-negative; torch's and Python's take this range too
MAX_PATH_BYTES = 4095  # Linux's PATH_MAX less the terminating NUL
MAX_NAME_BYTES = 255  # one file or folder name (NAME_MAX)


def shown(text: str, limit: int = 60) -> str:
    """text quoted for a message, cut to `limit` characters (a 5,000-character argument is not echoed whole)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text):,} characters)"


def int_at_least(minimum: int, maximum: int = INT_MAX):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{shown(text)} must be at least {minimum}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{shown(text)} must be at most {maximum:,}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
seed_arg = int_at_least(0, SEED_MAX)
run_id_arg = int_at_least(1, 2**63 - 1)  # runs.id is a BIGINT


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def memory_size(text: str) -> int:
    """'80GB', '80 GiB', '81920M', '1.5T' → bytes (GB = 10^9, GiB and bare G = 2^30)."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 80GB, 80GiB, 81920MiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if not 1 << 20 <= value <= 1 << 50:
        raise argparse.ArgumentTypeError(f"{text!r}: a device memory size is between 1 MiB and 1 PiB")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def seconds_between(minimum: float, maximum: float = 7 * 24 * 3600.0):
    """A time limit in seconds from minimum to maximum (a week by default: a longer timeout means none)."""
    def parse(text: str) -> float:
        value = finite_float(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be between {minimum:g} and {maximum:g} seconds")
        return value

    return parse


def path_problem(text: str) -> str | None:
    """What makes text unusable as a path in any system call (empty, a NUL, too long), or None."""
    if not text.strip():
        return "is empty; give a file path"
    if "\0" in text:
        return "contains a NUL character"
    size = len(os.fsencode(text))
    if size > MAX_PATH_BYTES:
        return f"is {size:,} bytes long; a path has at most {MAX_PATH_BYTES:,}"
    longest = max((len(os.fsencode(part)) for part in text.split(os.sep)), default=0)
    if longest > MAX_NAME_BYTES:
        return f"has a name of {longest:,} bytes; one name has at most {MAX_NAME_BYTES}"
    return None


def text_arg(text: str) -> str:
    """A value that must say something: an empty one is refused rather than read as the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value; give one (or leave the option out for its default)")
    return text


def names_arg(text: str) -> str:
    """A name or a comma list of names (modes, levels, shapes …): at least one, so an empty value is refused rather
    than read as the default."""
    if not any(part.strip() for part in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r} names nothing; give a name or a comma list")
    return text


def path_arg(text: str) -> str:
    """A path of a file or a folder: not empty, not too long."""
    problem = path_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{shown(text)} {problem.replace('a file path', 'a path')}")
    return text


def file_arg(text: str) -> str:
    """A file path to read or write: not empty, not too long, not an existing folder."""
    problem = path_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{shown(text)} {problem}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{shown(text)} is a folder; give a file path")
    return text


def folder_arg(text: str) -> str:
    """A folder path (to read, or to create): not empty, not too long, not an existing file."""
    problem = path_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{shown(text)} {problem.replace('a file path', 'a folder')}")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{shown(text)} is a file; give a folder")
    return text


def check_writable(flag: str, path: str | os.PathLike[str]) -> None:
    """CliError (one line) when the file `path` cannot be written: a folder, under a file, or in a folder this user
    may not write (its missing folders would be created in the nearest existing one)."""
    import pathlib

    path = pathlib.Path(path)
    if path.is_dir():
        raise CliError(f"{flag} {path}: is a folder; give a file path")
    for folder in (path.parent, *path.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise CliError(f"{flag} {path}: {folder} is a file, not a folder")
            if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
                raise CliError(f"{flag} {path}: permission denied")
            return


def phases_arg(text: str) -> tuple[str, ...]:
    phases = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))  # each once, in order
    if not phases or any(p not in ("infer", "train") for p in phases):
        raise argparse.ArgumentTypeError(f"{text!r}: phases are infer and/or train, comma-separated")
    return phases


def device_arg(text: str) -> str:
    text = text.strip().lower()
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu, cuda or cuda:N")


def devices_arg(text: str) -> str:
    """One device, a comma list (cuda:0,cuda:1 — or cpu:0,cpu:1, two lanes on the CPU) or cuda:all."""
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    if parts == ["cuda:all"]:
        return "cuda:all"
    for part in parts:
        if not (part.startswith("cpu:") and part[4:].isdigit()):
            device_arg(part)
    if not parts or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: name each device once, e.g. cuda:0,cuda:1 or cuda:all")
    return ",".join(parts)


def expand_devices(spec: str) -> list[str]:
    """The devices of a --device value, checked: 'cuda:all' becomes every visible GPU."""
    if spec == "cuda:all":
        import torch

        if not torch.cuda.is_available():
            raise CliError("--device cuda:all: torch sees no CUDA device on this machine")
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    devices = spec.split(",")
    for device in devices:
        if not device.startswith("cpu"):
            check_device(device)
    return devices


def check_device(device: str) -> None:
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise CliError(f"--device {device}: torch {torch.__version__} sees no CUDA device on this machine "
                       f"(built with CUDA {torch.version.cuda}); use --device cpu")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise CliError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")


def open_store(args: argparse.Namespace) -> Store:
    store = Store(args.db)
    try:
        store.init()
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    from engine.runner.jobs import settle_stale_runs

    recorded, stale = settle_stale_runs(store)  # a finished worker's result.json is recorded, not failed
    if recorded:
        print(f"recorded {len(recorded)} finished run(s) their supervisor left unrecorded: {recorded}", file=sys.stderr)
    if stale:
        print(f"marked {len(stale)} interrupted run(s) as failed: {stale}", file=sys.stderr)
    return store


def add_model_args(p: argparse.ArgumentParser, *, seed: bool = True) -> None:
    """--model (your own nn.Module by import path), --inputs, --model-path (and --seed): see
    engine/workloads/user_model.py."""
    g = p.add_argument_group("your own model (instead of --workload)")
    g.add_argument("--model", type=text_arg, default=None, metavar="MODULE:FACTORY[:INPUTS_FN]",
                   help="an nn.Module factory by import path, e.g. my_pkg.models:make_model, or a built-in example "
                        "such as transformers:gpt2-tiny or lab:llama (`python -m engine ir --list`)")
    g.add_argument("--inputs", type=text_arg, default=None, metavar="SPEC",
                   help="its example inputs: 'float32[B,16];int64[B,32]@0-1000' (B: the batch dimension; integer "
                        "inputs need @low-high, high exclusive)")
    g.add_argument("--model-path", type=folder_arg, default=None, metavar="DIR",
                   help="folder put first on the Python path to import --model (default: the current directory)")
    if seed:
        g.add_argument("--seed", type=seed_arg, default=0, help="seed of --model's weights and inputs (default 0)")


@dataclass
class UserModel:
    """A --model that its check in a child process accepted: its workload's name and the params its runs carry."""

    name: str
    params: dict


def user_model(args: argparse.Namespace, *, probe: bool = True) -> UserModel | None:
    """The --model of these arguments, checked in a child process with a time limit (import, factory, one forward
    unless not `probe`, inputs at the asked batch sizes), or None. The user's code never runs in the CLI's own
    process: whatever it does (raise, exit, crash, hang) is one line here (CliError)."""
    if not getattr(args, "model", None):
        if getattr(args, "inputs", None):
            raise CliError("--inputs needs --model (the lab's workloads bring their own inputs)")
        return None
    from engine.workloads.user_model import UserModelError, check_in_subprocess, spec_from_args

    sizes = [*(getattr(args, "batch_sizes", None) or ()), *(getattr(args, "train_batch_sizes", None) or ()),
             *([args.batch_size] if getattr(args, "batch_size", None) else [])]
    try:
        spec = spec_from_args(args)
    except UserModelError as exc:
        raise CliError(f"--model {args.model}: {exc}") from exc
    report = check_in_subprocess(spec, sizes=sizes, probe=probe)
    if not report.ok:
        raise CliError(f"--model {args.model}: {report.error}")
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    return UserModel(report.name, spec.params())


class Bars:
    """One tqdm bar per run, fed by the supervisor's progress callback."""

    def __init__(self, labels: dict[int, str]):
        import threading

        self.labels = labels
        self.bars: dict[int, object] = {}
        self.lock = threading.Lock()  # sweeps over several devices report from one thread per device
        self.ended: dict[int, str] = {}  # off a terminal: the end line printed for each run

    def __call__(self, run_id: int, frac: float, message: str) -> None:
        with self.lock:
            self._update(run_id, frac, message)

    def _update(self, run_id: int, frac: float, message: str) -> None:
        from tqdm import tqdm

        if not sys.stderr.isatty():  # logs and CI get one line per finished run, not carriage-return noise
            # the worker's "done" and the supervisor's end say it again: a line only when the end says something new
            if frac >= 1.0 and self.ended.get(run_id) != message:
                self.ended[run_id] = message
                print(f"{self.labels.get(run_id, run_id)}: {message}", file=sys.stderr)
            return
        bar = self.bars.get(run_id)
        if bar is None:
            bar = self.bars[run_id] = tqdm(total=100, desc=self.labels.get(run_id, str(run_id)), unit="%",
                                           bar_format="{desc:<28} {percentage:3.0f}%|{bar:24}| {postfix}",
                                           file=sys.stderr, leave=True)
        bar.n = int(frac * 100)
        bar.set_postfix_str(message[:60], refresh=True)
        if frac >= 1.0:
            bar.close()


def prepare_parallel(text: str) -> int | str:
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def add_group_args(p: argparse.ArgumentParser) -> None:
    """How a group of runs on one device is supervised (engine.runner.plan): side by side while they prepare, alone to
    time."""
    p.add_argument("--prepare-parallel", type=prepare_parallel, default="auto", metavar="N|auto",
                   help="runs that prepare (build, compile, capture) side by side; each still times alone with the "
                        "device to itself (default: auto, from the cores or, for LLM runs, the free device memory)")
    p.add_argument("--serial", action="store_true", help="one run at a time from start to end (cold compile "
                   "times without other runs' contention); same as --prepare-parallel 1")


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Arguments every command that opens the store takes: --db."""
    p.add_argument("--db", type=file_arg, default=None,
                   help=f"results database (default: $RESULTS_DB or {default_db_path()})")

