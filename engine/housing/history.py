"""A trained model's learning curve: training and validation loss per epoch, from the training run that wrote its
weights file (its per-step losses and per-epoch validation losses are stored as samples) or, for a file no run in
this store wrote, from the history the checkpoint carries (engine.housing.train saves it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.store.db import Store

COLUMNS = ["epoch", "train_loss", "val_loss"]


def per_epoch(step_losses: list[float], val_losses: list[float], steps_per_epoch: int | None) -> pd.DataFrame:
    """epoch (1…), the mean training loss of its steps, the validation loss after it."""
    epochs = len(val_losses)
    if not epochs:
        return pd.DataFrame(columns=COLUMNS)
    per = int(steps_per_epoch or 0) or max(1, len(step_losses) // epochs)
    steps = np.asarray(step_losses[:per * epochs], dtype=float)
    train = [float(steps[i * per:(i + 1) * per].mean()) if steps[i * per:(i + 1) * per].size else float("nan")
             for i in range(epochs)]
    return pd.DataFrame({"epoch": range(1, epochs + 1), "train_loss": train, "val_loss": list(val_losses)})


def run_of(store: Store, weights: Path) -> int | None:
    """The newest ok training run that wrote this weights file, or None."""
    frame = store.query("SELECT max(r.id) AS id FROM runs r JOIN artifacts a ON a.run_id = r.id WHERE r.kind = "
                        "'train' AND r.status = 'ok' AND a.kind = 'weights' AND a.path = ?", [str(Path(weights))])
    value = frame["id"].iloc[0] if not frame.empty else None
    return None if value is None or pd.isna(value) else int(value)


def from_run(store: Store, run_id: int) -> pd.DataFrame:
    samples = store.samples([run_id])
    if samples.empty:
        return pd.DataFrame(columns=COLUMNS)
    samples = samples.sort_values("idx")
    steps = samples[samples["phase"] == "loss"]["value"].tolist()
    val = samples[samples["phase"] == "val_loss"]["value"].tolist()
    metrics = store.metrics([run_id])
    per = metrics[metrics["name"] == "steps_per_epoch"]["value"] if not metrics.empty else pd.Series(dtype=float)
    return per_epoch(steps, val, int(per.iloc[0]) if len(per) else None)


def from_checkpoint(ckpt: dict[str, Any]) -> pd.DataFrame:
    history = ckpt.get("history")
    if not isinstance(history, dict):
        return pd.DataFrame(columns=COLUMNS)
    train, val = list(history.get("train_loss") or []), list(history.get("val_loss") or [])
    if not val or len(train) != len(val):
        return pd.DataFrame(columns=COLUMNS)
    return pd.DataFrame({"epoch": range(1, len(val) + 1), "train_loss": [float(v) for v in train],
                         "val_loss": [float(v) for v in val]})


def loss_curve(store: Store, weights: Path) -> tuple[pd.DataFrame, int | None]:
    """(epoch, train_loss, val_loss per epoch; the training run it comes from, None when it comes from the file).
    Empty where neither keeps one (a checkpoint written before the history was saved)."""
    run_id = run_of(store, weights)
    if run_id is not None:
        curve = from_run(store, run_id)
        if not curve.empty:
            return curve, run_id
    import torch

    try:
        ckpt = torch.load(Path(weights), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - an unreadable file has no curve; the page reports the load error itself
        return pd.DataFrame(columns=COLUMNS), None
    return (from_checkpoint(ckpt) if isinstance(ckpt, dict) else pd.DataFrame(columns=COLUMNS)), None
