"""Cancelling a run, and nothing else: a queued run becomes 'cancelled' at once and no supervisor starts it; a running
one gets a request file in its artifacts folder, which its supervisor (engine.runner.jobs) looks for while it watches
the worker: it kills the worker's process group and records the run 'cancelled'. The other runs of its group go on,
and nothing stored about other runs changes.

A file, not a column: the supervisor looks for it every few tens of milliseconds while it watches, which costs a stat
and never contends with the dashboard for the store.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from engine.store.db import Store

CANCELLED = "cancelled"
REQUEST_FILE = "cancel-requested"
QUEUED_REASON = "cancelled before it started"
RUNNING_REASON = "cancelled while it ran: its worker was stopped"


def request_file(workdir: Path) -> Path:
    return Path(workdir) / REQUEST_FILE


def requested(workdir: Path) -> bool:
    """Whether someone asked to cancel the run whose artifacts folder this is."""
    return request_file(workdir).exists()


def clear(workdir: Path) -> None:
    """Forget a request left by an earlier run of the same number (another store using the same artifacts folder)."""
    request_file(workdir).unlink(missing_ok=True)


def mark_cancelled(store: Store, run_id: int, reason: str, only_queued: bool = False) -> bool:
    """Status 'cancelled' with the reason, while the run is still queued (or running, unless only_queued); False when
    it had ended already (or started, with only_queued)."""
    states = ("queued",) if only_queued else ("queued", "running")
    with store.transaction() as con:
        row = con.execute("SELECT status FROM runs WHERE id = ?", [int(run_id)]).fetchone()
        if row is None or row[0] not in states:
            return False
        con.execute("UPDATE runs SET status = ?, message = ?, error = ?, finished_at = ? WHERE id = ?",
                    [CANCELLED, CANCELLED, reason, datetime.now(timezone.utc).replace(tzinfo=None), int(run_id)])
    return True


def cancel(store: Store, run_id: int, workdir: Path) -> str:
    """Cancel a queued or running run whose artifacts folder (engine.runner.jobs names it) is `workdir`: 'cancelled'
    (it was queued: it never starts), 'requested' (it runs: its supervisor stops it within a moment), else the status
    it had ended with (nothing changes)."""
    if mark_cancelled(store, run_id, QUEUED_REASON, only_queued=True):
        return CANCELLED
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in {store.path}")
    if run["status"] != "running":
        return str(run["status"])
    Path(workdir).mkdir(parents=True, exist_ok=True)
    request_file(workdir).write_text("cancel\n")
    return "requested"
