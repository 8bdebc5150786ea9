"""The house-price workload: a 5→256→256→1 MLP regressing price from five housing features."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.workloads.base import Workload
from engine.workloads.housing_data import FEATURE_NAMES, Normalizer, generate_housing, to_tensors

N_FEATURES = len(FEATURE_NAMES)
HIDDEN = 256


class HousePriceNN(nn.Module):
    """Linear → ReLU → Linear → ReLU → Linear, on z-scored features, predicting a z-scored price."""

    def __init__(self, n_features: int = N_FEATURES, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_features, hidden)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def make_model(seed: int = 0) -> HousePriceNN:
    torch.manual_seed(seed)
    return HousePriceNN()


def make_batch(batch_size: int, device: str) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Real (normalised) rows of the synthetic housing data, the same rows for every mode."""
    frame = generate_housing(n=max(batch_size, 4096), seed=1)
    x, y = to_tensors(frame.iloc[:batch_size], Normalizer.fit(frame))
    return (x.to(device),), y.to(device)


WORKLOAD = Workload(
    name="house_price",
    description="5→256→256→1 MLP on synthetic housing data (MSE on z-scored price).",
    make_model=make_model,
    make_batch=make_batch,
    loss_fn=F.mse_loss,
    default_batch_sizes=(1, 64, 1024),
    default_train_batch_sizes=(64,),
)


# -- what one step must do, analytically (the explainer's floor: engine/explain/why.py)
# ---------------------------------
@dataclass(frozen=True)
class StepCost:
    flops: float  # matmul FLOPs (2 per multiply-add); bias, ReLU, loss and Adam arithmetic are left out (tiny)
    bytes: float  # bytes that must cross memory at least once (reads + writes), fp32
    notes: tuple[str, ...] = ()


def n_parameters(n_features: int = N_FEATURES, hidden: int = HIDDEN) -> int:
    return (n_features * hidden + hidden) + (hidden * hidden + hidden) + (hidden + 1)


def step_cost(batch_size: int, phase: str, n_features: int = N_FEATURES, hidden: int = HIDDEN) -> StepCost:
    """FLOPs and compulsory bytes of one step of the 5→256→256→1 MLP at `batch_size`.

    infer: the forward's matmuls, 2·B·Σ(in·out); bytes: the weights read once, the input read, the output written.
    train: forward + the weight gradients (2·B·Σ(in·out) again) + the input gradients of layers 2 and 3 (layer 1's
    input needs none); bytes: Adam reads the parameters and both moments and writes all three back (6 × 4 bytes per
    parameter), plus the input and target. Activations and gradients are assumed to stay on chip — true for a fully
    fused step (at B=64 they are 64 KiB) — so this is a floor, not what any mode moves.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    layers = [(n_features, hidden), (hidden, hidden), (hidden, 1)]
    forward = 2.0 * batch_size * sum(i * o for i, o in layers)
    params = n_parameters(n_features, hidden)
    io = 4.0 * batch_size * (n_features + 1)  # input rows and one output (or target) per row
    if phase == "infer":
        return StepCost(forward, 4.0 * params + io, ("infer: weights read once, input read, output written",))
    if phase == "train":
        flops = forward + forward + 2.0 * batch_size * sum(i * o for i, o in layers[1:])
        return StepCost(flops, 6 * 4.0 * params + io,
                        ("train: Adam reads and writes parameters, exp_avg, exp_avg_sq (6 × 4 B per parameter); "
                         "activations and gradients assumed on chip",))
    raise ValueError(f"unknown phase {phase!r}; use infer or train")
