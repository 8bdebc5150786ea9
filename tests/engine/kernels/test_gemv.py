"""The Triton GEMV of the LLM lab's `triton-gemv` mode against float64 F.linear (interpreted on CPU; see conftest),
the custom op's fallback for several rows, and a Llama decoder whose linears were swapped onto it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from engine.kernels.triton import gemv as gemv_mod  # noqa: E402
from engine.kernels.triton._common import is_interpreted  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
if DEVICE == "cpu" and not is_interpreted(gemv_mod._gemv_kernel):
    pytest.skip("the GEMV kernel was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

# Relative L2 error of the output: fp32 accumulates in fp32 (only summation order differs); bf16 stores rounded
# outputs (2^-9 per element).
TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double().cpu() - ref.cpu()).norm() / ref.cpu().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(64, 256), (37, 300), (5, 1000), (130, 129)])  # ragged N and K tails included
def test_gemv_matches_float64_linear(n: int, k: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(n * 1000 + k)
    x = torch.randn(1, k, generator=gen).to(DEVICE, dtype)
    w = torch.randn(n, k, generator=gen).to(DEVICE, dtype)
    y = gemv_mod.gemv(x, w)
    assert y.shape == (1, n) and y.dtype == dtype
    assert rel_err(y, gemv_mod._reference(x, w)) < TOL[dtype]
    assert gemv_mod.gemv(x[0], w).shape == (n,)


def test_gemv_reads_a_strided_weight_and_refuses_bad_shapes() -> None:
    x = torch.randn(1, 64).to(DEVICE)
    w = torch.randn(64, 40).to(DEVICE).t()  # (40, 64), stride (1, 40): copied to rows first
    assert rel_err(gemv_mod.gemv(x, w), gemv_mod._reference(x, w)) < TOL[torch.float32]
    with pytest.raises(ValueError, match="one row"):
        gemv_mod.gemv(torch.randn(2, 64).to(DEVICE), w)
    with pytest.raises(ValueError, match="does not match"):
        gemv_mod.gemv(torch.randn(1, 63).to(DEVICE), w)


def test_the_op_takes_f_linear_for_several_rows_and_compiles_without_a_graph_break() -> None:
    x, w = torch.randn(3, 1, 32).to(DEVICE), torch.randn(16, 32).to(DEVICE)
    assert torch.equal(gemv_mod.linear(x, w), F.linear(x, w))
    compiled = torch.compile(lambda a, b: gemv_mod.linear(a, b) * 2, fullgraph=True, backend="eager")
    assert rel_err(compiled(x[0], w), 2 * gemv_mod._reference(x[0], w)) < TOL[torch.float32]


def test_a_decoder_with_swapped_linears_decodes_like_the_original() -> None:
    from engine.llm.generate import Decoder, generate, step_fn
    from engine.workloads.llama import build_model, preset

    cfg = preset("tiny")
    model = build_model(cfg, DEVICE, torch.float32, seed=3).eval()
    model.setup_cache(1, 24)
    prompt = torch.randint(0, cfg.vocab, (1, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        ref = generate(step_fn(model), Decoder(step_fn(model)), prompt, 4)
        linears = sum(type(m) is torch.nn.Linear for m in model.modules())
        assert gemv_mod.swap_linears(model) == linears > 0
        assert not any(type(m) is torch.nn.Linear for m in model.modules())
        got = generate(step_fn(model), Decoder(step_fn(model)), prompt, 4)
    assert torch.equal(got.tokens, ref.tokens)
    for a, b in zip(got.logits, ref.logits):
        assert rel_err(a, b.double()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(64, 256), (37, 300)])
def test_norm_and_residual_inside_the_gemv(n: int, k: int, dtype: torch.dtype) -> None:
    """RMSNorm in the prologue (rstd from the same pass over x) and a residual in the epilogue, against float64."""
    gen = torch.Generator().manual_seed(7 * n + k)
    x = (3 * torch.randn(1, k, generator=gen)).to(DEVICE, dtype)  # RMS far from 1: a skipped norm would show
    g = (1 + 0.5 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    w = torch.randn(n, k, generator=gen).to(DEVICE, dtype)
    r = torch.randn(1, n, generator=gen).to(DEVICE, dtype)
    eps = 1e-5
    normed = gemv_mod.rms_norm(x.double(), g.double(), eps)
    assert rel_err(gemv_mod.gemv(x, w, norm_weight=g, eps=eps), F.linear(normed, w.double())) < TOL[dtype]
    assert rel_err(gemv_mod.gemv(x, w, residual=r), r.double() + gemv_mod._reference(x, w)) < TOL[dtype]
    both = gemv_mod.gemv(x, w, norm_weight=g, eps=eps, residual=r)
    assert rel_err(both, r.double() + F.linear(normed, w.double())) < TOL[dtype]
    # the custom ops: the fused kernel for one row, the unfused ops for several, the same values either way
    assert rel_err(gemv_mod.norm_linear(x, g, eps, w), F.linear(normed, w.double())) < TOL[dtype]
    assert rel_err(gemv_mod.linear_add(x, w, r), r.double() + gemv_mod._reference(x, w)) < TOL[dtype]
    rows = x.expand(3, k).contiguous()
    assert torch.equal(gemv_mod.norm_linear(rows, g, eps, w), F.linear(gemv_mod.rms_norm(rows, g, eps), w))
    with pytest.raises(ValueError, match="norm weight"):
        gemv_mod.gemv(x, w, norm_weight=g[:-1], eps=eps)
    with pytest.raises(ValueError, match="residual"):
        gemv_mod.gemv(x, w, residual=r[:, :-1])


def test_a_swapped_linear_sends_only_one_row_through_the_custom_op(monkeypatch) -> None:
    """Several rows (prefill) take plain F.linear — visible to Inductor rather than inside an opaque custom op —
    and one row goes through modelab::gemv_linear."""
    layer = torch.nn.Linear(32, 16, bias=True).to(DEVICE)
    x = torch.randn(2, 5, 32, device=DEVICE)
    want = layer(x)
    assert gemv_mod.swap_linears(layer) == 1 and type(layer) is gemv_mod.GemvLinear
    calls = []
    real = gemv_mod.linear
    monkeypatch.setattr(gemv_mod, "linear", lambda *a: (calls.append(a[0].shape), real(*a))[1])
    with torch.no_grad():
        assert torch.equal(layer(x), want) and calls == []
        row = x[:1, :1]
        assert rel_err(layer(row), want[:1, :1].double()) < 1e-5 and calls == [row.shape]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(64, 256), (38, 300)])
def test_norm_and_swiglu_inside_the_gemv(n: int, k: int, dtype: torch.dtype) -> None:
    """The gate_up product of W = [gate; up] with the RMSNorm in its prologue and silu(gate) · up of each row pair
    in its epilogue (half as many outputs), against float64; 19 outputs: the last program's pairs partly masked."""
    gen = torch.Generator().manual_seed(11 * n + k)
    x = (2 * torch.randn(1, k, generator=gen)).to(DEVICE, dtype)
    g = (1 + 0.5 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    w = torch.randn(n, k, generator=gen).to(DEVICE, dtype)
    xd = x.double()
    gate, up = F.linear(xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * g.double(),
                        w.double()).chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = gemv_mod.gemv(x, w, norm_weight=g, eps=1e-5, glu=True)
    assert got.shape == (1, n // 2) and rel_err(got, want) < TOL[dtype] * 4
    assert rel_err(gemv_mod.norm_swiglu(x, g, 1e-5, w), want) < TOL[dtype] * 4
    # several rows: the unfused ops, the same values
    rows = x.expand(3, k).contiguous()
    g3, u3 = F.linear(gemv_mod.rms_norm(rows, g, 1e-5), w).chunk(2, dim=-1)
    assert torch.equal(gemv_mod.norm_swiglu(rows, g, 1e-5, w), F.silu(g3) * u3)
    with pytest.raises(ValueError, match="even number of rows"):
        gemv_mod.gemv(x, w[:-1], glu=True)
    with pytest.raises(ValueError, match="no residual"):
        gemv_mod.gemv(x, w, residual=torch.zeros(1, n, device=DEVICE, dtype=dtype), glu=True)


def test_a_decoder_with_fused_ops_decodes_like_the_original() -> None:
    """set_fused_ops: norms and residual adds inside the decode step's GEMVs (prefill unchanged), compiled without a
    graph break; same tokens, logits within fp32 summation-order error; refused before fuse_projections."""
    from engine.llm.generate import Decoder, generate, step_fn
    from engine.workloads.llama import build_model, preset

    cfg = preset("tiny")
    model = build_model(cfg, DEVICE, torch.float32, seed=5).eval()
    model.setup_cache(1, 24)
    prompt = torch.randint(0, cfg.vocab, (1, 8), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with pytest.raises(RuntimeError, match="fuse_projections"):
        model.set_fused_ops(gemv_mod.FusedDecodeOps)
    with torch.no_grad():
        model.fuse_projections()
        ref = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
        model.set_fused_ops(gemv_mod.FusedDecodeOps)
        generate(step_fn(model), Decoder(step_fn(model)), prompt, 1)  # on CUDA the choices are timed here, once
        calls = []
        real = gemv_mod.gemv
        gemv_mod.gemv = lambda *a, **kw: (calls.append(sorted(kw)), real(*a, **kw))[1]
        try:
            got = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
        finally:
            gemv_mod.gemv = real
        compiled = torch.compile(step_fn(model), fullgraph=True, backend="eager")
        graphed = generate(step_fn(model), Decoder(compiled), prompt, 5)
        model.set_fused_ops(None)
        back = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
    # per decode step: qkv with its norm and o with its residual per layer, gate_up with its norm and the SwiGLU,
    # down with the residual, and lm_head with the norm
    per_step = [["eps", "norm_weight"], ["residual"], ["eps", "glu", "norm_weight"], ["residual"]] * cfg.layers
    assert calls[:len(per_step) + 1] == per_step + [["eps", "norm_weight"]]
    for out in (got, graphed, back):
        assert torch.equal(out.tokens, ref.tokens)
        for a, b in zip(out.logits, ref.logits):
            assert rel_err(a, b.double()) < 1e-5


@pytest.mark.skipif(DEVICE != "cuda", reason="deferred tuning times kernels: CUDA only")
def test_deferred_tuning_runs_stand_ins_then_tunes_what_they_stood_in_for() -> None:
    """While deferred, a new shape runs the fixed tile (correctly) and is remembered; compile_pending compiles the
    candidates, tune_pending autotunes and times the cuBLAS-or-Triton choice, and the next call takes the tuned path."""
    n, k = 96, 320  # a shape no other test uses: nothing cached for it in this process
    x = torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16)
    r = torch.randn(1, n, device=DEVICE, dtype=torch.bfloat16)
    ref = (x.double() @ w.double().T + r.double())
    gemv_mod.defer_tuning(True)
    try:
        got = gemv_mod.linear_add(x, w, r)
        assert rel_err(got, ref) < TOL[torch.bfloat16]
        key = (n, k, torch.bfloat16, str(x.device), (False, True, False))  # the residual fused
        assert key in gemv_mod._PENDING_CHOICES and key not in gemv_mod._CHOICES
        assert any(s[:2] == (n, k) for s in gemv_mod._PENDING_TILES)
        assert gemv_mod.compile_pending() == len(gemv_mod.TILES) * sum(s[:2] == (n, k)
                                                                       for s in gemv_mod._PENDING_TILES)
        done = gemv_mod.tune_pending()
    finally:
        gemv_mod.defer_tuning(False)
    assert f"tiles {n}×{k} +residual" in done and any(d.startswith(f"choice {n}×{k} +residual: ") for d in done)
    assert not gemv_mod._PENDING_TILES and not gemv_mod._PENDING_CHOICES
    assert gemv_mod._CHOICES[key]["triton_us"] > 0 and gemv_mod._CHOICES[key]["cublas_us"] > 0
    assert rel_err(gemv_mod.linear_add(x, w, r), ref) < TOL[torch.bfloat16]


@pytest.mark.skipif(DEVICE != "cuda", reason="the cuBLAS-or-Triton choice is made on CUDA only")
def test_a_fused_op_weighs_cublas_with_its_unfused_ops_per_shape_and_fusion(monkeypatch) -> None:
    """The choice is kept per (shape, fusion) and timed as the op would run: cuBLAS with the norm and SwiGLU one by
    one against the fused GEMV (a 1B step whose gate_up took cuBLAS on a tie of the bare products ran 40 % slower).
    Where cuBLAS wins, the op's output is the unfused ops'; the bare product of the same shape is its own choice."""
    n, k = 98, 352  # a shape no other test uses
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, k, generator=gen).to(DEVICE, torch.bfloat16)
    g = (1 + 0.5 * torch.randn(k, generator=gen)).to(DEVICE, torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(DEVICE, torch.bfloat16)
    timed = []

    def fake_time(x_, w_, norm_weight=None, eps=1e-5, residual=None, glu=False, l2_multiple=3.0):
        timed.append((norm_weight is not None, residual is not None, glu))
        return {"cublas_us": 1.0, "triton_us": 2.0} if glu else {"cublas_us": 2.0, "triton_us": 1.0}

    monkeypatch.setattr(gemv_mod, "time_choice", fake_time)
    monkeypatch.setattr(gemv_mod, "_CHOICES", {})
    got = gemv_mod.norm_swiglu(x, g, 1e-5, w)
    assert timed == [(True, False, True)]
    assert torch.equal(got, gemv_mod._unfused(x, w, g, 1e-5, glu=True))  # cuBLAS and the ops, as timed
    assert rel_err(gemv_mod.linear(x, w), gemv_mod._reference(x, w)) < TOL[torch.bfloat16]
    assert timed == [(True, False, True), (False, False, False)]
    picked = {c["fusion"]: c["impl"] for c in gemv_mod.choices()}
    assert picked == {"+norm +glu": "cublas", "": "triton"}
    gemv_mod.norm_swiglu(x, g, 1e-5, w)
    assert len(timed) == 2  # once per (shape, fusion) and process
