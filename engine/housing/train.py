"""Train the house-price MLP in a given mode and save its weights with the normalisation they need.

The loop is the textbook one — zero_grad → forward → MSE → backward → step — with drop_last so every batch has the
same shape and compiled modes compile once. Weights go to models/house_price-<mode>.pt next to the store and load
back with weights_only=True.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from engine.housing.history import per_epoch
from engine.measure import nvtx_ranges
from engine.modes import Prepared, get_mode
from engine.modes.base import TRAIN_LR
from engine.store import settings
from engine.store.db import Artifact, Metric, RunResult, Samples, default_db_path
from engine.store.envinfo import capture_env
from engine.workloads.house_price import HousePriceNN
from engine.workloads.housing_data import (
    DEFAULT_CSV,
    FEATURE_NAMES,
    Normalizer,
    ensure_default_dataset,
    load_housing_csv,
    to_tensors,
)

Progress = Callable[[float, str], None]
CHECKPOINT_FORMAT = 1


class TrainingError(RuntimeError):
    """A training run that ended with a loss, a figure or a weight that is not finite: nothing is saved, and the
    mode's weights file keeps the weights it had."""


@dataclass
class TrainConfig:
    mode: str = "eager"
    device: str = "cpu"
    csv: str | None = None  # None: the embedded default dataset
    epochs: int = 30
    batch_size: int = 64
    lr: float = 1e-3
    val_fraction: float = 0.2
    seed: int = 0
    models_dir: str | None = None
    db: str | None = None
    artifacts_dir: str | None = None


def models_dir(db: str | Path | None = None) -> Path:
    """models/ beside the store (the repository root for the default store)."""
    return settings.get("MODELS_DIR") or Path(db or default_db_path()).resolve().parent / "models"


def weights_path(mode: str, directory: Path) -> Path:
    return directory / f"house_price-{mode}.pt"


@dataclass
class _Split:
    """The rows of one training run, split and normalised with the training rows' statistics."""
    csv: Path
    train_rows: int
    normalizer: Normalizer
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    batch_size: int  # cfg.batch_size, lowered for a CSV with fewer training rows


def train_model(cfg: TrainConfig, progress: Progress = lambda f, m: None) -> tuple[RunResult, Path]:
    if cfg.epochs < 1 or cfg.batch_size < 1 or not 0 < cfg.val_fraction < 1 or cfg.lr <= 0:
        raise ValueError("epochs and batch_size must be ≥ 1, 0 < val_fraction < 1 and lr > 0")
    data = _load_split(cfg)
    nvtx_ranges.enable(cfg.device.startswith("cuda"))
    loader = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=data.batch_size, shuffle=True,
                        drop_last=True, generator=torch.Generator().manual_seed(cfg.seed))
    model, prepared = _prepare_model(cfg, data)
    losses, val_losses, train_seconds = _train(cfg, model, prepared, loader, data, progress)
    mae, rmse = _validation_errors(model, data, cfg.device)
    metrics = {"val_mae_usd": mae, "val_rmse_usd": rmse, "final_train_loss": losses[-1],
               "final_val_loss": val_losses[-1], "train_seconds": train_seconds}
    _check_finite(cfg, model, data, losses + val_losses, metrics)
    history = per_epoch(losses, val_losses, len(loader))  # the learning curve travels with the weights
    path = _save_weights(cfg, model, data, metrics, {"train_loss": history["train_loss"].tolist(),
                                                     "val_loss": history["val_loss"].tolist()})

    result = RunResult(env=capture_env(cfg.device))
    result.samples.append(Samples(phase="loss", values=losses, unit="mse"))
    result.samples.append(Samples(phase="val_loss", values=val_losses, unit="mse"))
    units = {"val_mae_usd": "USD", "val_rmse_usd": "USD", "train_seconds": "s"}
    result.metrics += [Metric(name, value, units.get(name, "mse")) for name, value in metrics.items()]
    result.metrics.append(Metric("steps", len(losses), "", phase=None))
    result.metrics.append(Metric("steps_per_epoch", len(loader), ""))
    result.metrics.append(Metric("rows_train", data.train_rows, ""))
    result.artifacts.append(Artifact(kind="weights", name=path.name, path=str(path)))
    result.notes += [n for n in prepared.notes if n not in result.notes]
    if data.batch_size < cfg.batch_size:
        result.notes.append(f"only {data.train_rows} training rows: batch size lowered from {cfg.batch_size} to "
                            f"{data.batch_size}")
    return result, path


def _load_split(cfg: TrainConfig) -> _Split:
    """The CSV's rows, shuffled by cfg.seed and split into training and validation rows."""
    csv = Path(cfg.csv) if cfg.csv else ensure_default_dataset(DEFAULT_CSV)
    frame = load_housing_csv(csv)
    generator = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(frame), generator=generator).numpy()
    n_val = max(1, int(len(frame) * cfg.val_fraction))
    train_frame, val_frame = frame.iloc[order[n_val:]], frame.iloc[order[:n_val]]
    batch_size = min(cfg.batch_size, len(train_frame))  # a small CSV still trains, on smaller batches
    normalizer = Normalizer.fit(train_frame)  # fit on the training split only, so validation stays unseen
    x_train, y_train = to_tensors(train_frame, normalizer)
    x_val, y_val = to_tensors(val_frame, normalizer)
    return _Split(csv, len(train_frame), normalizer, x_train, y_train, x_val, y_val, batch_size)


def _prepare_model(cfg: TrainConfig, data: _Split) -> tuple[torch.nn.Module, Prepared]:
    """The seeded model on cfg.device, prepared by the mode for training."""
    device = cfg.device
    torch.manual_seed(cfg.seed)
    model = HousePriceNN().to(device)
    mode = get_mode(cfg.mode)
    ok, reason = mode.available(device)
    if not ok:
        raise RuntimeError(f"mode {mode.name} is not available on {device}: {reason}")
    prepared = mode.prepare(model, (data.x_train[:data.batch_size].to(device),), True)
    if prepared.train_step is not None and cfg.lr != TRAIN_LR:
        # Modes that own the whole step (cuda-graph, triton, cuda) bake Adam's learning rate into their kernels.
        raise ValueError(f"mode {mode.name} trains with its own fused Adam step at lr={TRAIN_LR:g}; "
                         f"lr={cfg.lr:g} is not supported by it (use eager, fx, … for another rate)")
    return model, prepared


def _train(cfg: TrainConfig, model: torch.nn.Module, prepared: Prepared, loader: DataLoader, data: _Split,
           progress: Progress) -> tuple[list[float], list[float], float]:
    """The epochs: (training loss of every step, validation loss after each epoch, seconds spent)."""
    device = cfg.device
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses: list[float] = []
    val_losses: list[float] = []
    start = time.perf_counter()
    for epoch in range(cfg.epochs):
        model.train()
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            losses.append(_step(prepared, optimizer, xb, yb))
        val_losses.append(_mse(model, data.x_val, data.y_val, device))
        progress((epoch + 1) / cfg.epochs,
                 f"epoch {epoch + 1}/{cfg.epochs}: train loss {losses[-1]:.4f}, val loss {val_losses[-1]:.4f}")
    return losses, val_losses, time.perf_counter() - start


def _step(prepared: Prepared, optimizer: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor) -> float:
    """One training step on a batch; its loss."""
    if prepared.before_step:
        prepared.before_step()
    if prepared.train_step is not None:  # the mode runs zero_grad → forward → MSE → backward → Adam itself
        with nvtx_ranges.range("train_step"):
            loss = prepared.train_step((xb,), yb)
        return float(loss.item())
    optimizer.zero_grad(set_to_none=True)
    with nvtx_ranges.range("forward"):
        loss = torch.nn.functional.mse_loss(prepared.fn(xb), yb)
    with nvtx_ranges.range("backward"):
        loss.backward()
    with nvtx_ranges.range("optimizer_step"):
        optimizer.step()
    return loss.item()


def _validation_errors(model: torch.nn.Module, data: _Split, device: str) -> tuple[float, float]:
    """(MAE, RMSE) of the predicted prices on the validation rows, in dollars."""
    with torch.no_grad():
        pred = model.eval()(data.x_val.to(device)).cpu()
    price_pred = data.normalizer.inverse_y(pred)
    price_true = data.normalizer.inverse_y(data.y_val)
    mae = float((price_pred - price_true).abs().mean())
    rmse = float(((price_pred - price_true) ** 2).mean().sqrt())
    return mae, rmse


def _weights_file(cfg: TrainConfig) -> Path:
    return weights_path(cfg.mode, Path(cfg.models_dir) if cfg.models_dir else models_dir(cfg.db))


def _check_finite(cfg: TrainConfig, model: torch.nn.Module, data: _Split, losses: list[float],
                  metrics: dict[str, float]) -> None:
    """Raise TrainingError, before anything is saved, when a loss, a figure or a weight is NaN or inf (a NaN MAE
    would otherwise be stored as a result and its weights would replace good ones)."""
    bad = [name for name, value in metrics.items() if not math.isfinite(value)]
    if not all(math.isfinite(v) for v in losses):
        bad.append("loss")
    if not all(bool(torch.isfinite(t).all()) for t in model.state_dict().values()):
        bad.append("weights")
    if not bad:
        return
    stats = data.normalizer
    overflowed = [name for name, mean, std in zip((*FEATURE_NAMES, "price"), (*stats.x_mean, stats.y_mean),
                                                  (*stats.x_std, stats.y_std)) if not math.isfinite(mean + std)]
    cause = (f" (the CSV's {', '.join(overflowed)} values are too large: their mean or spread overflows float64)"
             if overflowed else "")
    raise TrainingError(f"training gave NaN or inf in {', '.join(bad)}{cause}; nothing saved "
                        f"({_weights_file(cfg)} is left as it was)")


def _save_weights(cfg: TrainConfig, model: torch.nn.Module, data: _Split, metrics: dict[str, float],
                  history: dict[str, list[float]] | None = None) -> Path:
    """The checkpoint (weights, normaliser, metrics, the per-epoch training and validation loss), written atomically
    to models/house_price-<mode>.pt."""
    path = _weights_file(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "workload": "house_price",
        "mode": cfg.mode,
        "device": cfg.device,
        "features": list(FEATURE_NAMES),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "normalizer": data.normalizer.to_dict(),
        "metrics": metrics,
        "history": history or {},
        "epochs": cfg.epochs,
        "dataset": str(data.csv),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    tmp.replace(path)  # a reader never sees a half-written file
    return path


def _mse(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: str) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model.eval()(x.to(device)), y.to(device)))


def train_job(params: dict, progress: Progress) -> RunResult:
    known = set(TrainConfig.__dataclass_fields__)
    result, _ = train_model(TrainConfig(**{k: v for k, v in params.items() if k in known}), progress)
    return result
