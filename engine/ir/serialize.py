"""The IR as JSON: a versioned envelope with a checksum, validated on load.

    {"format": "modelab-ir", "schema_version": 2, "sha256": "<of the canonical 'ir' object>", "ir": {...}}

Schema 2 (this code writes it) adds `subgraphs` (control-flow bodies), `mutations` (state forward writes) and a
per-node `scope`; version 1 files, which have none of them, are still read.

`load_ir` raises SerializationError saying what is wrong: not JSON or cut short (truncated), another format or
schema version, a checksum that does not match (edited after it was written), or an IR whose references do not
resolve (a node reading a tensor nobody produces, an unknown dtype).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.ir.errors import SerializationError
from engine.ir.graph import IR, Mutation, OpNode, Subgraph, TensorMeta

FORMAT = "modelab-ir"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no subgraphs, mutations or node scopes (they default to empty)
DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"}


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def ir_to_dict(ir: IR) -> dict[str, Any]:
    return asdict(ir)


def dumps_ir(ir: IR) -> str:
    body = ir_to_dict(ir)
    canonical = _canonical(body)
    envelope = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                "sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    # The canonical text is the file's "ir" member verbatim, so load can check the hash without re-encoding.
    head = json.dumps(envelope, separators=(",", ":"))
    return head[:-1] + ',"ir":' + canonical + "}\n"


def save_ir(ir: IR, path: str | os.PathLike[str]) -> int:
    """Write the IR as JSON (atomically); returns the file's size in bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_ir(ir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return len(text.encode())


def load_ir(path: str | os.PathLike[str]) -> IR:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SerializationError(f"{path}: no such IR file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SerializationError(f"{path}: cannot read it as UTF-8 text: {exc}") from exc
    return loads_ir(text, source=str(path))


def loads_ir(text: str, source: str = "<string>") -> IR:
    if not text.strip():
        raise SerializationError(f"{source}: empty file, not an IR")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = not text.rstrip().endswith("}")  # a whole file ends with the envelope's closing brace
        what = "truncated: the JSON ends early" if cut else "not valid JSON"
        raise SerializationError(f"{source}: {what} ({exc.msg} at line {exc.lineno}, column {exc.colno})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise SerializationError(f"{source}: not a Mode Lab IR file (format {found!r}, expected {FORMAT!r})")
    version = doc.get("schema_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        raise SerializationError(
            f"{source}: IR schema version {version!r}, but this code reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
            + ("; it was written by a newer Mode Lab: update this one" if newer else "; re-extract the IR"))
    body = doc.get("ir")
    if not isinstance(body, dict):
        raise SerializationError(f"{source}: the 'ir' member is missing")
    digest = hashlib.sha256(_canonical(body).encode()).hexdigest()
    if digest != doc.get("sha256"):
        raise SerializationError(f"{source}: checksum mismatch (sha256 {digest[:12]}… vs recorded "
                                 f"{str(doc.get('sha256'))[:12]}…): the file was modified after it was written")
    return ir_from_dict(body, source)


def _tensor(d: Any, where: str) -> TensorMeta:
    if not isinstance(d, dict):
        raise SerializationError(f"{where}: expected a tensor object, found {type(d).__name__}")
    try:
        meta = TensorMeta(name=d["name"], shape=list(d["shape"]), dtype=d["dtype"],
                          producer_node=d.get("producer_node"),
                          producer_output_idx=d.get("producer_output_idx"))
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"{where}: malformed tensor ({exc})") from exc
    if not isinstance(meta.name, str) or not meta.name:
        raise SerializationError(f"{where}: tensor without a name")
    if meta.dtype not in DTYPES:
        raise SerializationError(f"{where}: tensor {meta.name!r} has unknown dtype {meta.dtype!r}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in meta.shape):
        raise SerializationError(f"{where}: tensor {meta.name!r} has an invalid shape {meta.shape!r}")
    return meta


def _nodes(items: Any, where: str) -> list[OpNode]:
    nodes = []
    for i, n in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(n, dict):
            raise SerializationError(f"{at}: expected a node object")
        nodes.append(OpNode(name=n["name"], op_type=n["op_type"], inputs=list(n["inputs"]),
                            outputs=[_tensor(t, f"{at} ({n.get('name')}) output") for t in n["outputs"]],
                            attrs=dict(n.get("attrs", {})), input_args=dict(n.get("input_args", {})),
                            module_path=n.get("module_path", ""), scope=dict(n.get("scope") or {})))
    return nodes


def ir_from_dict(body: dict[str, Any], source: str = "<dict>") -> IR:
    """Build and validate an IR from its dict form (what `ir_to_dict` gives; schema 1 bodies too)."""
    try:
        inputs = [_tensor(t, f"{source}: graph_inputs[{i}]") for i, t in enumerate(body["graph_inputs"])]
        weights = {k: _tensor(t, f"{source}: weights[{k!r}]") for k, t in body["weights"].items()}
        constants = {k: _tensor(t, f"{source}: constants[{k!r}]") for k, t in body.get("constants", {}).items()}
        nodes = _nodes(body["nodes"], f"{source}: nodes")
        subgraphs = {}
        for key, sub in (body.get("subgraphs") or {}).items():
            where = f"{source}: subgraphs[{key!r}]"
            subgraphs[key] = Subgraph(inputs=[_tensor(t, f"{where} input") for t in sub["inputs"]],
                                      nodes=_nodes(sub["nodes"], f"{where} nodes"), outputs=list(sub["outputs"]))
        mutations = [Mutation(target=m["target"], node=m["node"], kind=m["kind"], value=m.get("value"))
                     for m in (body.get("mutations") or [])]
        ir = IR(nodes=nodes, graph_inputs=inputs, graph_outputs=list(body["graph_outputs"]), weights=weights,
                weight_name_mapping=dict(body["weight_name_mapping"]), constants=constants,
                model_name=str(body.get("model_name", "model")), constant_data=dict(body.get("constant_data", {})),
                weight_kinds=dict(body.get("weight_kinds", {})), module_types=dict(body.get("module_types", {})),
                torch_version=str(body.get("torch_version", "")), subgraphs=subgraphs, mutations=mutations)
    except SerializationError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SerializationError(f"{source}: malformed IR: missing or wrong-typed member {exc}") from exc
    validate(ir, source)
    return ir


def validate(ir: IR, source: str = "IR") -> None:
    """Every reference resolves: node inputs and graph outputs name known tensors, produced before they are read;
    control-flow nodes name existing subgraphs, each valid on its own inputs; mutations name state and nodes."""
    known: set[str] = {t.name for t in ir.graph_inputs} | set(ir.weights) | set(ir.constants)
    for name in ir.weights:
        if name not in ir.weight_name_mapping:
            raise SerializationError(f"{source}: weight {name!r} has no entry in weight_name_mapping")
    seen_nodes: set[str] = set()
    _validate_nodes(ir, ir.nodes, known, seen_nodes, source)
    for t in ir.graph_outputs:
        if t not in known:
            raise SerializationError(f"{source}: graph output {t!r} is not produced by any node")
    for key, sub in ir.subgraphs.items():
        scope = {t.name for t in sub.inputs}
        _validate_nodes(ir, sub.nodes, scope, seen_nodes, f"{source}: subgraph {key!r}")
        for t in sub.outputs:
            if t not in scope:
                raise SerializationError(f"{source}: subgraph {key!r} returns {t!r}, which none of its nodes produces")
    state = {t.name for t in ir.graph_inputs} | set(ir.weights) | set(ir.constants)
    for m in ir.mutations:
        if m.target not in state:
            raise SerializationError(f"{source}: mutation of {m.target!r}, which is not an input, weight or constant")
        if m.value is not None and m.value not in known:
            raise SerializationError(f"{source}: mutation of {m.target!r} takes its value from unknown {m.value!r}")


def _validate_nodes(ir: IR, nodes: list[OpNode], known: set[str], seen_nodes: set[str], source: str) -> None:
    for node in nodes:
        if node.name in seen_nodes:
            raise SerializationError(f"{source}: two nodes are named {node.name!r}")
        seen_nodes.add(node.name)
        if not isinstance(node.op_type, str) or not node.op_type:
            raise SerializationError(f"{source}: node {node.name!r} has no op_type")
        for t in node.inputs:
            if t not in known:
                raise SerializationError(f"{source}: node {node.name!r} ({node.op_type}) reads tensor {t!r}, which no "
                                         "earlier node, input or weight produces")
        for arg, ref in node.input_args.items():
            for r in (ref if isinstance(ref, list) else [ref]):
                if r is not None and not (isinstance(r, int) and 0 <= r < len(node.inputs)):
                    raise SerializationError(f"{source}: node {node.name!r} argument {arg!r} points at input {r!r} "
                                             f"of {len(node.inputs)}")
        if node.op_type.startswith("higher_order."):
            for attr, key in node.attrs.items():
                if attr.endswith("_graph") and key not in ir.subgraphs:
                    raise SerializationError(f"{source}: node {node.name!r} ({node.op_type}) names subgraph {key!r}, "
                                             "which the IR does not have")
        for t in node.outputs:
            if t.name in known:
                raise SerializationError(f"{source}: tensor {t.name!r} is produced twice (node {node.name!r})")
            known.add(t.name)
