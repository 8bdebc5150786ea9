"""Bring your own kernel: a callable `pkg.mod:fn` with a component's reference signature, run as the level
"yours:pkg.mod:fn" beside L1–L5 and judged by engine.levels.guards.

The callable is imported only in worker processes (the level's build) and in a separate checking process
(check_in_subprocess, `python -m engine.levels.yours`), never in the CLI or the dashboard. Errors are one line
(UserKernelError): a bad path, a module that does not import, a missing or non-callable name, a signature that does
not take the reference's inputs, a call that raises or returns something other than a tensor of the reference's shape.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.levels.base import Built, Level
from engine.workloads.component import Component, Shape
from engine.workloads.user_model import one_line

PREFIX = "yours:"
LEVEL_NUMBER = 6
_NAME = r"[A-Za-z_]\w*"
_IMPL_RE = re.compile(rf"^({_NAME}(?:\.{_NAME})*):({_NAME})$")


class UserKernelError(ValueError):
    """A user kernel cannot be used; the message is one line saying why."""


def level_key(impl: str) -> str:
    return PREFIX + impl.strip()


def is_yours(key: str) -> bool:
    return key.startswith(PREFIX)


def impl_of(key: str) -> str:
    return key[len(PREFIX):]


def _import(module: str, path: str | None):
    if path:
        folder = str(Path(path).expanduser().resolve())
        if not Path(folder).is_dir():
            raise UserKernelError(f"--impl-path {path!r} is not a folder")
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            where = f" (looked in {path} and the Python path)" if path else ""
            raise UserKernelError(f"cannot import {module!r}{where}: {one_line(exc)}; pass --impl-path") from exc
        raise UserKernelError(f"cannot import {module!r}: {one_line(exc)} (a module it imports is missing)") from exc
    except Exception as exc:  # noqa: BLE001 - an error at import time: one line with its cause
        raise UserKernelError(f"cannot import {module!r}: {one_line(exc)}") from exc


def load_impl(impl: str, path: str | None) -> Callable[..., torch.Tensor]:
    """Import pkg.mod and return its callable fn; UserKernelError with the reason."""
    m = _IMPL_RE.match(impl.strip())
    if not m:
        raise UserKernelError(f"--impl {impl!r}: expected module.path:function (e.g. my_pkg.kernels:attention)")
    module_name, fn_name = m.groups()
    module = _import(module_name, path)
    if not hasattr(module, fn_name):
        raise UserKernelError(f"module {module_name!r} ({getattr(module, '__file__', module_name)}) has no "
                              f"attribute {fn_name!r}")
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise UserKernelError(f"{impl} is a {type(fn).__name__}, not a callable")
    return fn


def reference_params(component: Component, shape: Shape) -> list[str]:
    return list(inspect.signature(component.make_naive(shape).forward).parameters)


def check_signature(impl: str, fn: Callable, params: list[str]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the call decides
    try:
        sig.bind(*params)
    except TypeError:
        raise UserKernelError(f"{impl} has the signature {sig}, which does not take the reference's inputs "
                              f"({', '.join(params)})") from None


def build_impl(impl: str, path: str | None) -> Callable[[Component, Shape, torch.nn.Module, str], Built]:
    def build(component: Component, shape: Shape, naive: torch.nn.Module, device: str) -> Built:
        fn = load_impl(impl, path)
        check_signature(impl, fn, reference_params(component, shape))
        source = inspect.getsourcefile(fn) if inspect.isfunction(fn) else None
        return Built(fn=fn, notes=[f"your kernel {impl}" + (f" from {source}" if source else "")])

    return build


def yours_level(key: str, path: str | None) -> Level:
    """The level of a "yours:pkg.mod:fn" key; nothing is imported until it is built (in a worker)."""
    impl = impl_of(key)
    return Level(key, LEVEL_NUMBER, "your kernel", f"{impl}, judged by the guards (engine/levels/guards.py)",
                 build_impl(impl, path))


# -- checking before anything is queued --------------------------------------------------------------------------
@dataclass
class ImplReport:
    ok: bool
    impl: str = ""
    error: str = ""


def check(component: Component, shape: Shape, impl: str, path: str | None, device: str = "cpu") -> ImplReport:
    """Import, signature and one call on the shape's inputs (output a tensor of the reference's shape)."""
    try:
        fn = load_impl(impl, path)
        check_signature(impl, fn, reference_params(component, shape))
        inputs = component.make_inputs(shape, device, 0)
        try:
            with torch.no_grad():
                out = fn(*inputs)
        except Exception as exc:  # noqa: BLE001 - the user's error, as one line
            raise UserKernelError(f"{impl} raised on {component.name} {shape.name}: {one_line(exc)}") from exc
        if not isinstance(out, torch.Tensor):
            raise UserKernelError(f"{impl} returned a {type(out).__name__}, not a tensor")
        with torch.no_grad():
            expected = component.make_naive(shape).to(device)(*inputs)
        if tuple(out.shape) != tuple(expected.shape):
            raise UserKernelError(f"{impl} returned shape {tuple(out.shape)}; the reference's is "
                                  f"{tuple(expected.shape)}")
    except UserKernelError as exc:
        return ImplReport(ok=False, impl=impl, error=str(exc))
    return ImplReport(ok=True, impl=impl)


def check_in_subprocess(component: str, shape: str, impl: str, path: str | None, device: str = "cpu",
                        timeout_s: float = 180.0) -> ImplReport:
    """check() in a fresh Python process: the CLI and the dashboard never import the user's code."""
    from engine.store import REPO_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    payload = {"component": component, "shape": shape, "impl": impl, "path": path, "device": device}
    cmd = [sys.executable, "-m", "engine.levels.yours", "--json", json.dumps(payload)]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ImplReport(False, impl, f"checking {impl} took more than {timeout_s:.0f} s (a hang in its import or "
                                       "call?)")
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            return ImplReport(**json.loads(line))
        except (ValueError, TypeError):
            continue
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return ImplReport(False, impl, f"checking {impl} crashed (exit code {proc.returncode}): {tail[:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.levels.yours",
                                     description="Check a user kernel; prints one JSON line (internal).")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    p = json.loads(args.json)
    from engine.levels import get_component

    try:
        component = get_component(p["component"])
        report = check(component, component.shape(p["shape"]), p["impl"], p.get("path"), p.get("device", "cpu"))
    except ValueError as exc:
        report = ImplReport(False, p.get("impl", ""), str(exc))
    sys.stdout.flush()
    print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
