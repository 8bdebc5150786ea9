"""The house-price dataset: a deterministic synthetic generator, a strict CSV loader, and z-score normalisation.

Price formula (US dollars), before noise:

    price = 50_000 + 120·sqft + 8_000·bedrooms + 12_000·bathrooms − 900·age_years
            + 180_000·exp(−distance_km / 8) + 0.004·sqft²·exp(−distance_km / 20)

The last term is a mild nonlinearity (big houses near the centre are worth more than the sum of their parts).
The result is multiplied by a Gaussian factor N(1, 0.06) and clipped at $20,000. Seed 0, 5,000 rows by default.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # torch is imported lazily: the CSV checks and the generator should not pay for it
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CSV = REPO_ROOT / "data" / "housing.csv"
TARGET = "price"
MIN_ROWS = 32
MAX_ROWS = 10_000_000  # what the generator writes at most (~0.5 GB of CSV); the default is 5,000
MAX_SEED = 2**32 - 1
MAX_PROBLEMS = 10
_NAN_WORDS = ("", "nan", "-nan", "na", "n/a", "null", "none")  # cells that mean "no value", not "not a number"


@dataclass(frozen=True)
class FeatureSpec:
    """One model input: how to label it, its training range, its absurd-value limits and its form step/default."""
    name: str
    label: str
    unit: str
    train_min: float  # the generator's range: predictions outside it are extrapolations
    train_max: float
    hard_min: float  # beyond these a value is absurd and refused
    hard_max: float
    step: float
    default: float


FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec("sqft", "Living area", "ft²", 500, 5000, 100, 50_000, 50, 1800),
    FeatureSpec("bedrooms", "Bedrooms", "rooms", 1, 6, 0, 50, 1, 3),
    FeatureSpec("bathrooms", "Bathrooms", "rooms", 1, 4, 0, 50, 0.5, 2),
    FeatureSpec("age_years", "Age", "years", 0, 100, 0, 500, 1, 20),
    FeatureSpec("distance_km", "Distance to city centre", "km", 0.5, 50, 0, 1000, 0.5, 8),
)
FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)
FEATURE_BY_NAME: dict[str, FeatureSpec] = {f.name: f for f in FEATURES}


class DatasetError(ValueError):
    """A CSV that cannot be used for training; the message says exactly what is wrong."""


def price_formula(sqft: Any, bedrooms: Any, bathrooms: Any, age_years: Any, distance_km: Any) -> Any:
    """Noise-free price in dollars (numpy arrays or scalars)."""
    return (50_000 + 120 * sqft + 8_000 * bedrooms + 12_000 * bathrooms - 900 * age_years
            + 180_000 * np.exp(-distance_km / 8) + 0.004 * sqft**2 * np.exp(-distance_km / 20))


def generate_housing(n: int = 5000, seed: int = 0) -> pd.DataFrame:
    """Deterministic synthetic housing data: same (n, seed), same frame. ValueError for a row count outside
    1..MAX_ROWS or a seed outside 0..MAX_SEED."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_ROWS:
        raise ValueError(f"rows must be a whole number from 1 to {MAX_ROWS:,} (got {n!r})")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be a whole number from 0 to {MAX_SEED:,} (got {seed!r})")
    rng = np.random.default_rng(seed)
    sqft = np.clip(rng.lognormal(math.log(1800), 0.4, n), 500, 5000).round()
    # Bigger houses have more rooms: bedrooms follow area, with spread.
    bedrooms = np.clip(np.round(sqft / 650 + rng.normal(0, 0.7, n)), 1, 6)
    bathrooms = np.clip(np.round((bedrooms * 0.6 + rng.normal(0.3, 0.5, n)) * 2) / 2, 1, 4)
    age_years = np.clip(rng.gamma(2.0, 15.0, n), 0, 100).round()
    distance_km = np.clip(rng.lognormal(math.log(10), 0.7, n), 0.5, 50).round(1)
    price = price_formula(sqft, bedrooms, bathrooms, age_years, distance_km) * rng.normal(1.0, 0.06, n)
    return pd.DataFrame({
        "sqft": sqft, "bedrooms": bedrooms, "bathrooms": bathrooms, "age_years": age_years,
        "distance_km": distance_km, TARGET: np.clip(price, 20_000, None).round(),
    })


def ensure_default_dataset(path: Path = DEFAULT_CSV) -> Path:
    """Write the default CSV if it is missing (atomically, so a concurrent reader never sees half a file)."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per-process name: two writers never share a temp file
        try:
            generate_housing().to_csv(tmp, index=False)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def _rows(index: pd.Index) -> str:
    """'3, 7, 9' for the first five 1-based row numbers, then a count of the rest."""
    rows = [str(i + 1) for i in index[:5]]
    more = f" and {len(index) - 5} more" if len(index) > 5 else ""
    return ", ".join(rows) + more


def load_housing_csv(source: str | os.PathLike[str] | io.IOBase | bytes) -> pd.DataFrame:
    """Read and validate a housing CSV; returns FEATURE_NAMES + price as float64, or raises DatasetError.

    Row numbers in messages count data rows from 1 (the header is not a row).
    """
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    if isinstance(source, (str, os.PathLike)):
        name = str(source)  # the whole path (a Path's .name would drop the folder)
        if not Path(source).is_file():
            raise DatasetError(f"no file at {source}")
    else:
        name = getattr(source, "name", None) or "the CSV"  # an uploaded file has a name worth showing
    try:
        raw = pd.read_csv(source, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise DatasetError(f"{name} is empty: expected a header line with {', '.join(FEATURE_NAMES)}, {TARGET}")
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{name} is not a readable CSV text file: {str(exc).strip()[:200]}") from exc
    except OSError as exc:
        raise DatasetError(f"cannot read {name}: {exc}") from exc

    raw.columns = [str(c).strip() for c in raw.columns]
    expected = [*FEATURE_NAMES, TARGET]
    missing = [c for c in expected if c not in raw.columns]
    if missing:
        found = ", ".join(raw.columns) or "none"
        hint = " (is it separated by ';' instead of ','?)" if len(raw.columns) == 1 and ";" in raw.columns[0] else ""
        raise DatasetError(f"{name} is missing column(s) {', '.join(missing)}; a housing CSV needs the columns "
                           f"{', '.join(expected)} (found: {found}){hint}")
    raw = raw[expected].fillna("")  # extra columns are allowed and dropped; short lines come back as NaN

    problems: list[str] = []
    if len(raw) < MIN_ROWS:
        problems.append(f"only {len(raw)} data row(s); training needs at least {MIN_ROWS}")
    columns: dict[str, pd.Series] = {}
    for column in expected:
        text = raw[column].astype(str).str.strip()
        values = pd.to_numeric(text, errors="coerce")  # parses inf, -inf, Infinity and 1e400 (= inf) too
        nan = text.str.lower().isin(_NAN_WORDS)
        bad = values.isna() & ~nan
        for i in bad[bad].index[:3]:
            problems.append(f"column '{column}', row {i + 1}: {raw[column][i]!r} is not a number")
        if bad.sum() > 3:
            problems.append(f"column '{column}': {bad.sum() - 3} more non-numeric cell(s)")
        if nan.any():
            problems.append(f"column '{column}': empty or NaN in row(s) {_rows(nan[nan].index)}")
        inf = values.isin([math.inf, -math.inf])
        if inf.any():
            problems.append(f"column '{column}': infinite value in row(s) {_rows(inf[inf].index)}")
        finite = values[np.isfinite(values)]
        negative = finite < 0
        if negative.any():
            problems.append(f"column '{column}': negative value in row(s) {_rows(negative[negative].index)}")
        spec = FEATURE_BY_NAME.get(column)
        if spec is not None:
            # Negatives are already reported above, so only non-negative values are checked against the limits.
            absurd = (finite > spec.hard_max) | ((finite < spec.hard_min) & (finite >= 0))
            if absurd.any():
                problems.append(f"column '{column}': value(s) outside {spec.hard_min:g}–{spec.hard_max:g} "
                                f"{spec.unit} in row(s) {_rows(absurd[absurd].index)}")
        columns[column] = values
    if problems:
        shown = problems[:MAX_PROBLEMS]
        more = f"\n… and {len(problems) - MAX_PROBLEMS} more problem(s)" if len(problems) > MAX_PROBLEMS else ""
        raise DatasetError(f"{name} has {len(problems)} problem(s):\n" + "\n".join(shown) + more)
    return pd.DataFrame(columns).astype("float64")


def validate_features(values: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(errors, warnings) for one prediction input; errors make it unusable, warnings flag extrapolation."""
    errors: list[str] = []
    warnings: list[str] = []
    for spec in FEATURES:
        what = f"{spec.label} ({spec.unit})"
        if spec.name not in values or values[spec.name] is None or values[spec.name] == "":
            errors.append(f"{what} is missing")
            continue
        limits = f"allowed {spec.hard_min:g}–{spec.hard_max:g} {spec.unit}"
        try:
            if isinstance(values[spec.name], bool):  # float(True) == 1.0 would hide a wiring bug
                raise TypeError
            value = float(values[spec.name])
        except (TypeError, ValueError):
            errors.append(f"{what}: {values[spec.name]!r} is not a number; {limits}")
            continue
        if math.isnan(value):
            errors.append(f"{what} is NaN; enter a number ({limits})")
        elif math.isinf(value):
            errors.append(f"{what} is infinite; enter a finite number ({limits})")
        elif value < 0:
            errors.append(f"{what} cannot be negative (got {value:g}); {limits}")
        elif not spec.hard_min <= value <= spec.hard_max:
            errors.append(f"{what} = {value:g} is not plausible; {limits}")
        elif not spec.train_min <= value <= spec.train_max:
            warnings.append(f"{what} = {value:g} is outside the training range {spec.train_min:g}–"
                            f"{spec.train_max:g} {spec.unit}; the prediction is an extrapolation")
    return errors, warnings


@dataclass
class Normalizer:
    """z-score statistics of features and target, saved with the weights and applied at inference."""
    x_mean: list[float]
    x_std: list[float]
    y_mean: float
    y_std: float

    @classmethod
    def fit(cls, frame: pd.DataFrame) -> Normalizer:
        """Population (ddof=0) mean and std of each feature column and of the target."""
        x = frame[list(FEATURE_NAMES)].to_numpy(dtype=np.float64)
        y = frame[TARGET].to_numpy(dtype=np.float64)
        x_std = x.std(axis=0)
        y_std = float(y.std())
        return cls(
            x_mean=[float(v) for v in x.mean(axis=0)],
            x_std=[float(v) if v > 0 else 1.0 for v in x_std],  # a constant column must not divide by zero
            y_mean=float(y.mean()),
            y_std=y_std if y_std > 0 else 1.0,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain Python floats and lists only, so torch.load(weights_only=True) accepts it inside a checkpoint."""
        return {"x_mean": list(map(float, self.x_mean)), "x_std": list(map(float, self.x_std)),
                "y_mean": float(self.y_mean), "y_std": float(self.y_std)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Normalizer:
        """Rebuild from to_dict() output, e.g. out of a checkpoint; ValueError says what is wrong with it."""
        if not isinstance(d, Mapping):
            raise ValueError(f"normalizer must be a dict, got {type(d).__name__}")
        try:
            x_mean, x_std = [float(v) for v in d["x_mean"]], [float(v) for v in d["x_std"]]
            y_mean, y_std = float(d["y_mean"]), float(d["y_std"])
        except KeyError as exc:
            raise ValueError(f"normalizer is missing {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"normalizer has a non-numeric value: {exc}") from None
        n = len(FEATURE_NAMES)
        if len(x_mean) != n or len(x_std) != n:
            raise ValueError(f"normalizer has {len(x_mean)} means and {len(x_std)} stds; expected {n} each")
        values = [*x_mean, *x_std, y_mean, y_std]
        if not all(math.isfinite(v) for v in values):
            raise ValueError("normalizer contains NaN or inf")
        if min(*x_std, y_std) <= 0:
            raise ValueError("normalizer standard deviations must be positive")
        return cls(x_mean, x_std, y_mean, y_std)

    def _like(self, values: list[float], ref: Any) -> Any:
        """values as an array of ref's kind (numpy or torch, float dtype, same device): broadcasting keeps the type."""
        if isinstance(ref, np.ndarray):
            return np.asarray(values, dtype=ref.dtype if ref.dtype.kind == "f" else np.float64)
        import torch

        return torch.tensor(values, dtype=ref.dtype if ref.is_floating_point() else torch.float32, device=ref.device)

    def transform_x(self, x: Any) -> Any:
        """(N, 5) features -> z-scores; numpy in, numpy out; torch in, torch out."""
        return (x - self._like(self.x_mean, x)) / self._like(self.x_std, x)

    def transform_y(self, y: Any) -> Any:
        return (y - self.y_mean) / self.y_std

    def inverse_y(self, y: Any) -> Any:
        return y * self.y_std + self.y_mean


def to_tensors(frame: pd.DataFrame, normalizer: Normalizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised float32 tensors: X (N, 5) and y (N, 1)."""
    import torch

    x = normalizer.transform_x(frame[list(FEATURE_NAMES)].to_numpy(dtype=np.float64))
    y = normalizer.transform_y(frame[TARGET].to_numpy(dtype=np.float64))
    return (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32)).unsqueeze(1))
