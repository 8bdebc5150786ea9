"""Bring your own kernel: a callable `pkg.mod:fn` with a component's reference signature, run as the level
"yours:pkg.mod:fn" beside L1–L5 and judged by engine.levels.guards. Bring your own component too: `pkg.mod:spec`, a
Component (engine/workloads/component.py), a callable returning one, or an object with its attributes; its
reference module is L1-naive, and L2 TorchScript and L3 compile are derived from it (load_component,
check_component).

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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from engine.levels.base import Built, Level
from engine.workloads.component import DTYPES, Component, Shape
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
                        timeout_s: float = 180.0, component_path: str | None = None) -> ImplReport:
    """check() in a fresh Python process: the CLI and the dashboard never import the user's code.
    component_path: the folder of a user component (`pkg.mod:spec`), when `component` is one."""
    payload = {"component": component, "shape": shape, "impl": impl, "path": path, "device": device,
               "component_path": component_path}
    found, error = _run_checker(payload, impl, timeout_s)
    return ImplReport(**found) if found is not None else ImplReport(False, impl, error)


def _run_checker(payload: dict, what: str, timeout_s: float) -> tuple[dict | None, str]:
    """`python -m engine.levels.yours --json payload`: (its JSON answer, "") or (None, why there is none)."""
    from engine.store.db import REPO_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "engine.levels.yours", "--json", json.dumps(payload)]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"checking {what} took more than {timeout_s:.0f} s (a hang in its import or call?)"
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "ok" in found:
            return found, ""
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"checking {what} crashed (exit code {proc.returncode}): {tail[:300]}"


# -- a user's component ------------------------------------------------------------------------------------------
_REQUIRED = ("name", "shapes", "make_inputs", "make_naive", "flops", "min_bytes")
_KERNEL_LEVELS = {"L4-triton": "Triton", "L5-cuda": "CUDA"}


def is_component_path(name: str) -> bool:
    """True for `pkg.mod:spec` (a user's component), False for a built-in name such as causal_attention."""
    return bool(_IMPL_RE.match(name.strip()))


def load_component(spec: str, path: str | None) -> Component:
    """Import pkg.mod and return its component `spec` (called first when it is a factory); UserKernelError."""
    m = _IMPL_RE.match(spec.strip())
    if not m:
        raise UserKernelError(f"--component {spec!r}: expected a built-in name or module.path:spec "
                              "(e.g. my_pkg.components:rowsum)")
    module_name, attr = m.groups()
    module = _import(module_name, path)
    if not hasattr(module, attr):
        raise UserKernelError(f"module {module_name!r} ({getattr(module, '__file__', module_name)}) has no "
                              f"attribute {attr!r}")
    obj = getattr(module, attr)
    if not isinstance(obj, Component) and not hasattr(obj, "make_naive") and callable(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - the user's error, as one line
            raise UserKernelError(f"{spec}() raised: {one_line(exc)}") from exc
    return as_component(spec, obj)


def as_component(spec: str, obj: Any) -> Component:
    """A Component from a Component or an object with its attributes, validated; UserKernelError with the reason."""
    if not isinstance(obj, Component):
        missing = [a for a in _REQUIRED if not hasattr(obj, a)]
        if missing:
            raise UserKernelError(f"{spec} is a {type(obj).__name__} without {', '.join(missing)}: a component needs "
                                  f"{', '.join(_REQUIRED)} (see engine/workloads/component.py)")
        kwargs = {f.name: getattr(obj, f.name) for f in fields(Component) if hasattr(obj, f.name)}
        kwargs.setdefault("description", "")
        kwargs.setdefault("make_native", None)
        kwargs.setdefault("flops_formula", "")
        kwargs.setdefault("bytes_formula", "")
        try:
            obj = Component(**kwargs)
        except TypeError as exc:
            raise UserKernelError(f"{spec}: {one_line(exc)}") from exc
    c = obj
    if not isinstance(c.name, str) or not c.name:
        raise UserKernelError(f"{spec}: name must be a non-empty string, not {c.name!r}")
    if not isinstance(c.shapes, dict) or not c.shapes:
        raise UserKernelError(f"{spec}: shapes must be a non-empty dict of name -> Shape")
    for key, shape in c.shapes.items():
        if not isinstance(shape, Shape):
            raise UserKernelError(f"{spec}: shape {key!r} is a {type(shape).__name__}, not an "
                                  "engine.workloads.component.Shape")
        if shape.dtype not in DTYPES:
            raise UserKernelError(f"{spec}: shape {key!r} has dtype {shape.dtype!r}; known: {', '.join(DTYPES)}")
    for attr in ("make_inputs", "make_naive", "flops", "min_bytes"):
        if not callable(getattr(c, attr)):
            raise UserKernelError(f"{spec}: {attr} must be callable, not a {type(getattr(c, attr)).__name__}")
    if c.make_native is not None and not callable(c.make_native):
        raise UserKernelError(f"{spec}: make_native must be callable or None")
    bad_tol = {k: v for k, v in dict(c.tolerances).items() if k not in DTYPES or not _positive(v)}
    if bad_tol:
        raise UserKernelError(f"{spec}: tolerances must map a dtype ({', '.join(DTYPES)}) to a positive number, "
                              f"not {bad_tol}")
    bad_kernels = [k for k, v in dict(c.kernels).items() if k not in _KERNEL_LEVELS or not callable(v)]
    if bad_kernels:
        raise UserKernelError(f"{spec}: kernels must map {' or '.join(_KERNEL_LEVELS)} to a callable "
                              f"(shape, naive, device) -> kernel; got {', '.join(map(str, bad_kernels))}")
    return c


def _positive(value: Any) -> bool:
    try:
        return float(value) > 0 and float(value) != float("inf")
    except (TypeError, ValueError):
        return False


def missing_level(component: str, key: str, has_native: bool, kernels: list[str]) -> str | None:
    """Why a user component cannot run level `key` (it provides no native op / no such kernel), or None."""
    if key == "L1-native" and not has_native:
        return f"{component} provides no idiomatic native op (make_native)"
    if key in _KERNEL_LEVELS and key not in kernels:
        return f"{component} provides no hand-written {_KERNEL_LEVELS[key]} kernel (kernels[{key!r}])"
    return None


def kernel_build(make: Callable) -> Callable[[Component, Shape, torch.nn.Module, str], Built]:
    """The build of an L4/L5 level from a user component's kernels[key](shape, naive, device)."""
    def build(component: Component, shape: Shape, naive: torch.nn.Module, device: str) -> Built:
        return Built(fn=make(shape, naive, device), notes=[f"{component.name}'s own kernel"])

    return build


@dataclass
class ComponentReport:
    ok: bool
    spec: str = ""
    error: str = ""
    name: str = ""
    description: str = ""
    shapes: list[dict] = field(default_factory=list)  # name, dims, dtype, devices, note
    native: bool = False
    kernels: list[str] = field(default_factory=list)

    def shape_objects(self) -> dict[str, Shape]:
        return {s["name"]: Shape(s["name"], s["dims"], s["dtype"], tuple(s["devices"]), s["note"])
                for s in self.shapes}


def check_component(spec: str, path: str | None, device: str = "cpu") -> ComponentReport:
    """Import and validate the component, then on each shape meant for `device`: inputs, the reference module
    (its signature and one call returning a tensor), FLOPs and minimum bytes (positive numbers)."""
    try:
        c = load_component(spec, path)
        shapes = [s for s in c.shapes.values() if s.runs_on(device)]
        if not shapes:
            known = ", ".join(f"{s.name} on {'/'.join(s.devices)}" for s in c.shapes.values())
            raise UserKernelError(f"{spec}: no shape is meant for {device} (shapes: {known})")
        for shape in shapes:
            _check_shape(spec, c, shape, device)
    except UserKernelError as exc:
        return ComponentReport(ok=False, spec=spec, error=str(exc))
    return ComponentReport(ok=True, spec=spec, name=c.name, description=c.description,
                           shapes=[{"name": s.name, "dims": {k: v if isinstance(v, (int, float, str, bool)) else str(v)
                                                             for k, v in s.dims.items()},
                                    "dtype": s.dtype, "devices": list(s.devices), "note": s.note}
                                   for s in c.shapes.values()],
                           native=c.make_native is not None, kernels=list(c.kernels))


def _check_shape(spec: str, c: Component, shape: Shape, device: str) -> None:
    where = f"on shape {shape.name}"
    try:
        inputs = c.make_inputs(shape, device, 0)
    except Exception as exc:  # noqa: BLE001 - the user's error, as one line
        raise UserKernelError(f"{spec}: make_inputs raised {where}: {one_line(exc)}") from exc
    if not isinstance(inputs, tuple) or not inputs:
        raise UserKernelError(f"{spec}: make_inputs returned a {type(inputs).__name__} {where}; it must return a "
                              "non-empty tuple of the reference's inputs")
    try:
        naive = c.make_naive(shape)
    except Exception as exc:  # noqa: BLE001
        raise UserKernelError(f"{spec}: make_naive raised {where}: {one_line(exc)}") from exc
    if not isinstance(naive, torch.nn.Module):
        raise UserKernelError(f"{spec}: make_naive returned a {type(naive).__name__} {where}, not a torch.nn.Module")
    params = list(inspect.signature(naive.forward).parameters)
    try:
        inspect.signature(naive.forward).bind(*inputs)
    except TypeError:
        raise UserKernelError(f"{spec}: the reference's forward({', '.join(params)}) does not take the "
                              f"{len(inputs)} inputs make_inputs returns {where}") from None
    try:
        naive = naive.to(device)
        if any(True for _ in naive.parameters()):
            naive = naive.to(dtype=shape.torch_dtype)
        with torch.no_grad():
            out = naive.eval()(*inputs)
    except Exception as exc:  # noqa: BLE001
        raise UserKernelError(f"{spec}: the reference module raised {where}: {one_line(exc)}") from exc
    if not isinstance(out, torch.Tensor):
        raise UserKernelError(f"{spec}: the reference module returned a {type(out).__name__} {where}, not a tensor")
    for attr in ("flops", "min_bytes"):
        try:
            value = getattr(c, attr)(shape)
        except Exception as exc:  # noqa: BLE001
            raise UserKernelError(f"{spec}: {attr} raised {where}: {one_line(exc)}") from exc
        if not _positive(value):
            raise UserKernelError(f"{spec}: {attr} returned {value!r} {where}; it must be a positive number")


def check_component_in_subprocess(spec: str, path: str | None, device: str = "cpu",
                                  timeout_s: float = 180.0) -> ComponentReport:
    """check_component() in a fresh Python process: the CLI never imports the user's component."""
    found, error = _run_checker({"kind": "component", "spec": spec, "path": path, "device": device}, spec,
                                timeout_s)
    return ComponentReport(**found) if found is not None else ComponentReport(False, spec, error)


def _component(name: str, path: str | None) -> Component:
    """A user's `pkg.mod:spec`, or a built-in component: engine/workloads/<name>.py's COMPONENT (the registry in
    engine.levels imports this module, so it is not imported back here)."""
    if is_component_path(name):
        return load_component(name, path)
    try:
        found = getattr(importlib.import_module(f"engine.workloads.{name}"), "COMPONENT", None)
    except ImportError:
        found = None
    if not isinstance(found, Component):
        raise ValueError(f"unknown component {name!r}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.levels.yours",
                                     description="Check a user kernel; prints one JSON line (internal).")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    p = json.loads(args.json)
    if p.get("kind") == "component":
        print(json.dumps(asdict(check_component(p["spec"], p.get("path"), p.get("device", "cpu")))), flush=True)
        return 0
    try:
        component = _component(p["component"], p.get("component_path"))
        report = check(component, component.shape(p["shape"]), p["impl"], p.get("path"), p.get("device", "cpu"))
    except ValueError as exc:
        report = ImplReport(False, p.get("impl", ""), str(exc))
    sys.stdout.flush()
    print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
