"""A hand-written C++ operator in the graph: every Linear → ReLU pair becomes F.linear (no bias) + modelab::bias_relu.

The model is traced with torch.fx, and each `Linear` whose only user is a ReLU (nn.ReLU, F.relu, torch.relu or
`.relu()`) is rewritten into a bias-free matmul followed by the fused `torch.ops.modelab.bias_relu(y, bias)` from
csrc/modelab_ops.cpp (CPU kernel always, CUDA kernel when built with CUDA). The rewritten graph reads the original
module's parameters, so the optimizer still updates them, and the op's autograd formula (engine/native/ops.py) gives
eager's gradients. The first prepare in a process builds the op library (about a minute; cached in .build/ after).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from engine.modes.base import Mode, Prepared, cuda_only
from engine.modes.fx import graph_table

_RELU_FUNCTIONS = (F.relu, torch.relu)


def _is_relu(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), nn.ReLU)
    if node.op == "call_function":
        inplace = node.kwargs.get("inplace", False) or (len(node.args) > 1 and node.args[1] is True)
        return node.target in _RELU_FUNCTIONS and not inplace
    if node.op == "call_method":
        return node.target == "relu"
    return False


def _is_linear_with_bias(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op != "call_module":
        return False
    mod = gm.get_submodule(str(node.target))
    return isinstance(mod, nn.Linear) and mod.bias is not None


def rewrite_linear_relu(gm: fx.GraphModule) -> list[str]:
    """Fuse every Linear(+bias) → ReLU pair in place; returns the names of the rewritten Linear modules."""
    rewritten = []
    for node in list(gm.graph.nodes):
        if not _is_linear_with_bias(gm, node) or len(node.users) != 1:
            continue
        relu = next(iter(node.users))
        if not _is_relu(gm, relu) or relu.args[0] is not node:
            continue
        target = str(node.target)
        with gm.graph.inserting_before(relu):
            weight = gm.graph.get_attr(f"{target}.weight")
            bias = gm.graph.get_attr(f"{target}.bias")
            matmul = gm.graph.call_function(F.linear, (node.args[0], weight))
            fused = gm.graph.call_function(torch.ops.modelab.bias_relu.default, (matmul, bias))
        relu.replace_all_uses_with(fused)
        gm.graph.erase_node(relu)
        gm.graph.erase_node(node)
        rewritten.append(target)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return rewritten


def availability(device: str) -> str | None:
    from engine.native.build import custom_ops_missing  # looks for tools; builds nothing

    if device.startswith("cuda"):
        reason = cuda_only(device)
        if reason:
            return reason
    return custom_ops_missing(device)


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    from engine.native import ops

    device = example_inputs[0].device if example_inputs else torch.device("cpu")
    ops.load(with_cuda=True if device.type == "cuda" else None)
    gm = fx.symbolic_trace(model)  # shares the original's parameters, so training updates them
    fused = rewrite_linear_relu(gm)
    if fused:
        note = (f"custom_op: {len(fused)} Linear → ReLU pair(s) ({', '.join(fused)}) run as F.linear (no bias) + "
                "modelab::bias_relu (C++ op from csrc/modelab_ops.cpp)")
    else:
        note = "custom_op: no Linear → ReLU pair found; the graph runs unchanged (plain torch.fx)"
    return Prepared(fn=gm, artifacts={"custom_op_graph.py": gm.code, "custom_op_graph_table.txt": graph_table(gm)},
                    notes=[note])


MODE = Mode(
    name="custom_op",
    description="torch.fx rewrite: each Linear → ReLU runs as F.linear + a fused C++ bias+ReLU op (TORCH_LIBRARY).",
    prepare=prepare, availability=availability)
