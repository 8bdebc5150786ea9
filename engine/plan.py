"""The group planner: how a group of queued runs is supervised — in which order, and how many prepare side by side.

It sits above the job runner (engine.jobs), which supervises whatever order and slot count it is given and knows
nothing of what a run is for. Kind-specific knowledge stays with its feature: an LLM group's memory-bound slots and
its ceilings-first rule come from engine.llm.group.

    CLI (`llm --mode all`, …)  ─┐
                                ├─▶ plan_group() ─▶ engine.jobs.run_jobs(order, prepare_parallel=slots)
    dashboard: jobs.submit()  ──┘   (`python -m engine.plan`, the detached supervisor)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from engine.jobs import run_jobs
from engine.store import Store


@dataclass
class GroupPlan:
    slots: int  # runs preparing at once (each still times alone)
    order: list[int]  # the order runs start in
    why: str  # one line: why that many at once

    def describe(self) -> str:
        return f"preparing {self.why}; timing one at a time"


def plan_group(store: Store, run_ids: Sequence[int], requested: int | str = "auto", serial: bool = False
               ) -> GroupPlan:
    """The plan for a group of queued runs: an LLM group of one device plans as `llm --mode all` does; any other
    group runs one at a time, in the order given."""
    runs = [store.run(i) for i in run_ids]
    if len(runs) > 1 and all(r is not None and r["kind"] == "llm" for r in runs):
        from engine.llm.group import plan_group as plan_llm_group

        slots, order, why = plan_llm_group(store, run_ids, requested, serial)
        return GroupPlan(slots, order, why)
    return GroupPlan(1, list(run_ids), "one run at a time")


def supervise(store: Store, run_ids: Sequence[int], requested: int | str = "auto", serial: bool = False
              ) -> dict[int, str]:
    """Plan the group, say how it will run, and supervise it to its end; {run id: final status}."""
    plan = plan_group(store, run_ids, requested, serial)
    if len(plan.order) > 1:
        kinds = {store.run(i)["kind"] for i in plan.order}
        what = "LLM runs" if kinds == {"llm"} else "runs"
        print(f"{len(plan.order)} {what}; {plan.describe()}", flush=True)
    return run_jobs(store, plan.order, prepare_parallel=plan.slots)


def main(argv: Sequence[str] | None = None) -> int:
    """The detached supervisor the dashboard starts (engine.jobs.submit): plans the group, then supervises it."""
    parser = argparse.ArgumentParser(prog="python -m engine.plan", description="Plan and supervise queued runs "
                                     "(internal: the dashboard's detached supervisor).")
    parser.add_argument("--db", required=True)
    parser.add_argument("run_ids", nargs="+", type=int)
    args = parser.parse_args(argv)
    statuses = supervise(Store(args.db), args.run_ids)
    print(json.dumps(statuses))
    return 0 if all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
