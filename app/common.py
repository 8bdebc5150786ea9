"""What every page shares: the store, the environment, job submission, flash messages and live progress.

Pages stay thin views: they call the engine and query the store through here and app/queries.py, nothing more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st

from engine.cli.kinds import KINDS  # noqa: F401 - every run kind registered before a page queues runs
from engine.runner import jobs
from engine.store.db import Store, StoreDamagedError, StoreError, default_db_path

ACTIVE = ("queued", "running")
MAX_BATCH_SIZE = 1 << 20


@st.cache_resource(show_spinner=False)
def _open_store(path: str) -> Store:
    # Once per process and path: migrate the schema and fail runs whose supervisor died while nobody watched.
    store = Store(path)
    store.init()
    store.fail_stale_runs()
    return store


def get_store() -> Store:
    """The store at RESULTS_DB (read on every call, so tests and users can point elsewhere)."""
    try:
        return _open_store(str(default_db_path()))
    except StoreDamagedError as exc:  # which file, nothing changed, what to do: the message says it all
        text = str(exc)
        st.error(text[0].upper() + text[1:] + ".", icon=":material/error:")
        st.stop()
        raise
    except StoreError as exc:
        st.error(f"The results store cannot be opened: {exc}")
        st.stop()
        raise  # st.stop() raises; this keeps type checkers happy


@st.cache_resource(show_spinner="Looking for devices…")
def device_info() -> dict[str, Any]:
    """Devices torch can see. Imports torch, so only the Benchmark and Predict pages call it."""
    from engine.store.envinfo import device_report

    return device_report()


def page_header(title: str, intro: str) -> None:
    st.title(title)
    st.caption(intro)


def first_line(text: Any) -> str:
    """The first non-empty line of an error (the full text goes in an expander)."""
    if not isinstance(text, str):
        return ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def fmt_us(value: float | None) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{value / 1e3:,.2f} ms" if value >= 10_000 else f"{value:,.1f} µs"


def fmt_time(value: Any) -> str:
    if value is None or pd.isna(value):
        return "—"
    return pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def parse_batch_sizes(text: str) -> list[int]:
    """'1, 64 1024' → [1, 64, 1024]; raises ValueError with a message meant for the user."""
    tokens = [t for t in re.split(r"[,\s;]+", text.strip()) if t]
    if not tokens:
        raise ValueError("enter at least one batch size, e.g. 1, 64, 1024")
    sizes: list[int] = []
    for token in tokens:
        if not re.fullmatch(r"\+?\d+", token):
            raise ValueError(f"{token!r} is not a whole number; enter batch sizes like 1, 64, 1024")
        size = int(token)
        if not 1 <= size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch size {size} is out of range; use 1 to {MAX_BATCH_SIZE:,}")
        if size not in sizes:
            sizes.append(size)
    return sizes


# -- flash messages: callbacks run before the script, so they leave a message for the render that follows ----------
def flash(kind: str, text: str) -> None:
    st.session_state.setdefault("_flash", []).append((kind, text))


def show_flash() -> None:
    for kind, text in st.session_state.pop("_flash", []):
        getattr(st, kind)(text)


def submit(specs: Sequence[jobs.JobSpec], group_id: str | None = None) -> list[int] | None:
    """Queue runs in a detached supervisor; on failure leave an error message instead of raising."""
    try:
        # Looked up at call time so tests can replace engine.runner.jobs.submit.
        return jobs.submit(get_store(), specs, group_id)
    except Exception as exc:  # noqa: BLE001 - whatever stops a submission, the user sees why
        flash("error", f"Could not start the run: {type(exc).__name__}: {exc}")
        return None


# -- live progress --------------------------------------------------------------------------------------------------
def active_runs(store: Store, kind: str | None = None) -> pd.DataFrame:
    return store.runs(kind=kind, status=ACTIVE, limit=50)


def watch_active_runs(kind: str | None = None) -> bool:
    """Show a progress bar per queued/running run, refreshed every second; the page reruns when one ends.

    Returns whether anything is in progress. Polls only while something is (every poll opens the database).
    """
    active = active_runs(get_store(), kind)
    if active.empty:
        return False
    _progress_fragment(kind, tuple(sorted(int(i) for i in active["id"])))
    return True


@st.fragment(run_every=1.0)
def _progress_fragment(kind: str | None, watched: tuple[int, ...]) -> None:
    store = get_store()
    store.fail_stale_runs()  # a killed supervisor would otherwise leave a bar spinning forever
    active = active_runs(store, kind)
    now = tuple(sorted(int(i) for i in active["id"])) if not active.empty else ()
    if now != watched:
        st.rerun()  # a run finished (or a new one started): redraw the whole page with fresh results
    with st.container(border=True):
        st.markdown(f"**{len(active)} run(s) in progress**")
        for row in active.sort_values("id").itertuples():
            progress = float(row.progress) if pd.notna(row.progress) else 0.0
            message = row.message if isinstance(row.message, str) else row.status
            st.progress(min(max(progress, 0.0), 1.0),
                        text=f"#{row.id} · {row.kind} {row.mode} on {row.device} · {row.status}: {message}")


# -- your own model: an import path typed into a page (the code stays where the user keeps it) ----------------------
@dataclass
class ModelChoice:
    """A model typed into a page's field: its spec (params for jobs) and the subprocess check's verdict."""
    spec: Any  # engine.workloads.user_model.ModelSpec
    ok: bool
    error: str = ""
    description: str = ""
    notes: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    train_batch_sizes: list[int] = field(default_factory=list)


@st.cache_data(show_spinner="Checking the model (imported in a separate process)…", ttl=60, max_entries=64)
def _check_model(model: str, inputs: str | None, path: str) -> dict[str, Any]:
    from dataclasses import asdict

    from engine.workloads import user_model

    # Looked up at call time so tests can replace it; a separate process, so user code never runs in the dashboard.
    return asdict(user_model.check_in_subprocess(user_model.ModelSpec(model, inputs, 0, path)))


def model_field(key: str, container: Any = None) -> ModelChoice | None:
    """Text fields for your own model (import path, inputs, folder) on a page; None while the path is empty.

    The model is imported and run once in a subprocess (cached for a minute); an error is shown as its one line."""
    from engine.workloads.user_model import ModelSpec

    where = container or st
    model = where.text_input(
        "Your model (import path)", key=f"{key}-model",
        placeholder="my_pkg.models:make_model  or  transformers:gpt2-tiny",
        help="module.path:factory — the factory returns an nn.Module — or module.path:factory:inputs_fn; or a "
             "built-in example such as lab:llama, transformers:gpt2-tiny, transformers:bert-tiny, "
             "transformers:llama-tiny, transformers:t5-encoder-tiny or transformers:vit-tiny. "
             "Nothing is uploaded: the module is imported from the folder below, in worker processes.").strip()
    if not model:
        return None
    inputs = where.text_input(
        "Its inputs", key=f"{key}-inputs", placeholder="float32[B,16];int64[B,32]@0-1000",
        help="Leave empty when the path names an inputs function or a built-in example. B is the batch dimension; "
             "integer inputs need @low-high (high exclusive).").strip() or None
    folder = where.text_input("Folder on the Python path", value=os.getcwd(), key=f"{key}-path",
                              help="The folder that holds the module (put first on sys.path when importing it).")
    spec = ModelSpec(model, inputs, 0, folder.strip() or os.getcwd())
    report = _check_model(spec.model, spec.inputs, spec.path)
    if not report.get("ok"):
        where.error(first_line(report.get("error")) or "the model could not be checked", icon=":material/error:")
    return ModelChoice(spec=spec, ok=bool(report.get("ok")), error=report.get("error", ""),
                       description=report.get("description", ""), notes=list(report.get("notes", [])),
                       batch_sizes=list(report.get("batch_sizes", [])),
                       train_batch_sizes=list(report.get("train_batch_sizes", [])))
