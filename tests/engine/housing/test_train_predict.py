"""engine.housing.train + engine.housing.predict: training lowers the loss and saves safe-to-load weights; prediction
validates its
input and refuses weights that are corrupt, foreign or do not fit the model."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.housing.predict import (
    InvalidInputError,
    WeightLoadError,
    list_weights,
    load_trained,
    predict,
    predict_prices,
    price_curve,
)
from engine.housing.train import CHECKPOINT_FORMAT, TrainConfig, train_job, train_model, weights_path
from engine.workloads.housing_data import (
    DEFAULT_CSV,
    FEATURE_NAMES,
    DatasetError,
    generate_housing,
    load_housing_csv,
    price_formula,
)

TYPICAL = {"sqft": 2000, "bedrooms": 3, "bathrooms": 2, "age_years": 10, "distance_km": 5}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three epochs of eager training on the embedded dataset (about two seconds)."""
    tmp = tmp_path_factory.mktemp("train")
    progress: list[tuple[float, str]] = []
    result, path = train_model(TrainConfig(epochs=3, models_dir=str(tmp / "models"), db=str(tmp / "r.duckdb")),
                               lambda frac, msg: progress.append((frac, msg)))
    return result, path, progress


def samples_of(result, phase: str) -> list[float]:
    [series] = [s for s in result.samples if s.phase == phase]
    return series.values


def metrics_of(result) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics}


def test_training_lowers_the_loss(trained):
    result, _, progress = trained
    losses = samples_of(result, "loss")
    metrics = metrics_of(result)
    per_epoch = int(metrics["steps_per_epoch"])
    assert per_epoch == 4000 // 64  # 5000 rows, 20 % held out, drop_last
    assert len(losses) == metrics["steps"] == 3 * per_epoch
    first, last = np.mean(losses[:per_epoch]), np.mean(losses[-per_epoch:])
    assert last < first
    assert last < 0.2  # z-scored target: 1.0 is what predicting the mean would give
    val = samples_of(result, "val_loss")
    assert len(val) == 3 and max(val) < 0.2 and metrics["final_val_loss"] == val[-1]  # held-out rows: no overfit
    assert [f for f, _ in progress] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert progress[-1][1].startswith("epoch 3/3: train loss")
    assert 0 < metrics["val_mae_usd"] < metrics["val_rmse_usd"] < 100_000


def test_weights_are_saved_and_load_with_weights_only(trained):
    result, path, _ = trained
    assert path.name == "house_price-eager.pt" and path == weights_path("eager", path.parent)
    assert [(a.kind, Path(a.path)) for a in result.artifacts] == [("weights", path)]
    assert not path.with_suffix(".tmp").exists()
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == CHECKPOINT_FORMAT and raw["features"] == list(FEATURE_NAMES) and raw["epochs"] == 3
    model = load_trained(path)
    assert model.mode == "eager" and model.epochs == 3 and model.path == path
    assert model.metrics["val_mae_usd"] == pytest.approx(metrics_of(result)["val_mae_usd"])
    assert not model.model.training
    assert list_weights(path.parent) == {"eager": path}
    assert list_weights(path.parent / "missing") == {}


def test_prediction_is_a_plausible_price(trained):
    model = load_trained(trained[1])
    frame = load_housing_csv(DEFAULT_CSV)
    result = predict(model, TYPICAL)
    assert result.warnings == []
    assert frame["price"].min() <= result.price_usd <= frame["price"].max()
    expected = price_formula(**TYPICAL)
    assert abs(result.price_usd - expected) / expected < 0.15
    # Strings from a form are fine.
    assert predict(model, {k: str(v) for k, v in TYPICAL.items()}).price_usd == pytest.approx(result.price_usd)


def test_price_increases_with_sqft(trained):
    model = load_trained(trained[1])
    prices = [predict(model, {**TYPICAL, "sqft": s}).price_usd for s in (800, 1600, 2400, 3200, 4000)]
    assert prices == sorted(prices) and prices[-1] - prices[0] > 200_000
    xs, ys = price_curve(model, TYPICAL, "sqft", points=5)
    assert xs[0] == 500 and xs[-1] == 5000 and ys[-1] > ys[0]
    batch = predict_prices(model, np.array([[TYPICAL[n] for n in FEATURE_NAMES]] * 2))
    # Rows of one batch may take different BLAS paths: equal to float32 precision, not bit for bit.
    assert batch.shape == (2,) and batch[0] == pytest.approx(batch[1], rel=1e-6)
    assert batch[0] == pytest.approx(predict(model, TYPICAL).price_usd, rel=1e-6)


@pytest.mark.parametrize("field, value, message", [
    ("sqft", "abc", r"Living area \(ft²\): 'abc' is not a number"),
    ("bedrooms", None, r"Bedrooms \(rooms\) is missing"),
    ("bathrooms", -1, r"Bathrooms \(rooms\) cannot be negative \(got -1\)"),
    ("age_years", float("nan"), r"Age \(years\) is NaN"),
    ("distance_km", float("inf"), r"Distance to city centre \(km\) is infinite"),
    ("sqft", 1e6, r"Living area \(ft²\) = 1e\+06 is not plausible; allowed 100–50000"),
])
def test_invalid_input_names_the_field(trained, field, value, message):
    model = load_trained(trained[1])
    with pytest.raises(InvalidInputError, match=message) as info:
        predict(model, {**TYPICAL, field: value})
    assert len(info.value.errors) == 1


def test_every_invalid_field_is_reported(trained):
    model = load_trained(trained[1])
    with pytest.raises(InvalidInputError) as info:
        predict(model, {"sqft": "x"})
    assert len(info.value.errors) == 5


def test_out_of_training_range_is_a_warning(trained):
    model = load_trained(trained[1])
    result = predict(model, {**TYPICAL, "sqft": 8000})
    assert math.isfinite(result.price_usd)
    assert len(result.warnings) == 1
    assert "Living area (ft²) = 8000 is outside the training range 500–5000" in result.warnings[0]


# -- weights that must be refused ------------------------------------------------------------------------------------

class NotAllowed:
    """A class weights_only unpickling must refuse to construct."""


def checkpoint(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def test_missing_file(tmp_path):
    with pytest.raises(WeightLoadError, match="no weights file at .*; train a model first"):
        load_trained(tmp_path / "house_price-eager.pt")


def test_truncated_file(trained, tmp_path):
    bad = tmp_path / "house_price-eager.pt"
    data = trained[1].read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightLoadError, match="house_price-eager.pt is not a readable weights file"):
        load_trained(bad)


def test_random_bytes(tmp_path):
    bad = tmp_path / "house_price-eager.pt"
    bad.write_bytes(os.urandom(10_000))
    with pytest.raises(WeightLoadError, match="is not a readable weights file"):
        load_trained(bad)


def test_pickled_code_is_not_loaded(trained, tmp_path):
    bad = tmp_path / "evil.pt"
    torch.save({**checkpoint(trained[1]), "extra": NotAllowed()}, bad)
    with pytest.raises(WeightLoadError, match="is not a readable weights file"):
        load_trained(bad)


def test_wrong_state_dict(trained, tmp_path):
    bad = tmp_path / "wrong.pt"
    ckpt = checkpoint(trained[1])
    ckpt["state_dict"] = {"fc1.weight": torch.zeros(3, 3)}
    torch.save(ckpt, bad)
    with pytest.raises(WeightLoadError, match="wrong.pt does not fit the 5→256→256→1 model"):
        load_trained(bad)


def test_checkpoint_without_normalizer(trained, tmp_path):
    bad = tmp_path / "nonorm.pt"
    ckpt = checkpoint(trained[1])
    del ckpt["normalizer"]
    torch.save(ckpt, bad)
    with pytest.raises(WeightLoadError, match="not a Mode Lab house-price checkpoint"):
        load_trained(bad)
    torch.save(ckpt["state_dict"], bad)  # a bare state_dict, as most tutorials save it
    with pytest.raises(WeightLoadError, match="not a Mode Lab house-price checkpoint"):
        load_trained(bad)


def test_broken_normalizer_format_features_and_nan_weights(trained, tmp_path):
    base = checkpoint(trained[1])
    cases = [
        ({"normalizer": {**base["normalizer"], "y_std": 0.0}}, "does not fit.*standard deviations must be positive"),
        ({"normalizer": {"x_mean": [0.0] * 5}}, "does not fit.*normalizer is missing"),
        ({"format": 99}, "checkpoint format 99; expected 1"),
        ({"features": ["a", "b"]}, r"trained on features \['a', 'b'\]"),
        ({"state_dict": {**base["state_dict"], "fc3.bias": torch.tensor([float("nan")])}}, "NaN or inf weights"),
    ]
    for i, (change, message) in enumerate(cases):
        path = tmp_path / f"case{i}.pt"
        torch.save({**base, **change}, path)
        with pytest.raises(WeightLoadError, match=message):
            load_trained(path)


# -- training input --------------------------------------------------------------------------------------------------

def test_training_on_a_bad_csv_raises_dataset_error(tmp_path):
    bad = tmp_path / "bad.csv"
    generate_housing(100).drop(columns=["bathrooms"]).to_csv(bad, index=False)
    with pytest.raises(DatasetError, match="missing column"):
        train_model(TrainConfig(epochs=1, csv=str(bad), models_dir=str(tmp_path)))
    with pytest.raises(DatasetError, match="no file at"):
        train_model(TrainConfig(epochs=1, csv=str(tmp_path / "nope.csv"), models_dir=str(tmp_path)))
    assert not list(tmp_path.glob("*.pt"))


def test_training_config_is_validated(tmp_path):
    with pytest.raises(ValueError, match="epochs and batch_size"):
        train_model(TrainConfig(epochs=0, models_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="epochs and batch_size"):
        train_model(TrainConfig(val_fraction=1.0, models_dir=str(tmp_path)))
    assert not list(tmp_path.glob("*.pt"))


def test_a_small_csv_trains_on_smaller_batches(tmp_path):
    small = tmp_path / "small.csv"
    generate_housing(40).to_csv(small, index=False)  # 32 training rows, fewer than one batch of 64
    result, path = train_model(TrainConfig(epochs=2, csv=str(small), batch_size=64, models_dir=str(tmp_path)))
    assert path.exists()
    assert metrics_of(result)["steps"] == 2 and metrics_of(result)["rows_train"] == 32
    assert "batch size lowered from 64 to 32" in " ".join(result.notes)


def test_a_traced_mode_trains_like_eager(tmp_path):
    """FX runs the same ops as eager, so from the same seed it sees the same losses; and train_job saves per mode."""
    csv = tmp_path / "h.csv"
    generate_housing(600, seed=5).to_csv(csv, index=False)
    common = dict(epochs=1, csv=str(csv), models_dir=str(tmp_path / "models"))
    eager, _ = train_model(TrainConfig(mode="eager", **common))
    fx = train_job({"mode": "fx", "unknown_key": "ignored", **common}, lambda f, m: None)
    assert samples_of(fx, "loss") == pytest.approx(samples_of(eager, "loss"), rel=1e-5, abs=1e-7)
    assert set(list_weights(tmp_path / "models")) == {"eager", "fx"}
    assert load_trained(tmp_path / "models" / "house_price-fx.pt").mode == "fx"


def test_a_run_whose_figures_are_not_finite_fails_and_keeps_the_weights(tmp_path, store):
    """Prices of 1e300 overflow the normaliser's float64 spread: the validation MAE comes out NaN. The run fails with
    the reason and the weights file of the earlier good run stays byte for byte."""
    from engine.runner.jobs import JobSpec, create_runs, run_jobs

    good, huge = tmp_path / "good.csv", tmp_path / "huge.csv"
    generate_housing(300, seed=1).to_csv(good, index=False)
    frame = generate_housing(300, seed=1)
    frame["price"] = frame["price"] * 1e295  # ~1e300: finite, and accepted by the CSV's checks
    frame.to_csv(huge, index=False)
    _, path = train_model(TrainConfig(epochs=1, csv=str(good)))  # MODELS_DIR of the test's lab
    before = path.read_bytes()
    ids = create_runs(store, [JobSpec("train", "house_price", "eager", "cpu",
                                      {"mode": "eager", "device": "cpu", "epochs": 1, "csv": str(huge)},
                                      target="engine.housing.train:train_job")])
    assert run_jobs(store, ids) == {ids[0]: "failed"}
    reason = store.run(ids[0])["error"].splitlines()[0]
    assert reason.startswith("TrainingError: training gave NaN or inf in val_mae_usd, val_rmse_usd (the CSV's "
                             "price values are too large"), reason
    assert f"nothing saved ({path} is left as it was)" in reason
    assert path.read_bytes() == before
    assert store.metrics(ids).empty


def test_nan_weights_after_training_are_never_saved(tmp_path, monkeypatch):
    """Whatever turns non-finite (here the weights, as a diverging step would leave them) fails the run unsaved."""
    import engine.housing.train as train

    real_train = train._train

    def diverging(cfg, model, *args):
        out = real_train(cfg, model, *args)
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))
        return out

    monkeypatch.setattr(train, "_train", diverging)
    with pytest.raises(train.TrainingError, match=r"NaN or inf in val_mae_usd, val_rmse_usd, "
                                                  r"weights; nothing saved"):
        train_model(TrainConfig(epochs=1, models_dir=str(tmp_path)))
    assert not list(tmp_path.glob("*.pt"))
