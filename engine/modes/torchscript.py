"""TorchScript (torch.jit.script): the TorchScript interpreter with its profiling executor and fusers."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from engine.modes.base import Mode, Prepared


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    # torch.jit is deprecated in recent releases and warns on every script() call; keep one copy of each message as a
    # note.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scripted = torch.jit.script(model)
    notes = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return Prepared(fn=scripted, artifacts={"torchscript_graph.txt": str(scripted.graph),
                                         "torchscript_code.py": scripted.code}, notes=notes)


MODE = Mode(name="torchscript", description="torch.jit.script → TorchScript IR run by the JIT interpreter.",
            prepare=prepare)
