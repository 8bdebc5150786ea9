"""Run an IR with real tensors.

ATen ops are looked up by name (`aten.linear.default` → torch.ops.aten.linear.default) and called through their
schema: tensor arguments come from `input_args`, everything else from `attrs`, so an op the converter has never seen
needs no code here. Op types that are not OpOverloads get an executor with `register_executor`. Control-flow nodes
(higher_order.cond / while_loop / map_impl) run their subgraphs; ops with an autocast `scope` run under autocast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    """Placeholder name -> tensor, from a dict keyed by state_dict key (or by placeholder name). State the IR writes
    (IR.mutations) is copied, so running the IR never changes the caller's tensors."""
    from engine.ir.export import decode_data

    written = {m.target for m in ir.mutations}
    env: dict[str, torch.Tensor] = {}
    for name, meta in {**ir.weights, **ir.constants}.items():
        key = ir.weight_name_mapping.get(name, name)
        tensor = weights.get(key, weights.get(name))
        if tensor is None and name in ir.constant_data:
            tensor = torch.tensor(decode_data(ir.constant_data[name]), dtype=getattr(torch, meta.dtype))
        if tensor is None:
            if name in ir.constants:
                raise WeightLoadError(
                    f"no value for constant {key!r} (graph placeholder {name!r}): torch.export lifted a tensor that "
                    "forward creates, and its value was not recorded (created from another tensor on the meta device, "
                    f"or more than {_max_constant()} elements). Pass it in weights under {key!r}, or build it from a "
                    "buffer in __init__")
            raise WeightLoadError(f"no tensor for weight {key!r} (graph placeholder {name!r}); pass it in weights "
                                  "under its state_dict key")
        if list(tensor.shape) != meta.shape:
            raise WeightLoadError(f"weight {key!r} has shape {list(tensor.shape)}, the IR expects {meta.shape}")
        if str(tensor.dtype).removeprefix("torch.") != meta.dtype:
            raise WeightLoadError(f"weight {key!r} has dtype {tensor.dtype}, the IR expects {meta.dtype}")
        if tensor.device.type == "meta":
            raise WeightLoadError(f"weight {key!r} is on the meta device (no data); load real weights")
        tensor = tensor.to(device)
        env[name] = tensor.clone() if name in written else tensor
    return env


def _max_constant() -> int:
    from engine.ir.export import MAX_CONSTANT_ELEMENTS

    return MAX_CONSTANT_ELEMENTS


@contextmanager
def _scoped(scope: dict[str, Any]) -> Iterator[None]:
    """Re-apply the state an inlined autocast region set (grad mode does not matter: the executor runs no_grad)."""
    cast = scope.get("autocast")
    if not cast:
        yield
        return
    dtype = getattr(torch, cast["dtype"]) if cast.get("dtype") else None
    with torch.autocast(device_type=cast["device_type"], dtype=dtype, enabled=bool(cast.get("enabled", True)),
                        cache_enabled=cast.get("cache_enabled")):
        yield


def _run_nodes(ir: IR, nodes: Sequence[OpNode], env: dict[str, torch.Tensor], device: torch.device,
               check_shapes: bool) -> None:
    for node in nodes:
        try:
            tensors = [env[t] for t in node.inputs]
        except KeyError as exc:
            raise ExecutionError(f"node {node.name!r} ({node.op_type}) reads {exc.args[0]!r} before it is produced",
                                 node.name) from None
        try:
            with _scoped(node.scope):
                if node.op_type in _CONTROL_FLOW:
                    result = _CONTROL_FLOW[node.op_type](ir, node, tensors, device, check_shapes)
                elif node.op_type in _EXECUTORS:
                    attrs = {k: decode_attr(v, device) for k, v in node.attrs.items()}
                    result = _EXECUTORS[node.op_type](node, tensors, attrs, device)
                else:
                    op = resolve_op(node.op_type)
                    args, kwargs = _call_args(op, node, tensors, device)
                    result = op(*args, **kwargs)
        except ExecutionError:
            raise  # a node inside a subgraph failed: its message already names it
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


def run_subgraph(ir: IR, key: str, inputs: Sequence[torch.Tensor], device: torch.device,
                 check_shapes: bool = True) -> list[torch.Tensor]:
    """Run one control-flow body on real tensors; returns its outputs in order."""
    sub = ir.subgraphs[key]
    if len(inputs) != len(sub.inputs):
        raise ExecutionError(f"subgraph {key!r} takes {len(sub.inputs)} input(s), got {len(inputs)}")
    env = {meta.name: value for meta, value in zip(sub.inputs, inputs)}
    _run_nodes(ir, sub.nodes, env, device, check_shapes)
    return [env[name] for name in sub.outputs]


def _operands(node: OpNode, tensors: list[torch.Tensor], arg: str) -> list[torch.Tensor]:
    refs = node.input_args.get(arg, [])
    return [tensors[r] for r in (refs if isinstance(refs, list) else [refs])]


def _cond(ir: IR, node: OpNode, tensors: list[torch.Tensor], device: torch.device, check: bool) -> list:
    pred = tensors[node.input_args["pred"]]
    branch = node.attrs["true_graph"] if bool(pred) else node.attrs["false_graph"]
    return run_subgraph(ir, branch, _operands(node, tensors, "operands"), device, check)


def _while_loop(ir: IR, node: OpNode, tensors: list[torch.Tensor], device: torch.device, check: bool) -> list:
    carried = _operands(node, tensors, "carried_inputs")
    extra = _operands(node, tensors, "additional_inputs")
    while bool(run_subgraph(ir, node.attrs["cond_graph"], carried + extra, device, check)[0]):
        carried = run_subgraph(ir, node.attrs["body_graph"], carried + extra, device, check)
    return carried


def _map(ir: IR, node: OpNode, tensors: list[torch.Tensor], device: torch.device, check: bool) -> list:
    xs = _operands(node, tensors, "xs")
    rest = _operands(node, tensors, "pos_args")
    steps = [run_subgraph(ir, node.attrs["body_graph"], [x[i] for x in xs] + rest, device, check)
             for i in range(xs[0].shape[0])]
    return [torch.stack([step[j] for step in steps]) for j in range(len(node.outputs))]


# Control-flow op types run their subgraphs: fn(ir, node, input tensors, device, check_shapes) -> outputs.
_CONTROL_FLOW: dict[str, Callable[..., Any]] = {
    "higher_order.cond": _cond, "higher_order.while_loop": _while_loop, "higher_order.map_impl": _map,
}


@torch.no_grad()
def execute_ir(ir: IR, weights: Mapping[str, torch.Tensor], inputs: Sequence[torch.Tensor], *,
               device: str | torch.device = "cpu", check_shapes: bool = True,
               state_out: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Run the IR on real tensors; returns the graph outputs in order. ExecutionError names a failing node.

    State the graph writes (IR.mutations) is written into copies; `state_out`, if given, receives each written
    target's final value keyed by its state_dict key (or input name), so callers can compare it with the model's."""
    device = torch.device(device)
    flat = list(torch.utils._pytree.tree_leaves(tuple(inputs)))
    if len(flat) != len(ir.graph_inputs):
        raise ExecutionError(f"{ir.model_name} takes {len(ir.graph_inputs)} input tensor(s) "
                             f"({', '.join(t.name for t in ir.graph_inputs)}), got {len(flat)}")
    env = bind_weights(ir, weights, device)
    written = {m.target for m in ir.mutations}
    for meta, value in zip(ir.graph_inputs, flat):
        if not isinstance(value, torch.Tensor):
            raise ExecutionError(f"input {meta.name!r} must be a tensor, got {type(value).__name__}")
        if list(value.shape) != meta.shape or str(value.dtype).removeprefix("torch.") != meta.dtype:
            raise ExecutionError(f"input {meta.name!r} is {value.dtype} {list(value.shape)}, the IR was extracted "
                                 f"for {meta.dtype} {meta.shape}")
        value = value.to(device)
        env[meta.name] = value.clone() if meta.name in written else value
    _run_nodes(ir, ir.nodes, env, device, check_shapes)
    for m in ir.mutations:
        if m.value is not None:  # torch.export returned the new value instead of writing in place
            env[m.target].copy_(env[m.value])
    if state_out is not None:
        for target in dict.fromkeys(m.target for m in ir.mutations):
            state_out[ir.weight_name_mapping.get(target, target)] = env[target]
    return [env[name] for name in ir.graph_outputs]
