"""A workload: a model, the inputs to feed it, and the loss its training step minimises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    make_model: Callable[[], nn.Module]
    # (batch_size, device) -> (inputs tuple, target) with fixed seeds, so every mode sees the same data.
    make_batch: Callable[[int, str], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    default_batch_sizes: tuple[int, ...]
    default_train_batch_sizes: tuple[int, ...]
    # Tolerances for comparing a mode's output with eager's (fp32 reductions may be reordered by fused kernels).
    rtol: float = 1e-4
    atol: float = 1e-4
