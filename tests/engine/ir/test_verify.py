"""The verifier: ok for a faithful IR, and it catches a perturbed weight, a broken IR and oversized presets."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from engine.ir import WeightLoadError, verify_ir, zoo
from engine.ir.verify import model_weights


@pytest.mark.parametrize("name", ["llama", "multi_io", "skip"])
def test_verify_ok(zoo_irs, real_models, name: str) -> None:
    model, inputs = real_models[name]
    report = verify_ir(zoo_irs[name], model, inputs)
    assert report.ok, report.summary()
    assert len(report.outputs) == len(zoo_irs[name].graph_outputs)
    assert all(o.max_abs_err <= 1e-4 for o in report.outputs)
    assert "OK" in report.summary()


def test_perturbed_weight_is_caught(zoo_irs, real_models) -> None:
    model, inputs = real_models["llama"]
    weights = model_weights(model)
    weights["layers.1.mlp.down_proj.weight"] = weights["layers.1.mlp.down_proj.weight"] + 1e-2
    report = verify_ir(zoo_irs["llama"], model, inputs, weights=weights)
    assert not report.ok
    assert report.outputs[0].max_abs_err > 1e-3 and not math.isnan(report.outputs[0].max_rel_err)
    assert "MISMATCH" in report.summary()


def test_broken_ir_is_reported_not_raised(zoo_irs, real_models) -> None:
    ir = copy.deepcopy(zoo_irs["house_price"])
    ir.nodes[1].op_type = "aten.no_such_op.default"
    model, inputs = real_models["house_price"]
    report = verify_ir(ir, model, inputs)
    assert not report.ok and "ExecutionError" in report.error and ir.nodes[1].name in report.error


def test_tolerances_are_applied(zoo_irs, real_models) -> None:
    model, inputs = real_models["house_price"]
    weights = model_weights(model)
    weights["fc3.bias"] = weights["fc3.bias"] + 1e-3
    assert not verify_ir(zoo_irs["house_price"], model, inputs, weights=weights).ok
    assert verify_ir(zoo_irs["house_price"], model, inputs, rtol=0, atol=1e-2, weights=weights).ok


def test_large_presets_are_refused_before_allocating() -> None:
    with pytest.raises(WeightLoadError, match=r"llama/7B has 6\.74 B parameters.*smaller preset \(tiny, small\)"):
        zoo.build("llama", "7B", device="cpu")
    zoo.check_verify_size("llama", "small")  # fine


def test_real_build_is_deterministic() -> None:
    a, xa = zoo.build("attention", "tiny", device="cpu", seed=3)
    b, xb = zoo.build("attention", "tiny", device="cpu", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(xa[0], xb[0])


def test_nan_outputs_never_verify_even_where_model_and_ir_agree(zoo_irs, real_models) -> None:
    """allclose(equal_nan=True) called a NaN in both the model and its IR a match; a NaN or inf is never one."""
    model, inputs = real_models["house_price"]
    poisoned = copy.deepcopy(model)
    with torch.no_grad():
        next(poisoned.parameters()).fill_(float("nan"))
    both = verify_ir(zoo_irs["house_price"], poisoned, inputs)  # the IR runs on the poisoned model's weights too
    assert not both.ok and "the IR's output has NaN or inf" in both.outputs[0].message
    assert "the model's output has NaN or inf" in both.outputs[0].message
    weights = {k: torch.full_like(v, float("inf")) if v.is_floating_point() else v
               for k, v in model_weights(model).items()}
    ir_only = verify_ir(zoo_irs["house_price"], model, inputs, weights=weights)
    assert not ir_only.ok and "the IR's output has NaN or inf" in ir_only.outputs[0].message
    assert "model's" not in ir_only.outputs[0].message
