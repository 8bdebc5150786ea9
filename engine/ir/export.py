"""Meta-device export: check that nothing holds real memory, run torch.export, convert its graph to the IR.

The model's parameters, buffers and example inputs must live on the meta device, so a 7B-parameter model is exported
with shapes and dtypes only (no weight memory). torch.export's graph_signature says which placeholders are user
inputs, parameters, buffers and lifted constants; each call_function node's OpOverload `_schema` names its arguments,
which become the node's tensor inputs and attrs.

Higher-order ops: scope-only ones (grad mode, autocast, checkpoint tags) are inlined with their state in each op's
`scope`; cond, while_loop and map become nodes with subgraphs. In-place writes into parameters, buffers, lifted
constants or inputs (a step counter, a training-mode BatchNorm) are followed through views and recorded as
`IR.mutations` rather than refused.
"""

from __future__ import annotations

import math
import operator
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from engine.ir.errors import ConversionError, ExportError
from engine.ir.graph import IR, Mutation, OpNode, Subgraph, TensorMeta

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
    found = re.search(r"Found <class '([^']+)'> in output", text)
    if found:
        cls = found.group(1)
        hint = (" A transformers model returns its KV cache object: build it with config.use_cache=False."
                if "cache" in cls.lower() else "")
        return (f"forward returns a {cls.rsplit('.', 1)[-1]} object ({cls}), which torch.export cannot flatten into "
                f"tensors.{hint} Fix: return tensors (or tuples, lists, dicts of them). (torch.export said: {first})")
    if "meta tensors" in text.lower() and ("item" in text.lower() or "data" in text.lower()):
        return ("forward reads tensor data (`.item()`, `.tolist()`, printing a value), which meta tensors do not "
                f"have. Fix: keep forward free of data reads. (torch.export said: {first})")
    return None


class _ConstantRecorder(TorchFunctionMode):
    """Remembers the Python data behind `torch.tensor(data, device=meta)` calls made while exporting.

    torch.export lifts such tensors into `ep.constants` as meta tensors, whose values are gone; the data given to
    torch.tensor is still known here, keyed by the tensor object (the very object torch.export lifts)."""

    FACTORIES = (torch.tensor, torch.as_tensor, torch.scalar_tensor)

    def __init__(self) -> None:
        super().__init__()
        # id(tensor) -> (the tensor, kept alive so that its id stays unique; its data)
        self.data: dict[int, tuple[torch.Tensor, Any]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.FACTORIES and args and isinstance(out, torch.Tensor) and out.device.type == "meta":
            data = _python_data(args[0])
            if data is not None and out.numel() <= MAX_CONSTANT_ELEMENTS:
                self.data[id(out)] = (out, data)
        return out


def _python_data(value: Any) -> Any:
    """Nested lists of Python numbers from torch.tensor's data argument; None when it holds no plain values."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_python_data(v) for v in value]
        return None if any(i is None for i in items) else items
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars
    return _python_data(tolist()) if callable(tolist) else None


def export_meta(model: nn.Module, example_inputs: tuple, *, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """torch.export of a meta-device model; ExportError with a cause and a fix when it cannot be exported.

    Values of constants created in forward on the meta device (`torch.tensor(v, device=x.device)`) are kept in
    `ep.modelab_constant_data` (constant target -> nested list), so the IR can carry them."""
    if dynamic_shapes is not None:
        raise ExportError("dynamic shapes are not supported: the IR records one static shape per tensor. Fix: extract "
                          "without dynamic_shapes, once per input shape you need (e.g. per sequence length)")
    check_meta(model, example_inputs)
    with _EXPORT_LOCK:
        recorder = _ConstantRecorder()
        try:
            with recorder:
                ep = torch.export.export(model, example_inputs, strict=False)
        except Exception as exc:  # noqa: BLE001 - every export failure becomes one ExportError with its cause
            why = _explain(exc)
            if why is None:
                why = f"torch.export failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:500]}"
            raise ExportError(why) from exc
    found = {target: recorder.data[id(t)][1] for target, t in ep.constants.items() if id(t) in recorder.data}
    try:
        ep.modelab_constant_data = found
    except AttributeError:  # an ExportedProgram that takes no attributes: the IR then lacks these values
        pass
    return ep


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


# Higher-order ops that only set state around their body: inlined, the state kept in each op's `scope`.
# name -> (index of the body GraphModule in args, index of the first operand, scope from args)
_SCOPE_ONLY: dict[str, tuple[int, int, Callable[[tuple], dict[str, Any]]]] = {
    "wrap_with_set_grad_enabled": (1, 2, lambda a: {"grad_enabled": bool(a[0])}),
    "wrap_with_autocast": (4, 5, lambda a: {"autocast": {"device_type": str(a[0]),
                                                         "dtype": None if a[1] is None else _dtype_name(a[1]),
                                                         "enabled": bool(a[2]), "cache_enabled": a[3]}}),
    "tag_activation_checkpoint": (0, 1, lambda a: {"checkpoint": True}),
    "wrap": (0, 1, lambda a: {}),
    "invoke_subgraph": (0, 2, lambda a: {}),
}
# Control flow kept as subgraphs: name -> (subgraph arguments, operand arguments) as (attr/arg name, index).
CONTROL_FLOW = {
    "cond": ((("true_graph", 1), ("false_graph", 2)), (("pred", 0), ("operands", 3))),
    "while_loop": ((("cond_graph", 0), ("body_graph", 1)), (("carried_inputs", 2), ("additional_inputs", 3))),
    "map_impl": ((("body_graph", 0),), (("xs", 1), ("pos_args", 2))),
}
_NOT_MUTATIONS = {"aten.detach_.default"}  # writes autograd metadata only, never values (lifted constants get it)
_HOP_HELP = ("the IR inlines higher-order ops that only scope state (" + ", ".join(sorted(_SCOPE_ONLY)) + ") and keeps "
             + ", ".join(sorted(CONTROL_FLOW)) + " as subgraphs")


@dataclass
class _Ctx:
    """What one conversion shares across the graph, inlined bodies and subgraphs."""
    used: set[str]  # every IR node and tensor name handed out so far
    module_types: dict[str, str]
    subgraphs: dict[str, Subgraph]
    placeholders: dict[str, str]  # top-level placeholder -> kind ("parameter", "buffer", "constant", "input")
    alias_root: dict[str, str] = field(default_factory=dict)  # IR tensor -> placeholder it views (or is)
    mutations: list[Mutation] = field(default_factory=list)
    autocast_out: set[str] = field(default_factory=set)  # tensors computed under an inlined autocast


@dataclass
class _Scope:
    """One graph being converted: the top graph, an inlined body (same IR namespace) or a subgraph."""
    gm: torch.fx.GraphModule
    produced: dict[str, Any]  # fx node name (of this graph) -> IR tensor name, or a list of them (multi-output)
    nodes: list[OpNode]  # where converted nodes go
    prefix: str  # "" for the top graph, "<subgraph key>/" inside a subgraph
    state: dict[str, Any]  # scope of inlined state ops around this graph
    top: bool  # the top graph keeps torch.export's own node names
    rename: dict[str, str] = field(default_factory=dict)

    def ir_name(self, fx_name: str, ctx: _Ctx) -> str:
        if self.top:
            return fx_name
        if fx_name not in self.rename:
            self.rename[fx_name] = _fresh(self.prefix + fx_name, ctx.used)
        return self.rename[fx_name]


@dataclass
class _Signature:
    """The placeholders of an ExportedProgram, sorted by what torch.export's graph_signature says they are."""
    graph_inputs: list[TensorMeta] = field(default_factory=list)
    weights: dict[str, TensorMeta] = field(default_factory=dict)
    constants: dict[str, TensorMeta] = field(default_factory=dict)
    constant_data: dict[str, Any] = field(default_factory=dict)
    mapping: dict[str, str] = field(default_factory=dict)  # placeholder -> the model's parameter/buffer/constant name
    kinds: dict[str, str] = field(default_factory=dict)  # weight placeholder -> parameter, buffer, …
    ph_kind: dict[str, str] = field(default_factory=dict)  # placeholder -> "parameter", "buffer", "constant", "input"


def convert(ep: torch.export.ExportedProgram, model_name: str = "model") -> IR:
    """The ExportedProgram's graph as an IR (ConversionError naming the cause when it holds something a static IR
    cannot represent)."""
    sig = _read_signature(ep)
    ctx, top, out_args = _convert_top_graph(ep, sig)
    graph_outputs = _read_outputs(ep, sig, ctx, top.produced, out_args)
    return IR(nodes=top.nodes, graph_inputs=sig.graph_inputs, graph_outputs=graph_outputs, weights=sig.weights,
              weight_name_mapping=sig.mapping, constants=sig.constants, model_name=model_name,
              constant_data=sig.constant_data, weight_kinds=sig.kinds, module_types=ctx.module_types,
              torch_version=torch.__version__.split("+")[0], subgraphs=ctx.subgraphs, mutations=ctx.mutations)


def _read_signature(ep: torch.export.ExportedProgram) -> _Signature:
    """Each placeholder's meta and kind; ConversionError for inputs the IR cannot hold (custom objects, tokens)."""
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    sig = _Signature()
    recorded = getattr(ep, "modelab_constant_data", {}) or {}
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        node = placeholders.get(name)
        val = node.meta.get("val") if node is not None else None
        where = f"placeholder {name!r}"
        if spec.kind == InputKind.USER_INPUT:
            sig.graph_inputs.append(_meta_of(val, name, None, None, where))
            sig.ph_kind[name] = "input"
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            sig.weights[name] = _meta_of(val, name, None, None, where)
            sig.mapping[name] = spec.target
            sig.kinds[name] = ("parameter" if spec.kind == InputKind.PARAMETER
                               else "buffer" if spec.persistent is not False else "buffer (non-persistent)")
            sig.ph_kind[name] = "parameter" if spec.kind == InputKind.PARAMETER else "buffer"
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            sig.constants[name] = _meta_of(val, name, None, None, where)
            sig.mapping[name] = spec.target
            sig.ph_kind[name] = "constant"
            real = ep.constants.get(spec.target)
            if (isinstance(real, torch.Tensor) and real.device.type != "meta"
                    and real.numel() <= MAX_CONSTANT_ELEMENTS and not real.is_complex()):
                sig.constant_data[name] = encode_data(real.detach().cpu().tolist())
            elif spec.target in recorded:  # created on meta in forward: the value given to torch.tensor
                sig.constant_data[name] = encode_data(recorded[spec.target])
        elif spec.kind == InputKind.CUSTOM_OBJ:
            raise ConversionError(f"{where} is a custom object ({spec.target}, a TorchBind/ScriptObject): the IR holds "
                                  "tensors only. Fix: keep such objects out of the exported forward")
        else:
            raise ConversionError(f"{where} is a {spec.kind.name} input (an effect token: forward calls an op with "
                                  "side effects, such as printing or a custom op with effects), which the IR cannot "
                                  "represent. Fix: keep side-effecting calls out of forward")
    return sig


def _convert_top_graph(ep: torch.export.ExportedProgram, sig: _Signature) -> tuple[_Ctx, _Scope, list[Any]]:
    """Convert the top graph's ops: (what the conversion shared, the top scope, the output node's arguments)."""
    graph = ep.graph
    # get_attr nodes (the bodies of higher-order ops) become no IR node: their names stay free for subgraph keys.
    ctx = _Ctx(used={n.name for n in graph.nodes if n.op != "get_attr"}, module_types={}, subgraphs={},
               placeholders=sig.ph_kind)
    ctx.alias_root.update({n: n for n in sig.ph_kind})
    produced: dict[str, Any] = {t.name: t.name for t in sig.graph_inputs}
    produced.update({n: n for n in sig.weights})
    produced.update({n: n for n in sig.constants})
    top = _Scope(gm=ep.graph_module, produced=produced, nodes=[], prefix="", state={}, top=True)
    return ctx, top, _convert_graph(top, ctx)


def _read_outputs(ep: torch.export.ExportedProgram, sig: _Signature, ctx: _Ctx, produced: dict[str, Any],
                  out_args: list[Any]) -> list[str]:
    """The graph's user outputs (IR tensor names); writes into parameters, buffers or inputs go to ctx.mutations."""
    from torch.export.graph_signature import OutputKind

    by_target = {v: k for k, v in sig.mapping.items()}
    graph_outputs: list[str] = []
    for spec, arg in zip(ep.graph_signature.output_specs, out_args):
        tensor = produced.get(arg.name) if isinstance(arg, torch.fx.Node) else None
        if spec.kind == OutputKind.USER_OUTPUT:
            if not isinstance(tensor, str):
                raise ConversionError(f"model output {arg!r} is not a tensor; the IR's outputs are tensors only")
            graph_outputs.append(tensor)
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION,
                           getattr(OutputKind, "PARAMETER_MUTATION", OutputKind.BUFFER_MUTATION)):
            target = by_target.get(spec.target, spec.target)
            if target not in sig.ph_kind or not isinstance(tensor, str):
                raise ConversionError(f"output {arg!r} writes {spec.target!r} ({spec.kind.name}), which is not a "
                                      "parameter, buffer or input of the graph")
            ctx.mutations.append(Mutation(target=target, node=arg.name, kind=sig.ph_kind[target], value=tensor))
        else:
            raise ConversionError(f"graph output {arg!r} is a {spec.kind.name} output (a training graph with a loss or "
                                  "gradients); the IR records a forward pass only. Fix: export the model's forward")
    return graph_outputs


def _convert_graph(sc: _Scope, ctx: _Ctx) -> list[Any]:
    """Convert the call_function nodes of sc.gm's graph into sc.nodes; returns the output node's arguments."""
    graph = sc.gm.graph
    attrs: dict[str, Any] = {}  # get_attr node name -> the attribute (a GraphModule body)
    for fx_node in graph.nodes:
        if fx_node.op == "get_attr":
            attrs[fx_node.name] = _get_attr(sc.gm, str(fx_node.target))
            continue
        if fx_node.op != "call_function":
            continue
        target = fx_node.target
        if target is operator.getitem:
            src, idx = fx_node.args
            outs = sc.produced.get(src.name)
            if not isinstance(outs, list) or not isinstance(idx, int) or outs[idx] is None:
                raise ConversionError(f"node {fx_node.name!r}: getitem of {src.name!r}[{idx!r}] is not an output "
                                      "of a multi-output op")
            sc.produced[fx_node.name] = outs[idx]
            continue
        if isinstance(target, torch._ops.HigherOrderOperator):
            hop = target.__name__
            if hop in _SCOPE_ONLY:
                _inline(fx_node, hop, sc, ctx, attrs)
            elif hop in CONTROL_FLOW:
                sc.nodes.append(_control_flow(fx_node, hop, sc, ctx, attrs))
            else:
                raise ConversionError(f"node {fx_node.name!r} calls the higher-order op {hop!r}, which the IR cannot "
                                      f"represent ({_HOP_HELP})")
            continue
        if not isinstance(target, torch._ops.OpOverload):
            what = getattr(target, "__name__", str(target))
            raise ConversionError(f"node {fx_node.name!r} calls {what}, which is not an ATen operator (Python "
                                  "arithmetic on sizes: dynamic shapes cannot be recorded in a static IR)")
        node = _convert_node(fx_node, sc.produced, ctx.used, lambda n: sc.ir_name(n, ctx),
                             sc.ir_name(fx_node.name, ctx))
        node.scope = dict(sc.state)
        if "autocast" in node.scope:
            ctx.autocast_out.update(o.name for o in node.outputs)
        if str(target) == "aten._assert_tensor_metadata.default" and set(node.inputs) & ctx.autocast_out:
            # torch.export asserts the dtype it traced, before autocast's casts: a check real runs would fail.
            continue
        path, stack = _module_info(fx_node)
        node.module_path = path
        for p, t in stack:
            ctx.module_types.setdefault(p, t)
        if not sc.prefix:  # state lives in the top namespace; control-flow bodies cannot write it (torch.cond forbids)
            _track_state(fx_node, node, ctx)
        sc.nodes.append(node)
    outputs = [n for n in graph.nodes if n.op == "output"]
    (out_args,) = outputs[0].args
    return list(out_args) if isinstance(out_args, (list, tuple)) else [out_args]


def _get_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _body(fx_node: torch.fx.Node, arg: Any, attrs: dict[str, Any], what: str) -> torch.fx.GraphModule:
    gm = attrs.get(arg.name) if isinstance(arg, torch.fx.Node) else None
    if not isinstance(gm, torch.fx.GraphModule):
        raise ConversionError(f"node {fx_node.name!r} ({what}): its body {arg!r} is not a graph module")
    return gm


def _operand_names(fx_node: torch.fx.Node, values: Any, produced: dict[str, Any]) -> list[str]:
    names = []
    for v in (values if isinstance(values, (list, tuple)) else [values]):
        name = produced.get(v.name) if isinstance(v, torch.fx.Node) else None
        if not isinstance(name, str):
            raise ConversionError(f"node {fx_node.name!r} ({fx_node.target.__name__}) takes {v!r}, which is not a "
                                  "tensor (a Python value or a symbolic size): the IR's subgraphs take tensors only")
        names.append(name)
    return names


def _inline(fx_node: torch.fx.Node, hop: str, sc: _Scope, ctx: _Ctx, attrs: dict[str, Any]) -> None:
    """Splice a scope-only higher-order op's body into the enclosing graph, its state recorded on every op."""
    body_idx, first_operand, scope_of = _SCOPE_ONLY[hop]
    body = _body(fx_node, fx_node.args[body_idx], attrs, hop)
    operands = _operand_names(fx_node, list(fx_node.args[first_operand:]), sc.produced)
    phs = [n for n in body.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(operands):
        raise ConversionError(f"node {fx_node.name!r} ({hop}) passes {len(operands)} operand(s) to a body that takes "
                              f"{len(phs)}")
    inner = _Scope(gm=body, produced={p.name: o for p, o in zip(phs, operands)}, nodes=sc.nodes, prefix=sc.prefix,
                   state={**sc.state, **scope_of(fx_node.args)}, top=False)
    out_args = _convert_graph(inner, ctx)
    results = [inner.produced.get(a.name) if isinstance(a, torch.fx.Node) else None for a in out_args]
    val = fx_node.meta.get("val")
    sc.produced[fx_node.name] = results if isinstance(val, (list, tuple)) or len(results) != 1 else results[0]


def _control_flow(fx_node: torch.fx.Node, hop: str, sc: _Scope, ctx: _Ctx, attrs: dict[str, Any]) -> OpNode:
    """A cond / while_loop / map node whose bodies become IR subgraphs."""
    bodies, operand_args = CONTROL_FLOW[hop]
    name = sc.ir_name(fx_node.name, ctx)
    where = f"node {fx_node.name!r} ({hop})"
    node_attrs: dict[str, Any] = {}
    for attr, idx in bodies:
        gm = _body(fx_node, fx_node.args[idx], attrs, hop)
        key = _fresh(sc.prefix + str(fx_node.args[idx].target), ctx.used)
        node_attrs[attr] = key
        ctx.subgraphs[key] = _subgraph(gm, key, ctx, f"{where} {attr}", sc.state)
    inputs: list[str] = []
    input_args: dict[str, Any] = {}
    for arg_name, idx in operand_args:
        value = fx_node.args[idx] if idx < len(fx_node.args) else ()
        names = _operand_names(fx_node, value, sc.produced)
        refs = list(range(len(inputs), len(inputs) + len(names)))
        inputs += names
        input_args[arg_name] = refs[0] if arg_name == "pred" else refs
    val = fx_node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    users = {u.args[1]: u.name for u in fx_node.users if u.target is operator.getitem}
    outputs, slots = [], []
    for idx, v in enumerate(vals):
        out_name = sc.ir_name(users[idx], ctx) if idx in users else _fresh(f"{name}_out{idx}", ctx.used)
        outputs.append(_meta_of(v, out_name, name, idx, f"{where} output {idx}"))
        slots.append(out_name)
    sc.produced[fx_node.name] = slots if isinstance(val, (list, tuple)) else slots[0]
    path, stack = _module_info(fx_node)
    for p, t in stack:
        ctx.module_types.setdefault(p, t)
    return OpNode(name=name, op_type=f"higher_order.{hop}", inputs=inputs, outputs=outputs, attrs=node_attrs,
                  input_args=input_args, module_path=path, scope=dict(sc.state))


def _subgraph(gm: torch.fx.GraphModule, key: str, ctx: _Ctx, where: str, state: dict[str, Any]) -> Subgraph:
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = []
    for ph in phs:
        inputs.append(_meta_of(ph.meta.get("val"), _fresh(f"{key}/{ph.name}", ctx.used), None, None,
                               f"{where} input {ph.name!r}"))
    sub = _Scope(gm=gm, produced={p.name: t.name for p, t in zip(phs, inputs)}, nodes=[], prefix=f"{key}/",
                 state=dict(state), top=False)
    ctx.subgraphs[key] = Subgraph(inputs=inputs, nodes=[], outputs=[])  # reserve the key before nested bodies
    out_args = _convert_graph(sub, ctx)
    outputs = []
    for a in out_args:
        name = sub.produced.get(a.name) if isinstance(a, torch.fx.Node) else None
        if not isinstance(name, str):
            raise ConversionError(f"{where}: returns {a!r}, which is not a tensor of the body")
        outputs.append(name)
    return Subgraph(inputs=inputs, nodes=sub.nodes, outputs=outputs)


def _track_state(fx_node: torch.fx.Node, node: OpNode, ctx: _Ctx) -> None:
    """Follow views of parameters, buffers, constants and inputs; record every op that writes into one."""
    op = fx_node.target
    schema = op._schema
    arg_tensor: dict[str, str | None] = {}
    for a in schema.arguments:
        ref = node.input_args.get(a.name)
        arg_tensor[a.name] = node.inputs[ref] if isinstance(ref, int) else None
    written: list[str] = []
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write and str(op) not in _NOT_MUTATIONS:
            tensor = arg_tensor.get(a.name)
            if tensor is not None:
                written.append(tensor)
    if str(op).startswith("aten.batch_norm") and node.attrs.get("training") is True:
        # batch_norm's schema carries no write annotation, but in training mode it updates the running statistics.
        written += [t for t in (arg_tensor.get("running_mean"), arg_tensor.get("running_var")) if t]
    for tensor in written:
        root = ctx.alias_root.get(tensor)
        if root is not None:
            ctx.mutations.append(Mutation(target=root, node=node.name, kind=ctx.placeholders[root]))
    # Outputs that alias an argument (views like slice/transpose, in-place results) share its root.
    for i, ret in enumerate(schema.returns):
        if ret.alias_info is None or i >= len(node.outputs):
            continue
        for a in schema.arguments:
            if a.alias_info is not None and set(a.alias_info.before_set) & set(ret.alias_info.before_set):
                root = ctx.alias_root.get(arg_tensor.get(a.name) or "")
                if root is not None:
                    ctx.alias_root[node.outputs[i].name] = root


def encode_data(value: Any) -> Any:
    """Constant data for JSON: non-finite floats as the strings "inf", "-inf", "nan" (decode_data reverses it)."""
    if isinstance(value, list):
        return [encode_data(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def decode_data(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_data(v) for v in value]
    if isinstance(value, str):
        return float(value)
    return value


def _convert_node(fx_node: torch.fx.Node, produced: dict[str, Any], names: set[str],
                  ir_name: Callable[[str], str] = lambda n: n, name: str | None = None) -> OpNode:
    op = fx_node.target
    op_type = str(op)  # "aten.linear.default"
    name = name or fx_node.name
    where = f"node {fx_node.name!r} ({op_type})"
    inputs: list[str] = []
    input_args: dict[str, Any] = {}
    attrs: dict[str, Any] = {}

    def ref(value: Any) -> int | None:
        if value is None:
            return None
        if not isinstance(value, torch.fx.Node):
            raise ConversionError(f"{where}: expected a tensor argument, found {value!r}")
        tensor = produced.get(value.name)
        if not isinstance(tensor, str):
            raise ConversionError(f"{where}: argument {value.name!r} is not a tensor (a symbolic size or a tuple): "
                                  "dynamic shapes cannot be recorded in a static IR")
        inputs.append(tensor)
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
            out_name = ir_name(users[idx]) if idx in users else _fresh(f"{name}_out{idx}", names)
            outputs.append(_meta_of(v, out_name, name, idx, f"{where} output {idx}"))
            slots.append(out_name)
        produced[fx_node.name] = slots
    elif isinstance(val, torch.Tensor):
        outputs.append(_meta_of(val, name, name, 0, where))
        produced[fx_node.name] = name
    elif val is not None:
        raise ConversionError(f"{where} returns {type(val).__name__} ({val}), not a tensor: a symbolic size "
                              "(dynamic shapes) cannot be recorded in a static IR")
    return OpNode(name=name, op_type=op_type, inputs=inputs, outputs=outputs, attrs=attrs, input_args=input_args)


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
