"""torch.fx symbolic tracing: the model as a Python-level graph, re-emitted as straight-line code."""

from __future__ import annotations

import torch
from torch import fx, nn

from engine.modes.base import Mode, Prepared


def graph_table(gm: fx.GraphModule) -> str:
    """The graph as a plain-text table (print_tabular needs the optional `tabulate` package and only prints)."""
    rows = [("opcode", "name", "target", "args", "kwargs")]
    for node in gm.graph.nodes:
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        rows.append((node.op, node.name, str(target), str(node.args), str(node.kwargs)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def prepare(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], train: bool) -> Prepared:
    gm = fx.symbolic_trace(model)  # shares the original's parameters, so training updates them
    return Prepared(fn=gm, artifacts={"fx_graph.py": gm.code, "fx_graph_table.txt": graph_table(gm)})


MODE = Mode(name="fx", description="torch.fx symbolic_trace → GraphModule (Python codegen of the traced graph).",
            prepare=prepare)
