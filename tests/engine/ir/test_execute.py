"""The executor: the IR with real weights equals the model for every zoo model; failures name their node."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.ir import ExecutionError, WeightLoadError, execute_ir, register_executor
from engine.ir.graph import IR, OpNode, TensorMeta
from engine.ir.verify import model_weights


@pytest.mark.parametrize("name", ["llama", "attention", "multi_io", "skip", "shared_weights", "house_price"])
def test_executor_equals_the_model(zoo_irs, real_models, name: str) -> None:
    ir = zoo_irs[name]
    model, inputs = real_models[name]
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = execute_ir(ir, model.state_dict() | model_weights(model), inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_weights_by_state_dict_key(zoo_irs, real_models) -> None:
    model, inputs = real_models["house_price"]
    out = execute_ir(zoo_irs["house_price"], model.state_dict(), inputs)[0]
    torch.testing.assert_close(out, model(*inputs).detach())


def test_missing_or_wrong_weights(zoo_irs, real_models) -> None:
    model, inputs = real_models["house_price"]
    weights = dict(model.state_dict())
    del weights["fc2.bias"]
    with pytest.raises(WeightLoadError, match=r"no tensor for weight 'fc2\.bias'"):
        execute_ir(zoo_irs["house_price"], weights, inputs)
    weights["fc2.bias"] = torch.zeros(3)
    with pytest.raises(WeightLoadError, match=r"'fc2\.bias' has shape \[3\], the IR expects \[256\]"):
        execute_ir(zoo_irs["house_price"], weights, inputs)


def test_wrong_inputs(zoo_irs, real_models) -> None:
    model, _ = real_models["house_price"]
    with pytest.raises(ExecutionError, match=r"extracted for float32 \[64, 5\]"):
        execute_ir(zoo_irs["house_price"], model.state_dict(), (torch.zeros(3, 5),))
    with pytest.raises(ExecutionError, match="takes 1 input"):
        execute_ir(zoo_irs["house_price"], model.state_dict(), ())


def test_execution_error_names_the_node(zoo_irs, real_models) -> None:
    ir = copy.deepcopy(zoo_irs["attention"])
    model, inputs = real_models["attention"]
    softmax = next(n for n in ir.nodes if n.op_type.startswith("aten.softmax"))
    softmax.attrs["dim"] = 7
    match = rf"node '{softmax.name}' \(aten\.softmax\.int.*failed: IndexError"
    with pytest.raises(ExecutionError, match=match) as info:
        execute_ir(ir, model_weights(model), inputs)
    assert info.value.node == softmax.name
    softmax.attrs["dim"] = -1
    softmax.op_type = "aten.no_such_op.default"
    with pytest.raises(ExecutionError, match="has no operator aten.no_such_op.default"):
        execute_ir(ir, model_weights(model), inputs)


def test_register_executor_for_a_non_aten_op() -> None:
    x = TensorMeta("x", [3], "float32")
    ir = IR(nodes=[OpNode("double", "mylib.double", ["x"], [TensorMeta("double", [3], "float32", "double", 0)],
                          attrs={"factor": 2.0}),
                   OpNode("pick", "getitem", ["double", "x"], [TensorMeta("pick", [3], "float32", "pick", 0)],
                          attrs={"index": 0})],
            graph_inputs=[x], graph_outputs=["pick"], weights={}, weight_name_mapping={})

    @register_executor("mylib.double")
    def _double(node, inputs, attrs, device):
        return inputs[0] * attrs["factor"]

    (out,) = execute_ir(ir, {}, (torch.arange(3.0),))
    assert out.tolist() == [0.0, 2.0, 4.0]
