"""The group planner: how a group of queued runs is supervised — in which order, and how many prepare side by side.

It sits above the job runner (engine.runner.jobs), which supervises whatever order and slot count it is given and knows
nothing of what a run is for. What it knows of a kind of run is what the run stored of it (engine.runner.kinds): whether
it is phased, the kind's own planner (an LLM group's memory-bound slots come from engine.llm.group), what to do when a
group starts side by side (measure the ceilings first, start native builds) and how long each run takes to prepare.

    CLI (`llm --mode all`, …)  ─┐
                                ├─▶ plan_group() ─▶ engine.runner.jobs.run_jobs(order, prepare_parallel=slots)
    dashboard: jobs.submit()  ──┘   (`python -m engine.runner.plan`, the detached supervisor)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from engine.runner.device_lock import TIMING_CORES
from engine.runner.jobs import (
    SUPERVISOR_SIGNALS,
    OnProgress,
    interrupt_on,
    interrupt_runs,
    preload_for,
    prestarted_launcher,
    run_jobs,
    signal_name,
)
from engine.runner.kinds import StoredKind, resolve
from engine.store.db import Store


@dataclass
class GroupPlan:
    slots: int  # runs preparing at once, at most (each still times alone)
    order: list[int]  # the order runs start in
    why: str  # one line: why that many at once
    needs: dict[int, int] | None = None  # what each run holds (an LLM group: device bytes), where admission counts it
    budget: int | None = None  # what the runs under way may hold together: the next starts only while it fits

    def describe(self) -> str:
        return f"preparing {self.why}; timing one at a time"


def plan_group(store: Store, run_ids: Sequence[int], requested: int | str = "auto", serial: bool = False
               ) -> GroupPlan:
    """The plan for a group of queued runs. Runs of one kind on one device prepare side by side where their worker
    marks its timed sections (a phased kind, engine.runner.kinds): as the kind's planner says (an LLM group:
    engine.llm.group), else as _side_by_side says, the slowest to prepare first. Anything else runs one at a time, as
    given."""
    runs = [store.run(i) for i in run_ids]
    if len(runs) < 2 or any(r is None for r in runs):
        return GroupPlan(1, list(run_ids), "one run at a time")
    kinds, devices = {r["kind"] for r in runs}, {r["device"] for r in runs}
    if len(kinds) > 1 or len(devices) > 1:
        return GroupPlan(1, list(run_ids), "one run at a time (not one kind of run on one device)")
    kind, device = kinds.pop(), devices.pop()
    stored = [StoredKind.of(r) for r in runs]
    if not all(s.phased for s in stored):
        return GroupPlan(1, list(run_ids), f"one run at a time ({kind} runs hold the device from start to end)")
    if stored[0].planner:  # (slots, order, why) or (slots, order, why, (needs, budget)): the kind's admission
        slots, order, why, *admission = resolve(stored[0].planner)(store, run_ids, requested, serial)
        needs, budget = admission[0] if admission and admission[0] else (None, None)
        return GroupPlan(slots, order, why, needs, budget)
    repeats = max(int(r["params"].get("repeats", 1) or 1) for r in runs)
    if repeats > 1 and requested == "auto" and not serial:
        # `bench --repeat N`: the processes of each mode time in the order given, interleaved across modes (A B C A
        # B C …), so a slow drift of the machine falls on every mode alike; side by side, whoever finished preparing
        # first would time first.
        return GroupPlan(1, list(run_ids), f"one run at a time ({repeats} repeats, interleaved across modes)")
    slots, why = _side_by_side(len(runs), device, requested, serial)
    # The slow to prepare first (native builds and autotuning, then compiles), the quick fill in behind them.
    order = list(run_ids) if repeats > 1 else \
        [i for _, i in sorted(zip(stored, run_ids), key=lambda si: si[0].prepare_cost, reverse=True)]
    return GroupPlan(slots, order, why)


# The most bench or levels runs that prepare at once on a GPU: on a 16-core GPU machine `bench --mode all` is faster
# cold and warm at 6 than at 4 (docs/figures.md, "bench --mode all").
MAX_GPU_SLOTS = 6


def _side_by_side(count: int, device: str, requested: int | str, serial: bool) -> tuple[int, str]:
    """How many bench or levels runs prepare at once: their models are small, so the cores bound it — on a GPU two
    of the cores a timing leaves free each (a compile uses several threads; most of a warm run's preparation is its
    worker's start, CUDA's included, beside the others), on the CPU one per core (whoever times holds the cores
    alone: preparing runs wait)."""
    if serial:
        return 1, "one run at a time (--serial)"
    if requested != "auto":
        return min(int(requested), count), f"--prepare-parallel {requested}"
    cores = os.cpu_count() or 1
    if device.startswith("cuda"):
        slots = max(1, min(count, (cores - TIMING_CORES) // 2, MAX_GPU_SLOTS))
    else:
        slots = max(1, min(count, cores, 4))
    if slots == 1:
        return 1, f"one run at a time ({cores} cores)"
    return slots, f"{slots} at a time ({cores} cores)"


def start_group(store: Store, run_ids: Sequence[int]) -> None:
    """A group starts side by side: its kind's group_start hooks run now, in order (measure the device's ceilings,
    which runs preparing at once would each wait for the device alone to do; start the group's native builds in the
    background)."""
    runs = [r for r in (store.run(i) for i in run_ids) if r is not None]
    if not runs:
        return
    for hook in StoredKind.of(runs[0]).group_start:
        resolve(hook)(store, runs)


def supervise(store: Store, run_ids: Sequence[int], on_progress: OnProgress | None = None, launcher=None,
              requested: int | str = "auto", serial: bool = False, out: TextIO | None = None,
              what: str = "runs") -> dict[int, str]:
    """Plan the group, say how it will run ("N runs; preparing …"), and supervise it to its end; {run id: status}."""
    plan = plan_group(store, run_ids, requested, serial)
    if len(plan.order) > 1:
        print(f"{len(plan.order)} {what}; {plan.describe()}", file=out or sys.stdout, flush=True)
    if plan.slots > 1:
        start_group(store, plan.order)
    statuses = run_jobs(store, plan.order, on_progress, launcher, prepare_parallel=plan.slots, needs=plan.needs,
                        budget=plan.budget) if plan.order else {}
    # a run the planner refused (it cannot fit the device alone) is failed already: its status as stored
    return {i: statuses.get(i) or str((store.run(i) or {}).get("status", "failed")) for i in run_ids}


def main(argv: Sequence[str] | None = None) -> int:
    """The detached supervisor the dashboard starts (engine.runner.jobs.submit): plans the group, then supervises it."""
    parser = argparse.ArgumentParser(prog="python -m engine.runner.plan", description="Plan and supervise queued runs "
                                     "(internal: the dashboard's detached supervisor).")
    parser.add_argument("--db", required=True)
    parser.add_argument("run_ids", nargs="+", type=int)
    args = parser.parse_args(argv)
    store = Store(args.db)
    # SIGTERM, SIGINT or SIGHUP ends the group as Ctrl-C ends a CLI's: its workers are killed, its unfinished runs
    # marked failed "interrupted by SIG…" (a finished worker's result recorded), and it exits; the second signal
    # waits for that.
    with interrupt_on(*SUPERVISOR_SIGNALS, once=True):
        try:
            statuses = _plan_and_supervise(store, args.run_ids)
        except KeyboardInterrupt as exc:
            interrupt_runs(store, args.run_ids, exc)
            print(f"interrupted by {signal_name(exc)}", file=sys.stderr)
            return 128 + signal.Signals[signal_name(exc)]
    print(json.dumps(statuses))
    return 0 if all(s == "ok" for s in statuses.values()) else 1


def _plan_and_supervise(store: Store, run_ids: Sequence[int]) -> dict[int, str]:
    plurals = {StoredKind.of(run).plural for run in (store.run(i) for i in run_ids) if run}
    # The lane's fork server starts before planning and the group's start, whose ceilings check imports torch: the
    # imports overlap.
    preload = preload_for(store, run_ids) if len(run_ids) > 1 else None
    with prestarted_launcher(store, preload) as launcher:
        return supervise(store, run_ids, launcher=launcher, what=plurals.pop() if len(plurals) == 1 else "runs")


if __name__ == "__main__":
    sys.exit(main())
