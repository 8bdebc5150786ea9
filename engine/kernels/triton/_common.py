"""Helpers shared by the Triton kernels: interpreter detection and device checks.

Triton decides at decoration time (``@triton.jit``) whether a kernel is compiled for the GPU or run by its
interpreter (``TRITON_INTERPRET=1`` in the environment before ``triton`` is imported). The wrappers ask the kernel
object itself, so a process that set the variable late still gets a consistent answer.
"""

from __future__ import annotations

import torch
import triton


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
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
