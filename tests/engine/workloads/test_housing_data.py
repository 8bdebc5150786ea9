"""engine/workloads/housing_data.py: the generator, the default CSV, the strict loader, input checks and the
normalizer."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from engine.workloads.housing_data import (
    DEFAULT_CSV,
    FEATURE_NAMES,
    FEATURES,
    MIN_ROWS,
    TARGET,
    DatasetError,
    Normalizer,
    ensure_default_dataset,
    generate_housing,
    load_housing_csv,
    to_tensors,
    validate_features,
)

COLUMNS = [*FEATURE_NAMES, TARGET]
GOOD = {"sqft": 1800, "bedrooms": 3, "bathrooms": 2, "age_years": 20, "distance_km": 8}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return generate_housing()


def csv_bytes(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False).encode()


def with_cell(row: int, column: str, value: str, n: int = 40) -> bytes:
    """A valid CSV of n rows whose data row `row` (1-based) has `value` in `column`."""
    df = generate_housing(n).astype(object)
    df.loc[row - 1, column] = value
    return csv_bytes(df)


def problems(source: object) -> str:
    with pytest.raises(DatasetError) as info:
        load_housing_csv(source)
    return str(info.value)


# --- generator ---------------------------------------------------------------------------------------------------

def test_features_and_names() -> None:
    assert FEATURE_NAMES == ("sqft", "bedrooms", "bathrooms", "age_years", "distance_km")
    assert TARGET == "price"
    for f in FEATURES:
        assert f.hard_min <= f.train_min < f.train_max <= f.hard_max
        assert f.train_min <= f.default <= f.train_max and f.step > 0
    assert DEFAULT_CSV == Path(__file__).resolve().parents[3] / "data" / "housing.csv"


def test_generator_is_deterministic(frame: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(frame, generate_housing(5000, seed=0))
    assert not frame.equals(generate_housing(5000, seed=1))
    assert list(frame.columns) == COLUMNS and len(frame) == 5000
    assert len(generate_housing(7)) == 7


def test_generator_ranges_and_rounding(frame: pd.DataFrame) -> None:
    for f in FEATURES:
        assert frame[f.name].between(f.train_min, f.train_max).all(), f.name
    assert (frame["price"] > 0).all() and not frame.isna().any().any()
    assert (frame["sqft"] % 1 == 0).all() and (frame["bedrooms"] % 1 == 0).all()
    assert (frame["bathrooms"] * 2 % 1 == 0).all() and (frame["price"] % 1 == 0).all()
    assert np.allclose(frame["distance_km"], frame["distance_km"].round(1))
    assert frame["bedrooms"].nunique() >= 5 and frame["bathrooms"].nunique() >= 5  # not degenerate


def test_generator_correlations(frame: pd.DataFrame) -> None:
    corr = frame.corr()
    assert corr.loc["price", "sqft"] > 0.5
    assert corr.loc["price", "age_years"] < 0
    assert corr.loc["price", "distance_km"] < 0
    assert corr.loc["bedrooms", "sqft"] > 0.5


# --- default dataset ---------------------------------------------------------------------------------------------

def test_ensure_default_dataset_writes_once(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "housing.csv"
    assert ensure_default_dataset(path) == path and path.is_file()
    pd.testing.assert_frame_equal(pd.read_csv(path), generate_housing(), check_dtype=False)
    os.utime(path, (1_000_000, 1_000_000))  # an old mtime: any rewrite would show
    ensure_default_dataset(path)
    assert path.stat().st_mtime == 1_000_000
    assert sorted(p.name for p in path.parent.iterdir()) == ["housing.csv"]  # no temp file left behind


# --- loader ------------------------------------------------------------------------------------------------------

def test_load_round_trip(tmp_path: Path) -> None:
    df = generate_housing(100, seed=3)
    path = tmp_path / "h.csv"
    df.to_csv(path, index=False)
    for source in (path, str(path), path.read_bytes(), io.BytesIO(path.read_bytes())):
        loaded = load_housing_csv(source)
        assert list(loaded.columns) == COLUMNS
        assert (loaded.dtypes == "float64").all()
        pd.testing.assert_frame_equal(loaded, df.astype("float64"))


def test_extra_columns_dropped_and_order_fixed() -> None:
    df = generate_housing(40)
    shuffled = df[COLUMNS[::-1]].assign(zip_code="12345", notes="x")
    loaded = load_housing_csv(csv_bytes(shuffled))
    assert list(loaded.columns) == COLUMNS
    pd.testing.assert_frame_equal(loaded, df.astype("float64"))


def test_missing_column_named() -> None:
    msg = problems(csv_bytes(generate_housing(40).drop(columns=["bathrooms", "price"])))
    assert "missing column(s) bathrooms, price" in msg
    assert "sqft, bedrooms, bathrooms, age_years, distance_km, price" in msg  # the expected columns


def test_semicolon_hint() -> None:
    assert "';'" in problems(generate_housing(40).to_csv(index=False, sep=";").encode())


def test_non_numeric_cell_names_row_and_column() -> None:
    assert "column 'sqft', row 17: 'abc' is not a number" in problems(with_cell(17, "sqft", "abc"))


def test_nan_and_empty_cells() -> None:
    assert "column 'age_years': empty or NaN in row(s) 4" in problems(with_cell(4, "age_years", "nan"))
    assert "column 'price': empty or NaN in row(s) 9" in problems(with_cell(9, "price", ""))


def test_inf_cells() -> None:
    assert "column 'distance_km': infinite value in row(s) 2" in problems(with_cell(2, "distance_km", "inf"))
    assert "column 'price': infinite value in row(s) 3" in problems(with_cell(3, "price", "-inf"))


def test_negative_and_absurd_values() -> None:
    assert "column 'bedrooms': negative value in row(s) 5" in problems(with_cell(5, "bedrooms", "-2"))
    msg = problems(with_cell(6, "sqft", "99999"))
    assert "column 'sqft'" in msg and "100–50000" in msg and "row(s) 6" in msg


def test_many_problems_collected_and_capped() -> None:
    df = generate_housing(40).astype(object)
    df["sqft"] = "abc"
    df["bedrooms"] = ""
    df["bathrooms"] = "-1"
    df["age_years"] = "inf"
    msg = problems(csv_bytes(df))
    assert "row 1: 'abc'" in msg and "37 more non-numeric" in msg
    assert "empty or NaN in row(s) 1, 2, 3, 4, 5 and 35 more" in msg
    assert "negative value" in msg and "infinite value" in msg
    assert len(msg.splitlines()) <= 1 + 10 + 1  # header line, at most ten problems, "… and N more"


def test_too_few_rows() -> None:
    msg = problems(csv_bytes(generate_housing(MIN_ROWS - 1)))
    assert f"only {MIN_ROWS - 1} data row(s)" in msg and f"at least {MIN_ROWS}" in msg
    assert len(load_housing_csv(csv_bytes(generate_housing(MIN_ROWS)))) == MIN_ROWS


def test_empty_missing_and_binary_files(tmp_path: Path) -> None:
    assert "is empty" in problems(b"")
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    assert f"{empty} is empty" in problems(empty)
    assert "no file at" in problems(tmp_path / "nope.csv")
    assert "no file at" in problems(tmp_path)  # a folder is not a file
    assert "not a readable CSV" in problems(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\xfd")
    assert "only 0 data row(s)" in problems(",".join(COLUMNS).encode())


def test_named_buffer_is_named_in_message() -> None:
    buf = io.BytesIO(b"a,b\n1,2\n")
    buf.name = "mine.csv"
    assert problems(buf).startswith("mine.csv is missing column(s)")


# --- one prediction input ----------------------------------------------------------------------------------------

def test_validate_features_good_input() -> None:
    assert validate_features(GOOD) == ([], [])
    assert validate_features({k: str(v) for k, v in GOOD.items()}) == ([], [])  # text from a form is fine


@pytest.mark.parametrize(("value", "expected"), [
    (None, "Living area (ft²) is missing"),
    ("abc", "'abc' is not a number"),
    (True, "True is not a number"),
    (math.nan, "is NaN"),
    (math.inf, "is infinite"),
    (-5, "cannot be negative"),
    (60_000, "= 60000 is not plausible"),
    (50, "= 50 is not plausible"),
])
def test_validate_features_errors(value: object, expected: str) -> None:
    errors, warnings = validate_features({**GOOD, "sqft": value})
    assert len(errors) == 1 and expected in errors[0] and warnings == []
    if value is not None:
        assert "Living area (ft²)" in errors[0] and "allowed 100–50000 ft²" in errors[0]


def test_validate_features_missing_key_and_warnings() -> None:
    errors, _ = validate_features({k: v for k, v in GOOD.items() if k != "bedrooms"})
    assert errors == ["Bedrooms (rooms) is missing"]
    errors, warnings = validate_features({**GOOD, "sqft": 6000, "distance_km": 0.2})
    assert errors == []
    assert len(warnings) == 2
    assert "outside the training range 500–5000 ft²; the prediction is an extrapolation" in warnings[0]
    assert "0.5–50 km" in warnings[1]


# --- normalizer --------------------------------------------------------------------------------------------------

def test_normalizer_standardises(frame: pd.DataFrame) -> None:
    norm = Normalizer.fit(frame)
    x = norm.transform_x(frame[list(FEATURE_NAMES)].to_numpy())
    assert np.allclose(x.mean(axis=0), 0, atol=1e-9) and np.allclose(x.std(axis=0), 1)
    y = norm.transform_y(frame[TARGET].to_numpy())
    assert abs(y.mean()) < 1e-9 and abs(y.std() - 1) < 1e-9
    assert norm.y_std == pytest.approx(frame[TARGET].std(ddof=0))


def test_normalizer_round_trip_numpy_and_torch(frame: pd.DataFrame) -> None:
    norm = Normalizer.fit(frame)
    y = frame[TARGET].to_numpy()
    back = norm.inverse_y(norm.transform_y(y))
    assert isinstance(back, np.ndarray) and np.allclose(back, y)
    t = torch.tensor(y, dtype=torch.float64)
    back_t = norm.inverse_y(norm.transform_y(t))
    assert isinstance(back_t, torch.Tensor) and torch.allclose(back_t, t)
    xs = frame[list(FEATURE_NAMES)].to_numpy()
    x_np = norm.transform_x(xs)
    x_t = norm.transform_x(torch.tensor(xs, dtype=torch.float32))
    assert isinstance(x_t, torch.Tensor) and x_t.dtype == torch.float32
    assert np.allclose(x_t.numpy(), x_np, atol=1e-5)


def test_normalizer_constant_column() -> None:
    df = generate_housing(100).assign(bedrooms=3.0, price=250_000.0)
    norm = Normalizer.fit(df)
    assert norm.x_std[1] == 1.0 and norm.y_std == 1.0
    x = norm.transform_x(df[list(FEATURE_NAMES)].to_numpy())
    assert np.isfinite(x).all() and (x[:, 1] == 0).all()


def test_normalizer_dict_round_trip_and_checkpoint(frame: pd.DataFrame, tmp_path: Path) -> None:
    norm = Normalizer.fit(frame)
    d = norm.to_dict()
    assert Normalizer.from_dict(d) == norm
    assert all(type(v) is float for v in [*d["x_mean"], *d["x_std"], d["y_mean"], d["y_std"]])
    torch.save({"normalizer": d}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert Normalizer.from_dict(loaded["normalizer"]) == norm


@pytest.mark.parametrize(("change", "expected"), [
    ({"y_std": None}, "missing 'y_std'"),
    ({"x_mean": [0.0] * 4}, "expected 5 each"),
    ({"y_mean": math.nan}, "NaN or inf"),
    ({"x_std": [1.0, 1.0, math.inf, 1.0, 1.0]}, "NaN or inf"),
    ({"x_std": [1.0, 1.0, 0.0, 1.0, 1.0]}, "must be positive"),
    ({"y_mean": "abc"}, "non-numeric"),
])
def test_normalizer_from_dict_errors(change: dict, expected: str) -> None:
    d = {"x_mean": [0.0] * 5, "x_std": [1.0] * 5, "y_mean": 0.0, "y_std": 1.0, **change}
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(ValueError, match=expected):
        Normalizer.from_dict(d)
    with pytest.raises(ValueError, match="must be a dict"):
        Normalizer.from_dict([1, 2])  # type: ignore[arg-type]


def test_to_tensors(frame: pd.DataFrame) -> None:
    norm = Normalizer.fit(frame)
    x, y = to_tensors(frame, norm)
    assert x.shape == (5000, 5) and y.shape == (5000, 1)
    assert x.dtype == y.dtype == torch.float32
    assert torch.allclose(x.mean(0), torch.zeros(5), atol=1e-4)
    assert torch.allclose(norm.inverse_y(y.double()).squeeze(1), torch.tensor(frame[TARGET].to_numpy()), rtol=1e-6)
