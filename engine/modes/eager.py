"""Eager PyTorch: the reference every other mode is checked against."""

from __future__ import annotations

import torch
from torch import nn

from engine.modes.base import Mode, Prepared


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    return Prepared(fn=model)


MODE = Mode(name="eager", description="Plain PyTorch, op by op from Python — the reference.", prepare=prepare)
