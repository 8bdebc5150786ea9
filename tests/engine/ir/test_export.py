"""Meta-device export: the checks, the IR's structure (ops, attrs, weights, multi-output ops), each limit's error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.ir import ConversionError, ExportError, extract_ir, zoo
from engine.workloads.house_price import HousePriceNN


def meta_input(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def test_house_price_ir_structure(zoo_irs) -> None:
    ir = zoo_irs["house_price"]
    assert [n.op_type for n in ir.nodes] == ["aten.linear.default", "aten.relu.default", "aten.linear.default",
                                             "aten.relu.default", "aten.linear.default"]
    assert [t.shape for t in ir.graph_inputs] == [[64, 5]]
    assert ir.graph_inputs[0].dtype == "float32"
    # graph placeholders map to state_dict keys, all of them
    assert sorted(ir.weight_name_mapping.values()) == sorted(HousePriceNN().state_dict())
    first = ir.nodes[0]
    assert first.inputs[0] == ir.graph_inputs[0].name
    assert ir.weight_name_mapping[first.inputs[1]] == "fc1.weight"
    assert first.input_args == {"input": 0, "weight": 1, "bias": 2}
    assert first.outputs[0].shape == [64, 256] and first.outputs[0].producer_node == first.name
    assert first.module_path == "fc1" and ir.module_types["fc1"] == "Linear"
    assert ir.tensors()[ir.graph_outputs[0]].shape == [64, 1]


def test_attrs_come_from_the_op_schema(zoo_irs) -> None:
    ir = zoo_irs["attention"]
    ln = next(n for n in ir.nodes if n.op_type == "aten.layer_norm.default")
    assert ln.attrs["normalized_shape"] == [32]
    assert ln.attrs["eps"] == pytest.approx(1e-5)
    assert isinstance(ln.attrs["cudnn_enable"], bool)
    assert set(ln.input_args) == {"input", "weight", "bias"}
    softmax = next(n for n in ir.nodes if n.op_type.startswith("aten.softmax"))
    assert softmax.attrs == {"dim": -1, "dtype": None}  # dtype: not passed, its schema default filled in


def test_buffers_and_shared_weights(zoo_irs) -> None:
    skip = zoo_irs["skip"]
    targets = set(skip.weight_name_mapping.values())
    assert "blocks.0.bn1.running_mean" in targets and "blocks.0.bn1.running_var" in targets
    assert skip.weight_kinds[next(k for k, v in skip.weight_name_mapping.items() if v == "blocks.0.bn1.running_mean")] \
        == "buffer"
    llama = zoo_irs["llama"]
    rope = [k for k, v in llama.weight_name_mapping.items() if v == "rope_cos"]
    assert rope and llama.weight_kinds[rope[0]] == "buffer (non-persistent)"
    tied = zoo_irs["shared_weights"]
    # embed.weight and head.weight are one tensor: one placeholder, used by the embedding and the head
    users = [n for n in tied.nodes if any(tied.weight_name_mapping.get(i) in ("embed.weight", "head.weight")
                                          for i in n.inputs)]
    assert {n.op_type for n in users} == {"aten.embedding.default", "aten.linear.default"}
    assert len({i for n in users for i in n.inputs if i in tied.weights}) == 1


def test_multiple_inputs_and_outputs(zoo_irs) -> None:
    ir = zoo_irs["multi_io"]
    assert [t.shape for t in ir.graph_inputs] == [[4, 8], [4, 7, 6]]
    shapes = [ir.tensors()[o].shape for o in ir.graph_outputs]
    assert shapes == [[4, 5], [4, 1]]


def test_multi_output_ops_have_no_getitem_nodes(zoo_irs) -> None:
    ir = zoo_irs["llama"]
    assert not any("getitem" in n.op_type for n in ir.nodes)
    chunk = next(n for n in ir.nodes if len(n.outputs) > 1)
    assert [o.producer_output_idx for o in chunk.outputs] == list(range(len(chunk.outputs)))
    readers = {i for n in ir.nodes for i in n.inputs}
    assert all(o.name in readers for o in chunk.outputs)


def test_module_paths_and_ops(zoo_irs) -> None:
    ir = zoo_irs["llama"]
    assert "layers.1.self_attn" in ir.module_types and ir.module_types["layers.1"] == "DecoderLayer"
    q = next(n for n in ir.nodes if n.module_path == "layers.0.self_attn.q_proj")
    assert ir.module_stack(q) == ["layers.0", "layers.0.self_attn", "layers.0.self_attn.q_proj"]
    assert "aten.scaled_dot_product_attention.default" in ir.op_histogram()


def test_a_large_preset_exports_without_weight_memory() -> None:
    model, inputs = zoo.build("llama", "small", device="meta")
    ir = extract_ir(model, inputs)
    assert ir.parameter_count() == sum(p.numel() for p in model.parameters())
    assert all(p.device.type == "meta" for p in model.parameters())


# -- meta checks ----------------------------------------------------------------------------------------------------
def test_parameter_off_meta_is_named() -> None:
    with pytest.raises(ExportError, match=r"parameter 'fc1\.weight' is on cpu, not meta.*torch\.device\('meta'\)"):
        extract_ir(HousePriceNN(), (meta_input(2, 5),))


def test_buffer_off_meta_is_named() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    model[1].running_mean = torch.zeros(4)
    with pytest.raises(ExportError, match=r"buffer '1\.running_mean' is on cpu"):
        extract_ir(model, (meta_input(2, 4),))


def test_tensor_attribute_off_meta_is_named() -> None:
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.ones(4)

        def forward(self, x):
            return x * self.scale

    with pytest.raises(ExportError, match=r"tensor attribute 'scale'.*register it as a buffer"):
        extract_ir(Scaled(), (meta_input(2, 4),))


def test_input_off_meta_or_not_a_tensor() -> None:
    with torch.device("meta"):
        model = HousePriceNN()
    with pytest.raises(ExportError, match=r"input example_inputs\[0\] is on cpu"):
        extract_ir(model, (torch.zeros(2, 5),))
    with pytest.raises(ExportError, match=r"example_inputs\[1\] is a int, not a tensor"):
        extract_ir(model, (meta_input(2, 5), 3))


# -- limits: each a clear error naming the cause and the fix --------------------------------------------------------
class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y


class TensorInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])


class DataDependentSize(nn.Module):
    def forward(self, x):
        return torch.nonzero(x)


def _meta(cls):
    with torch.device("meta"):
        return cls().eval()


def test_data_dependent_control_flow() -> None:
    with pytest.raises(ExportError, match=r"data-dependent control flow.*Fix:.*torch\.cond"):
        extract_ir(_meta(DataDependent), (meta_input(2, 4),))


def test_torch_tensor_inside_forward() -> None:
    with pytest.raises(ExportError, match=r"torch\.tensor\(\.\.\.\).*Fix: create it with `device=x\.device`"):
        extract_ir(_meta(TensorInForward), (meta_input(2, 4),))


def test_dynamic_shapes() -> None:
    dims = ({0: torch.export.Dim("batch")},)
    with pytest.raises(ExportError, match=r"dynamic shapes are not supported.*Fix: extract without dynamic_shapes"):
        extract_ir(_meta(HousePriceNN), (meta_input(2, 5),), dynamic_shapes=dims)


def test_data_dependent_output_size() -> None:
    with pytest.raises((ConversionError, ExportError), match=r"(symbolic shape|data-dependent)"):
        extract_ir(DataDependentSize(), (meta_input(3, 4),))


def test_training_mode_buffer_mutation_is_represented() -> None:
    # A training-mode BatchNorm updates its running statistics in forward: recorded as mutations, not refused.
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    ir = extract_ir(model, (meta_input(2, 4),))
    written = {ir.weight_name_mapping[m.target] for m in ir.mutations}
    assert written == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert {m.kind for m in ir.mutations} == {"buffer"}
