"""The hand-written modes — cuda-graph, triton, cuda — against eager.

Without a GPU: triton runs under Triton's interpreter (this module sets TRITON_INTERPRET=1 before triton is
imported; small batches, the interpreter is slow); cuda-graph and cuda are unavailable and say why. With a GPU: every
mode's prediction, loss and weights after several Adam steps match eager, and a new batch size captures a new graph
that carries on from the same weights and Adam state.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton chooses its interpreter when triton and each kernel are imported: set it before anything imports them
    # (as tests/engine/kernels/conftest.py does for the other Triton kernels).
    os.environ["TRITON_INTERPRET"] = "1"

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from engine.bench.run import BenchConfig, bench_mode  # noqa: E402
from engine.modes import Prepared, get_mode  # noqa: E402
from engine.modes.mlp_chain import mlp_chain  # noqa: E402
from engine.workloads.house_price import make_batch, make_model  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
pytestmark = pytest.mark.gpu  # the triton mode compiled on a GPU, interpreted without one; the other modes need one
TOL = dict(rtol=1e-4, atol=1e-4)  # the house-price workload's tolerance; no mode needs a looser one


@pytest.fixture
def interpreter() -> None:
    """Triton's interpreter is on (TRITON_INTERPRET=1 was set above, before triton and the kernels were imported)."""
    pytest.importorskip("triton")
    if HAS_CUDA:
        pytest.skip("the interpreter runs are for machines without a GPU; the GPU tests cover triton there")
    from engine.kernels.triton import mlp

    if not (mlp.interpreted() and mlp.interpreter_consistent()):
        pytest.skip("triton or its kernels were imported before TRITON_INTERPRET=1 was set")


def eager_run(base: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[nn.Module, list[float]]:
    """bench's reference step (zero_grad → forward → MSE → backward → Adam(lr=1e-3)) over the batches."""
    model = copy.deepcopy(base).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for x, t in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def mode_run(mode: str, base: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
             ) -> tuple[nn.Module, list[float], Prepared]:
    model = copy.deepcopy(base).train()
    prepared = get_mode(mode).prepare(model, (batches[0][0],), True)
    assert prepared.train_step is not None
    losses = [prepared.train_step((x,), t).item() for x, t in batches]
    return model, losses, prepared


def assert_same_training(mode: str, device: str, sizes: list[int]) -> Prepared:
    base = make_model().to(device)
    batches = [(inputs[0], target) for inputs, target in (make_batch(b, device) for b in sizes)]
    ref, ref_losses = eager_run(base, batches)
    model, losses, prepared = mode_run(mode, base, batches)
    assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-4)
    moved = 0.0
    for (name, p), p_ref, p0 in zip(model.named_parameters(), ref.parameters(), base.parameters()):
        torch.testing.assert_close(p.detach(), p_ref.detach(), **TOL, msg=lambda m, n=name: f"{mode} {n}: {m}")
        moved = max(moved, float((p.detach() - p0.detach()).abs().max()))
    assert moved > 1e-4  # the steps really changed the weights (Adam moves each by ~lr per step)
    return prepared


def assert_same_prediction(mode: str, device: str, sizes: list[int]) -> Prepared:
    base = make_model().to(device).eval()
    model = copy.deepcopy(base)
    first = make_batch(sizes[0], device)[0]
    with torch.no_grad():
        prepared = get_mode(mode).prepare(model, first, False)
        for b in sizes:
            (x,), _ = make_batch(b, device)
            x = x + 0.01 * b  # different values per size, so a stale static input would show
            torch.testing.assert_close(prepared.fn(x).clone(), base(x), **TOL)
    return prepared


# ---------------------------------------------------------------- CPU: triton interpreted, the others unavailable


def test_triton_matches_eager_interpreted(interpreter):
    assert get_mode("triton").available("cpu") == (True, "")
    assert_same_prediction("triton", "cpu", [3])
    prepared = assert_same_training("triton", "cpu", [8, 8, 8])
    with pytest.raises(RuntimeError, match="owns the whole training step"):
        prepared.fn(make_batch(8, "cpu")[0][0])


def test_triton_bench_checks_against_eager_interpreted(interpreter):
    result = bench_mode(BenchConfig(mode="triton", batch_sizes=(2,), train_batch_sizes=(8,), warmup=0, iters=1))
    errors = {(m.phase, m.batch_size): m.value for m in result.metrics if m.name == "max_abs_err"}
    assert set(errors) == {("infer", 2), ("train", 8)}
    assert all(0 <= e <= 1e-4 for e in errors.values())
    assert any("interpreter" in n for n in result.notes)


def test_triton_needs_the_interpreter_on_cpu(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok, reason = get_mode("triton").available("cpu")
    assert not ok and "TRITON_INTERPRET=1" in reason and "GPU" in reason


@pytest.mark.skipif(HAS_CUDA, reason="checks the reasons given where there is no GPU")
@pytest.mark.parametrize("mode, why", [("cuda-graph", "CUDA graphs capture and replay GPU kernels"),
                                       ("cuda", "hand-written CUDA kernels need a CUDA device")])
def test_gpu_modes_say_why_they_skip_on_cpu(mode, why):
    ok, reason = get_mode(mode).available("cpu")
    assert not ok and why in reason
    ok, reason = get_mode(mode).available("cuda")
    assert not ok and "no CUDA device is visible" in reason
    with pytest.raises(RuntimeError, match=f"mode {mode} is not available on cpu: .*"):
        bench_mode(BenchConfig(mode=mode, batch_sizes=(2,), train_batch_sizes=(2,), iters=1))


def test_kernel_modes_refuse_models_they_cannot_run():
    class Skip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(5, 8), nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            return self.b(h + h)

    assert [lin.out_features for lin in mlp_chain(make_model(), "triton").linears] == [256, 256, 1]
    with pytest.raises(ValueError, match="where a Linear with bias belongs"):
        mlp_chain(Skip(), "triton")
    with pytest.raises(ValueError, match="the last Linear has 2 outputs"):
        mlp_chain(nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2)), "cuda")
    with pytest.raises(ValueError, match="where a ReLU belongs"):
        mlp_chain(nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1)), "cuda")


# ---------------------------------------------------------------- GPU


@needs_cuda
@pytest.mark.parametrize("mode", ["cuda-graph", "triton", "cuda"])
def test_gpu_mode_matches_eager(mode):
    assert get_mode(mode).available("cuda") == (True, "")
    assert_same_prediction(mode, "cuda", [1, 64, 1024, 64])
    assert_same_training(mode, "cuda", [64] * 5)


@needs_cuda
@pytest.mark.parametrize("mode", ["cuda-graph", "triton", "cuda"])
def test_new_batch_size_recaptures_and_carries_on(mode):
    prepared = assert_same_training(mode, "cuda", [8, 8, 16, 16, 8, 200])
    runner = getattr(prepared.train_step, "__self__", None)
    if mode != "cuda":  # graph modes: one capture per batch size, reused when a size comes back
        assert runner is not None and runner.captures == 3
    prepared = assert_same_prediction(mode, "cuda", [4, 8, 4])
    if mode != "cuda":
        assert prepared.fn.__self__.captures == 2


@needs_cuda
def test_graph_modes_feed_new_data_and_leave_callers_tensors_alone():
    """Other tensors, and the same tensor changed in place, reach the graph; the caller's tensors are never written."""
    base = make_model().cuda()
    (x,), t = make_batch(32, "cuda")
    for mode in ("cuda-graph", "triton", "cuda"):
        xs, ts = x.clone(), t.clone()
        mine = xs.clone()
        steps = [(xs, ts), (xs.flip(0), ts.flip(0)), (xs * 0.5, ts), (mine, ts), (mine, ts), (mine, ts)]
        batches = []  # what each step really saw, for the eager reference
        prepared = get_mode(mode).prepare(copy.deepcopy(base).train(), (xs,), True)
        losses = []
        for i, (xb, tb) in enumerate(steps):
            if i == 5:
                mine.add_(0.25)  # in place after its last use: the same tensor object, new values
            batches.append((xb.clone(), tb.clone()))
            losses.append(prepared.train_step((xb,), tb).item())
        _, ref_losses = eager_run(base, batches)
        assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-4), mode
        torch.testing.assert_close(xs, x, rtol=0, atol=0)
        torch.testing.assert_close(ts, t, rtol=0, atol=0)


def test_training_command_runs_a_mode_that_owns_its_step(tmp_path) -> None:
    """`engine train --mode triton` (interpreted here) trains through the mode's own fused step and lowers the loss;
    another learning rate is refused with the reason."""
    import os

    import pytest

    from engine.housing.train import TrainConfig, train_model
    from engine.workloads.housing_data import generate_housing

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the triton mode runs on CPU only under TRITON_INTERPRET=1")
    csv = tmp_path / "small.csv"
    generate_housing(200, seed=3).to_csv(csv, index=False)
    result, path = train_model(TrainConfig(mode="triton", epochs=2, batch_size=64, csv=str(csv),
                                           models_dir=str(tmp_path / "models"), db=str(tmp_path / "r.duckdb")))
    losses = [m.value for m in result.metrics if m.name in ("final_train_loss",)]
    steps = [s for s in result.samples if s.phase == "loss"][0].values
    assert path.exists() and len(steps) >= 4 and steps[-1] < steps[0] and losses
    with pytest.raises(ValueError, match="lr=0.01 is not supported"):
        train_model(TrainConfig(mode="triton", epochs=1, lr=1e-2, csv=str(csv), models_dir=str(tmp_path / "m2")))
