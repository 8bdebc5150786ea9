"""The registry of run kinds: what the runner needs to know of each kind of run, registered by its feature.

A feature registers its kind in a light module of its own (engine/bench/kind.py, …: no torch at import), which the
code that queues runs of that kind imports — the CLI and the dashboard import every one at start (engine/cli/kinds.py).
The runner imports no feature: `create_runs` stores on each run what the runner needs of its kind (params["_kind"],
a StoredKind, beside its target in params["_target"]), and the supervisor works from the stored run alone. A run
stored without it (queued before kinds were stored, or of a kind nobody registered) is not phased: it runs alone.

Hooks are "module:function" strings, or top-level functions (named that way when a run stores them); the supervisor
imports a hook only when it calls it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Hook = str | Callable[..., Any]

# Targets of runs stored before their modules moved: a queued run under an old name still starts.
MOVED_TARGETS = {
    "engine.bench:bench_job": "engine.bench.run:bench_job",
    "engine.train:train_job": "engine.housing.train:train_job",
    "engine.ceilings:ceilings_job": "engine.measure.ceilings:ceilings_job",
    "engine.workloads.user_model:bench_job": "engine.bench.run:bench_job",
    "engine.workloads.user_model:profile_job": "engine.profiling.profile:profile_job",
}


def current_target(target: str) -> str:
    """Where a stored target lives now (MOVED_TARGETS), else the target itself."""
    return MOVED_TARGETS.get(target, target)


def hook_name(hook: Hook) -> str:
    """A hook as a run stores it: "module:function". A callable must be a module's top-level function."""
    if isinstance(hook, str):
        module, _, name = hook.partition(":")
        if not module or not name:
            raise ValueError(f"hook {hook!r} is not 'module:function'")
        return hook
    module, name = getattr(hook, "__module__", None), getattr(hook, "__qualname__", "")
    if not module or not name or "<" in name or "." in name:
        raise ValueError(f"hook {hook!r} is not a module's top-level function: a run could not name it")
    return f"{module}:{name}"


def resolve(hook: Hook) -> Callable[..., Any]:
    """The function a hook names (imported now), or the callable itself."""
    if not isinstance(hook, str):
        return hook
    module, _, name = hook_name(hook).partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class StoredKind:
    """What a run stores of its kind (params["_kind"]): everything the runner reads of it. The defaults are what a run
    without one gets: it runs alone."""
    phased: bool = False  # its worker marks its timed sections: it may prepare beside others of its group
    # (store, run_ids, requested, serial) -> (slots, order, why[, (needs, budget)]); None: the runner's
    planner: str | None = None
    group_start: tuple[str, ...] = ()  # each called (store, runs in order) when a group starts side by side
    preload: tuple[str, ...] | None = None  # what its lane's fork server imports; None: the default
    prepare_cost: int = 1  # higher prepares longer: a group starts those first
    plural: str = "runs"  # what the plan's line calls a group of them

    def to_json(self) -> dict[str, Any]:
        return {"phased": self.phased, "planner": self.planner, "group_start": list(self.group_start),
                "preload": None if self.preload is None else list(self.preload), "prepare_cost": self.prepare_cost,
                "plural": self.plural}

    @classmethod
    def of(cls, run: dict[str, Any] | None) -> StoredKind:
        """The kind a stored run names (run["params"]["_kind"]); the defaults for a run without one."""
        stored = ((run or {}).get("params") or {}).get("_kind")
        if not isinstance(stored, dict):
            return cls()
        preload = stored.get("preload")
        return cls(phased=bool(stored.get("phased", False)), planner=stored.get("planner") or None,
                   group_start=tuple(stored.get("group_start") or ()),
                   preload=None if preload is None else tuple(preload),
                   prepare_cost=int(stored.get("prepare_cost", 1)), plural=str(stored.get("plural") or "runs"))


@dataclass(frozen=True)
class RunKind:
    """One kind of run (runs.kind), as its feature registers it."""
    name: str
    # The "module:function" the worker calls with (params, progress); None where each run names its own (the IR's
    # extractions and verifications).
    target: str | None
    # Its worker marks its timed sections (engine.runner.device_lock.exclusive), so runs of a group prepare side by
    # side and time alone.
    phased: bool = False
    # How a group of them is planned: (store, run_ids, requested, serial) -> (slots, order, why). None: the runner's
    # planner (engine.runner.plan: cores-bound slots, the slowest to prepare first).
    planner: Hook | None = None
    # What happens when a group of them starts side by side, in order; each hook is called (store, runs in order):
    # measure the device's ceilings first, start the native builds the group needs, …
    group_start: tuple[Hook, ...] = ()
    # (device) -> the modules the fork server of a lane of these runs may import, or None for the default.
    preload: Hook | None = None
    # (mode) -> a rough rank of how long a run of that mode takes to prepare (1: quick); None: all alike.
    prepare_cost: Hook | None = None
    plural: str = "runs"  # what the plan's line calls a group of them ("LLM runs")

    def preload_for(self, device: str) -> tuple[str, ...] | None:
        found = resolve(self.preload)(device) if self.preload is not None else None
        return None if found is None else tuple(found)

    def stored(self, mode: str, device: str) -> StoredKind:
        """What a run of this kind in `mode` on `device` stores of it."""
        cost = int(resolve(self.prepare_cost)(mode)) if self.prepare_cost is not None else 1
        return StoredKind(phased=self.phased, planner=hook_name(self.planner) if self.planner is not None else None,
                          group_start=tuple(hook_name(h) for h in self.group_start), preload=self.preload_for(device),
                          prepare_cost=cost, plural=self.plural)


_KINDS: dict[str, RunKind] = {}


def register(kind: RunKind) -> RunKind:
    """Add a kind (again: the same kind is fine, another one of the same name is an error); returns it."""
    for hook in (*([kind.planner] if kind.planner is not None else []), *kind.group_start):
        hook_name(hook)  # a run must be able to name it
    known = _KINDS.get(kind.name)
    if known is not None:
        if known != kind:
            raise ValueError(f"run kind {kind.name!r} is registered already, differently")
        return known
    _KINDS[kind.name] = kind
    return kind


def get(name: str) -> RunKind | None:
    return _KINDS.get(name)


def all() -> list[RunKind]:
    """Every registered kind, in the order registered."""
    return list(_KINDS.values())


def known() -> str:
    """The registered kinds' names, for a message."""
    return ", ".join(sorted(_KINDS)) or "none"


__all__ = ["MOVED_TARGETS", "Hook", "RunKind", "StoredKind", "all", "current_target", "get", "hook_name", "known",
           "register", "resolve"]
