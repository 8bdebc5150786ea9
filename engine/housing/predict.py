"""Predict a house price from trained weights: validate the input, normalise, run the MLP, de-normalise to dollars."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.housing.train import CHECKPOINT_FORMAT, models_dir
from engine.workloads.house_price import HousePriceNN
from engine.workloads.housing_data import FEATURE_NAMES, FEATURES, Normalizer, validate_features


class WeightLoadError(ValueError):
    """A weights file is missing, unreadable, not ours, or does not fit the model."""


class InvalidInputError(ValueError):
    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass
class TrainedModel:
    mode: str
    path: Path
    model: HousePriceNN
    normalizer: Normalizer
    metrics: dict[str, float] = field(default_factory=dict)
    created_at: str = ""
    epochs: int = 0


@dataclass
class Prediction:
    price_usd: float
    warnings: list[str]


def list_weights(directory: Path | None = None) -> dict[str, Path]:
    """mode -> weights file, for every house_price-<mode>.pt in the models folder."""
    directory = directory or models_dir()
    if not directory.is_dir():
        return {}
    return {p.stem.removeprefix("house_price-"): p for p in sorted(directory.glob("house_price-*.pt"))}


def _metadata_problem(ckpt: dict[str, Any]) -> str | None:
    """What is wrong with the checkpoint's descriptive fields (each optional, but of its type when present), or
    None: a file written by engine.housing.train always passes."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    expected = {"mode": (str, "a string"), "created_at": (str, "a string"), "dataset": (str, "a string"),
                "device": (str, "a string"), "workload": (str, "a string")}
    for key, (kind, name) in expected.items():
        if ckpt.get(key) is not None and not isinstance(ckpt[key], kind):
            return f"its {key} is {type(ckpt[key]).__name__}, not {name}"
    epochs = ckpt.get("epochs", 0)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        return f"its epochs is {epochs!r}, not a whole number of 0 or more"
    metrics = ckpt.get("metrics", {})
    if not isinstance(metrics, dict):
        return f"its metrics is {type(metrics).__name__}, not a mapping of names to numbers"
    bad = next((k for k, v in metrics.items() if not isinstance(k, str) or not number(v)), None)
    if bad is not None:
        return f"its metric {bad!r} is {metrics[bad]!r}, not a number"
    if not isinstance(ckpt.get("features", []), (list, tuple)):
        return f"its features is {type(ckpt['features']).__name__}, not a list of names"
    return None


def load_trained(path: Path) -> TrainedModel:
    """Load a checkpoint with weights_only=True (no code runs from the file) and check it fits the model."""
    path = Path(path)
    if not path.is_file():
        raise WeightLoadError(f"no weights file at {path}; train a model first")
    try:
        ckpt: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for corrupt files
        raise WeightLoadError(f"{path.name} is not a readable weights file ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]})") from exc
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "normalizer" not in ckpt:
        raise WeightLoadError(f"{path.name} is not a Mode Lab house-price checkpoint (no state_dict/normalizer)")
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise WeightLoadError(f"{path.name} has checkpoint format {ckpt.get('format')!r}; expected "
                              f"{CHECKPOINT_FORMAT} — retrain it")
    problem = _metadata_problem(ckpt)
    if problem:
        raise WeightLoadError(f"{path.name} is not a Mode Lab weights file: {problem}")
    if list(ckpt.get("features", [])) != list(FEATURE_NAMES):
        raise WeightLoadError(f"{path.name} was trained on features {ckpt.get('features')}, not {list(FEATURE_NAMES)}")
    model = HousePriceNN()
    try:
        model.load_state_dict(ckpt["state_dict"])
        normalizer = Normalizer.from_dict(ckpt["normalizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise WeightLoadError(f"{path.name} does not fit the 5→256→256→1 model: {str(exc)[:300]}") from exc
    if not all(torch.isfinite(t).all() for t in model.state_dict().values()):
        raise WeightLoadError(f"{path.name} contains NaN or inf weights (training diverged?)")
    return TrainedModel(mode=str(ckpt.get("mode", path.stem)), path=path, model=model.eval(), normalizer=normalizer,
                        metrics={k: float(v) for k, v in ckpt.get("metrics", {}).items()},
                        created_at=str(ckpt.get("created_at", "")), epochs=int(ckpt.get("epochs", 0)))


def predict_prices(trained: TrainedModel, rows: np.ndarray) -> np.ndarray:
    """Prices in dollars for an (N, 5) array of raw feature values (no validation: callers validate)."""
    x = trained.normalizer.transform_x(torch.as_tensor(np.asarray(rows, dtype=np.float32)))
    with torch.no_grad():
        y = trained.model(x.float())
    return trained.normalizer.inverse_y(y).squeeze(-1).double().numpy()


def predict(trained: TrainedModel, values: Mapping[str, Any]) -> Prediction:
    errors, warnings = validate_features(values)
    if errors:
        raise InvalidInputError(errors)
    row = np.array([[float(values[name]) for name in FEATURE_NAMES]])
    price = float(predict_prices(trained, row)[0])
    if not math.isfinite(price):
        raise InvalidInputError(["the model produced a non-finite price for these values"])
    if price < 0:
        warnings.append("the model predicts a negative price here: the input is far from anything it was trained on")
    return Prediction(price_usd=price, warnings=warnings)


def price_curve(trained: TrainedModel, values: Mapping[str, Any], feature: str, points: int = 50
                ) -> tuple[np.ndarray, np.ndarray]:
    """Price as one feature sweeps its training range, the others held at `values`."""
    spec = next(f for f in FEATURES if f.name == feature)
    xs = np.linspace(spec.train_min, spec.train_max, points)
    rows = np.array([[float(values[n]) if n != feature else 0.0 for n in FEATURE_NAMES]] * points)
    rows[:, FEATURE_NAMES.index(feature)] = xs
    return xs, predict_prices(trained, rows)
