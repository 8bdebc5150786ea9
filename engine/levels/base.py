"""The five levels a component is written at, behind one small interface.

    L1 native      the naive PyTorch formulation, and the idiomatic native op where one exists (two rows)
    L2 TorchScript the naive module through engine.modes' torchscript mode
    L3 compile     the naive module through engine.modes' torch.compile mode (Inductor)
    L4 Triton      hand-written Triton kernels (engine/kernels/triton/)
    L5 CUDA        hand-written CUDA kernels (csrc/levels/, built with torch.utils.cpp_extension)

A level says whether it can run on a device and why not (the page greys it out with that reason), and builds a
callable for a component at a shape. Every build is checked against the naive module in fp32 by engine.levels.run.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.workloads.component import Component, Shape

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Built:
    fn: Callable[..., torch.Tensor]
    # Sub-steps timed on their own (e.g. the ViT patch embedding), stage name -> callable on the same inputs.
    stages: dict[str, Callable[..., torch.Tensor]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Notes only known once the level ran (e.g. the tile an autotuner chose), asked after timing.
    late_notes: Callable[[], list[str]] | None = None
    interpreted: bool = False  # Triton under TRITON_INTERPRET=1: a correctness run, never a timing to compare
    # Its first calls time candidate kernels (Triton's autotuner): beside other runs they take the device alone.
    autotunes: bool = False


@dataclass(frozen=True)
class Level:
    key: str
    number: int
    title: str
    description: str
    build: Callable[[Component, Shape, nn.Module, str], Built]
    availability: Callable[[str], str | None] = lambda device: None
    # Files a reader opens to see what this level changed (relative to the repo root); component name -> paths.
    sources: Callable[[Component], list[str]] = lambda component: []

    def available(self, device: str) -> tuple[bool, str]:
        reason = self.availability(device)
        return reason is None, reason or ""


def triton_missing(device: str) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch on this machine"
        return None
    return None  # CPU: runs under TRITON_INTERPRET=1, for correctness only (labelled "interpreted")


def use_triton_interpreter(device: str) -> bool:
    """Set TRITON_INTERPRET=1 for a CPU run; must happen before triton is first imported in this process."""
    if device.startswith("cuda"):
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def component_source(component: Component) -> str:
    return f"engine/workloads/{component.name}.py"


def describe(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)
