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
# The 5-step scale of a measured-time colouring (engine.ir.overlay): light for little time, dark for the most.
HEAT = (("#fff5eb", "#7f2704"), ("#fdd0a2", "#7f2704"), ("#fd8d3c", "#000000"), ("#e6550d", "#ffffff"),
        ("#a63603", "#ffffff"))
# A box's colouring: (kind, name) as in MermaidGraph.items ("node", op name) / ("module", path) -> fraction of the max.
Colour = dict[tuple[str, str], float]


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


_PREFIX = {"node": "n", "module": "g", "input": "i", "output": "o"}


@dataclass
class _Ids:
    """Mermaid ids, numbered per kind in order of first use: n0, n1, … for ops, g… modules, i… inputs, o… outputs."""
    ids: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, name) -> mermaid id
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_PREFIX, 0))

    def __call__(self, key: tuple[str, str]) -> str:
        if key not in self.ids:
            self.ids[key] = f"{_PREFIX[key[0]]}{self.counts[key[0]]}"
            self.counts[key[0]] += 1
        return self.ids[key]


@dataclass
class _Layout:
    """to_mermaid's first pass: where each item sits, which module box draws each op, which boxes connect."""
    # tree of drawn items: container path ("" the chart) -> ordered children, items and ("sub", expanded module)
    tree: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: {"": []})
    group_ops: dict[str, list[OpNode]] = field(default_factory=dict)  # module box -> the ops it stands for
    producer: dict[str, tuple[str, str]] = field(default_factory=dict)  # tensor -> the item that computes it
    edges: dict[tuple[str, str], None] = field(default_factory=dict)  # (src id, dst id), in order
    # src mermaid id -> dst ids reached only through constant tensors
    const_edges: dict[str, set[str]] = field(default_factory=dict)
    varying_src: set[str] = field(default_factory=set)  # src ids with at least one edge carrying a varying tensor


def to_mermaid(ir: IR, *, depth: int | None = None, expand: Iterable[str] = (), direction: str = "TD",
               colour: Colour | None = None) -> MermaidGraph:
    """A flowchart of the IR: one box per op (depth None) or per module at `depth`, with `expand`ed modules opened.

    `colour` ((kind, name) -> fraction of the max, e.g. engine.ir.overlay.fractions) shades those op and module boxes
    on a 5-step scale (HEAT) (classDef heat0…heat4); None leaves the chart as it is without it."""
    expand_set = set(expand)
    ids = _Ids()
    layout = _layout(ir, depth, expand_set, ids)
    hidden_fanout = _hide_constant_fanout(layout, depth)
    tensors = ir.tensors()
    writer = _Writer(ir=ir, layout=layout, ids=ids, hidden_fanout=hidden_fanout, tensors=tensors,
                     leaving=_leaving_shapes(ir, layout, depth, expand_set, tensors),
                     nodes_by_name={n.name: n for n in ir.nodes}, lines=[f"flowchart {direction}"],
                     colour=colour)
    for key in layout.tree[""]:
        writer.emit(key, "  ")
    writer.emit_edges_and_classes()
    return MermaidGraph(text="\n".join(writer.lines) + "\n", items=writer.items_by_id(),
                        edges=len(layout.edges) + len(writer.body_edges), depth=depth,
                        expanded=tuple(sorted(expand_set)))


def _layout(ir: IR, depth: int | None, expand: set[str], ids: _Ids) -> _Layout:
    """Place every op (its own box or its module's, inside the expanded modules around it) and connect the boxes."""
    layout = _Layout(producer={t.name: ("input", t.name) for t in ir.graph_inputs})
    layout.tree[""] += [("input", t.name) for t in ir.graph_inputs]
    # Tensors computed from weights alone (RoPE tables sliced from buffers, say) feed every layer; in a collapsed
    # view their dozens of edges would drown the model's structure, so a box that only feeds such tensors to more
    # than FANOUT_HIDE boxes says so in its label instead (_hide_constant_fanout).
    const: set[str] = set(ir.weights) | set(ir.constants)
    for node in ir.nodes:
        containers, key = _placement(ir, node, depth, expand)
        parent = ""
        for c in containers:
            if c not in layout.tree:
                layout.tree[c] = []
                layout.tree[parent].append(("sub", c))
            parent = c
        if key not in layout.tree[parent]:
            layout.tree[parent].append(key)
        if key[0] == "module":
            layout.group_ops.setdefault(key[1], []).append(node)
        _connect(layout, ids, node, key, const)
        for out in node.outputs:
            layout.producer[out.name] = key
    for i, t in enumerate(ir.graph_outputs):
        key = ("output", f"{i}")
        layout.tree[""].append(key)
        src = layout.producer.get(t)
        if src is not None:
            layout.edges[(ids(src), ids(key))] = None
    return layout


def _connect(layout: _Layout, ids: _Ids, node: OpNode, key: tuple[str, str], const: set[str]) -> None:
    """Edges into the node's item from the items computing its inputs; outputs of constant-only inputs join const."""
    for t in node.inputs:
        src = layout.producer.get(t)
        if src is not None and src != key:
            layout.edges[(ids(src), ids(key))] = None
            if t in const:
                layout.const_edges.setdefault(ids(src), set()).add(ids(key))
            else:
                layout.varying_src.add(ids(src))
    if node.inputs and all(t in const for t in node.inputs):
        const.update(o.name for o in node.outputs)


def _hide_constant_fanout(layout: _Layout, depth: int | None) -> dict[str, int]:
    """In a collapsed view, drop the edges of boxes feeding only constant tensors to many boxes: id -> edges hidden."""
    hidden: dict[str, int] = {}
    if depth is None:
        return hidden
    for src, dsts in layout.const_edges.items():
        if len(dsts) > FANOUT_HIDE and src not in layout.varying_src:
            hidden[src] = len(dsts)
            for dst in dsts:
                layout.edges.pop((src, dst), None)
    return hidden


def _leaving_shapes(ir: IR, layout: _Layout, depth: int | None, expand: set[str],
                    tensors: dict[str, TensorMeta]) -> dict[str, TensorMeta]:
    """The shape a module box shows: its last output read outside it (or a graph output)."""
    leaving: dict[str, TensorMeta] = {}
    for node in ir.nodes:
        for t in node.inputs:
            src = layout.producer.get(t)
            if src and src[0] == "module" and _placement(ir, node, depth, expand)[1] != src:
                leaving[src[1]] = tensors[t]
    for t in ir.graph_outputs:
        src = layout.producer.get(t)
        if src and src[0] == "module":
            leaving[src[1]] = tensors[t]
    return leaving


@dataclass
class _Writer:
    """to_mermaid's second pass: the flowchart's lines, item by item, and what each drawn id stands for."""
    ir: IR
    layout: _Layout
    ids: _Ids
    hidden_fanout: dict[str, int]  # box id -> constant-only out-edges dropped
    tensors: dict[str, TensorMeta]
    leaving: dict[str, TensorMeta]  # module box -> the shape it shows
    nodes_by_name: dict[str, OpNode]
    lines: list[str]
    classes: dict[str, list[str]] = field(default_factory=lambda: {"inp": [], "out": [], "grp": []})
    subgraphs: dict[str, str] = field(default_factory=dict)  # subgraph id -> expanded module path
    bodies: dict[str, str] = field(default_factory=dict)  # control-flow body box id -> subgraph key
    body_edges: list[tuple[str, str, str]] = field(default_factory=list)  # (control-flow node id, body id, role)
    colour: Colour | None = None  # measured-time shading of op and module boxes (to_mermaid's `colour`)

    def emit(self, key: tuple[str, str], indent: str) -> None:
        """One child of the layout tree: an expanded module as a subgraph around its children, or one box."""
        kind, name = key
        if kind == "sub":
            sid = f"s{len(self.subgraphs)}"
            self.subgraphs[sid] = name
            self.lines.append(f"{indent}subgraph {sid}[{_label(name, self.ir.module_types.get(name, ''))}]")
            for child in self.layout.tree[name]:
                self.emit(child, indent + "  ")
            self.lines.append(f"{indent}end")
            return
        mid = self.ids(key)
        self.lines.append(indent + self._box(kind, name, mid))
        if kind == "node":
            self._emit_bodies(self.nodes_by_name[name], indent)

    def _box(self, kind: str, name: str, mid: str) -> str:
        if kind == "input":
            self.classes["inp"].append(mid)
            return f"{mid}([{_label('input ' + name, self.tensors[name].shape_str())}])"
        if kind == "output":
            self.classes["out"].append(mid)
            t = self.ir.graph_outputs[int(name)]
            return f"{mid}([{_label('output ' + name, self.tensors[t].shape_str())}])"
        if kind == "node":
            node = self.nodes_by_name[name]
            return f"{mid}[{_label(name, short_op(node.op_type), _shapes(node.outputs), self._fan(mid))}]"
        ops = self.layout.group_ops[name]
        out = self.leaving.get(name)
        mtype = self.ir.module_types.get(name, "")
        count = f"{len(ops)} op" + ("s" if len(ops) != 1 else "")
        what = f"{mtype} · {count}" if mtype else count
        self.classes["grp"].append(mid)
        return f"{mid}[[{_label(name, what, out.shape_str() if out else '', self._fan(mid))}]]"

    def _fan(self, mid: str) -> str:  # a box whose many constant-only out-edges were dropped says so
        return f"feeds {self.hidden_fanout[mid]} boxes (edges hidden)" if mid in self.hidden_fanout else ""

    def _emit_bodies(self, node: OpNode, indent: str) -> None:
        """The subgraphs of a control-flow node, each a box of its inputs and ops."""
        order = list(BODY_ROLES)  # the same order however the attrs were stored (JSON sorts keys)
        ranked = sorted(node.attrs.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0]))
        for attr, key in ranked:
            sub = self.ir.subgraphs.get(key) if attr.endswith("_graph") and isinstance(key, str) else None
            if sub is None:
                continue
            hid = f"h{len(self.bodies)}"
            self.bodies[hid] = key
            role = BODY_ROLES.get(attr, attr)
            count = f"{len(sub.nodes)} op" + ("s" if len(sub.nodes) != 1 else "")
            self.lines.append(f"{indent}subgraph {hid}[{_label(key, f'{short_op(node.op_type)} {role} · {count}')}]")
            local: dict[str, str] = {}
            for t in sub.inputs:
                local[t.name] = self.ids(("input", t.name))
                self.lines.append(f"{indent}  {local[t.name]}([{_label(t.name.rsplit('/', 1)[-1], t.shape_str())}])")
                self.classes["inp"].append(local[t.name])
            for inner in sub.nodes:
                mid = self.ids(("node", inner.name))
                label = _label(inner.name.rsplit("/", 1)[-1], short_op(inner.op_type), _shapes(inner.outputs))
                self.lines.append(f"{indent}  {mid}[{label}]")
                for t in inner.inputs:
                    if t in local and local[t] != mid:
                        self.layout.edges[(local[t], mid)] = None
                for out in inner.outputs:
                    local[out.name] = mid
                self._emit_bodies(inner, indent + "  ")
            self.lines.append(f"{indent}end")
            self.body_edges.append((self.ids(("node", node.name)), hid, role))

    def emit_edges_and_classes(self) -> None:
        """After the boxes: the edges (a body's dotted one with its role), then the colour classes."""
        for a, b in self.layout.edges:
            self.lines.append(f"  {a} --> {b}")
        for a, b, role in self.body_edges:
            self.lines.append(f"  {a} -.->|{escape_label(role)}| {b}")
        self.lines.append("  classDef inp fill:#e8f4ea,stroke:#3c8c4f")
        self.lines.append("  classDef out fill:#fdf0e2,stroke:#c07a2c")
        self.lines.append("  classDef grp fill:#e9eefb,stroke:#4a66b5")
        for cls, ids in self.classes.items():
            for start in range(0, len(ids), 200):
                self.lines.append(f"  class {','.join(ids[start:start + 200])} {cls}")
        if self.colour is not None:
            self.emit_heat()

    def emit_heat(self) -> None:
        """The colour scale's classes, after the others so they win, and each coloured box's class."""
        levels: dict[int, list[str]] = {}
        for key, mid in self.ids.ids.items():
            frac = (self.colour or {}).get(key)
            if frac is not None and key[0] in ("node", "module"):
                levels.setdefault(heat_level(frac), []).append(mid)
        for i, (fill, text) in enumerate(HEAT):
            self.lines.append(f"  classDef heat{i} fill:{fill},stroke:#7f2704,color:{text}")
        for level in sorted(levels):
            ids = levels[level]
            for start in range(0, len(ids), 200):
                self.lines.append(f"  class {','.join(ids[start:start + 200])} heat{level}")

    def items_by_id(self) -> dict[str, tuple[str, str]]:
        """Mermaid id -> (kind, name) of everything drawn (MermaidGraph.items)."""
        by_id = {mid: key for key, mid in self.ids.ids.items()}
        by_id.update({sid: ("module", path) for sid, path in self.subgraphs.items()})
        by_id.update({hid: ("subgraph", key) for hid, key in self.bodies.items()})
        return by_id


def heat_level(fraction: float) -> int:
    """0…len(HEAT)-1: which step of the colour scale a fraction of the max falls on."""
    return max(0, min(len(HEAT) - 1, int(float(fraction) * len(HEAT))))


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
