"""The IR on real-world models and on what they contain: transformers GPT-2, BERT, Llama, T5-encoder and ViT (small
configs, random weights) through extract → JSON → execute → verify; control flow (cond, while_loop, map) kept as
subgraphs; grad-mode and autocast scopes inlined; lifted constants and mutated buffers represented; old files read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.ir import ConversionError, ExportError, execute_ir, extract_ir, load_ir, save_ir, verify_ir
from engine.ir.mermaid import to_mermaid
from engine.ir.serialize import _canonical
from engine.ir.verify import model_weights
from engine.workloads import user_model as um

TRANSFORMERS = ["transformers:gpt2-tiny", "transformers:bert-tiny", "transformers:llama-tiny",
                "transformers:t5-encoder-tiny", "transformers:vit-tiny"]


def meta_input(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def round_trip(ir, tmp_path: Path):
    path = tmp_path / "ir.json"
    save_ir(ir, path)
    loaded = load_ir(path)
    assert loaded == ir
    return loaded


def real(cls, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return cls().eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_models_extract_execute_verify(name: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    res = um.resolve(um.ModelSpec(name))
    meta_model = um.build_model(res, "meta").eval()
    ir = extract_ir(meta_model, um.build_inputs(res, 2, "meta"), model_name=name)
    assert all(not n.op_type.startswith("higher_order.wrap") for n in ir.all_nodes())
    ir = round_trip(ir, tmp_path)
    model = um.build_model(res, "cpu").eval()  # the same config with real, seeded weights
    inputs = um.build_inputs(res, 2, "cpu")
    got = execute_ir(ir, model_weights(model), inputs)
    with torch.no_grad():
        want = [t for t in torch.utils._pytree.tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    report = verify_ir(ir, model, inputs)
    assert report.ok, report.summary()


def test_llama_rotary_grad_scope_is_inlined() -> None:
    pytest.importorskip("transformers")
    res = um.resolve(um.ModelSpec("transformers:llama-tiny"))
    ir = extract_ir(um.build_model(res, "meta").eval(), um.build_inputs(res, 1, "meta"))
    scoped = [n for n in ir.nodes if n.scope.get("grad_enabled") is False]  # the rotary embedding's no_grad block
    assert scoped and {n.module_path for n in scoped} == {"model.rotary_emb"}
    assert not ir.subgraphs


def test_a_kv_cache_output_names_the_fix() -> None:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                                               n_positions=16, use_cache=True)).eval()
    with pytest.raises(ExportError, match=r"forward returns a DynamicCache object .*config\.use_cache=False"):
        extract_ir(model, (meta_input(1, 8, dtype=torch.long),))


# -- control flow: subgraphs ----------------------------------------------------------------------------------------
class Gate(nn.Module):
    """torch.cond on a data-dependent predicate: both branches are traced, one runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: self.fc(t).relu(), lambda t: t * 2.0 - 1.0, (x,))


def test_cond_round_trips_and_runs_both_branches(tmp_path: Path) -> None:
    with torch.device("meta"):
        meta = Gate().eval()
    ir = round_trip(extract_ir(meta, (meta_input(2, 4),), model_name="gate"), tmp_path)
    (cond,) = [n for n in ir.nodes if n.op_type == "higher_order.cond"]
    assert set(ir.subgraphs) == {cond.attrs["true_graph"], cond.attrs["false_graph"]}
    true_ops = [n.op_type for n in ir.subgraphs[cond.attrs["true_graph"]].nodes]
    assert true_ops == ["aten.linear.default", "aten.relu.default"]
    assert all("/" in n.name for s in ir.subgraphs.values() for n in s.nodes)  # body names are scoped
    model = real(Gate)
    for x in (torch.ones(2, 4), -torch.ones(2, 4)):  # one input per branch
        (got,) = execute_ir(ir, model_weights(model), (x,))
        torch.testing.assert_close(got, model(x).detach())
        assert verify_ir(ir, model, (x,)).ok
    text = to_mermaid(ir).text
    assert "subgraph h0" in text and "-.->|true branch| h0" in text and "-.->|false branch| h1" in text
    assert "cond true branch" in text


class Loops(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as tmap
        from torch._higher_order_ops.while_loop import while_loop

        mapped = tmap(lambda x: self.fc(x).tanh(), xs)
        i = torch.zeros((), dtype=torch.long, device=xs.device)
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2.0), (i, mapped))[1]


def test_while_loop_and_map_run_their_bodies(tmp_path: Path) -> None:
    with torch.device("meta"):
        meta = Loops().eval()
    ir = round_trip(extract_ir(meta, (meta_input(3, 2, 4),)), tmp_path)
    assert [n.op_type for n in ir.nodes if n.op_type.startswith("higher_order.")] == \
        ["higher_order.map_impl", "higher_order.while_loop"]
    assert len(ir.subgraphs) == 3  # map body, loop condition, loop body
    model = real(Loops)
    report = verify_ir(ir, model, (torch.randn(3, 2, 4),))
    assert report.ok, report.summary()


# -- scope-only higher-order ops: inlined ---------------------------------------------------------------------------
class Scoped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("table", torch.arange(8.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            freq = self.table[None, :] * 0.5
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.fc(x)
        return y.float() + freq


def test_grad_and_autocast_scopes_are_inlined_and_reapplied(tmp_path: Path) -> None:
    with torch.device("meta"):
        meta = Scoped().eval()
    ir = round_trip(extract_ir(meta, (meta_input(2, 8),)), tmp_path)
    assert not any(n.op_type.startswith("higher_order.") for n in ir.nodes)
    linear = next(n for n in ir.nodes if n.op_type == "aten.linear.default")
    assert linear.scope == {"autocast": {"device_type": "cpu", "dtype": "bfloat16", "enabled": True,
                                         "cache_enabled": False}}
    assert any(n.scope == {"grad_enabled": False} for n in ir.nodes)
    model = real(Scoped)
    report = verify_ir(ir, model, (torch.randn(2, 8),), rtol=0, atol=0)  # bit-exact: bf16 matmul re-applied
    assert report.ok, report.summary()


def test_unsupported_higher_order_op_names_itself() -> None:
    from torch._higher_order_ops.scan import scan

    class Scan(nn.Module):
        def forward(self, init, xs):
            return scan(lambda c, x: (c + x, (c + x) * 2), init, xs)[1]

    with pytest.raises(ConversionError, match=r"calls the higher-order op 'scan', which the IR cannot represent .*"
                                              r"keeps cond, map_impl, while_loop as subgraphs"):
        extract_ir(Scan(), (meta_input(4), meta_input(3, 4)))


# -- lifted constants and mutated state ----------------------------------------------------------------------------
class Constants(nn.Module):
    """Tensors created in forward on the input's device: lifted by torch.export (with a detach_ of each)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(0.5, device=x.device)
        bias = torch.tensor([1.0, -2.0, 3.0, 0.25], device=x.device)
        floor = torch.tensor(float("-inf"), device=x.device)
        return torch.maximum(x * scale + bias, floor)


def test_lifted_constants_on_meta_keep_their_values(tmp_path: Path) -> None:
    ir = round_trip(extract_ir(Constants(), (meta_input(2, 4),)), tmp_path)
    assert len(ir.constants) == 3 and not ir.mutations  # detach_ writes no values
    assert sorted(map(str, ir.constant_data.values())) == ["-inf", "0.5", "[1.0, -2.0, 3.0, 0.25]"]
    x = torch.randn(2, 4)
    report = verify_ir(ir, Constants(), (x,))
    assert report.ok, report.summary()


class Stateful(nn.Module):
    """A step counter and a cache written through a slice (a view of the buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("cache", torch.zeros(2, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        self.cache[:, :4] = x
        return self.fc(x) * self.steps + self.cache.sum()


def test_mutated_buffers_are_represented_and_checked(tmp_path: Path) -> None:
    with torch.device("meta"):
        meta = Stateful().eval()
    ir = round_trip(extract_ir(meta, (meta_input(2, 4),)), tmp_path)
    written = {ir.weight_name_mapping[m.target] for m in ir.mutations}
    assert written == {"steps", "cache"} and {m.kind for m in ir.mutations} == {"buffer"}
    model = real(Stateful)
    weights = model_weights(model)
    before = {k: v.clone() for k, v in weights.items()}
    state: dict[str, torch.Tensor] = {}
    x = torch.randn(2, 4)
    (got,) = execute_ir(ir, weights, (x,), state_out=state)
    assert all(torch.equal(before[k], weights[k]) for k in before)  # the caller's tensors are not written
    assert float(state["steps"]) == 1.0 and torch.equal(state["cache"][:, :4], x)
    report = verify_ir(ir, model, (x,))  # the model steps its counter; the IR starts from the value before
    assert report.ok, report.summary()
    assert {o.name for o in report.outputs} >= {"state:steps", "state:cache"}
    assert float(model.steps) == 1.0


# -- schema 1 files are still read ---------------------------------------------------------------------------------
def test_schema_1_file_still_loads(zoo_irs, tmp_path: Path) -> None:
    ir = zoo_irs["attention"]
    path = tmp_path / "v1.json"
    save_ir(ir, path)
    doc = json.loads(path.read_text())
    body = doc["ir"]
    body.pop("subgraphs"), body.pop("mutations")
    for node in body["nodes"]:
        node.pop("scope")
    doc.update(schema_version=1, sha256=hashlib.sha256(_canonical(body).encode()).hexdigest())
    path.write_text(json.dumps(doc))
    assert load_ir(path) == ir
