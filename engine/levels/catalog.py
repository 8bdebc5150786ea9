"""The registry of kernel-levels components and levels: COMPONENTS, LEVELS, get_component, get_level, resolve_levels
(engine.levels names them too)."""

from __future__ import annotations

from engine.levels.base import Built, Level
from engine.levels.builders import LEVEL_LIST
from engine.workloads import causal_attention, gnn_message_passing, vit_patch_attention
from engine.workloads.component import Component

COMPONENTS: dict[str, Component] = {c.name: c for c in (causal_attention.COMPONENT, vit_patch_attention.COMPONENT,
                                                        gnn_message_passing.COMPONENT)}
LEVELS: dict[str, Level] = {level.key: level for level in LEVEL_LIST}
REFERENCE_LEVEL = "L1-naive"


def get_component(name: str, path: str | None = None) -> Component:
    """A built-in component by name, or a user's `pkg.mod:spec` imported from the folder `path`
    (engine.levels.yours.load_component; a ValueError with one line when it cannot be used)."""
    if name in COMPONENTS:
        return COMPONENTS[name]
    from engine.levels.yours import is_component_path, load_component

    if is_component_path(name):
        return load_component(name, path)
    raise ValueError(f"unknown component {name!r}; known: {', '.join(COMPONENTS)} (or your own, module.path:spec)")


def get_level(key: str) -> Level:
    try:
        return LEVELS[key]
    except KeyError:
        raise ValueError(f"unknown level {key!r}; known: {', '.join(LEVELS)}") from None


def resolve_levels(spec: str, device: str) -> tuple[list[Level], dict[str, str]]:
    """'all' or a comma list (keys like L4-triton, or bare numbers like 4) → (levels to run, {skipped: reason})."""
    if spec.strip() == "all":
        chosen = list(LEVELS.values())
    else:
        chosen = []
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            matches = [lv for lv in LEVELS.values() if part in (lv.key, str(lv.number), f"L{lv.number}")]
            if not matches:
                raise ValueError(f"unknown level {part!r}; known: {', '.join(LEVELS)} (or 1–5)")
            chosen += [m for m in matches if m not in chosen]
    if not chosen:
        raise ValueError("no level given; use 'all' or a comma list such as L1-naive,L4-triton")
    runnable, skipped = [], {}
    for level in chosen:
        ok, reason = level.available(device)
        if ok:
            runnable.append(level)
        else:
            skipped[level.key] = reason
    return runnable, skipped


__all__ = ["COMPONENTS", "LEVELS", "REFERENCE_LEVEL", "Built", "Level", "get_component", "get_level",
           "resolve_levels"]
