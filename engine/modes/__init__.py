"""The registry of execution modes. Adding a mode: write a module with a `Mode`, then `register` it here."""

from __future__ import annotations

from engine.modes import aoti as _aoti
from engine.modes import compile as _compile
from engine.modes import cuda_graph as _cuda_graph
from engine.modes import cuda_mlp as _cuda_mlp
from engine.modes import custom_op as _custom_op
from engine.modes import eager as _eager
from engine.modes import fx as _fx
from engine.modes import torchscript as _torchscript
from engine.modes import triton_mlp as _triton_mlp
from engine.modes.base import Mode, Prepared

MODES: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    if mode.name in MODES:
        raise ValueError(f"mode {mode.name!r} is already registered")
    MODES[mode.name] = mode
    return mode


for _mode in (_eager.MODE, _fx.MODE, _torchscript.MODE, _compile.MODE, _compile.REDUCE_OVERHEAD,
              _compile.MAX_AUTOTUNE, _custom_op.MODE, _aoti.MODE, _cuda_graph.MODE, _triton_mlp.MODE, _cuda_mlp.MODE):
    register(_mode)


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; known modes: {', '.join(MODES)}") from None


def resolve_modes(spec: str, device: str) -> tuple[list[Mode], dict[str, str]]:
    """'all' or a comma list → (modes to run, {skipped mode: reason}); a mode named twice runs once, at its first
    place. Unknown names raise ValueError."""
    names = list(MODES) if spec.strip() == "all" else list(dict.fromkeys(n.strip() for n in spec.split(",")
                                                                         if n.strip()))
    if not names:
        raise ValueError("no mode given; use 'all' or a comma-separated list such as eager,fx")
    chosen, skipped = [], {}
    for name in names:
        mode = get_mode(name)
        ok, reason = mode.available(device)
        if ok:
            chosen.append(mode)
        else:
            skipped[name] = reason
    return chosen, skipped


__all__ = ["MODES", "Mode", "Prepared", "get_mode", "register", "resolve_modes"]
