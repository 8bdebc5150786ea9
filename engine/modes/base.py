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

# The training step's optimizer, for every mode: torch.optim.Adam with this learning rate and default betas / eps.
TRAIN_LR = 1e-3


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
    # (phase, batch size), e.g. the aoti mode's native-runner latency. Returns engine.store.db.Metric objects; bench
    # sets their phase and batch size. May raise (a wrong result fails the run like any other mismatch).
    extra_metrics: Callable[..., list] | None = None
    # Set by a mode that owns the whole training step (graph-captured or fused kernels): train_step(inputs, target)
    # does zero_grad → forward → MSE (mean) → backward → Adam(lr=TRAIN_LR, default betas and eps) and returns the
    # loss (it may be a static buffer, overwritten by the next step). It updates the model's parameters in place, so a
    # caller compares real weights after a step. bench then builds no optimizer and never calls `fn` for training.
    train_step: Callable[[tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    prepare: Callable[[nn.Module, tuple[torch.Tensor, ...], bool], Prepared]
    availability: Callable[[str], str | None] = lambda device: None  # None: available; else the reason it is not
    compiles: bool = False  # counts recompiles and graph breaks through dynamo
    autotunes: bool = False  # its first call times candidate kernels (beside a preparing group it takes the device)
    phases: tuple[str, ...] = ("infer", "train")  # what the mode supports; bench skips the others with a note

    def skip_note(self, phase: str) -> str:
        """What a run records when asked for a phase this mode does not support."""
        return f"{self.name} runs only the {', '.join(self.phases)} phase(s): {phase} skipped"

    def available(self, device: str) -> tuple[bool, str]:
        reason = self.availability(device)
        return (reason is None, reason or "")


def owned_step_only(mode: str) -> Callable[..., torch.Tensor]:
    """The `fn` of a mode prepared for training that owns the whole step: a clear error, not a silent eager run."""
    def fn(*args: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"mode {mode} owns the whole training step: call Prepared.train_step(inputs, target), "
                           "not fn (it has no autograd forward to put under another optimizer)")

    return fn


def cuda_only(device: str) -> str | None:
    if not device.startswith("cuda"):
        return "needs a CUDA device"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch on this machine"
    return None
