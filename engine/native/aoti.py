"""AOTInductor packages: export → compile → .pt2, loading it in Python, and timing it in the native runner.

    torch.export.export (batch dimension dynamic) → torch._inductor.aoti_compile_and_package → model.pt2
        ├── load(): libtorch's AOTIModelPackageLoader from Python (in this process: what the `aoti` mode times)
        └── csrc/aoti_runner.cpp (another process, no Python: AOTIModelPackageLoader, warm-up + N timed calls → JSON)

Packages are cached under .build/<torch tag>/aoti/<digest>/model.pt2, the digest covering the exported graph, the
exported program's tensors (weights, buffers, constants), the input dtypes, the device (type; on CUDA capability, name
and Triton version), the Inductor options (and TORCHINDUCTOR_* settings) and the torch version: a second benchmark of
the same model reuses the package instead of compiling again (about 15-30 s on a 2-core CPU).

Loading a package runs native code inside the caller's process; a crash there (seen on one CUDA image: a segfault in
`_load_aoti`) kills the process. `check_load_in_child` loads and runs a package in a throw-away child first, so the
caller can fail with a reason instead. `python -m engine.native.aoti check ...` is that child's entry point.

Extra Inductor options for the compile come from $MODELAB_AOTI_OPTIONS (JSON, e.g.
'{"aot_inductor.embed_kernel_binary": true}'); `python -m engine.native.aoti_probe` tries several of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.native.build import REPO_ROOT, build_lock, build_root, build_tag, record_build
from engine.native.toolchain import with_libstdcxx_preloaded
from engine.runner import device_lock
from engine.store import settings

OPTIONS_ENV = "MODELAB_AOTI_OPTIONS"
_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
           torch.int64: "int64", torch.int32: "int32"}
_BY_NAME = {v: k for k, v in _DTYPES.items()} | {"bool": torch.bool}


class NativeRunError(RuntimeError):
    """The native runner (or a child loading a package) failed or crashed; the message says how."""


@dataclass
class Package:
    path: Path
    digest: str
    cache_hit: bool
    export_s: float
    compile_s: float  # 0 on a cache hit
    dynamic_batch: bool
    options: dict
    exported_program: str  # str(ExportedProgram): the graph and its signature
    notes: list[str] = field(default_factory=list)


def env_options() -> dict:
    """Extra Inductor options from $MODELAB_AOTI_OPTIONS (a JSON object), {} when unset."""
    return settings.get(OPTIONS_ENV) or {}


def export(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dynamic_batch: bool = True):
    """torch.export with dim 0 of every input dynamic (one package serves every batch size); static if that fails.

    Returns (ExportedProgram, whether the batch is dynamic, notes).
    """
    notes: list[str] = []
    if dynamic_batch and inputs and all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in inputs):
        batch = torch.export.Dim("batch", min=1, max=1 << 24)
        shapes = tuple({0: batch} for _ in inputs)
        # export specialises a size-1 dimension to 1; trace a batch of 2 (the package still runs batch 1).
        examples = tuple(torch.cat([x, x]) if x.shape[0] < 2 else x for x in inputs) if all(
            x.shape[0] >= 1 for x in inputs) else inputs
        try:
            return torch.export.export(model, examples, dynamic_shapes=shapes), True, notes
        except Exception as exc:  # noqa: BLE001 - any export failure: fall back to static shapes and say so
            notes.append(f"aoti: exporting with a dynamic batch dimension failed ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); compiled for the example's shapes")
    return torch.export.export(model, inputs), False, notes


def _inductor_env() -> dict[str, str]:
    """TORCHINDUCTOR_* settings that change what Inductor generates (where caches live does not)."""
    ignored = {"TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
               "TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE"}
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCHINDUCTOR_") and k not in ignored}


def _tensor_bytes(t) -> bytes:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _digest(ep, model: torch.nn.Module, inputs, device: torch.device, options: dict, dynamic: bool) -> str:
    """The package's cache key: everything that changes the compiled code or the numbers it computes."""
    h = hashlib.sha256()
    h.update(f"{torch.__version__}|{device.type}|{dynamic}|{json.dumps(options, sort_keys=True, default=str)}".encode())
    h.update(json.dumps(_inductor_env()).encode())
    if device.type == "cuda":
        h.update(f"{torch.cuda.get_device_capability(device)}|{torch.cuda.get_device_name(device)}".encode())
        try:  # Triton writes the GPU kernels inside the package
            import triton

            h.update(f"triton {triton.__version__}".encode())
        except ImportError:
            pass
    h.update(ep.graph_module.code.encode())
    for x in inputs:
        h.update(f"{x.dtype}|{tuple(x.shape[1:]) if dynamic else tuple(x.shape)}".encode())
    # The exported program's own tensors: parameters, persistent buffers, and the constants and non-persistent
    # buffers (e.g. rotary tables) that model.state_dict() leaves out but the package bakes in.
    tensors = dict(getattr(ep, "state_dict", None) or model.state_dict())
    tensors.update({f"constant:{k}": v for k, v in (getattr(ep, "constants", None) or {}).items()
                    if isinstance(v, torch.Tensor)})
    for name, t in sorted(tensors.items()):
        h.update(name.encode())
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()[:24]


def package_digest(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], options: dict | None = None,
                   dynamic_batch: bool = True) -> str:
    """The cache key compile_package would use (exports, compiles nothing)."""
    options = dict(env_options() if options is None else options)
    device = inputs[0].device if inputs else torch.device("cpu")
    ep, dynamic, _ = export(model, inputs, dynamic_batch)
    return _digest(ep, model, inputs, device, options, dynamic)


def compile_package(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], options: dict | None = None,
                    dynamic_batch: bool = True, use_cache: bool = True) -> Package:
    """Export `model` (in eval mode, on the inputs' device) and compile it into a cached .pt2."""
    options = dict(env_options() if options is None else options)
    device = inputs[0].device if inputs else torch.device("cpu")
    start = time.perf_counter()
    ep, dynamic, notes = export(model, inputs, dynamic_batch)
    export_s = time.perf_counter() - start
    digest = _digest(ep, model, inputs, device, options, dynamic)
    path = build_root() / build_tag() / "aoti" / digest / "model.pt2"
    compile_s, hit = 0.0, True
    with build_lock(f"aoti-{digest}"):
        if not (use_cache and path.is_file()):
            hit = False
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"model.tmp{os.getpid()}.pt2")
            start = time.perf_counter()
            torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs=options or None)
            compile_s = time.perf_counter() - start
            os.replace(tmp, path)
            record_build("aoti_package", False, compile_s)
            (path.parent / "options.json").write_text(json.dumps(
                {"options": options, "dynamic_batch": dynamic, "torch": torch.__version__, "device": str(device),
                 "compile_s": compile_s}, indent=2, default=str))
    if hit:
        record_build("aoti_package", True, 0.0)
    return Package(path=path, digest=digest, cache_hit=hit, export_s=export_s, compile_s=compile_s,
                   dynamic_batch=dynamic, options=options, exported_program=str(ep), notes=notes)


def generated_sources(pt2: Path, limit: int = 1 << 20) -> dict[str, str]:
    """The C++ the package was built from (wrapper and CPU kernels), name → text, each at most `limit` bytes."""
    found: dict[str, str] = {}
    with zipfile.ZipFile(pt2) as z:
        for info in z.infolist():
            name = info.filename.rsplit("/", 1)[-1]
            for suffix, label in ((".wrapper.cpp", "aoti_wrapper.cpp"), (".kernel.cpp", "aoti_kernel.cpp")):
                if name.endswith(suffix) and info.file_size <= limit and label not in found:
                    found[label] = z.read(info).decode(errors="replace")
    return found


def load(pt2: Path | str, device: torch.device | str):
    """Load a package onto `device` (CPU packages: index -1; cuda:N: N) with libtorch's AOTIModelPackageLoader, the
    loader the native runner uses and torch's own load_package falls back to.

    Not through torch._inductor.aoti_load_package: before loading, it compares this machine with the package's
    metadata only to log an advisory warning, and that comparison picks the CPU vector ISA by test-compiling C++ —
    about a minute in a fresh process on the GPU machine (benchmarks/aoti_timing.py), twice per CUDA run with the child
    check."""
    device = torch.device(device)
    index = device.index if device.type == "cuda" and device.index is not None else -1
    try:
        from torch._inductor.package import AOTICompiledModel

        loader = torch._C._aoti.AOTIModelPackageLoader
    except (ImportError, AttributeError):  # another torch layout: the public path is slower but equivalent
        return torch._inductor.aoti_load_package(str(pt2), device_index=index)
    return AOTICompiledModel(loader(str(pt2), "model", False, 1, index))


# ---- raw tensor files shared with the native runner -------------------------------------------------------------

def write_tensor(t: torch.Tensor, path: Path) -> str:
    """Write `t` as raw C-contiguous bytes; returns the runner's --input spec FILE:DTYPE:D0,D1,..."""
    if t.dtype not in _DTYPES:
        raise ValueError(f"the native runner does not take {t.dtype} inputs (supported: {', '.join(_DTYPES.values())})")
    c = t.detach().cpu().contiguous()
    path.write_bytes(c.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"{path}:{_DTYPES[t.dtype]}:{','.join(str(d) for d in c.shape)}"


def read_tensor(path: Path | str, dtype: str, shape: list[int]) -> torch.Tensor:
    data = bytearray(Path(path).read_bytes())
    return torch.frombuffer(data, dtype=_BY_NAME[dtype]).reshape(shape) if data else torch.empty(
        shape, dtype=_BY_NAME[dtype])


def _signal_text(returncode: int) -> str:
    try:
        return f"crashed with {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def run_native(runner: Path, pt2: Path, inputs: tuple[torch.Tensor, ...], device: torch.device | str,
               warmup: int, iters: int, workdir: Path | None = None, timeout_s: float = 600) -> dict:
    """Time the package in the native runner; returns its JSON with `outputs[i]["tensor"]` read back (CPU)."""
    device = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="aoti-native-", dir=workdir) as tmp:
        folder = Path(tmp)
        specs = [write_tensor(x, folder / f"input_{i}.bin") for i, x in enumerate(inputs)]
        cmd = [str(runner), "--package", str(pt2), "--device", str(device), "--warmup", str(warmup),
               "--iters", str(iters), "--output-dir", str(folder)]
        for spec in specs:
            cmd += ["--input", spec]
        hold = device_lock.current()
        if hold is not None and hold.cores is not None:
            # Beside a group the runner holds the device itself (shared while CUDA starts and the package loads,
            # ~1 s; exclusive on the timing cores while it times), so others time while it loads.
            cmd += ["--device-lock", str(device_lock.lock_path(hold.device)),
                    "--timing-cores", ",".join(str(c) for c in sorted(hold.cores[0]))]
        try:
            with device_lock.released():  # passes straight through exactly where the runner takes no hold
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                      env=with_libstdcxx_preloaded(dict(os.environ)))
        except subprocess.TimeoutExpired as exc:
            raise NativeRunError(f"the native runner timed out after {timeout_s:.0f} s") from exc
        last = (done.stdout.strip().splitlines() or [""])[-1]
        try:
            result = json.loads(last)
        except ValueError:
            result = None
        if done.returncode < 0:
            raise NativeRunError(f"the native runner {_signal_text(done.returncode)} running {pt2.name} on {device}"
                                 f"; stderr: {done.stderr.strip()[-800:]}")
        if done.returncode != 0 or not result or not result.get("ok"):
            why = (result or {}).get("error") or done.stderr.strip()[-800:] or done.stdout.strip()[-800:]
            raise NativeRunError(f"the native runner failed (exit {done.returncode}): {why}")
        for out in result.get("outputs", []):
            if out.get("path"):
                out["tensor"] = read_tensor(out["path"], out["dtype"], out["shape"]).clone()
        return result


_CHILD_HOLDS = "MODELAB_CHILD_HOLDS_DEVICE"  # set: the check's child takes a shared hold on that device itself


def check_load_in_child(pt2: Path, inputs: tuple[torch.Tensor, ...], device: torch.device | str,
                        timeout_s: float = 600) -> None:
    """Load and call the package once in a child process; raise NativeRunError if that fails or crashes."""
    device = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="aoti-check-") as tmp:
        specs = [write_tensor(x, Path(tmp) / f"input_{i}.bin") for i, x in enumerate(inputs)]
        cmd = [sys.executable, "-m", "engine.native.aoti", "check", "--package", str(pt2), "--device", str(device)]
        for spec in specs:
            cmd += ["--input", spec]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env = with_libstdcxx_preloaded(env)
        hold = device_lock.current()
        if hold is not None and hold.cores is not None:
            # Beside a group the child takes the device itself, only to load and call the package: its imports (most
            # of its 9–13 s on an H100) leave the device to the group's timings.
            env[_CHILD_HOLDS] = hold.device
        try:
            with device_lock.released():  # passes straight through exactly where the child takes no hold
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO_ROOT)
        except subprocess.TimeoutExpired as exc:
            raise NativeRunError(f"loading {pt2.name} in a child process hung for {timeout_s:.0f} s") from exc
    if done.returncode < 0:
        raise NativeRunError(f"the package loader {_signal_text(done.returncode)} loading or running {pt2.name} on "
                             f"{device} (checked in a child process); last lines:\n{done.stderr.strip()[-1500:]}")
    if done.returncode != 0:
        raise NativeRunError(f"loading {pt2.name} in a child process failed (exit {done.returncode}):\n"
                             f"{done.stderr.strip()[-1500:]}")


def _parse_input(spec: str) -> torch.Tensor:
    path, dtype, dims = spec.rsplit(":", 2)
    return read_tensor(path, dtype, [int(d) for d in dims.split(",") if d])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.native.aoti",
                                     description="Load an AOTInductor package and call it once (a crash check).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check")
    check.add_argument("--package", required=True)
    check.add_argument("--device", default="cpu")
    check.add_argument("--input", action="append", default=[], help="FILE:DTYPE:D0,D1,... (raw bytes)")
    args = parser.parse_args(argv)
    import faulthandler

    faulthandler.enable()
    device = torch.device(args.device)
    held = settings.get(_CHILD_HOLDS)
    if held:  # a phased parent gave the device up while this child runs
        device_lock.begin_phases(held, group_size=2)
    inputs = tuple(_parse_input(s).to(device) for s in args.input)
    start = time.perf_counter()
    compiled = load(args.package, device)
    load_s = time.perf_counter() - start
    with torch.no_grad():
        out = compiled(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    outs = out if isinstance(out, (list, tuple)) else [out]
    print(json.dumps({"ok": True, "load_s": load_s, "shapes": [list(o.shape) for o in outs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
