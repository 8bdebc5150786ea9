"""The whole step in CUDA graphs, by hand: torch.cuda.CUDAGraph around PyTorch's own kernels.

Training: zero_grad → forward → MSE → backward → Adam(capturable=True) captured once per batch size and replayed;
the launches of ~30 small kernels then cost one graph launch instead of one Python round trip each. Inference: the
forward under no_grad, one graph per batch size.

Capture recipe (PyTorch's "whole network capture"): warm up on a side stream first (Adam creates its state lazily,
cuBLAS its workspace, autograd its buffers), then capture with gradients set to None, so the captured backward
writes fresh gradients on every replay — zero_grad is part of the graph. The warm-up steps would train the model, so
the parameters and Adam's state are saved before and restored after: the first replay is the first real step.

Static inputs are buffers owned here; a call copies its tensors into them (skipped when it passes the very tensors
it passed last time, unchanged — see StaticInputs); a new shape (batch size) captures a new graph, with the same
parameters and Adam state. Outputs (loss, prediction) are static buffers the next replay overwrites.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.modes.base import TRAIN_LR, Mode, Prepared, cuda_only, owned_step_only


def availability(device: str) -> str | None:
    reason = cuda_only(device)
    if reason:
        return f"{reason}: CUDA graphs capture and replay GPU kernels"
    return None


class StaticInputs:
    """A graph's input buffers, owned here (clones of the first batch), and what was last copied into them.

    A call copies its tensors in, except a tensor that is the very one copied last time and unchanged since (same
    object, same autograd version counter, which every in-place torch op bumps): feeding the same batch again costs no
    copy kernel. Tensors written behind torch's back (raw kernels) would not bump the counter; pass a new tensor then.
    """

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.buffers = tuple(t.detach().clone(memory_format=torch.contiguous_format) for t in tensors)
        self._last: list[tuple[torch.Tensor, int]] = [(t, _version(t)) for t in tensors]

    def fill(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for i, (static, t) in enumerate(zip(self.buffers, tensors)):
            seen, version = self._last[i]
            if t is seen and version >= 0 and _version(t) == version:
                continue
            static.copy_(t)
            self._last[i] = (t, _version(t))


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors keep no version counter: always copy them
        return -1


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: StaticInputs
    output: torch.Tensor

    def run(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        self.inputs.fill(tensors)
        self.graph.replay()
        return self.output


def _key(*tensors: torch.Tensor) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device, t.stride()) for t in tensors)


class GraphedModel:
    """A model whose inference and training step run as replayed CUDA graphs (one per input shape)."""

    def __init__(self, model: nn.Module, train: bool, loss_fn: Callable = F.mse_loss) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.graphs: dict[tuple, _Captured] = {}
        self.captures = 0
        self.optimizer = torch.optim.Adam(model.parameters(), lr=TRAIN_LR, capturable=True) if train else None

    def _warm_up(self, fn: Callable[[], object], steps: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(steps):
                fn()
        torch.cuda.current_stream().wait_stream(stream)

    def _state(self) -> list[torch.Tensor]:
        """Everything a training step changes: parameters and Adam's moments and step counters."""
        tensors = [p.detach() for p in self.model.parameters()]
        assert self.optimizer is not None
        for state in self.optimizer.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
        return tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = ("infer", *_key(x))
        captured = self.graphs.get(key)
        if captured is None:
            static = StaticInputs((x,))
            (sx,) = static.buffers
            with torch.no_grad():
                self._warm_up(lambda: self.model(sx), 2)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = self.model(sx)
            captured = self.graphs[key] = _Captured(graph, static, out)
            self.captures += 1
        return captured.run((x,))

    def _eager_step(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), target)
        loss.backward()
        self.optimizer.step()
        return loss

    def train_step(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
        (x,) = inputs
        key = ("train", *_key(x, target))
        captured = self.graphs.get(key)
        if captured is None:
            static = StaticInputs((x, target))
            x, target = static.buffers
            fresh = not self.optimizer.state  # Adam's state does not exist before its first step
            saved = [] if fresh else [t.clone() for t in self._state()]
            params = [p.detach().clone() for p in self.model.parameters()]
            self._warm_up(lambda: self._eager_step(x, target), 2)
            with torch.no_grad():
                if fresh:  # the warm-up created it: back to "no step taken yet"
                    for p, v in zip(self.model.parameters(), params):
                        p.copy_(v)
                    for state in self.optimizer.state.values():
                        for v in state.values():
                            if torch.is_tensor(v):
                                v.zero_()
                else:
                    for t, v in zip(self._state(), saved):
                        t.copy_(v)
            self.optimizer.zero_grad(set_to_none=True)  # the captured backward then writes, never accumulates
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = self._eager_step(x, target)
            captured = self.graphs[key] = _Captured(graph, static, loss.detach())
            self.captures += 1
        return captured.run((x, target))


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    if not example_inputs or example_inputs[0].device.type != "cuda":
        raise ValueError("mode cuda-graph needs CUDA inputs")
    if len(example_inputs) != 1:
        raise ValueError(f"mode cuda-graph takes one input tensor, got {len(example_inputs)}")
    graphed = GraphedModel(model, train)
    if train:
        note = ("cuda-graph: zero_grad, forward, MSE, backward and Adam(capturable=True) captured in one CUDA graph "
                "per batch size (after a 2-step warm-up whose effect is undone)")
        return Prepared(fn=owned_step_only("cuda-graph"), train_step=graphed.train_step, notes=[note])
    return Prepared(fn=graphed.forward, notes=["cuda-graph: the forward captured in one CUDA graph per batch size"])


MODE = Mode(
    name="cuda-graph",
    description="Whole step captured by hand in CUDA graphs (forward, MSE, backward, capturable Adam), replayed.",
    prepare=prepare, availability=availability)
