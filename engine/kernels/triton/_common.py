"""Helpers shared by the Triton kernels: interpreter detection and device checks.

Triton decides at decoration time (``@triton.jit``) whether a kernel is compiled for the GPU or run by its
interpreter (``TRITON_INTERPRET=1`` in the environment before ``triton`` is imported). The wrappers ask the kernel
object itself, so a process that set the variable late still gets a consistent answer.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


def _fix_interpreter_index() -> None:
    """Triton 3.6's interpreter turns a scalar built from tl.program_id (a 1-element numpy array there) into a Python
    int with int(array), which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"),
    so `range(lo, hi)` with such bounds fails. Upstream fixed it (triton-lang/triton#9171, PR #9172) by squeezing
    first; this applies the same one-line change, only when the interpreter is on. Compiled kernels are unaffected."""
    if not triton.knobs.runtime.interpret:
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_modelab_fixed", False):
        return

    def patched(tensor, scope) -> None:  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._modelab_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


_fix_interpreter_index()


def is_interpreted(kernel: object) -> bool:
    """True when `kernel` (a jit function, possibly wrapped by autotune/heuristics) runs in Triton's interpreter."""
    fn = kernel
    while hasattr(fn, "fn") and type(fn).__name__ != "InterpretedFunction":
        fn = fn.fn
    return type(fn).__name__ == "InterpretedFunction"


def check_device(kernel: object, name: str, *tensors: torch.Tensor) -> torch.device:
    """The one device all `tensors` share; ValueError on a mix, RuntimeError where Triton cannot run there."""
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"{name}: all inputs must be on one device, got {device} and {t.device}")
    if device.type == "cuda":
        return device
    if device.type == "cpu":
        if not is_interpreted(kernel):
            raise RuntimeError(
                f"{name}: CPU tensors need Triton's interpreter; set TRITON_INTERPRET=1 before triton is imported"
            )
        return device
    raise ValueError(f"{name}: unsupported device {device} (Triton kernels run on CUDA, or on CPU interpreted)")


def is_hopper_or_newer(device: torch.device) -> bool:
    """Compute capability >= 9.0: the TMA (tensor descriptor) path is available."""
    return device.type == "cuda" and _capability(device.index)[0] >= 9


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    # asked on every launch: the query costs µs, the answer never changes
    return torch.cuda.get_device_capability(index)


class LaunchCache:
    """Launches a compiled Triton kernel directly, past the autotuner's and the JIT's per-call Python.

    Triton's launch path binds and specialises every argument, hashes a cache key and, under autotune, looks up the
    tuned config on each call: ~100 µs of Python a call on the H100 machine (benchmarks/triton_host_cost.py), twice the
    device time of the patch embedding at B=64 — so per-call timings measured that path, not the kernel. The first
    call for a key goes through the normal path (it autotunes and compiles); the compiled kernel it returns and the
    final non-tensor arguments it was launched with (constexprs, heuristics, the winning config) are kept; later calls
    with the same key launch that kernel with the new tensors. The key must hold everything Triton specialises on:
    shapes, dtypes, the device, flags, and whether each pointer is 16-byte aligned (`aligned`).
    """

    def __init__(self, jit_fn: object) -> None:
        import inspect

        fn = jit_fn
        while not hasattr(fn, "pre_run_hooks"):  # through autotune / heuristics wrappers to the JITFunction
            fn = fn.fn  # type: ignore[attr-defined]
        self.jit = fn
        self.names: list[str] = list(fn.arg_names)  # type: ignore[attr-defined]
        self.defaults = {p.name: p.default for p in inspect.signature(fn.fn).parameters.values()  # type: ignore
                         if p.default is not inspect.Parameter.empty}
        self.entries: dict[tuple, tuple | None] = {}  # key -> (compiled kernel, meta values) or None (path refused)
        self.refused: str | None = None  # why a kept launch was refused, the last time one was

    @staticmethod
    def aligned(*tensors: torch.Tensor) -> tuple[bool, ...]:
        return tuple(t.data_ptr() % 16 == 0 for t in tensors)

    def meta(self, key: tuple) -> dict | None:
        """The non-tensor arguments the kernel was launched with for `key` (BLOCK sizes etc.), or None."""
        entry = self.entries.get(key)
        return entry[1] if entry else None

    def first(self, key: tuple, run, n_positional: int):  # type: ignore[no-untyped-def]
        """Call run() (the normal launch; it returns Triton's compiled kernel) and keep what a direct launch needs."""
        captured: dict = {}

        def hook(*args: object, **kwargs: object) -> None:  # the last call is the launch itself (after tuning)
            captured["kwargs"] = kwargs

        self.jit.pre_run_hooks.append(hook)  # type: ignore[attr-defined]
        try:
            compiled = run()
        finally:
            self.jit.pre_run_hooks.remove(hook)  # type: ignore[attr-defined]
        try:
            values = {**self.defaults, **{k: v for k, v in captured["kwargs"].items() if k in self.names}}
            meta = {name: values[name] for name in self.names[n_positional:]}
            compiled.__getitem__  # noqa: B018 — a Triton whose run() returns no CompiledKernel: keep the slow path
            self.entries[key] = (compiled, meta)
        except (KeyError, AttributeError, TypeError):
            self.entries[key] = None
        return compiled

    def launch(self, key: tuple, grid: tuple, *args: object) -> bool:
        """Launch the kept kernel for `key` with these positional (runtime) arguments; False when none is kept."""
        entry = self.entries.get(key)
        if entry is None:
            return False
        compiled, meta = entry
        try:
            compiled[(*grid, 1, 1)[:3]](*args, *meta.values())  # the compiled kernel's runner takes a 3-d grid
        except (IndexError, TypeError, ValueError, AttributeError) as exc:
            # refused before any launch (a Triton whose launcher takes its arguments otherwise): the normal path
            # from now on, for this key
            self.entries[key] = None
            self.refused = f"{type(exc).__name__}: {exc}"
            return False
        return True


def pdl_enabled(device: torch.device) -> bool:
    """Programmatic dependent launch for the decode step's kernels (the GEMVs, decode attention): on sm_90+ (Hopper
    and later). A kernel launched this way may start while the one before it drains; it waits (gdc_wait) before
    reading anything that kernel wrote, so it is as correct as a plain launch after any kernel."""
    if device.type != "cuda":
        return False
    return _major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    """The device's compute capability major, asked once (pdl_enabled runs on every GEMV call outside a graph)."""
    return torch.cuda.get_device_capability(index)[0]


@triton.jit
def load_fused_x(x_ptr, g_ptr, offs_k, k_mask, sumsq, NORM: tl.constexpr):
    """A one-row GEMV's input at offs_k in fp32, as the fused decode products form it: NORM: x's squares added to
    sumsq (the RMSNorm's sum, taken in the GEMV's own pass) and x scaled by the norm weight g. Returns (x, sumsq).
    Shared by engine.kernels.triton.gemv and quant_gemv."""
    x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    if NORM:
        sumsq += x * x
        x = x * tl.load(g_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    return x, sumsq


@triton.jit
def output_rows(pid_n, N, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """(offs_n, n_mask): the weight rows a one-row GEMV's program reduces, and which of them exist. GLU: W is
    [gate; up] (N = 2F rows) and the program takes BLOCK_N / 2 rows of each half, interleaved (gate j, up j,
    gate j + 1, ...), so that its epilogue holds both products of each of its F outputs (`store_output`)."""
    if GLU:
        i = tl.arange(0, BLOCK_N)
        j = pid_n * (BLOCK_N // 2) + i // 2
        offs_n = j + (i % 2) * (N // 2)
        n_mask = j < N // 2
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
    return offs_n, n_mask


@triton.jit
def store_output(y, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, BLOCK_N: tl.constexpr, ADD: tl.constexpr,
                 GLU: tl.constexpr):
    """A one-row GEMV's epilogue store of y (fp32, one value per row of offs_n), in y's dtype. ADD: the residual r
    added. GLU (rows as `output_rows` pairs them): silu(gate) · up of each pair, F = N / 2 outputs — the MLP's
    SwiGLU formed where both products already sit in registers, so the down projection reads F values, not 2F."""
    if GLU:
        gate, up = tl.split(tl.reshape(y, (BLOCK_N // 2, 2)))
        offs = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(y_ptr + offs, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=offs < N // 2)
    else:
        if ADD:
            y += tl.load(r_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)
