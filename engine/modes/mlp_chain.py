"""What the hand-written kernel modes (triton, cuda) accept: a plain chain Linear → ReLU → … → Linear(out=1).

They run their own kernels instead of the module's forward, so they must know the exact computation. torch.fx reads
it off the forward (module registration order could lie): a straight line of nn.Linear (with bias) modules, a ReLU
after every one but the last, and a single output feature (the regression head the MSE kernels assume). Anything else
is refused with a one-line reason instead of being computed wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

_RELUS = (F.relu, torch.relu)


@dataclass(frozen=True)
class MlpChain:
    linears: tuple[nn.Linear, ...]  # in forward order; every one but the last is followed by a ReLU

    @property
    def widths(self) -> tuple[int, ...]:
        """(in_features, hidden…, 1)."""
        return (self.linears[0].in_features, *(lin.out_features for lin in self.linears))


def _is_relu(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), nn.ReLU)
    if node.op == "call_function":
        return node.target in _RELUS
    return node.op == "call_method" and node.target == "relu"


def mlp_chain(model: nn.Module, mode: str) -> MlpChain:
    """The model's Linear layers if it is a Linear→ReLU chain ending in Linear(out=1); else ValueError saying why."""
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - any trace failure means: not a plain chain
        raise ValueError(f"mode {mode} runs hand-written MLP kernels; {type(model).__name__} could not be traced "
                         f"to check it is a Linear→ReLU chain: {exc}") from exc
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    why = f"mode {mode} runs hand-written kernels for a Linear→ReLU→…→Linear(out=1) chain"
    if len(inputs) != 1:
        raise ValueError(f"{why}; {type(model).__name__} takes {len(inputs)} inputs")
    linears: list[nn.Linear] = []
    prev: fx.Node = inputs[0]
    for i, node in enumerate(nodes):
        if len(node.args) < 1 or node.args[0] is not prev or len(node.users) > 1:
            raise ValueError(f"{why}; {type(model).__name__}'s forward is not a straight chain (at {node.name})")
        expect_linear = i % 2 == 0
        if expect_linear:
            mod = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
            if not isinstance(mod, nn.Linear) or mod.bias is None:
                raise ValueError(f"{why}; found {node.name} ({node.op} {node.target}) where a Linear with bias belongs")
            linears.append(mod)
        elif not _is_relu(gm, node):
            raise ValueError(f"{why}; found {node.name} ({node.op} {node.target}) where a ReLU belongs")
        prev = node
    if len(nodes) % 2 == 0 or not linears:
        raise ValueError(f"{why}; the chain must end with a Linear")
    chain = MlpChain(tuple(linears))
    if chain.widths[-1] != 1:
        raise ValueError(f"{why}; the last Linear has {chain.widths[-1]} outputs")
    for a, b in zip(linears, linears[1:]):
        if a.out_features != b.in_features:
            raise ValueError(f"{why}; layer widths do not chain ({a.out_features} → {b.in_features})")
    for lin in linears:
        for p in (lin.weight, lin.bias):
            if p.dtype != torch.float32:
                raise ValueError(f"{why} in float32; a parameter is {p.dtype}")
    return chain
