"""A user's own component: a scaled row-sum, x (N, M) → scale · Σ_j x[:, j]; and specs that are wrong on purpose
(tests/engine/levels/test_user_component.py)."""

from __future__ import annotations

import torch
from torch import nn

from engine.workloads.component import Component, Shape, seeded


class NaiveRowSum(nn.Module):
    """The naive formulation: multiply, then reduce each row."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).sum(dim=-1)


SHAPES = {"small": Shape("small", {"N": 64, "M": 96}, "fp32", note="CPU and tests"),
          "big": Shape("big", {"N": 8192, "M": 8192}, "bf16", devices=("cuda",))}


def make_inputs(shape: Shape, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    d = shape.dims
    return (torch.randn(d["N"], d["M"], device=device, generator=seeded(seed, device)).to(shape.torch_dtype),)


ROWSUM = Component(
    name="scaled_rowsum",
    description="A scaled row-sum: x (N, M) → 0.5 · x.sum(-1).",
    shapes=SHAPES,
    make_inputs=make_inputs,
    make_naive=lambda shape: NaiveRowSum(0.5),
    make_native=None,
    flops=lambda s: 2.0 * s.dims["N"] * s.dims["M"],
    min_bytes=lambda s: (s.dims["N"] * s.dims["M"] + s.dims["N"]) * s.torch_dtype.itemsize,
    flops_formula="2·N·M — a multiply and an add per element",
    bytes_formula="(N·M + N)·itemsize — x read once, the sums written once",
)


def rowsum() -> Component:
    """A factory: the spec may be a callable returning the component."""
    return ROWSUM


def rowsum_kernel(x: torch.Tensor) -> torch.Tensor:
    """A user kernel for the user component."""
    return torch.sum(x, dim=1) * 0.5


# -- bad specs -------------------------------------------------------------------------------------------------------
NOT_A_COMPONENT = {"name": "x"}


class _Incomplete:
    name = "half"
    shapes = SHAPES


INCOMPLETE = _Incomplete()
FLOPS_ZERO = Component(**{**ROWSUM.__dict__, "flops": lambda s: 0})
RAISING_REFERENCE = Component(**{**ROWSUM.__dict__, "make_naive": lambda s: NaiveRowSum("half")})
WRONG_ARITY = Component(**{**ROWSUM.__dict__, "make_inputs": lambda s, d, seed: make_inputs(s, d, seed) * 2})
GPU_ONLY = Component(**{**ROWSUM.__dict__, "shapes": {"big": SHAPES["big"]}})


def raising_factory() -> Component:
    raise RuntimeError("no config file")
