"""The bf16 rows kernel (engine.kernels.triton.gemv_rows: a few rows × a 16-bit weight on the tensor cores, with the
decode step's RMSNorm prologue, SwiGLU and residual epilogues) against float64 — interpreted on CPU (see conftest),
compiled on a GPU — at ragged shapes (K not a multiple of the tile, N not of the tile, rows padded to 16, 32 or 64);
its refusals; the rule that sends a fused decode step's rows to it; and its sm_90 build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from engine.kernels import choice  # noqa: E402
from engine.kernels.triton import gemv_rows as gr  # noqa: E402
from engine.kernels.triton._common import is_interpreted  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
if DEVICE == "cpu" and not is_interpreted(gr._rows_kernel):
    pytest.skip("the rows kernel was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

# The interpreter mishandles bf16 dot operands, so on a CPU the 16-bit case is fp16; on a GPU the decode step's bf16.
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
SHAPES = [(2, 38, 300), (3, 130, 129), (16, 16, 64), (17, 40, 100), (33, 6, 65)]  # (rows, N, K)


def _inputs(rows: int, n: int, k: int, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, 1, k, generator=gen).to(DEVICE, dtype)  # (B, 1, K), as the decode step passes it
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)
    g = (1 + 0.1 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    r = torch.randn(rows, 1, n, generator=gen).to(DEVICE, dtype)
    return x, w, g, r


def _reference(x, w, g=None, eps=1e-5, r=None, glu=False):  # type: ignore[no-untyped-def]
    x, w = x.double().cpu(), w.double().cpu()
    if g is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g.double().cpu()
    y = F.linear(x, w)
    if glu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return y if r is None else y + r.double().cpu()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double().cpu() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float32, HALF], ids=["fp32", "16-bit"])
@pytest.mark.parametrize("rows, n, k", SHAPES)
@pytest.mark.parametrize("fusion", ["plain", "norm", "norm+glu", "residual"])
def test_rows_match_float64(rows: int, n: int, k: int, dtype: torch.dtype, fusion: str) -> None:
    x, w, g, r = _inputs(rows, n, k, dtype)
    kw = {"plain": {}, "norm": {"norm_weight": g, "eps": 1e-5}, "norm+glu": {"norm_weight": g, "eps": 1e-5,
                                                                             "glu": True},
          "residual": {"residual": r}}[fusion]
    out = gr.rows(x, w, **kw)
    ref = _reference(x, w, kw.get("norm_weight"), 1e-5, kw.get("residual"), kw.get("glu", False))
    assert out.shape == ref.shape and out.dtype == dtype
    assert rel_err(out, ref) < TOL[dtype], fusion


def test_a_tile_passed_gives_the_same_product() -> None:
    """The benchmark passes tiles (BLOCK_N, BLOCK_K, num_warps, STAGES): one K step, and a pipelined loop."""
    x, w, g, _ = _inputs(5, 70, 333, torch.float32)
    ref = _reference(x, w, g, 1e-5, glu=True)
    for tile in ((32, 512, 1, 1), (16, 16, 1, 3)):
        assert rel_err(gr.rows(x, w, norm_weight=g, eps=1e-5, glu=True, tile=tile), ref) < TOL[torch.float32]


def test_the_custom_op_matches_the_launch_and_compiles_without_a_break() -> None:
    x, w, g, r = _inputs(4, 24, 48, torch.float32)
    assert torch.equal(gr.rows_linear(x, w, g, 1e-5, None, True), gr.rows(x, w, g, 1e-5, glu=True))
    fake = torch.library.opcheck(gr.rows_linear, (x, w, None, 0.0, r, False), test_utils=("test_faketensor",))
    assert fake["test_faketensor"] == "SUCCESS"


@pytest.mark.parametrize("call, says", [
    (lambda x, w, g, r: gr.rows(x[:1].expand(65, 1, -1), w), "1 to 64 rows"),
    (lambda x, w, g, r: gr.rows(x, w[:, :-1]), "does not match"),
    (lambda x, w, g, r: gr.rows(x, w, norm_weight=g[:-1]), "norm weight"),
    (lambda x, w, g, r: gr.rows(x, w[:-1], glu=True), "even number"),
    (lambda x, w, g, r: gr.rows(x, w, residual=r[:, :, :-1]), "residual has"),
])
def test_bad_shapes_are_one_clear_error(call, says: str) -> None:
    x, w, g, r = _inputs(2, 8, 16, torch.float32)
    with pytest.raises(ValueError, match=says):
        call(x, w, g, r)


def test_the_fused_step_sends_rows_where_the_rule_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """FusedDecodeOps: at 2 ≤ B ≤ ROWS_MAX_BATCH a bf16 projection's product is the rows kernel (with its fusions),
    above it the plain ops (the GEMM), at B = 1 the GEMV; the results agree with the reference either way."""
    from engine.kernels.triton.gemv import FusedDecodeOps as Ops

    monkeypatch.setattr(choice, "ROWS_MAX_BATCH", 4)
    calls: list[int] = []
    real = gr.rows
    monkeypatch.setattr(gr, "rows", lambda x, *a, **kw: calls.append(x.shape[0]) or real(x, *a, **kw))
    proj = torch.nn.Linear(48, 32, bias=False).to(DEVICE)
    g = torch.ones(48, device=DEVICE)
    for batch in (2, 4, 5):
        x = torch.randn(batch, 1, 48, device=DEVICE)
        out = Ops.norm_swiglu(x, g, 1e-5, proj)
        assert rel_err(out, _reference(x, proj.weight.detach(), g, 1e-5, glu=True)) < TOL[torch.float32]
    assert calls == [2, 4]


def test_the_rule_sends_rows_between_the_gemv_and_the_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "GEMV_MAX_BATCH", 1)
    monkeypatch.setattr(choice, "ROWS_MAX_BATCH", 16)
    assert [choice.decode_products(b) for b in (1, 2, 16, 17)] == ["gemv", "rows", "rows", "gemm"]
    assert "rows kernel" in choice.describe(8, 512, 1, ("qkv",))
    monkeypatch.setattr(choice, "ROWS_MAX_BATCH", 1)
    assert [choice.decode_products(b) for b in (1, 2)] == ["gemv", "gemm"]


@pytest.mark.sm90_offline
def test_the_rows_kernel_compiles_for_sm90(aot_check_rows) -> None:
    """Its GPU form (bf16 dot, the pipelined loop) at every tile the benchmark times, with each fusion, built by
    Triton's own ptxas for sm_90 without a GPU (benchmarks/triton_aot_check.py --kernels gemv_rows): no spills."""
    rows = aot_check_rows("--kernels", "gemv_rows")
    built = [r for r in rows if r.startswith("gemv_rows")]
    assert len(built) == 4 * len(gr.AOT_TILES), rows
    assert all(r.split()[-1] == "ok" and r.split()[-3] == "0" for r in built), built  # built, stack bytes 0
