"""The house-price workload: a 5→256→256→1 MLP regressing price from five housing features."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.data import FEATURE_NAMES, Normalizer, generate_housing, to_tensors
from engine.workloads.base import Workload

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
