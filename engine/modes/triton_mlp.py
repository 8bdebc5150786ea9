"""Hand-written Triton kernels (engine/kernels/triton/mlp.py) for the house-price MLP, replayed from CUDA graphs.

Training: forward (linear+bias+ReLU per hidden layer), the fused last layer + MSE + its backward, one fused backward
per hidden layer (dW, db and the masked input gradient in one launch), and Adam over every parameter in one launch —
6 launches for 5→256→256→1, captured once per batch size into one CUDA graph and replayed. The model's parameters
become views into one flat buffer (so Adam is one launch) and are updated in place: the weights bench checks are the
model's own. Inference: one graph of the forward launches per batch size.

Each graph reads input buffers of its own (engine.modes.cuda_graph.StaticInputs: a call copies its tensors in, unless
they are the very tensors of the last call, unchanged). Outputs (the loss, the prediction) are static buffers that the
next replay overwrites.

On CPU the same kernels run launch by launch under Triton's interpreter (TRITON_INTERPRET=1; slow, for tests).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.modes.base import TRAIN_LR, Mode, Prepared, cuda_only, owned_step_only
from engine.modes.cuda_graph import StaticInputs
from engine.modes.mlp_chain import mlp_chain

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
EPS = 1e-8
_KERNELS = "engine.kernels.triton.mlp"
_ALIGN = 32  # floats: every parameter's segment in the flat buffer starts 128-byte aligned (vector loads)


def availability(device: str) -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (pip install triton)"
    interpret = os.environ.get("TRITON_INTERPRET", "") == "1"
    loaded = sys.modules.get(_KERNELS)
    if device.startswith("cuda"):
        reason = cuda_only(device)
        if reason:
            return reason
        if torch.cuda.get_device_capability(torch.device(device))[0] < 7:
            return "Triton needs compute capability 7.0 or newer"
        if interpret or (loaded is not None and loaded.interpreted()):
            return ("TRITON_INTERPRET=1 is set: Triton would run the kernels in its CPU interpreter, which a CUDA "
                    "graph cannot capture; unset it for GPU runs")
        return None
    if device != "cpu":
        return f"Triton kernels run on CUDA (or on CPU interpreted), not on {device}"
    if not interpret:
        return ("Triton kernels need a GPU; on CPU they run only in Triton's interpreter: set TRITON_INTERPRET=1 "
                "before starting (slow, for tests)")
    if loaded is not None and not loaded.interpreted():
        return "the Triton kernels were already compiled for the GPU in this process (TRITON_INTERPRET was set late)"
    if "triton.language" in sys.modules:
        import triton.language.standard as standard

        if type(standard.zeros).__name__ != "InterpretedFunction":
            return "triton was imported before TRITON_INTERPRET=1 was set in this process; set it before starting"
    return None


@dataclass
class _Graph:
    graph: object  # torch.cuda.CUDAGraph (None on CPU)
    inputs: StaticInputs  # the graph's own input buffers
    output: torch.Tensor  # static output (loss or prediction)
    workspace: list[torch.Tensor] = field(default_factory=list)


def graph_key(*tensors: torch.Tensor) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


class TritonMlp:
    """Runs a Linear→ReLU chain with the Triton kernels; owns the flat parameter / gradient / Adam buffers."""

    def __init__(self, model: nn.Module, device: torch.device, train: bool) -> None:
        from engine.kernels.triton import mlp as kernels  # imported late: TRITON_INTERPRET decides at import

        self.k = kernels
        self.linears = mlp_chain(model, "triton").linears
        if len(self.linears) < 2:
            raise ValueError("mode triton needs at least one hidden layer (Linear → ReLU → Linear)")
        self.device = device
        self.use_graphs = device.type == "cuda"
        self.graphs: dict[tuple, _Graph] = {}
        self.captures = 0  # graphs captured so far (a new batch size captures a new one)
        self.params = [t for lin in self.linears for t in (lin.weight, lin.bias)]
        for p in self.params:
            if p.device != device:
                raise ValueError(f"mode triton: a parameter is on {p.device}, the inputs on {device}")
        if train:
            self._flatten()

    def _flatten(self) -> None:
        """Move every parameter into one flat buffer (the Parameters stay, their data become views)."""
        sizes = [p.numel() for p in self.params]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += -(-n // _ALIGN) * _ALIGN
        self.flat = torch.zeros(total, device=self.device)
        self.grad = torch.zeros(total, device=self.device)
        self.exp_avg = torch.zeros(total, device=self.device)
        self.exp_avg_sq = torch.zeros(total, device=self.device)
        self.step_count = torch.zeros((), device=self.device)  # float, like Adam(capturable=True)'s
        self.corr = torch.ones(2, device=self.device)  # this step's 1 - β1^t and sqrt(1 - β2^t)
        with torch.no_grad():
            for p, off, n in zip(self.params, offsets, sizes):
                view = self.flat[off:off + n].view_as(p)
                view.copy_(p)
                p.data = view
        self.grads = [self.grad[off:off + n].view_as(p) for p, off, n in zip(self.params, offsets, sizes)]

    def _weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(lin.weight.detach(), lin.bias.detach()) for lin in self.linears]

    # ---- launches (no autograd: the kernels read and write raw buffers)

    def _forward_launches(self, x: torch.Tensor, hidden: list[torch.Tensor], out: torch.Tensor) -> None:
        weights = self._weights()
        a = x
        for (w, b), h in zip(weights[:-1], hidden):
            self.k.linear_fwd(a, w, b, h, relu=True)
            a = h
        w, b = weights[-1]
        self.k.linear_fwd(a, w, b, out, relu=False)

    def _train_launches(self, x: torch.Tensor, target: torch.Tensor, hidden: list[torch.Tensor],
                        dz: list[torch.Tensor], loss: torch.Tensor) -> None:
        weights = self._weights()
        a = x
        for (w, b), h in zip(weights[:-1], hidden):
            self.k.linear_fwd(a, w, b, h, relu=True)
            a = h
        w_last, b_last = weights[-1]
        self.k.mse_head(hidden[-1], w_last, b_last, target, loss, dz[-1], self.grads[-2], self.grads[-1],
                        self.step_count, self.corr, BETAS)
        for i in range(len(hidden) - 1, -1, -1):  # hidden layer i: input is hidden[i-1] (or x), output hidden[i]
            w, _ = weights[i]
            layer_in = hidden[i - 1] if i > 0 else x
            self.k.linear_bwd(dz[i], layer_in, w, self.grads[2 * i], self.grads[2 * i + 1],
                              dz[i - 1] if i > 0 else None)
        self.k.adam(self.flat, self.grad, self.exp_avg, self.exp_avg_sq, self.corr, TRAIN_LR, BETAS, EPS)

    # ---- graphs

    def _capture(self, key: tuple, inputs: StaticInputs, output: torch.Tensor,
                 workspace: list[torch.Tensor], launches, state: list[torch.Tensor]) -> _Graph:
        """Warm up (compiles the kernels) with `state` saved and restored, then capture `launches` into a graph."""
        if not self.use_graphs:
            entry = _Graph(None, inputs, output, workspace)
        else:
            saved = [s.clone() for s in state]
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                launches()  # JIT-compiles every kernel outside the capture
            torch.cuda.current_stream(self.device).wait_stream(stream)
            for s, v in zip(state, saved):  # the warm-up must not count as a training step
                s.copy_(v)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                launches()
            entry = _Graph(graph, inputs, output, workspace)
            self.captures += 1
        self.graphs[key] = entry
        return entry

    def _buffers(self, batch: int) -> list[torch.Tensor]:
        return [torch.empty(batch, lin.out_features, device=self.device) for lin in self.linears[:-1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = ("infer", *graph_key(x))
        entry = self.graphs.get(key)
        if entry is None:
            static = StaticInputs((x,))
            (sx,) = static.buffers
            hidden = self._buffers(x.shape[0])
            out = torch.empty(x.shape[0], 1, device=self.device)
            entry = self._capture(key, static, out, hidden, lambda: self._forward_launches(sx, hidden, out), [])
        else:
            entry.inputs.fill((x,))
        if entry.graph is None:
            self._forward_launches(entry.inputs.buffers[0], entry.workspace, entry.output)
        else:
            entry.graph.replay()
        return entry.output

    def train_step(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
        (x,) = inputs
        key = ("train", *graph_key(x, target))
        entry = self.graphs.get(key)
        if entry is None:
            if target.numel() != x.shape[0]:
                raise ValueError(f"mode triton: target has {target.numel()} elements for a batch of {x.shape[0]}")
            static = StaticInputs((x, target))
            sx, st = static.buffers  # clones are contiguous
            hidden = self._buffers(x.shape[0])
            dz = self._buffers(x.shape[0])
            loss = torch.empty((), device=self.device)
            state = [self.flat, self.exp_avg, self.exp_avg_sq, self.step_count, self.corr]
            entry = self._capture(key, static, loss, hidden + dz,
                                  lambda: self._train_launches(sx, st, hidden, dz, loss), state)
        else:
            entry.inputs.fill((x, target))
        if entry.graph is None:
            n = len(self.linears) - 1
            sx, st = entry.inputs.buffers
            self._train_launches(sx, st, entry.workspace[:n], entry.workspace[n:], entry.output)
        else:
            entry.graph.replay()
        return entry.output


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    device = example_inputs[0].device
    with torch.no_grad():  # moving the parameters into the flat buffer is no autograd operation
        runner = TritonMlp(model, device, train)
    where = "replayed from one CUDA graph per batch size" if runner.use_graphs else "run by Triton's interpreter"
    if train:
        note = (f"triton: {2 * len(runner.linears)} launches per training step (forward, fused last layer + MSE + "
                f"backward, fused backward per hidden layer, one Adam over a flat parameter buffer), {where}")
        # The kernels take raw pointers (weights as detached views), so autograd never sees a launch.
        return Prepared(fn=owned_step_only("triton"), train_step=runner.train_step, notes=[note])
    note = f"triton: {len(runner.linears)} fused linear(+bias+ReLU) launches per forward, {where}"
    return Prepared(fn=runner.forward, notes=[note])


MODE = Mode(
    name="triton",
    description="Hand-written Triton kernels: fused linear+bias+ReLU, fused MSE head and backward, one-launch Adam; "
                "replayed from a CUDA graph.",
    prepare=prepare, availability=availability)
