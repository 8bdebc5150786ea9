"""The registry of workloads (model + inputs + loss). Later issues add kernels and LLM workloads here."""

from __future__ import annotations

from engine.workloads import house_price as _house_price
from engine.workloads.base import Workload

WORKLOADS: dict[str, Workload] = {w.name: w for w in (_house_price.WORKLOAD,)}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        from engine.workloads.user_model import workload_from_env  # a user model a parent worker passed down

        found = workload_from_env(name)
        if found is not None:
            return found
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}") from None


__all__ = ["WORKLOADS", "Workload", "get_workload"]
