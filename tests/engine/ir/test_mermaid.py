"""Mermaid graphs: ops with shapes, collapsed module views for large graphs, and labels no name can break out of."""

from __future__ import annotations

import re

from engine.ir.graph import IR, OpNode, TensorMeta
from engine.ir.mermaid import default_view, escape_label, modules_at, to_mermaid

EVIL = 'x"]; click n0 call alert(1) %%{init: {}}%% <script>alert(1)</script> --> end\n#quot; `md`'


def test_full_view_lists_every_op_with_its_shape(zoo_irs) -> None:
    ir = zoo_irs["house_price"]
    g = to_mermaid(ir)
    assert g.text.startswith("flowchart TD\n")
    assert g.boxes == len(ir.nodes) + 2  # ops, one input, one output
    assert "linear" in g.text and "f32#91;64, 256#93;" in g.text  # f32[64, 256]
    assert g.edges == len(ir.nodes) + 1
    assert g.fits_browser()


def test_collapsed_view_groups_by_module(zoo_irs) -> None:
    ir = zoo_irs["llama"]
    g = to_mermaid(ir, depth=1)
    modules = {name for kind, name in g.items.values() if kind == "module"}
    assert modules == {"embed_tokens", "layers.0", "layers.1", "norm", "lm_head"}
    assert "DecoderLayer #183; 50 ops" in g.text  # "·" is written as an entity code
    assert g.boxes < len(ir.nodes) / 5
    g2 = to_mermaid(ir, depth=1, expand=["layers.0"])
    assert "subgraph s0" in g2.text and "layers.0.self_attn" in g2.text
    assert "layers.1.self_attn" not in g2.text
    assert g2.module_of("s0") == "layers.0"
    assert modules_at(ir, 2)[:3] == ["embed_tokens", "layers.0.input_layernorm", "layers.0.self_attn"]


def big_ir(layers: int = 100, ops_per_layer: int = 10) -> IR:
    """A 1000-op chain in `layers` modules of `ops_per_layer` ops each (built by hand: no export needed)."""
    x = TensorMeta("x", [2, 8], "float32")
    nodes, prev = [], "x"
    for i in range(layers):
        for j in range(ops_per_layer):
            name = f"relu_{i}_{j}"
            nodes.append(OpNode(name, "aten.relu.default", [prev], [TensorMeta(name, [2, 8], "float32", name, 0)],
                                input_args={"self": 0}, module_path=f"layers.{i}.act"))
            prev = name
    types = {f"layers.{i}": "Block" for i in range(layers)} | {f"layers.{i}.act": "ReLU" for i in range(layers)}
    return IR(nodes=nodes, graph_inputs=[x], graph_outputs=[prev], weights={}, weight_name_mapping={},
              module_types=types)


def test_a_1000_node_graph_stays_readable() -> None:
    ir = big_ir()
    full = to_mermaid(ir)
    assert full.boxes == 1002
    assert not full.fits_browser()  # too big for mermaid's default limits: the page shows a collapsed view
    depth = default_view(ir)
    assert depth == 1
    collapsed = to_mermaid(ir, depth=depth)
    assert collapsed.boxes == 102 and collapsed.fits_browser()
    assert len(collapsed.text) < 20_000


def test_collapsed_view_hides_the_fan_out_of_a_weights_only_table() -> None:
    # `rope` computes a table from a buffer alone and every layer reads it (as RoPE's cos/sin tables in the decoder):
    # five edges from one box would drown the chain, so the view drops them and the box says so.
    w = TensorMeta("freqs", [8], "float32")
    table = TensorMeta("table", [8], "float32", "table", 0)
    nodes = [OpNode("table", "aten.cos.default", ["freqs"], [table], input_args={"self": 0}, module_path="rope")]
    prev, layers = "x", 5
    for i in range(layers):
        name = f"mul_{i}"
        nodes.append(OpNode(name, "aten.mul.Tensor", [prev, "table"], [TensorMeta(name, [2, 8], "float32", name, 0)],
                            input_args={"self": 0, "other": 1}, module_path=f"layers.{i}"))
        prev = name
    types = {"rope": "Rope"} | {f"layers.{i}": "Block" for i in range(layers)}
    ir = IR(nodes=nodes, graph_inputs=[TensorMeta("x", [2, 8], "float32")], graph_outputs=[prev],
            weights={"freqs": w}, weight_name_mapping={"freqs": "rope.freqs"}, module_types=types)
    collapsed = to_mermaid(ir, depth=1)
    assert "feeds 5 boxes (edges hidden)" in collapsed.text
    assert collapsed.edges == layers + 1  # x → layer 0 → … → layer 4 → output; none from rope
    full = to_mermaid(ir)  # the op-level view keeps every edge
    assert "edges hidden" not in full.text and full.edges == 2 * layers + 1


def test_labels_cannot_inject_markup() -> None:
    x = TensorMeta(EVIL, [1], "float32")
    node = OpNode(EVIL, "aten.relu.default", [EVIL], [TensorMeta("y", [1], "float32", EVIL, 0)],
                  input_args={"self": 0}, module_path=EVIL)
    ir = IR(nodes=[node], graph_inputs=[x], graph_outputs=["y"], weights={}, weight_name_mapping={},
            model_name=EVIL, module_types={EVIL: EVIL})
    for g in (to_mermaid(ir), to_mermaid(ir, depth=1), to_mermaid(ir, depth=1, expand=[EVIL])):
        for line in g.text.splitlines()[1:]:
            labels = re.findall(r'"([^"]*)"', line)
            stripped = re.sub(r'"[^"]*"', '""', line)
            # outside labels only ids, shapes, arrows and class statements
            assert re.fullmatch(r'\s*(subgraph s\d+\[""\]|end|[a-z]\d+(\(\[""\]\)|\[""\]|\[\[""\]\])|'
                                r'[a-z]\d+ --> [a-z]\d+|classDef \w+ [\w:#,]+|class [\w,]+ \w+)', stripped), line
            for label in labels:
                assert not re.search(r'[<>"`\n%;{}\[\]]', label.replace("<br>", "").replace("#", "").replace(";", ""))
    assert escape_label("<b>") == "#60;b#62;"
    assert escape_label('"') == "#34;"
    assert escape_label("#quot;") == "#35;quot#59;"
