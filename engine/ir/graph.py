"""The IR's data structures: tensors, op nodes and the graph, as plain dataclasses.

    IR ── graph_inputs: [TensorMeta]          user inputs, in call order
       ── weights: {placeholder: TensorMeta}  parameters and buffers (weight_name_mapping → state_dict key)
       ── constants: {placeholder: TensorMeta} tensors lifted by torch.export (values in constant_data when real)
       ── nodes: [OpNode]                     in a topological order; each consumes tensors by name
       ── graph_outputs: [tensor name]
       ── subgraphs: {key: Subgraph}          bodies of control-flow ops (cond branches, while_loop, map), schema 2
       ── mutations: [Mutation]               parameters, buffers, constants or inputs forward writes to, schema 2

An OpNode calls one operator: `op_type` is an ATen OpOverload name ("aten.linear.default"); tensor arguments are in
`inputs` (flat, by tensor name) and `input_args` says which schema argument each belongs to; every other schema
argument is in `attrs`. Multi-output ops (split, native_batch_norm…) name each of their outputs, so the graph has no
getitem nodes.

Higher-order ops that only scope state (grad mode, autocast, activation checkpointing) are inlined: their ops are
ordinary nodes whose `scope` records the state (e.g. {"autocast": {"device_type": "cpu", "dtype": "bfloat16", …}}).
Control flow is kept: a `higher_order.cond` / `higher_order.while_loop` / `higher_order.map_impl` node names its bodies
in `attrs` (keys of `IR.subgraphs`); a subgraph reads only its own inputs (torch.export passes every weight a body uses
as an operand) and its tensors are named `<key>/<name>`, so every tensor name in the IR is unique.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Tensor argument of an op: the index into OpNode.inputs, a list of them (Tensor[] / Tensor?[]), or None.
InputRef = int | None | list[int | None]


@dataclass
class TensorMeta:
    name: str
    shape: list[int]
    dtype: str  # torch dtype without the "torch." prefix: "float32", "int64", "bool"…
    producer_node: str | None = None  # None for graph inputs, weights and constants
    producer_output_idx: int | None = None  # which element of the producer's result (0 for single-output ops)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def shape_str(self) -> str:
        return f"{short_dtype(self.dtype)}[{', '.join(map(str, self.shape))}]"


@dataclass
class OpNode:
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[TensorMeta]
    attrs: dict[str, Any] = field(default_factory=dict)
    input_args: dict[str, InputRef] = field(default_factory=dict)
    module_path: str = ""  # innermost nn.Module (state_dict-style path) whose forward called this op; "" for the root
    # State an inlined higher-order op set around this op: {"autocast": {...}} and/or {"grad_enabled": bool}.
    # Output dtypes inside an autocast scope are as traced (before autocast's casts); the executor re-applies it.
    scope: dict[str, Any] = field(default_factory=dict)


@dataclass
class Subgraph:
    """The body of a control-flow node: its own inputs, nodes (topological) and outputs."""
    inputs: list[TensorMeta]
    nodes: list[OpNode]
    outputs: list[str]


@dataclass
class Mutation:
    """forward writes into state: a parameter, buffer, lifted constant or user input (`target`, a placeholder name).

    `node` wrote it in place (e.g. `aten.add_` on a step-counter buffer, a training-mode batch_norm on its running
    statistics); or, when torch.export returned the new value as an output instead, `value` names that tensor.
    """
    target: str
    node: str
    kind: str  # "parameter", "buffer", "constant" or "input"
    value: str | None = None


@dataclass
class IR:
    nodes: list[OpNode]
    graph_inputs: list[TensorMeta]
    graph_outputs: list[str]
    weights: dict[str, TensorMeta]
    weight_name_mapping: dict[str, str]
    constants: dict[str, TensorMeta] = field(default_factory=dict)
    model_name: str = "model"
    constant_data: dict[str, Any] = field(default_factory=dict)  # placeholder -> nested list (small real constants)
    # placeholder -> "parameter", "buffer" or "buffer (non-persistent)"
    weight_kinds: dict[str, str] = field(default_factory=dict)
    module_types: dict[str, str] = field(default_factory=dict)  # module path -> class name, for every called module
    torch_version: str = ""
    subgraphs: dict[str, Subgraph] = field(default_factory=dict)
    mutations: list[Mutation] = field(default_factory=list)

    # -- lookups ---------------------------------------------------------------------------------------------------
    def tensors(self) -> dict[str, TensorMeta]:
        """Every tensor of the graph by name: inputs, weights, constants and node outputs."""
        out: dict[str, TensorMeta] = {t.name: t for t in self.graph_inputs}
        out.update(self.weights)
        out.update(self.constants)
        for sub in self.subgraphs.values():
            out.update({t.name: t for t in sub.inputs})
        for node in self.all_nodes():
            for t in node.outputs:
                out[t.name] = t
        return out

    def all_nodes(self) -> list[OpNode]:
        """Every node: the graph's, then each subgraph's (control-flow bodies)."""
        return self.nodes + [n for sub in self.subgraphs.values() for n in sub.nodes]

    def node(self, name: str) -> OpNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the IR of {self.model_name}")

    def op_histogram(self) -> Counter[str]:
        """Op type -> count over every node, subgraphs included."""
        return Counter(n.op_type for n in self.all_nodes())

    def module_stack(self, node: OpNode) -> list[str]:
        """The called modules enclosing a node, outermost first (the root excluded)."""
        if not node.module_path:
            return []
        parts = node.module_path.split(".")
        prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return [p for p in prefixes if p in self.module_types] or [node.module_path]

    def parameter_count(self) -> int:
        kinds = self.weight_kinds
        return sum(t.numel for name, t in self.weights.items() if kinds.get(name, "parameter") == "parameter")

    def summary(self) -> str:
        nested = sum(len(s.nodes) for s in self.subgraphs.values())
        extra = f" (+{nested} in {len(self.subgraphs)} subgraph(s))" if self.subgraphs else ""
        state = f", writes {len({m.target for m in self.mutations})} state tensor(s)" if self.mutations else ""
        return (f"{self.model_name}: {len(self.nodes)} nodes{extra}, {len(self.op_histogram())} op types, "
                f"{len(self.graph_inputs)} input(s), {len(self.graph_outputs)} output(s), {len(self.weights)} weights "
                f"({self.parameter_count():,} parameters){state}")


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64", "int32": "i32",
          "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b8", "complex64": "c64"}


def short_dtype(dtype: str) -> str:
    return _SHORT.get(dtype, dtype)
