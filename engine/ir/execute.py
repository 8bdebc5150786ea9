"""Run an IR with real tensors.

ATen ops are looked up by name (`aten.linear.default` → torch.ops.aten.linear.default) and called through their
schema: tensor arguments come from `input_args`, everything else from `attrs`, so an op the converter has never seen
needs no code here. Op types that are not OpOverloads get an executor with `register_executor`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from engine.ir.errors import ExecutionError, WeightLoadError
from engine.ir.graph import IR, OpNode

# op_type -> fn(node, input tensors, decoded attrs, device) -> tensor or tuple of tensors
Executor = Callable[[OpNode, list[torch.Tensor], dict[str, Any], torch.device], Any]
_EXECUTORS: dict[str, Executor] = {}


def register_executor(op_type: str) -> Callable[[Executor], Executor]:
    """Decorator: run nodes of `op_type` with this function instead of looking up an ATen op."""

    def deco(fn: Executor) -> Executor:
        _EXECUTORS[op_type] = fn
        return fn

    return deco


@register_executor("getitem")
def _getitem(node: OpNode, inputs: list[torch.Tensor], attrs: dict[str, Any], device: torch.device) -> Any:
    # IRs from this converter fold getitem into the producer's outputs; IRs written by hand or other tools may
    # still select one tensor of a list input with {"op_type": "getitem", "attrs": {"index": i}}.
    return inputs[attrs.get("index", 0)]


def resolve_op(op_type: str) -> torch._ops.OpOverload:
    parts = op_type.split(".")
    if len(parts) != 3:
        raise KeyError(f"{op_type!r} is not 'namespace.op.overload'")
    ns, name, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as exc:
        raise KeyError(f"torch {torch.__version__} has no operator {op_type}") from exc


def decode_attr(value: Any, device: torch.device) -> Any:
    """The inverse of export.encode_attr; a recorded device of meta means the device we run on."""
    if isinstance(value, list):
        return [decode_attr(v, device) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (kind, v), = value.items()
        if kind == "dtype":
            return getattr(torch, v)
        if kind == "device":
            return device if v == "meta" else torch.device(v)
        if kind == "layout":
            return getattr(torch, v)
        if kind == "memory_format":
            return getattr(torch, v)
        if kind == "float":
            return float(v)
        if kind == "complex":
            return complex(*v)
    return value


def _call_args(op: torch._ops.OpOverload, node: OpNode, tensors: list[torch.Tensor],
               device: torch.device) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    for arg in op._schema.arguments:
        if arg.name in node.input_args:
            ref = node.input_args[arg.name]
            value = [None if r is None else tensors[r] for r in ref] if isinstance(ref, list) else (
                None if ref is None else tensors[ref])
        elif arg.name in node.attrs:
            value = decode_attr(node.attrs[arg.name], device)
        else:
            positional = False  # left to its default: later arguments go by name
            continue
        if arg.kwarg_only or not positional:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


def bind_weights(ir: IR, weights: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Placeholder name -> tensor, from a dict keyed by state_dict key (or by placeholder name)."""
    env: dict[str, torch.Tensor] = {}
    for name, meta in {**ir.weights, **ir.constants}.items():
        key = ir.weight_name_mapping.get(name, name)
        tensor = weights.get(key, weights.get(name))
        if tensor is None and name in ir.constant_data:
            tensor = torch.tensor(ir.constant_data[name], dtype=getattr(torch, meta.dtype))
        if tensor is None:
            what = "constant" if name in ir.constants else "weight"
            raise WeightLoadError(f"no tensor for {what} {key!r} (graph placeholder {name!r}); pass it in weights "
                                  "under its state_dict key")
        if list(tensor.shape) != meta.shape:
            raise WeightLoadError(f"weight {key!r} has shape {list(tensor.shape)}, the IR expects {meta.shape}")
        if str(tensor.dtype).removeprefix("torch.") != meta.dtype:
            raise WeightLoadError(f"weight {key!r} has dtype {tensor.dtype}, the IR expects {meta.dtype}")
        if tensor.device.type == "meta":
            raise WeightLoadError(f"weight {key!r} is on the meta device (no data); load real weights")
        env[name] = tensor.to(device)
    return env


@torch.no_grad()
def execute_ir(ir: IR, weights: Mapping[str, torch.Tensor], inputs: Sequence[torch.Tensor], *,
               device: str | torch.device = "cpu", check_shapes: bool = True) -> list[torch.Tensor]:
    """Run the IR on real tensors; returns the graph outputs in order. ExecutionError names a failing node."""
    device = torch.device(device)
    flat = list(torch.utils._pytree.tree_leaves(tuple(inputs)))
    if len(flat) != len(ir.graph_inputs):
        raise ExecutionError(f"{ir.model_name} takes {len(ir.graph_inputs)} input tensor(s) "
                             f"({', '.join(t.name for t in ir.graph_inputs)}), got {len(flat)}")
    env = bind_weights(ir, weights, device)
    for meta, value in zip(ir.graph_inputs, flat):
        if not isinstance(value, torch.Tensor):
            raise ExecutionError(f"input {meta.name!r} must be a tensor, got {type(value).__name__}")
        if list(value.shape) != meta.shape or str(value.dtype).removeprefix("torch.") != meta.dtype:
            raise ExecutionError(f"input {meta.name!r} is {value.dtype} {list(value.shape)}, the IR was extracted "
                                 f"for {meta.dtype} {meta.shape}")
        env[meta.name] = value.to(device)
    for node in ir.nodes:
        try:
            tensors = [env[t] for t in node.inputs]
        except KeyError as exc:
            raise ExecutionError(f"node {node.name!r} ({node.op_type}) reads {exc.args[0]!r} before it is produced",
                                 node.name) from None
        try:
            if node.op_type in _EXECUTORS:
                attrs = {k: decode_attr(v, device) for k, v in node.attrs.items()}
                result = _EXECUTORS[node.op_type](node, tensors, attrs, device)
            else:
                op = resolve_op(node.op_type)
                args, kwargs = _call_args(op, node, tensors, device)
                result = op(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure is reported against its node
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ExecutionError(f"node {node.name!r} ({node.op_type}, module {node.module_path or '<root>'}) "
                                 f"failed: {type(exc).__name__}: {why}", node.name) from exc
        for out in node.outputs:
            value = result if isinstance(result, torch.Tensor) else result[out.producer_output_idx or 0]
            if check_shapes and list(value.shape) != out.shape:
                raise ExecutionError(f"node {node.name!r} ({node.op_type}) produced {out.name!r} with shape "
                                     f"{list(value.shape)}, the IR records {out.shape}", node.name)
            env[out.name] = value
    return [env[name] for name in ir.graph_outputs]
