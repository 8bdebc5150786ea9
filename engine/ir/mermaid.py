"""The IR as a mermaid flowchart: every op with its output shape, or — for large graphs — one box per module.

Collapsed view: ops are grouped by the module that called them (torch.export's nn_module_stack), cut at `depth`
(1 = the model's direct children: embedding, each decoder layer, the head). Modules in `expand` are opened one level
and drawn as a subgraph around their children, so a 1000-op model stays a few dozen boxes.

Control-flow nodes (cond, while_loop, map) drawn as boxes are followed by one subgraph box per body (a cond's true
and false branches, a loop's condition and body), holding the body's inputs and ops, linked by a dotted edge.

Labels are built from model, module, op and tensor names, so every character outside a small safe set is written as
a mermaid entity code (`#60;` for "<"): no name can close a label, add an edge, a click handler or HTML.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.ir.graph import IR, OpNode, TensorMeta

# Mermaid renders at most 50 000 characters and 500 edges by default; bigger views are refused in the browser.
MERMAID_MAX_CHARS = 50_000
MERMAID_MAX_EDGES = 500
FANOUT_HIDE = 3
BODY_ROLES = {"true_graph": "true branch", "false_graph": "false branch", "cond_graph": "condition",
              "body_graph": "body"}
_SAFE = re.compile(r"[A-Za-z0-9 _.,:/()+\-]")


def escape_label(text: str) -> str:
    """Text safe inside a quoted mermaid label: unsafe characters become entity codes (#60; for '<')."""
    return "".join(ch if _SAFE.fullmatch(ch) else f"#{ord(ch)};" for ch in str(text))


def _label(*lines: str) -> str:
    return '"' + "<br>".join(escape_label(line) for line in lines if line) + '"'


def short_op(op_type: str) -> str:
    """aten.linear.default -> linear; aten.add.Tensor -> add.Tensor."""
    if op_type.startswith("higher_order."):
        return op_type.removeprefix("higher_order.")
    parts = op_type.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return parts[1] if parts[2] == "default" else f"{parts[1]}.{parts[2]}"
    return op_type


def _shapes(outputs: list[TensorMeta]) -> str:
    if not outputs:
        return "(no output)"
    more = f" +{len(outputs) - 1}" if len(outputs) > 1 else ""
    return outputs[0].shape_str() + more


@dataclass
class MermaidGraph:
    text: str
    # mermaid id -> (kind, name), kind one of node, module, input, output, subgraph (a control-flow body)
    items: dict[str, tuple[str, str]] = field(default_factory=dict)
    edges: int = 0
    depth: int | None = None
    expanded: tuple[str, ...] = ()

    @property
    def boxes(self) -> int:
        return len(self.items)

    def fits_browser(self) -> bool:
        return len(self.text) <= MERMAID_MAX_CHARS and self.edges <= MERMAID_MAX_EDGES

    def module_of(self, mermaid_id: str) -> str | None:
        kind, name = self.items.get(mermaid_id, ("", ""))
        return name if kind == "module" else None


def module_depth(ir: IR) -> int:
    """The deepest module nesting of any op."""
    return max((len(ir.module_stack(n)) for n in ir.nodes), default=0)


def modules_at(ir: IR, depth: int) -> list[str]:
    """Module paths that are boxes at this depth, in graph order."""
    seen: dict[str, None] = {}
    for n in ir.nodes:
        st = ir.module_stack(n)
        if st:
            seen.setdefault(st[min(depth, len(st)) - 1], None)
    return list(seen)


def _placement(ir: IR, node: OpNode, depth: int | None, expand: set[str]) -> tuple[list[str], tuple[str, str]]:
    """(the expanded modules around the node, outermost first; its item: ("node", name) or ("module", path))."""
    if depth is None:
        return [], ("node", node.name)
    st = ir.module_stack(node)
    if not st:
        return [], ("node", node.name)
    level = min(depth, len(st)) - 1
    containers: list[str] = []
    while st[level] in expand:
        containers.append(st[level])
        if level + 1 >= len(st):
            return containers, ("node", node.name)
        level += 1
    return containers, ("module", st[level])


def to_mermaid(ir: IR, *, depth: int | None = None, expand: Iterable[str] = (), direction: str = "TD") -> MermaidGraph:
    """A flowchart of the IR: one box per op (depth None) or per module at `depth`, with `expand`ed modules opened."""
    expand_set = set(expand)
    items: dict[tuple[str, str], str] = {}  # (kind, name) -> mermaid id
    counters = {"node": 0, "module": 0, "input": 0, "output": 0}
    prefix = {"node": "n", "module": "g", "input": "i", "output": "o"}

    def item_id(key: tuple[str, str]) -> str:
        if key not in items:
            items[key] = f"{prefix[key[0]]}{counters[key[0]]}"
            counters[key[0]] += 1
        return items[key]

    producer: dict[str, tuple[str, str]] = {t.name: ("input", t.name) for t in ir.graph_inputs}
    # tree of drawn items: container path -> ordered children (items and sub-containers)
    tree: dict[str, list[tuple[str, str]]] = {"": []}
    group_ops: dict[str, list[OpNode]] = {}
    for t in ir.graph_inputs:
        tree[""].append(("input", t.name))
    edges: dict[tuple[str, str], None] = {}
    # Tensors computed from weights alone (RoPE tables sliced from buffers, say) feed every layer; in a collapsed
    # view their dozens of edges would drown the model's structure, so a box that only feeds such tensors to more
    # than FANOUT_HIDE boxes says so in its label instead.
    const: set[str] = set(ir.weights) | set(ir.constants)
    const_edges: dict[str, set[str]] = {}  # src mermaid id -> dst ids reached only through constant tensors
    varying_src: set[str] = set()
    for node in ir.nodes:
        containers, key = _placement(ir, node, depth, expand_set)
        parent = ""
        for c in containers:
            if c not in tree:
                tree[c] = []
                tree[parent].append(("sub", c))
            parent = c
        if key not in tree[parent] and (key[0] == "node" or key not in group_ops):
            tree[parent].append(key)
        if key[0] == "module":
            group_ops.setdefault(key[1], []).append(node)
        for t in node.inputs:
            src = producer.get(t)
            if src is not None and src != key:
                edges[(item_id(src), item_id(key))] = None
                if t in const:
                    const_edges.setdefault(item_id(src), set()).add(item_id(key))
                else:
                    varying_src.add(item_id(src))
        if node.inputs and all(t in const for t in node.inputs):
            const.update(o.name for o in node.outputs)
        for out in node.outputs:
            producer[out.name] = key
    for i, t in enumerate(ir.graph_outputs):
        key = ("output", f"{i}")
        tree[""].append(key)
        src = producer.get(t)
        if src is not None:
            edges[(item_id(src), item_id(key))] = None

    hidden_fanout: dict[str, int] = {}
    if depth is not None:
        for src, dsts in const_edges.items():
            if len(dsts) > FANOUT_HIDE and src not in varying_src:
                hidden_fanout[src] = len(dsts)
                for dst in dsts:
                    edges.pop((src, dst), None)

    bodies: dict[str, str] = {}  # control-flow body box id -> subgraph key
    body_edges: list[tuple[str, str, str]] = []

    def emit_bodies(node: OpNode, indent: str) -> None:
        """The subgraphs of a control-flow node, each a box of its inputs and ops."""
        order = list(BODY_ROLES)  # the same order however the attrs were stored (JSON sorts keys)
        ranked = sorted(node.attrs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0]))
        for attr, key in ranked:
            sub = ir.subgraphs.get(key) if attr.endswith("_graph") and isinstance(key, str) else None
            if sub is None:
                continue
            hid = f"h{len(bodies)}"
            bodies[hid] = key
            role = BODY_ROLES.get(attr, attr)
            count = f"{len(sub.nodes)} op" + ("s" if len(sub.nodes) != 1 else "")
            lines.append(f"{indent}subgraph {hid}[{_label(key, f'{short_op(node.op_type)} {role} · {count}')}]")
            local: dict[str, str] = {}
            for t in sub.inputs:
                local[t.name] = item_id(("input", t.name))
                lines.append(f"{indent}  {local[t.name]}([{_label(t.name.rsplit('/', 1)[-1], t.shape_str())}])")
                classes["inp"].append(local[t.name])
            for inner in sub.nodes:
                mid = item_id(("node", inner.name))
                label = _label(inner.name.rsplit("/", 1)[-1], short_op(inner.op_type), _shapes(inner.outputs))
                lines.append(f"{indent}  {mid}[{label}]")
                for t in inner.inputs:
                    if t in local and local[t] != mid:
                        edges[(local[t], mid)] = None
                for out in inner.outputs:
                    local[out.name] = mid
                emit_bodies(inner, indent + "  ")
            lines.append(f"{indent}end")
            body_edges.append((item_id(("node", node.name)), hid, role))

    def fan(mid: str) -> str:  # a box whose many constant-only out-edges were dropped says so
        return f"feeds {hidden_fanout[mid]} boxes (edges hidden)" if mid in hidden_fanout else ""

    tensors = ir.tensors()
    nodes_by_name = {n.name: n for n in ir.nodes}
    # The shape a module box shows: its last output read outside it (or a graph output).
    leaving: dict[str, TensorMeta] = {}
    for node in ir.nodes:
        for t in node.inputs:
            src = producer.get(t)
            if src and src[0] == "module" and _placement(ir, node, depth, expand_set)[1] != src:
                leaving[src[1]] = tensors[t]
    for t in ir.graph_outputs:
        src = producer.get(t)
        if src and src[0] == "module":
            leaving[src[1]] = tensors[t]

    lines = [f"flowchart {direction}"]
    classes: dict[str, list[str]] = {"inp": [], "out": [], "grp": []}

    def emit(key: tuple[str, str], indent: str) -> None:
        kind, name = key
        if kind == "sub":
            sid = f"s{len(subgraphs)}"
            subgraphs[sid] = name
            lines.append(f"{indent}subgraph {sid}[{_label(name, ir.module_types.get(name, ''))}]")
            for child in tree[name]:
                emit(child, indent + "  ")
            lines.append(f"{indent}end")
            return
        mid = item_id(key)
        if kind == "input":
            lines.append(f"{indent}{mid}([{_label('input ' + name, tensors[name].shape_str())}])")
            classes["inp"].append(mid)
        elif kind == "output":
            t = ir.graph_outputs[int(name)]
            lines.append(f"{indent}{mid}([{_label('output ' + name, tensors[t].shape_str())}])")
            classes["out"].append(mid)
        elif kind == "node":
            node = nodes_by_name[name]
            lines.append(f"{indent}{mid}[{_label(name, short_op(node.op_type), _shapes(node.outputs), fan(mid))}]")
            emit_bodies(node, indent)
        else:
            ops = group_ops[name]
            out = leaving.get(name)
            mtype = ir.module_types.get(name, "")
            count = f"{len(ops)} op" + ("s" if len(ops) != 1 else "")
            what = f"{mtype} · {count}" if mtype else count
            lines.append(f"{indent}{mid}[[{_label(name, what, out.shape_str() if out else '', fan(mid))}]]")
            classes["grp"].append(mid)

    subgraphs: dict[str, str] = {}  # subgraph id -> expanded module path
    for key in tree[""]:
        emit(key, "  ")
    for a, b in edges:
        lines.append(f"  {a} --> {b}")
    for a, b, role in body_edges:
        lines.append(f"  {a} -.->|{escape_label(role)}| {b}")
    lines.append("  classDef inp fill:#e8f4ea,stroke:#3c8c4f")
    lines.append("  classDef out fill:#fdf0e2,stroke:#c07a2c")
    lines.append("  classDef grp fill:#e9eefb,stroke:#4a66b5")
    for cls, ids in classes.items():
        for start in range(0, len(ids), 200):
            lines.append(f"  class {','.join(ids[start:start + 200])} {cls}")
    by_id = {mid: key for key, mid in items.items()}
    by_id.update({sid: ("module", path) for sid, path in subgraphs.items()})
    by_id.update({hid: ("subgraph", key) for hid, key in bodies.items()})
    return MermaidGraph(text="\n".join(lines) + "\n", items=by_id, edges=len(edges) + len(body_edges),
                        depth=depth, expanded=tuple(sorted(expand_set)))


def default_view(ir: IR, max_boxes: int = 150) -> int | None:
    """None (every op) for graphs up to `max_boxes` ops, else the deepest module depth that stays under it."""
    if len(ir.nodes) <= max_boxes:
        return None
    loose = sum(1 for n in ir.nodes if not ir.module_stack(n))  # ops of the root module are always their own box
    best, best_boxes = 1, 0
    for depth in range(1, module_depth(ir) + 1):
        boxes = len(modules_at(ir, depth)) + loose
        if boxes > max_boxes:
            break
        if boxes > best_boxes:  # go deeper only where that shows more
            best, best_boxes = depth, boxes
    return best
