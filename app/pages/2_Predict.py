"""Predict: price a house with a trained model; with none, train one (on the embedded data or an uploaded CSV)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import streamlit as st

from app import charts
from app.common import (
    device_info,
    first_line,
    flash,
    fmt_time,
    get_store,
    page_header,
    show_flash,
    submit,
    watch_active_runs,
)
from engine.housing.history import loss_curve
from engine.housing.predict import (
    InvalidInputError,
    TrainedModel,
    WeightLoadError,
    list_weights,
    load_trained,
    predict,
    price_curve,
)
from engine.housing.train import models_dir
from engine.modes import MODES
from engine.runner.jobs import JobSpec
from engine.workloads.housing_data import FEATURE_BY_NAME, FEATURES, DatasetError, load_housing_csv, validate_features

st.set_page_config(page_title="Predict · Mode Lab", layout="wide")
store = get_store()
weights = list_weights(models_dir(store.path))

page_header("Predict", "Price a house from five features with the MLP trained in a mode of your choice. Values "
            "outside the training range are allowed but flagged: the model is extrapolating there.")
show_flash()


@st.cache_resource(show_spinner="Loading weights…", max_entries=16)
def _load(path: str, mtime_ns: int) -> TrainedModel:
    # Keyed on the file's mtime, so a retrained model is picked up; load errors are not cached and show every time.
    return load_trained(Path(path))


@st.cache_data(show_spinner=False, max_entries=32)
def _curve(path: str, mtime_ns: int) -> tuple[Any, int | None]:
    # Keyed on the file's mtime: a retrained model brings its own curve.
    return loss_curve(get_store(), Path(path))


def money(value: float) -> str:
    return f"-${abs(value):,.0f}" if value < 0 else f"${value:,.0f}"


def save_upload(name: str, data: bytes) -> Path:
    """Keep a validated upload under uploads/ beside the store; the content hash makes re-uploads idempotent."""
    folder = store.path.parent / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name)[:80] or "upload.csv"
    path = folder / f"{hashlib.sha256(data).hexdigest()[:12]}-{safe}"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def queue_training(mode: str, device: str, epochs: int, csv: str | None, batch_size: int) -> None:
    params = {"mode": mode, "device": device, "epochs": epochs, "batch_size": batch_size, "lr": 1e-3, "csv": csv}
    ids = submit([JobSpec("train", "house_price", mode, device, params)])
    if ids:
        source = Path(csv).name if csv else "the embedded dataset"
        flash("success", f"Queued training run #{ids[0]} ({mode} on {device}, {epochs} epochs, {source}). The model "
                         "appears here when it finishes.")


def train_panel() -> None:
    """Mode, epochs and an optional CSV (validated before anything is queued)."""
    info = device_info()
    c1, c2, c3 = st.columns(3)
    device = c1.selectbox("Device", info["devices"], key="train-device")
    modes = [name for name, mode in MODES.items() if mode.available(device)[0]]
    mode = c2.selectbox("Mode", modes, key="train-mode")
    epochs = int(c3.number_input("Epochs", min_value=1, max_value=1000, value=30, step=5, key="train-epochs"))
    upload = st.file_uploader("Training data (optional): a CSV with columns "
                              f"{', '.join(f.name for f in FEATURES)}, price", type=["csv"], key="train-csv")
    csv_path: str | None = None
    csv_ok = True
    batch_size = 64
    if upload is not None:
        data = upload.getvalue()
        try:
            upload.seek(0)
            frame = load_housing_csv(upload)  # an UploadedFile has a name, so messages name the file
        except DatasetError as exc:
            csv_ok = False
            st.error("This CSV cannot be used for training — fix it and upload again:  \n"
                     + str(exc).replace("\n", "  \n"), icon=":material/error:")
        else:
            csv_path = str(save_upload(upload.name, data))
            # Training holds out 20 % and needs one full batch of 64 in the rest; a small but valid CSV (≥ 32 rows,
            # data.MIN_ROWS) would otherwise fail after queueing. 16 fits the smallest valid file.
            batch_size = 64 if len(frame) >= 80 else 16
            st.success(f"{upload.name}: {len(frame):,} valid rows; the model will train on it.",
                       icon=":material/check:")
    st.button("Train a model", key="train", type="primary", disabled=not (csv_ok and mode),
              on_click=queue_training, args=(mode, device, epochs, csv_path, batch_size))


training = watch_active_runs(kind="train")
last_train = store.runs(kind="train", limit=1)
if not last_train.empty and last_train.iloc[0]["status"] == "failed":
    row = last_train.iloc[0]
    st.error(f"Training run #{row['id']} ({row['mode']}) failed: {first_line(row['error'])}", icon=":material/error:")
    with st.expander("Full error"):
        st.code(row["error"] or "", language=None)

if not weights:
    st.info("No trained model yet. Train one below (30 epochs of eager on the CPU take well under a minute); "
            "it appears here when the run finishes.", icon=":material/info:")
    with st.container(border=True):
        st.subheader("Train a model")
        train_panel()
    st.stop()

# -- a trained model ------------------------------------------------------------------------------------------------
top = st.columns([2, 1, 1])
choice = top[0].selectbox("Trained model", list(weights), key="model",
                          format_func=lambda m: f"{m}  ({weights[m].name})")
path = weights[choice]
trained: TrainedModel | None = None
try:
    trained = _load(str(path), path.stat().st_mtime_ns)
except (WeightLoadError, OSError) as exc:
    st.error(f"Cannot use the model {choice!r}: {exc}. Retrain it below.", icon=":material/error:")
if trained is not None:
    mae = trained.metrics.get("val_mae_usd")
    top[1].metric("Validation MAE", f"${mae:,.0f}" if mae is not None else "—",
                  help="Mean absolute error on the 20 % of rows held out from training.")
    top[2].caption(f"Trained {trained.epochs} epochs in {trained.mode}"
                   + (f", {fmt_time(trained.created_at)}" if trained.created_at else ""))
    curve, curve_run = _curve(str(path), path.stat().st_mtime_ns)
    if curve.empty:
        st.caption("This weights file keeps no training curve and no training run in this store wrote it.")
    else:
        with st.expander("Training curve", expanded=True, icon=":material/show_chart:"):
            st.plotly_chart(charts.training_curve(curve), key="chart-training")
            st.caption(f"{len(curve)} epochs · final training loss {curve['train_loss'].iloc[-1]:.4g}, validation "
                       f"loss {curve['val_loss'].iloc[-1]:.4g} · "
                       + (f"from training run #{curve_run}" if curve_run else "from the weights file"))

with st.form("predict-form"):
    values: dict[str, Any] = {}
    for col, spec in zip(st.columns(len(FEATURES)), FEATURES):
        # No min/max on the widget on purpose: Streamlit silently resets an out-of-bounds value to the default, so
        # a user typing -1 would get a price for the default instead of being told. The engine's validation below
        # names the problem; the limits are in the help text.
        values[spec.name] = col.number_input(
            f"{spec.label} ({spec.unit})", value=float(spec.default), step=float(spec.step),
            format="%.0f" if spec.step >= 1 else "%.1f", key=f"feature-{spec.name}",
            help=f"Allowed {spec.hard_min:g}–{spec.hard_max:g} {spec.unit}; trained on "
                 f"{spec.train_min:g}–{spec.train_max:g} (outside that the model extrapolates).")
    if st.form_submit_button("Predict", key="predict", type="primary"):
        st.session_state["predict-values"] = dict(values)

entered: dict[str, Any] | None = st.session_state.get("predict-values")
price: float | None = None
if entered is None:
    st.caption("Enter the features and press **Predict**.")
else:
    # Validate whatever arrived, whatever the widgets allowed: values can also come from session state or tests.
    errors, warnings = validate_features(entered)
    for message in errors:
        st.error(message, icon=":material/error:")
    for message in warnings:
        st.warning(message, icon=":material/warning:")
    if not errors and trained is not None:
        try:
            prediction = predict(trained, entered)
        except InvalidInputError as exc:
            for message in exc.errors:
                st.error(message, icon=":material/error:")
        else:
            price = prediction.price_usd
            with st.container(key="predicted-price"):  # a stable hook for the browser test
                st.metric("Predicted price", money(price), help=f"by the {choice} model")
            for message in prediction.warnings:
                if message not in warnings:
                    st.warning(message, icon=":material/warning:")

if trained is not None and price is not None and entered is not None:
    feature = st.selectbox("Plot price against", [f.name for f in FEATURES], key="curve-feature",
                           format_func=lambda n: f"{FEATURE_BY_NAME[n].label} ({FEATURE_BY_NAME[n].unit})")
    xs, ys = price_curve(trained, entered, feature)
    spec = FEATURE_BY_NAME[feature]
    st.plotly_chart(charts.price_curve(xs, ys, float(entered[feature]), price, f"{spec.label} ({spec.unit})"),
                    key="chart-price-curve")

with st.expander("Train another model", expanded=trained is None):
    if training:
        st.caption("A training run is in progress (see above).")
    train_panel()
