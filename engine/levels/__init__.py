"""Kernel Levels: one component written five ways, L1 naive PyTorch to L5 CUDA, checked, timed and compared.

catalog is the registry of components and levels, named here too (COMPONENTS, LEVELS, get_component, get_level,
resolve_levels; loaded on first use, so that importing the package imports no torch: kind, the `levels` run kind,
is imported at the CLI's start); base (what a level is), builders (the levels), run (one levels run: check, time,
record), guards and yours (your own kernel or component, and the guards it passes), deep (Nsight Compute per level),
results (the tables a run stores and shows)."""

from __future__ import annotations

from typing import Any

__all__ = ["COMPONENTS", "LEVELS", "REFERENCE_LEVEL", "Built", "Level", "get_component", "get_level",
           "resolve_levels"]


def __getattr__(name: str) -> Any:
    """The catalogue's names, imported on first use (PEP 562)."""
    if name in __all__:
        from engine.levels import catalog

        return getattr(catalog, name)
    raise AttributeError(f"module 'engine.levels' has no attribute {name!r}")
