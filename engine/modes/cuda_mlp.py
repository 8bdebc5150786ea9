"""Hand-written CUDA (csrc/mlp_step.cu): the whole training step in ONE persistent cooperative kernel, the forward in
one ordinary kernel — one launch per call, the fewest the math allows without a graph.

The training kernel runs forward, MSE, backward and Adam over a 64-block cooperative grid with two grid-wide barriers
(after the output partial sums, after the layer-2 gradient), updating the model's own parameter tensors in place, with
Adam's moments and step counter in the extension object (the counter on the device). The forward splits rows and
units over blocks and lets the last block of each row group add the shares (no grid barrier). Built with
torch.utils.cpp_extension on first use (about a minute) and cached (engine/native/mlp_step.py). Shapes: the house-price
MLP — F ≤ 32 inputs → 256 → ReLU → 256 → ReLU → 1, float32 (F = 5 has specialised kernels, other F a generic path).
Sums run in another order than cuBLAS's: results match eager to ~1e-7, well inside the workload's 1e-4.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.modes.base import TRAIN_LR, Mode, Prepared, owned_step_only
from engine.modes.mlp_chain import mlp_chain

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
EPS = 1e-8


def availability(device: str) -> str | None:
    from engine.native.mlp_step import missing  # looks for tools; builds nothing

    return missing(device)


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    from engine.native import mlp_step

    if not example_inputs or example_inputs[0].device.type != "cuda":
        raise ValueError("mode cuda needs CUDA inputs")
    linears = mlp_chain(model, "cuda").linears
    ext = mlp_step.load()
    widths = (linears[0].in_features, *(lin.out_features for lin in linears))
    if len(linears) != 3 or widths[1:] != (ext.HIDDEN, ext.HIDDEN, 1) or not 1 <= widths[0] <= ext.MAX_FEATURES:
        raise ValueError(f"mode cuda's kernels are written for F → {ext.HIDDEN} → {ext.HIDDEN} → 1 with "
                         f"1 ≤ F ≤ {ext.MAX_FEATURES}; this model is {' → '.join(map(str, widths))}")
    params = [t.detach() for lin in linears for t in (lin.weight, lin.bias)]  # views: updates land in the model
    step = ext.MlpStep(params, TRAIN_LR, BETAS[0], BETAS[1], EPS)
    if train:
        def train_step(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
            return step.train_step(inputs[0], target)

        train_step.runner = step  # type: ignore[attr-defined]
        return Prepared(fn=owned_step_only("cuda"), train_step=train_step,
                        notes=[f"cuda: forward, MSE, backward and Adam in one cooperative launch of {ext.BLOCKS} "
                               "blocks per step (csrc/mlp_step.cu)"])
    return Prepared(fn=step.forward, notes=["cuda: the forward in one launch per call (csrc/mlp_step.cu)"])


MODE = Mode(
    name="cuda",
    description="Hand-written CUDA: the whole training step (forward, MSE, backward, Adam) in one persistent "
                "cooperative kernel.",
    prepare=prepare, availability=availability)
