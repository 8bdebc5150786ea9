"""The modelab C++ ops (csrc/modelab_ops.cpp): eager parity, gradients, torch.compile, torch.export, the profiler,
the FX rewrite, and the custom_op mode through bench. One build per session (cached in .build/ across sessions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from engine.bench.run import BenchConfig, bench_mode
from engine.modes import MODES, get_mode
from engine.native import build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def ops() -> str:
    reason = build.custom_ops_missing("cpu")
    if reason:
        pytest.skip(f"cannot build the custom ops here: {reason}")
    from engine.native import ops as native_ops

    return native_ops.load()


def test_modes_are_registered():
    assert "custom_op" in MODES and "aoti" in MODES
    assert get_mode("custom_op").phases == ("infer", "train")
    assert get_mode("aoti").phases == ("infer",)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 256), (2, 3, 8), (1, 1), (0, 5)])
def test_bias_relu_matches_eager(ops, dtype, shape):
    torch.manual_seed(0)
    x, b = torch.randn(shape, dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    out = torch.ops.modelab.bias_relu(x, b)
    expected = torch.relu((x.float() + b.float())).to(dtype) if dtype == torch.bfloat16 else torch.relu(x + b)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_bias_relu_non_contiguous_and_nan(ops):
    x = torch.randn(8, 6).t()  # 6 x 8, not contiguous
    b = torch.randn(8)
    torch.testing.assert_close(torch.ops.modelab.bias_relu(x, b), torch.relu(x + b), rtol=0, atol=0)
    x = torch.tensor([[float("nan"), -1.0, 2.0]])
    out = torch.ops.modelab.bias_relu(x, torch.zeros(3))
    assert torch.isnan(out[0, 0]) and out[0, 1] == 0 and out[0, 2] == 2  # like torch.relu


def test_custom_add_matches_eager(ops):
    a, b = torch.randn(3, 70000), torch.randn(3, 70000)  # large enough to split across threads
    torch.testing.assert_close(torch.ops.modelab.custom_add(a, b), a + b, rtol=0, atol=0)
    ints = torch.arange(6).reshape(2, 3)
    assert torch.equal(torch.ops.modelab.custom_add(ints, ints), ints * 2)


def test_bad_arguments_raise_clearly(ops):
    with pytest.raises(RuntimeError, match="bias has 3 elements but x's last dimension is 4"):
        torch.ops.modelab.bias_relu(torch.randn(2, 4), torch.randn(3))
    with pytest.raises(RuntimeError, match="bias must be 1-D"):
        torch.ops.modelab.bias_relu(torch.randn(2, 4), torch.randn(1, 4))
    with pytest.raises(RuntimeError, match="shapes differ"):
        torch.ops.modelab.custom_add(torch.randn(2, 4), torch.randn(4, 2))


def test_gradients_match_finite_differences(ops):
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    x.data[x.data.abs() < 1e-3] = 0.5  # keep away from relu's kink, where finite differences disagree
    assert torch.autograd.gradcheck(torch.ops.modelab.bias_relu, (x, b))
    a2 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b2 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.modelab.custom_add, (a2, b2))


def test_gradients_match_eager(ops):
    x = torch.randn(6, 16, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    g = torch.randn(6, 16)
    torch.ops.modelab.bias_relu(x, b).backward(g)
    x_ref, b_ref = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.relu(x_ref + b_ref).backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(b.grad, b_ref.grad)


@pytest.mark.parametrize("name", ["bias_relu", "custom_add"])
def test_opcheck(ops, name):
    """torch.library.opcheck: schema, autograd registration, fake kernel, and AOT dispatch (dynamic shapes)."""
    op = getattr(torch.ops.modelab, name).default
    args = (torch.randn(3, 4, 8, requires_grad=True),
            torch.randn(8, requires_grad=True) if name == "bias_relu" else torch.randn(3, 4, 8, requires_grad=True))
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_torch_compile_fullgraph(ops):
    def f(x, w, b):
        return torch.ops.modelab.custom_add(torch.ops.modelab.bias_relu(x @ w, b), x @ w).sum()

    torch._dynamo.reset()
    x = torch.randn(4, 8)
    w, b = torch.randn(8, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    w_ref, b_ref = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    loss = torch.compile(f, fullgraph=True)(x, w, b)
    loss.backward()
    loss_ref = f(x, w_ref, b_ref)
    loss_ref.backward()
    torch.testing.assert_close(loss, loss_ref)
    torch.testing.assert_close(w.grad, w_ref.grad)
    torch.testing.assert_close(b.grad, b_ref.grad)


def test_torch_export(ops):
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.randn(8))

        def forward(self, x):
            return torch.ops.modelab.custom_add(torch.ops.modelab.bias_relu(x, self.bias), x)

    module = Block()
    x = torch.randn(4, 8)
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(module, (x,), dynamic_shapes=({0: batch},))
    code = ep.graph_module.code
    assert "torch.ops.modelab.bias_relu.default" in code and "torch.ops.modelab.custom_add.default" in code
    for rows in (4, 9):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(ep.module()(x), module(x), rtol=0, atol=0)


def test_profiler_names_the_op(ops):
    x, b = torch.randn(4, 256), torch.randn(256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ops.modelab.bias_relu(x, b)
        torch.ops.modelab.custom_add(x, x)
    names = {e.key for e in prof.key_averages()}
    assert {"modelab::bias_relu", "modelab::bias_relu_cpu_kernel", "modelab::custom_add_cpu_kernel"} <= names


class _FunctionalMLP(nn.Module):
    """Other spellings of ReLU, a Linear without bias, and a Linear whose output has two users."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8, bias=False)
        self.d = nn.Linear(8, 8)
        self.e = nn.Linear(8, 2)

    def forward(self, x):
        x = F.relu(self.a(x))
        x = self.b(x).relu()
        x = torch.relu(self.c(x))  # no bias: left alone
        y = self.d(x)
        return self.e(torch.relu(y) + y)  # two users: left alone


def test_rewrite_is_generic(ops):
    from engine.modes.custom_op import rewrite_linear_relu

    torch.manual_seed(0)
    model = _FunctionalMLP()
    gm = fx.symbolic_trace(model)
    assert rewrite_linear_relu(gm) == ["a", "b"]
    assert gm.code.count("torch.ops.modelab.bias_relu.default") == 2
    x = torch.randn(5, 6)
    torch.testing.assert_close(gm(x), model(x))


def test_mode_rewrites_house_price(ops):
    from engine.workloads.house_price import make_batch, make_model

    model = make_model()
    inputs, _ = make_batch(4, "cpu")
    prepared = get_mode("custom_op").prepare(model, inputs, False)
    code = prepared.artifacts["custom_op_graph.py"]
    assert code.count("torch.ops.modelab.bias_relu.default") == 2 and "fc3" in code
    assert "relu1" not in code and "relu2" not in code
    assert "fc1, fc2" in prepared.notes[0]
    table = prepared.artifacts["custom_op_graph_table.txt"]
    assert sum(line.split()[2:3] == ["bias_relu.default"] for line in table.splitlines()) == 2


def test_custom_op_mode_bench_matches_eager(ops, tmp_path):
    cfg = BenchConfig(mode="custom_op", batch_sizes=(4,), train_batch_sizes=(8,), warmup=1, iters=3,
                      artifacts_dir=str(tmp_path))
    result = bench_mode(cfg)
    assert {(s.phase, s.batch_size) for s in result.samples} == {("infer", 4), ("train", 8)}
    for s in result.samples:
        assert len(s.values) == 3 and all(v > 0 for v in s.values)
    for phase in ("infer", "train"):
        errs = [m.value for m in result.metrics if m.name == "max_abs_err" and m.phase == phase]
        assert len(errs) == 1 and errs[0] <= 1e-4
        assert any(m.name == "median" and m.phase == phase for m in result.metrics)
    assert {a.name for a in result.artifacts} == {"custom_op_graph.py", "custom_op_graph_table.txt"}
    assert "bias_relu" in Path(next(a.path for a in result.artifacts if a.name == "custom_op_graph.py")).read_text()


def test_missing_compiler_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    reason = build.custom_ops_missing("cpu")
    assert reason and "no C++ compiler found" in reason
    ok, why = get_mode("custom_op").available("cpu")
    assert not ok and "install g++" in why
    with pytest.raises(build.NativeBuildError, match="no C\\+\\+ compiler found"):
        build.build_aoti_runner()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_kernels_match_eager(ops):
    if not build._loaded_ops_has_cuda():
        pytest.skip(f"the ops were built without CUDA kernels: {build.nvcc_missing()}")
    x, b = torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda")
    torch.testing.assert_close(torch.ops.modelab.bias_relu(x, b), torch.relu(x + b), rtol=0, atol=0)
    torch.testing.assert_close(torch.ops.modelab.custom_add(x, x), x + x, rtol=0, atol=0)
    xh, bh = x.half(), b.half()
    torch.testing.assert_close(torch.ops.modelab.bias_relu(xh, bh), torch.relu(xh + bh))
    result = bench_mode(BenchConfig(mode="custom_op", device="cuda", batch_sizes=(4,), train_batch_sizes=(8,),
                                    warmup=1, iters=3))
    assert {(s.phase, s.batch_size) for s in result.samples} == {("infer", 4), ("train", 8)}
