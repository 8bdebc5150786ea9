"""What every page shares: the store, the environment, job submission, flash messages and live progress.

Pages stay thin views: they call the engine and query the store through here and app/queries.py, nothing more.
"""

from __future__ import annotations

import os
import re
import time
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
    jobs.settle_stale_runs(store)
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
    """A stored timestamp (UTC, naive: engine.store.db) in this machine's local time, to the second."""
    if value is None or pd.isna(value):
        return "—"
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp
    return stamp.to_pydatetime().astimezone().strftime("%Y-%m-%d %H:%M:%S")


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
def flash(kind: str, text: str, where: str = "") -> None:
    """Leave a message for the next render, shown by the show_flash(where) call placed next to the button that
    caused it ('' for the page's general place)."""
    st.session_state.setdefault("_flash", []).append((kind, text, where))


def show_flash(where: str = "") -> None:
    kept = []
    for kind, text, place in st.session_state.pop("_flash", []):
        if place == where:
            getattr(st, kind)(text)
        else:
            kept.append((kind, text, place))
    if kept:
        st.session_state["_flash"] = kept


def submit(specs: Sequence[jobs.JobSpec], group_id: str | None = None) -> list[int] | None:
    """Queue runs in a detached supervisor; on failure leave an error message instead of raising."""
    try:
        # Looked up at call time so tests can replace engine.runner.jobs.submit.
        return jobs.submit(get_store(), specs, group_id)
    except Exception as exc:  # noqa: BLE001 - whatever stops a submission, the user sees why
        flash("error", f"Could not start the run: {type(exc).__name__}: {exc}")
        return None


# -- live progress --------------------------------------------------------------------------------------------------
STATE_WORDS = {"queued": "waiting to start", "running": "running", "ok": "finished", "failed": "failed",
               "cancelled": "cancelled"}
MAX_SHOWN = 200  # runs listed in the progress panel; the heading counts the same rows


def active_runs(store: Store, kind: str | None = None) -> pd.DataFrame:
    """Queued and running runs in the order they will run: the running ones (oldest first), then the queued ones in
    the order they were queued (each supervisor takes its group in turn; the device lock keeps one timing at a time)."""
    frame = store.runs(kind=kind, status=ACTIVE, limit=MAX_SHOWN)
    if frame.empty:
        return frame
    return frame.assign(_waiting=frame["status"] != "running").sort_values(["_waiting", "id"]) \
        .drop(columns="_waiting").reset_index(drop=True)


def run_dir(store: Store, run_id: int) -> Any:
    """A run's artifacts folder, where its worker writes and a cancel request is left (engine.runner.jobs)."""
    return jobs.artifacts_root(store) / f"run_{int(run_id)}"


def _holder_text(store: Store, device: str) -> str:
    """Who holds the device now: the run whose supervisor holds it, else the holding process's command, and for how
    long (engine.runner.device_lock.holder)."""
    from engine.runner.device_lock import holder

    found = holder(device)
    if found is None:
        return "another run (its group is preparing)"
    owner = store.runs(status=["running"], limit=MAX_SHOWN)
    owner = owner[owner["pid"] == found.pid] if found.pid is not None and not owner.empty else owner.iloc[0:0]
    if not owner.empty:
        r = owner.iloc[0]
        return f"run #{int(r['id'])} ({r['kind']} {r['mode']}) — {found.describe()}"
    return found.describe()


def run_state(store: Store, row: Any) -> str:
    """A queued or running run's state in words: waiting to start, waiting for its device (held by whom, for how long),
    running and what it does now, or cancelling."""
    from engine.runner.cancel import requested
    from engine.runner.device_lock import WAITING_PREFIX

    message = row["message"] if isinstance(row["message"], str) else ""
    if row["status"] == "queued":
        if message.startswith(f"waiting for {row['device']}"):
            return f"waiting for {row['device']}, held by {_holder_text(store, row['device'])}"
        return STATE_WORDS["queued"]
    if requested(run_dir(store, int(row["id"]))):
        return "cancelling: stopping its worker"
    if message.startswith(WAITING_PREFIX):
        return "prepared, " + message.replace("the device", row["device"], 1)
    return "running" + (f" — {message}" if message and message not in ("running", "queued") else "")


def _cancel(run_id: int, what: str) -> None:
    from engine.runner.cancel import cancel

    try:
        outcome = cancel(get_store(), run_id, run_dir(get_store(), run_id))
    except Exception as exc:  # noqa: BLE001 - whatever stops a cancel, the user sees why beside the button
        st.session_state["_cancelled"] = ("error", f"Could not cancel #{run_id}: {type(exc).__name__}: {exc}",
                                          time.monotonic())
        return
    text = {"cancelled": f"Cancelled #{run_id} ({what}) before it started.",
            "requested": f"Cancelling #{run_id} ({what}): its worker is being stopped; the run ends as cancelled."}
    st.session_state["_cancelled"] = ("success", text.get(outcome, f"#{run_id} had already ended ({outcome})."),
                                      time.monotonic())


NOTE_S = 20.0  # how long a cancel's confirmation stays in the progress panel


def _cancel_note() -> None:
    note = st.session_state.get("_cancelled")
    if note and time.monotonic() - note[2] < NOTE_S:
        getattr(st, note[0])(note[1], icon=":material/cancel:" if note[0] == "success" else ":material/error:")


def watch_active_runs(kind: str | None = None) -> bool:
    """The runs in progress, one row each in the order they will run, with their state in words and a Cancel button,
    refreshed every second; the page reruns when one ends. Returns whether anything is in progress. Polls only while
    something is (every poll opens the database)."""
    active = active_runs(get_store(), kind)
    if active.empty:
        _cancel_note()  # the run cancelled last ended: say so where its row was
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
    with st.container(border=True, key="progress"):
        running = int((active["status"] == "running").sum())
        st.markdown(f"**{len(active)} run{'s' if len(active) != 1 else ''} in progress** — {running} running, "
                    f"{len(active) - running} waiting, in the order they run")
        _cancel_note()
        for row in active.to_dict("records"):
            what = f"{row['kind']} {row['mode']} on {row['device']}"
            left, right = st.columns([6, 1], vertical_alignment="center")
            label = f"#{row['id']} · {what} · {run_state(store, row)}"
            if row["status"] == "running":
                progress = float(row["progress"]) if pd.notna(row["progress"]) else 0.0
                left.progress(min(max(progress, 0.0), 1.0), text=label)
            else:
                left.markdown(f":material/schedule: {label}")
            right.button("Cancel", key=f"cancel-{row['id']}", on_click=_cancel, args=(int(row["id"]), what),
                         help="Stop this run (a running worker is killed); it ends as cancelled, nothing else changes.")


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
