"""The one interface every execution mode implements.

A mode takes an eager `nn.Module` and returns something to call in its place, for training (gradients flow back into
the original module's parameters, so one optimizer serves every mode) or for inference. Modes say whether they can run
on a device and, if not, why, so the dashboard can grey a card out with the reason instead of failing later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Prepared:
    fn: Callable[..., torch.Tensor]
    # Text artifacts worth keeping with the run (e.g. the FX graph's code), name -> content.
    artifacts: dict[str, str] = field(default_factory=dict)
    # Things the user should see once (e.g. a deprecation warning), not on every call.
    notes: list[str] = field(default_factory=list)
    # Called before every step; reduce-overhead uses it to tell CUDA graph trees a new iteration starts.
    before_step: Callable[[], None] | None = None
    # Binary files worth keeping with the run (e.g. the AOTInductor .pt2), name -> path of a file the mode wrote.
    files: dict[str, str] = field(default_factory=dict)
    # Called by bench after the timed loop as extra_metrics(warmup=, iters=, rtol=, atol=): more metrics for this
    # (phase, batch size), e.g. the aoti mode's native-runner latency. Returns engine.store.Metric objects; bench
    # sets their phase and batch size. May raise (a wrong result fails the run like any other mismatch).
    extra_metrics: Callable[..., list] | None = None


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    prepare: Callable[[nn.Module, tuple[torch.Tensor, ...], bool], Prepared]
    availability: Callable[[str], str | None] = lambda device: None  # None: available; else the reason it is not
    compiles: bool = False  # counts recompiles and graph breaks through dynamo
    phases: tuple[str, ...] = ("infer", "train")  # what the mode supports; bench skips the others with a note

    def skip_note(self, phase: str) -> str:
        """What a run records when asked for a phase this mode does not support."""
        return f"{self.name} runs only the {', '.join(self.phases)} phase(s): {phase} skipped"

    def available(self, device: str) -> tuple[bool, str]:
        reason = self.availability(device)
        return (reason is None, reason or "")


def cuda_only(device: str) -> str | None:
    if not device.startswith("cuda"):
        return "needs a CUDA device"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch on this machine"
    return None
