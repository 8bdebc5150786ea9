"""Meta-device export: check that nothing holds real memory, run torch.export, convert its graph to the IR.

The model's parameters, buffers and example inputs must live on the meta device, so a 7B-parameter model is exported
with shapes and dtypes only (no weight memory). torch.export's graph_signature says which placeholders are user
inputs, parameters, buffers and lifted constants; each call_function node's OpOverload `_schema` names its arguments,
which become the node's tensor inputs and attrs.
"""

from __future__ import annotations

import math
import operator
import re
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from engine.ir.errors import ConversionError, ExportError
from engine.ir.graph import IR, OpNode, TensorMeta

# torch.export uses process-wide state (fake modes, the dispatcher's python keys); the dashboard runs each session in
# a thread, so exports in one process take turns.
_EXPORT_LOCK = threading.Lock()
_TENSOR_TYPES = {"Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]"}
MAX_CONSTANT_ELEMENTS = 4096  # real lifted constants up to this size are stored in the JSON


# -- meta checks --------------------------------------------------------------------------------------------------
def _flat_inputs(example_inputs: Any) -> list[tuple[str, Any]]:
    leaves, _ = torch.utils._pytree.tree_flatten_with_path(example_inputs)
    return [(f"example_inputs{torch.utils._pytree.keystr(path)}", leaf) for path, leaf in leaves]


def check_meta(model: nn.Module, example_inputs: tuple) -> None:
    """Raise ExportError naming the first parameter, buffer, tensor attribute or input that is not on meta."""
    fix = ("build the model under `with torch.device('meta'):` (or call model.to('meta')) and create the inputs "
           "with device='meta'")
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.device.type != "meta":
            raise ExportError(f"parameter {name!r} is on {p.device}, not meta: {fix}")
    for name, b in model.named_buffers(remove_duplicate=False):
        if b.device.type != "meta":
            raise ExportError(f"buffer {name!r} is on {b.device}, not meta: {fix}")
    for mod_name, mod in model.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.device.type != "meta":
                where = f"{mod_name}.{attr}" if mod_name else attr
                raise ExportError(f"tensor attribute {where!r} (not a parameter or buffer) is on {value.device}, not "
                                  f"meta: register it as a buffer or create it on meta ({fix})")
    if not isinstance(example_inputs, tuple):
        raise ExportError(f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    for name, leaf in _flat_inputs(example_inputs):
        if not isinstance(leaf, torch.Tensor):
            raise ExportError(f"{name} is a {type(leaf).__name__}, not a tensor: the IR takes tensor inputs only; "
                              "make it a constant of the model (an attribute or buffer)")
        if leaf.device.type != "meta":
            raise ExportError(f"input {name} is on {leaf.device}, not meta: {fix}")


# -- export -------------------------------------------------------------------------------------------------------
def _explain(exc: BaseException) -> str | None:
    """A one-paragraph cause and fix for the export failures that models commonly hit."""
    text = f"{type(exc).__name__}: {exc}"
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:300]
    if "GuardOnDataDependent" in text or "data-dependent" in text or "Could not extract specialized integer" in text:
        return ("data-dependent control flow: forward branches or loops on a tensor's value (e.g. `if x.sum() > 0:`, "
                "`.item()`, `int(t)`), which meta tensors do not have. Fix: make the branch depend on shapes or "
                "module settings only, or express it with torch.cond / torch.where. "
                f"(torch.export said: {first})")
    if "FakeTensorDeviceMismatch" in text or ("found at least two devices" in text and "meta" in text):
        return ("a tensor created inside forward lives on the CPU while the model is on meta — typically "
                "`torch.tensor(...)` or `torch.ones(...)` without a device. Fix: create it with `device=x.device`, or "
                "register it as a buffer in __init__ so that it moves with the model. "
                f"(torch.export said: {first})")
    if "Constraints violated" in text or "specializ" in text.lower() or "dynamic_shapes" in text:
        return ("dynamic shapes: the IR records one static shape per tensor. Fix: extract without dynamic_shapes, once "
                f"per input shape you need (e.g. per batch size or sequence length). (torch.export said: {first})")
    if "meta tensors" in text.lower() and ("item" in text.lower() or "data" in text.lower()):
        return ("forward reads tensor data (`.item()`, `.tolist()`, printing a value), which meta tensors do not "
                f"have. Fix: keep forward free of data reads. (torch.export said: {first})")
    return None


def export_meta(model: nn.Module, example_inputs: tuple, *, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """torch.export of a meta-device model; ExportError with a cause and a fix when it cannot be exported."""
    if dynamic_shapes is not None:
        raise ExportError("dynamic shapes are not supported: the IR records one static shape per tensor. Fix: extract "
                          "without dynamic_shapes, once per input shape you need (e.g. per sequence length)")
    check_meta(model, example_inputs)
    with _EXPORT_LOCK:
        try:
            return torch.export.export(model, example_inputs, strict=False)
        except Exception as exc:  # noqa: BLE001 - every export failure becomes one ExportError with its cause
            why = _explain(exc)
            if why is None:
                why = f"torch.export failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:500]}"
            raise ExportError(why) from exc


# -- conversion ---------------------------------------------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _meta_of(val: Any, name: str, node: str | None, idx: int | None, where: str) -> TensorMeta:
    if not isinstance(val, torch.Tensor):
        raise ConversionError(f"{where}: expected a tensor, found {type(val).__name__}")
    shape = []
    for d in val.shape:
        if not isinstance(d, int):
            raise ConversionError(
                f"{where} has a symbolic shape {list(val.shape)}: dynamic shapes (or an op whose output size depends "
                "on data, like nonzero or boolean masking) cannot be recorded in a static IR. Fix: export with "
                "static shapes and avoid data-dependent output sizes")
        shape.append(int(d))
    return TensorMeta(name=name, shape=shape, dtype=_dtype_name(val.dtype), producer_node=node, producer_output_idx=idx)


def encode_attr(value: Any, where: str) -> Any:
    """A non-tensor argument as JSON: scalars as themselves, torch enums as one-key objects."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if isinstance(value, (list, tuple)):
        return [encode_attr(v, where) for v in value]
    if isinstance(value, torch.fx.Node):
        raise ConversionError(f"{where}: argument comes from node {value.name!r} ({value.target}), which is not a "
                              "tensor — a symbolic size: dynamic shapes cannot be recorded in a static IR")
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise ConversionError(f"{where}: symbolic value {value}: dynamic shapes cannot be recorded in a static IR")
    raise ConversionError(f"{where}: cannot serialise an argument of type {type(value).__name__}: {value!r}")


def _module_info(node: torch.fx.Node) -> tuple[str, list[tuple[str, str]]]:
    stack = node.meta.get("nn_module_stack") or {}
    entries = []
    for path, type_name in stack.values():
        path = _clean_path(path)
        if path:
            entries.append((path, type_name.rsplit(".", 1)[-1] if isinstance(type_name, str) else str(type_name)))
    return (entries[-1][0] if entries else ""), entries


def _clean_path(path: str) -> str:
    # Strict-mode paths look like "L['self'].layers[0]"; non-strict ones like "layers.0".
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    return path.strip(".")


def convert(ep: torch.export.ExportedProgram, model_name: str = "model") -> IR:
    """The ExportedProgram's graph as an IR (ConversionError when it holds what a static IR cannot represent)."""
    from torch.export.graph_signature import InputKind, OutputKind

    graph = ep.graph
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    graph_inputs: list[TensorMeta] = []
    weights: dict[str, TensorMeta] = {}
    constants: dict[str, TensorMeta] = {}
    constant_data: dict[str, Any] = {}
    mapping: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        node = placeholders.get(name)
        val = node.meta.get("val") if node is not None else None
        where = f"placeholder {name!r}"
        if spec.kind == InputKind.USER_INPUT:
            graph_inputs.append(_meta_of(val, name, None, None, where))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            weights[name] = _meta_of(val, name, None, None, where)
            mapping[name] = spec.target
            kinds[name] = ("parameter" if spec.kind == InputKind.PARAMETER
                           else "buffer" if spec.persistent is not False else "buffer (non-persistent)")
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            constants[name] = _meta_of(val, name, None, None, where)
            mapping[name] = spec.target
            real = ep.constants.get(spec.target)
            if (isinstance(real, torch.Tensor) and real.device.type != "meta"
                    and real.numel() <= MAX_CONSTANT_ELEMENTS and not real.is_complex()
                    and bool(torch.isfinite(real.detach().float()).all())):
                constant_data[name] = real.detach().cpu().tolist()
        else:
            raise ConversionError(f"{where} is a {spec.kind.name} input (custom object or effect token), which the "
                                  "IR cannot represent")

    names = {n.name for n in graph.nodes}
    # Where each FX value lives in the IR: node name -> tensor name, or, for multi-output ops, a list of them.
    produced: dict[str, Any] = {t.name: t.name for t in graph_inputs}
    produced.update({n: n for n in weights})
    produced.update({n: n for n in constants})
    module_types: dict[str, str] = {}
    nodes: list[OpNode] = []
    for fx_node in graph.nodes:
        if fx_node.op != "call_function":
            continue
        if fx_node.target is operator.getitem:
            src, idx = fx_node.args
            outs = produced.get(src.name)
            if not isinstance(outs, list) or not isinstance(idx, int) or outs[idx] is None:
                raise ConversionError(f"node {fx_node.name!r}: getitem of {src.name!r}[{idx!r}] is not an output "
                                      "of a multi-output op")
            produced[fx_node.name] = outs[idx]
            continue
        if not isinstance(fx_node.target, torch._ops.OpOverload):
            what = getattr(fx_node.target, "__name__", str(fx_node.target))
            hint = (" (torch.cond / a higher-order op: control flow cannot be flattened into a static op list)"
                    if isinstance(fx_node.target, torch._ops.HigherOrderOperator) else
                    " (python arithmetic on sizes: dynamic shapes)")
            raise ConversionError(f"node {fx_node.name!r} calls {what}, which is not an ATen operator{hint}")
        _check_no_state_mutation(fx_node, mapping, {t.name for t in graph_inputs})
        nodes.append(_convert_node(fx_node, produced, names))
        path, stack = _module_info(fx_node)
        nodes[-1].module_path = path
        for p, t in stack:
            module_types.setdefault(p, t)

    graph_outputs: list[str] = []
    (out_args,) = [n for n in graph.nodes if n.op == "output"][0].args
    out_specs = ep.graph_signature.output_specs
    for spec, arg in zip(out_specs, out_args):
        if spec.kind != OutputKind.USER_OUTPUT:
            raise ConversionError(
                f"the model mutates {spec.target!r} in forward ({spec.kind.name}); a training-mode BatchNorm is the "
                "usual cause. Fix: call model.eval() before extracting, or keep state updates out of forward")
        if not isinstance(arg, torch.fx.Node) or not isinstance(produced.get(arg.name), str):
            raise ConversionError(f"model output {arg!r} is not a tensor; the IR's outputs are tensors only")
        graph_outputs.append(produced[arg.name])

    return IR(nodes=nodes, graph_inputs=graph_inputs, graph_outputs=graph_outputs, weights=weights,
              weight_name_mapping=mapping, constants=constants, model_name=model_name, constant_data=constant_data,
              weight_kinds=kinds, module_types=module_types, torch_version=torch.__version__.split("+")[0])


def _check_no_state_mutation(fx_node: torch.fx.Node, mapping: dict[str, str], user_inputs: set[str]) -> None:
    """ConversionError for an op that writes into a parameter, buffer or user input (training-mode state updates)."""
    op = fx_node.target
    fix = ("a training-mode BatchNorm is the usual cause. Fix: call model.eval() before extracting, or keep state "
           "updates out of forward")
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = fx_node.args[i] if i < len(fx_node.args) else fx_node.kwargs.get(arg.name)
        if isinstance(value, torch.fx.Node) and (value.name in mapping or value.name in user_inputs):
            what = repr(mapping[value.name]) if value.name in mapping else f"its input {value.name!r}"
            raise ConversionError(f"the model mutates {what} in forward (node {fx_node.name!r}, {op}); {fix}")
    if str(op).startswith("aten.batch_norm") and len(fx_node.args) > 5 and fx_node.args[5] is True:
        stats = fx_node.args[3]
        target = mapping.get(stats.name, stats.name) if isinstance(stats, torch.fx.Node) else "running statistics"
        raise ConversionError(f"the model mutates {target!r} in forward (node {fx_node.name!r}, batch_norm in "
                              f"training mode); {fix}")


def _convert_node(fx_node: torch.fx.Node, produced: dict[str, Any], names: set[str]) -> OpNode:
    op = fx_node.target
    op_type = str(op)  # "aten.linear.default"
    where = f"node {fx_node.name!r} ({op_type})"
    inputs: list[str] = []
    input_args: dict[str, Any] = {}
    attrs: dict[str, Any] = {}

    def ref(value: Any) -> int | None:
        if value is None:
            return None
        if not isinstance(value, torch.fx.Node):
            raise ConversionError(f"{where}: expected a tensor argument, found {value!r}")
        name = produced.get(value.name)
        if not isinstance(name, str):
            raise ConversionError(f"{where}: argument {value.name!r} is not a tensor (a symbolic size or a tuple): "
                                  "dynamic shapes cannot be recorded in a static IR")
        inputs.append(name)
        return len(inputs) - 1

    args, kwargs = fx_node.args, fx_node.kwargs
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            raise ConversionError(f"{where}: no value for required argument {arg.name!r}")
        is_ref = isinstance(value, torch.fx.Node) or (
            isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value))
        if str(arg.type) in _TENSOR_TYPES and (is_ref or value is None):
            input_args[arg.name] = [ref(v) for v in value] if isinstance(value, (list, tuple)) else ref(value)
        else:
            attrs[arg.name] = encode_attr(value, f"{where}, argument {arg.name!r}")

    val = fx_node.meta.get("val")
    outputs: list[TensorMeta] = []
    if isinstance(val, (list, tuple)):
        users = {u.args[1]: u.name for u in fx_node.users if u.target is operator.getitem}
        slots: list[str | None] = []
        for idx, v in enumerate(val):
            if not isinstance(v, torch.Tensor):
                slots.append(None)
                continue
            name = users.get(idx) or _fresh(f"{fx_node.name}_out{idx}", names)
            outputs.append(_meta_of(v, name, fx_node.name, idx, f"{where} output {idx}"))
            slots.append(name)
        produced[fx_node.name] = slots
    elif isinstance(val, torch.Tensor):
        outputs.append(_meta_of(val, fx_node.name, fx_node.name, 0, where))
        produced[fx_node.name] = fx_node.name
    elif val is not None:
        raise ConversionError(f"{where} returns {type(val).__name__} ({val}), not a tensor: a symbolic size "
                              "(dynamic shapes) cannot be recorded in a static IR")
    return OpNode(name=fx_node.name, op_type=op_type, inputs=inputs, outputs=outputs, attrs=attrs,
                  input_args=input_args)


def _fresh(name: str, names: set[str]) -> str:
    base, k = name, 1
    while name in names:
        name, k = f"{base}_{k}", k + 1
    names.add(name)
    return name


def extract_ir(model: nn.Module, example_inputs: Sequence[Any], *, model_name: str | None = None,
               dynamic_shapes: Any = None) -> IR:
    """Export a meta-device model and convert it: the public one-call entry point."""
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, list) else example_inputs
    ep = export_meta(model, example_inputs, dynamic_shapes=dynamic_shapes)
    return convert(ep, model_name or type(model).__name__)
