"""The int4 rows kernel (engine.kernels.triton.quant_rows: a few rows × int4 codes dequantized in the loads, a
tensor-core dot) against float64 dequantize-then-matmul — interpreted on CPU (see conftest), compiled on a GPU — on
ragged shapes (K not a multiple of 64, N not of the tile, rows padded to 16 or 32); the rule that sends a
QuantLinear's rows to it; its refusals; and its sm_90 build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from engine.kernels import choice  # noqa: E402
from engine.kernels.triton import quant_gemv as qg  # noqa: E402
from engine.kernels.triton import quant_rows as qr  # noqa: E402
from engine.llm import quant  # noqa: E402
from tests.engine.kernels.dot_device import DEVICE, HALF, rel_err, skip_unless_it_runs  # noqa: E402

pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
skip_unless_it_runs(qr._int4_rows_kernel)
# The reference multiplies the weight rounded to x's dtype, as the kernel does.
TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 8e-3}
SHAPES = [(2, 37, 300), (3, 130, 129), (16, 16, 64), (17, 40, 1000), (5, 3, 65)]  # (rows, N, K)


def _int4(n: int, k: int, dtype: torch.dtype) -> quant.QuantWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n * 1000 + k)) / k ** 0.5
    qw = quant.quantize(w, "int4-wo").to(DEVICE)
    qw.scales = qw.scales.to(dtype)
    return qw


def _reference(x: torch.Tensor, qw: quant.QuantWeight) -> torch.Tensor:
    w = qg.dequantize_int4(qw.q.cpu(), qw.scales.cpu(), x.shape[-1], x.dtype)  # rounded to x's dtype, as the kernel
    return F.linear(x.double().cpu(), w.double())


@pytest.mark.parametrize("dtype", [torch.float32, HALF], ids=["fp32", "16-bit"])
@pytest.mark.parametrize("rows, n, k", SHAPES)
def test_rows_match_float64_dequantize_then_matmul(rows: int, n: int, k: int, dtype: torch.dtype) -> None:
    qw = _int4(n, k, dtype)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
    out = qr.int4_rows(x, qw.q, qw.scales)
    assert out.shape == (rows, n) and out.dtype == dtype
    assert rel_err(out, _reference(x, qw)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, HALF], ids=["fp32", "16-bit"])
@pytest.mark.parametrize("rows, n, k", [shape for shape in SHAPES if shape[0] <= qr.FMA_MAX_ROWS])
def test_the_multiply_add_form_matches_float64(rows: int, n: int, k: int, dtype: torch.dtype) -> None:
    """The candidate form the benchmark times beside the dot (codes − 8 formed once, multiplied by every row), at
    the same ragged shapes; it refuses more rows than its registers hold."""
    qw = _int4(n, k, dtype)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
    out = qr.int4_rows(x, qw.q, qw.scales, form="fma")
    assert out.shape == (rows, n) and out.dtype == dtype
    assert rel_err(out, _reference(x, qw)) < TOL[dtype]
    with pytest.raises(ValueError, match=f"at most {qr.FMA_MAX_ROWS} rows"):
        qr.int4_rows(x[:1].expand(qr.FMA_MAX_ROWS + 1, k), qw.q, qw.scales, form="fma")
    with pytest.raises(ValueError, match="form 'wmma'"):
        qr.int4_rows(x, qw.q, qw.scales, form="wmma")


def test_a_tile_passed_and_leading_dims_give_the_same_product() -> None:
    """The benchmark passes tiles (BLOCK_N, GROUPS, num_warps); a (B, 1, K) decode input keeps its leading dims."""
    qw = _int4(70, 333, torch.float32)
    x = torch.randn(4, 1, 333, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = qr.int4_rows(x, qw.q, qw.scales, tile=(32, 2, 1))
    assert out.shape == (4, 1, 70)
    assert rel_err(out.reshape(4, 70), _reference(x.reshape(4, 333), qw)) < TOL[torch.float32]


def test_bad_operands_are_refused_with_what_was_expected() -> None:
    qw = _int4(16, 128, torch.float32)
    with pytest.raises(ValueError, match=f"1 to {qr.MAX_ROWS} rows"):
        qr.int4_rows(torch.zeros(qr.MAX_ROWS + 1, 128, device=DEVICE), qw.q, qw.scales)
    with pytest.raises(ValueError, match="does not match x's 200 features"):
        qr.int4_rows(torch.zeros(2, 200, device=DEVICE), qw.q, qw.scales)


def test_quant_products_sends_two_to_the_threshold_to_the_rows_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "QUANT_ROWS_MAX_BATCH", 16)
    assert [choice.quant_products(r) for r in (1, 2, 16, 17, 512)] == ["dequantize", "rows", "rows", "dequantize",
                                                                       "dequantize"]
    assert "via the int4 rows kernel" in choice.describe(8, 640, 2, ("gate_up",), int4=True)  # the run's note
    monkeypatch.setattr(choice, "QUANT_ROWS_MAX_BATCH", 1)
    assert choice.quant_products(2) == "dequantize"
    with pytest.raises(ValueError, match="rows"):
        choice.quant_products(0)


@pytest.mark.parametrize("limit, takes", [(16, True), (1, False)], ids=["rows-kernel", "dequantize"])
def test_a_quantized_layer_takes_the_rule_s_path_with_the_same_values(
        monkeypatch: pytest.MonkeyPatch, limit: int, takes: bool) -> None:
    monkeypatch.setattr(choice, "QUANT_ROWS_MAX_BATCH", limit)
    calls: list[int] = []
    real = qr.int4_rows
    monkeypatch.setattr(qr, "int4_rows", lambda x, q, s, tile=None: calls.append(x.shape[0]) or real(x, q, s, tile))
    layer = quant.QuantLinear(_int4(48, 200, torch.float32), impl="triton", dtype=torch.float32).to(DEVICE)
    x = torch.randn(4, 200, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        out = layer(x)
    assert bool(calls) is takes
    assert rel_err(out, _reference(x, layer.weight_())) < TOL[torch.float32]


@pytest.mark.sm90_offline
def test_the_rows_kernel_compiles_for_sm90(aot_check_rows) -> None:
    """Its GPU form (bf16 dot, the LOP3 unpacking) at the launched tiles and the tiles the benchmark times, and the
    multiply-add form at its tiles for 8 and 16 rows, built by
    Triton's own ptxas for sm_90 without a GPU (benchmarks/triton_aot_check.py --kernels rows): no spills."""
    rows = aot_check_rows("--kernels", "rows")
    built = [r for r in rows if r.startswith("quant_rows int4")]
    fma = [r for r in built if r.startswith("quant_rows int4 fma")]
    assert len(built) - len(fma) == len(qr.AOT_TILES) * len(qr.AOT_ROWS), rows
    assert len(fma) == len(qr.FMA_TILES) * len(qr.FMA_AOT_ROWS), rows  # the multiply-add form the bench times
    assert all(r.split()[-1] == "ok" and r.split()[-3] == "0" for r in built), built  # built, stack bytes 0
