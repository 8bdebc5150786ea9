"""The Python half of the `modelab` custom operators (the C++ half: csrc/modelab_ops.cpp).

The C++ library defines the schemas, the CPU / CUDA kernels and the autograd formulas (C++ autograd::Functions, so
a training step pays no Python per call: a Python torch.library.register_autograd formula costs ~40 µs a call on
this 2-core CPU, the kernel itself ~5 µs). Here, once the library is loaded: the fake kernels
(torch.library.register_fake), shape and dtype only, so torch.compile and torch.export can trace the ops on fake
tensors without running them.

`load()` builds and loads the library (engine.native.build.load_custom_ops) and then calls `register_python_side`.
The C++ library names this module with `m.set_python_module`, so torch imports it if it needs a fake kernel first.
"""

from __future__ import annotations

import torch

_registered = False


def _bias_relu_fake(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    torch._check(bias.dim() == 1, lambda: f"modelab::bias_relu: bias must be 1-D, got {bias.dim()}-D")
    torch._check(x.dim() >= 1, lambda: "modelab::bias_relu: x must have at least one dimension")
    torch._check(bias.shape[0] == x.shape[-1],
                 lambda: f"modelab::bias_relu: bias has {bias.shape[0]} elements, x's last dimension {x.shape[-1]}")
    torch._check(x.dtype == bias.dtype, lambda: f"modelab::bias_relu: x is {x.dtype} but bias is {bias.dtype}")
    return x.new_empty(x.shape)  # the kernels return a contiguous tensor


def _custom_add_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch._check(a.shape == b.shape, lambda: f"modelab::custom_add: shapes differ: {a.shape} vs {b.shape}")
    torch._check(a.dtype == b.dtype, lambda: f"modelab::custom_add: dtypes differ: {a.dtype} vs {b.dtype}")
    return a.new_empty(a.shape)


def register_python_side() -> None:
    """Register the fake kernels of the loaded `modelab` ops (once per process)."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("modelab::bias_relu", _bias_relu_fake)
    torch.library.register_fake("modelab::custom_add", _custom_add_fake)
    _registered = True


def load(with_cuda: bool | None = None) -> str:
    """Build (cached) and load the ops with their Python side; returns the library path."""
    from engine.native.build import load_custom_ops

    path = load_custom_ops(with_cuda=with_cuda)
    register_python_side()
    return path


def bias_relu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.ops.modelab.bias_relu(x, bias)


def custom_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.modelab.custom_add(a, b)
