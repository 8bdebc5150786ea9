"""The Predict page: the train offer without a model, prices, input errors and warnings, broken weights, uploads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from engine.runner import jobs
from engine.store.db import Store
from engine.workloads.housing_data import generate_housing


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list:
    """Replace engine.runner.jobs.submit: runs are created (queued) but no supervisor is spawned."""
    calls: list = []

    def fake_submit(store, specs, group_id=None):
        calls.append(specs)
        return jobs.create_runs(store, specs, group_id)

    monkeypatch.setattr(jobs, "submit", fake_submit)
    return calls


def test_without_a_model_offers_training(lab: Store, page, queued: list) -> None:
    at = page("predict").run()
    assert not at.exception
    assert "No trained model yet" in texts(at.info)
    assert not at.metric
    at.number_input(key="train-epochs").set_value(3).run()
    at.button(key="train").click().run()
    assert not at.exception
    spec, = queued[0]
    assert (spec.kind, spec.mode, spec.params["epochs"], spec.params["csv"]) == ("train", "eager", 3, None)
    assert list(lab.runs(kind="train")["status"]) == ["queued"]
    assert any(m.value.startswith("**1 run in progress** — 0 running, 1 waiting") for m in at.markdown)


def test_prediction_shows_a_price(with_model: Path, page) -> None:
    at = page("predict").run()
    assert not at.exception
    assert any(m.label == "Validation MAE" and m.value.startswith("$") for m in at.metric)
    at.button(key="predict").click().run()
    assert not at.exception
    price, = [m for m in at.metric if m.label == "Predicted price"]
    assert price.value.startswith("$") and "." not in price.value
    assert float(price.value.lstrip("$").replace(",", "")) > 0
    assert not at.error and not at.warning
    assert at.get("plotly_chart")  # price against a feature
    at.selectbox(key="curve-feature").set_value("age_years").run()
    assert not at.exception and at.get("plotly_chart")


@pytest.mark.parametrize("feature, value, message", [
    ("bedrooms", -1.0, "cannot be negative"),
    ("sqft", 60_000.0, "is not plausible"),
])
def test_bad_input_shows_an_error_and_no_price(with_model: Path, page, feature: str, value: float,
                                               message: str) -> None:
    at = page("predict").run()
    at.number_input(key=f"feature-{feature}").set_value(value)
    at.button(key="predict").click().run()
    assert not at.exception
    assert message in texts(at.error)
    assert not [m for m in at.metric if m.label == "Predicted price"]


def test_values_from_session_state_are_validated_too(with_model: Path, page) -> None:
    # Streamlit's number_input turns NaN typed in the browser back into the default; values that reach the page
    # another way (session state, here) still go through the engine's validation.
    at = page("predict").run()
    values = {"sqft": math.nan, "bedrooms": 3.0, "bathrooms": 2.0, "age_years": "old", "distance_km": 8.0}
    at.session_state["predict-values"] = values
    at.run()
    assert not at.exception
    errors = texts(at.error)
    assert "is NaN" in errors and "'old' is not a number" in errors
    assert not [m for m in at.metric if m.label == "Predicted price"]


def test_out_of_training_range_warns(with_model: Path, page) -> None:
    at = page("predict").run()
    at.number_input(key="feature-age_years").set_value(150.0)
    at.button(key="predict").click().run()
    assert not at.exception
    assert "outside the training range" in texts(at.warning)
    assert [m for m in at.metric if m.label == "Predicted price"]


def test_corrupt_weights_show_a_clear_error(lab: Store, page, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "house_price-eager.pt").write_bytes(b"not a checkpoint")
    at = page("predict").run()
    assert not at.exception
    assert "is not a readable weights file" in texts(at.error)
    at.button(key="predict").click().run()
    assert not at.exception
    assert not [m for m in at.metric if m.label == "Predicted price"]


def test_uploaded_csv_is_validated_then_used(lab: Store, page, queued: list, tmp_path: Path) -> None:
    at = page("predict").run()
    at.file_uploader(key="train-csv").set_value(("mine.csv", b"sqft,price\n1,2\n", "text/csv")).run()
    assert not at.exception
    assert "missing column(s) bedrooms" in texts(at.error)
    assert at.button(key="train").disabled
    assert not (tmp_path / "uploads").exists()

    good = generate_housing(n=64).to_csv(index=False).encode()
    at.file_uploader(key="train-csv").set_value(("my data.csv", good, "text/csv")).run()
    assert not at.exception and not at.error
    assert "64 valid rows" in texts(at.success)
    at.button(key="train").click().run()
    spec, = queued[0]
    saved = Path(spec.params["csv"])
    assert saved.parent == tmp_path / "uploads" and saved.name.endswith("-my_data.csv")
    assert saved.read_bytes() == good
    assert spec.params["batch_size"] == 16  # 64 rows: 51 after the validation split, fewer than a batch of 64


def test_a_model_shows_its_training_curve_from_the_file_or_its_run(with_model: Path, lab: Store, page) -> None:
    """A weights file no run of this store wrote: the curve its checkpoint carries. A file a stored training run
    wrote: that run's per-epoch losses (the mean of each epoch's steps, and the validation loss), named."""
    from engine.store.db import Artifact, Metric, RunResult, Samples

    at = page("predict").run()
    assert not at.exception
    (chart,) = [c for c in at.get("plotly_chart") if "Training curve" in c.proto.spec]
    assert "validation (after the epoch)" in chart.proto.spec
    assert "2 epochs" in texts(at.caption) and "from the weights file" in texts(at.caption)
    run_id = lab.create_run("train", "house_price", "eager", "cpu", {})
    lab.start_run(run_id)
    lab.record_result(run_id, RunResult(
        metrics=[Metric("steps_per_epoch", 2, "")],
        samples=[Samples("loss", [4.0, 2.0, 1.0, 1.0, 0.5, 0.3], "mse"), Samples("val_loss", [2.5, 1.1, 0.35], "mse")],
        artifacts=[Artifact("weights", with_model.name, str(with_model))]))
    with_model.touch()  # a new mtime: the page reads the curve again
    at = page("predict").run()
    assert not at.exception
    assert (f"3 epochs · final training loss 0.4, validation loss 0.35 · from training run #{run_id}"
            in texts(at.caption))
