"""Workloads: what a run measures. The registry here holds the bench workloads (model + inputs + loss: the
house-price MLP, house_price and its dataset housing_data); beside it, the Llama-style decoder (llama), the Kernel
Levels' components (component, causal_attention, vit_patch_attention, gnn_message_passing) and the IR explorer's
model zoo (zoo).

Your own model (engine/workloads/user_model.py) joins the registry of the process that runs it: register_user_model,
or get_workload in a child process, which rebuilds the model its parent worker exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.workloads import house_price as _house_price
from engine.workloads.base import Workload

if TYPE_CHECKING:
    from engine.workloads.user_model import ModelSpec, Prepared

WORKLOADS: dict[str, Workload] = {w.name: w for w in (_house_price.WORKLOAD,)}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        from engine.workloads.user_model import spec_from_env  # a user model a parent worker passed down

        spec = spec_from_env(name)
        if spec is not None:  # probed: the adapter for tuple/dict outputs depends on what forward returns
            return register_user_model(spec).workload
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}") from None


def register_user_model(spec: ModelSpec, *, probe: bool = True) -> Prepared:
    """Build the spec's Workload (engine.workloads.user_model.prepare) and add it to the registry of this process, so
    get_workload(spec.name) finds it."""
    from engine.workloads.user_model import prepare

    prepared = prepare(spec, probe=probe)
    WORKLOADS[prepared.workload.name] = prepared.workload
    return prepared


__all__ = ["WORKLOADS", "Workload", "get_workload", "register_user_model"]
