"""A kernel-levels component: one computation (attention, patch attention, message passing) with its reference module,
fixed seeded inputs per shape, an analytic FLOP count, a minimum-bytes count and per-dtype tolerances.

The levels (engine/levels/) write the same computation five ways and check each against the reference module here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Relative L2 error ‖out − ref‖ / ‖ref‖ against the fp32 reference (METHOD.md): fp32 kernels land far below 1e-3 but
# Triton's fp32 dot runs in tf32 on the GPU (≈3e-4); bf16 operands land between 1e-3 and 1e-2.
REL_L2_TOL = {"fp32": 2e-3, "fp16": 1e-2, "bf16": 2e-2}


@dataclass(frozen=True)
class Shape:
    name: str
    dims: dict[str, Any]
    dtype: str = "fp32"
    devices: tuple[str, ...] = ("cpu", "cuda")  # real shapes are for the GPU; small ones run anywhere
    note: str = ""

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def label(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        return f"{self.name} ({dims}, {self.dtype})"

    def runs_on(self, device: str) -> bool:
        return ("cuda" if device.startswith("cuda") else "cpu") in self.devices


@dataclass(frozen=True)
class Component:
    name: str
    description: str
    shapes: dict[str, Shape]
    # (shape, device, seed) -> inputs: what every level is called with. Random, never zeros.
    make_inputs: Callable[[Shape, str, int], tuple[Any, ...]]
    # shape -> the naive reference module (L1 naive; L2 and L3 transform it), with seeded parameters if it has any.
    make_naive: Callable[[Shape], nn.Module]
    # shape -> the idiomatic native module (L1 native), sharing the naive module's parameters; None if no such op.
    make_native: Callable[[nn.Module, Shape], nn.Module] | None
    flops: Callable[[Shape], float]
    min_bytes: Callable[[Shape], float]
    flops_formula: str
    bytes_formula: str
    # Which matmul ceiling the FLOPs run on ("bf16"/"fp32"/...): attention is tensor-core work, message passing is
    # bandwidth work (its roofline compares against copy bandwidth).
    bound: str = "compute"
    stages: dict[str, str] = field(default_factory=dict)  # sub-steps timed on their own, name -> description
    # A user's component (engine.levels.yours): per-dtype tolerances overriding REL_L2_TOL, and hand-written kernels
    # for L4-triton / L5-cuda, level key -> (shape, naive module, device) -> a callable with the reference signature.
    tolerances: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, Callable[[Shape, nn.Module, str], Callable[..., Any]]] = field(default_factory=dict)

    def shape(self, name: str) -> Shape:
        try:
            return self.shapes[name]
        except KeyError:
            raise ValueError(f"unknown shape {name!r} for {self.name}; known: {', '.join(self.shapes)}") from None

    def tolerance(self, shape: Shape) -> float:
        return self.tolerances.get(shape.dtype, REL_L2_TOL[shape.dtype])


def seeded(seed: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def rel_l2_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64; inf when either has a NaN/inf (never passes: a NaN error would
    compare False with any tolerance)."""
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(a).all() or not torch.isfinite(e).all():
        return float("inf")
    denom = e.norm().item()
    return float((a - e).norm().item() / (denom if denom > 0 else 1.0))


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
