"""The split-K rows kernel (engine.kernels.triton.gemv_rows, a candidate the benchmark times against cuBLAS) against
float64 — interpreted on CPU (see conftest), compiled on a GPU — at ragged shapes (K not a multiple of the tile or of
the split, N not of the tile, rows padded to 16 or 32), one split and several; its refusals; its sm_90 build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from engine.kernels.triton import gemv_rows as gr  # noqa: E402
from tests.engine.kernels.dot_device import DEVICE, HALF, rel_err, skip_unless_it_runs  # noqa: E402

pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
skip_unless_it_runs(gr._split_kernel)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
SHAPES = [(2, 38, 300), (3, 130, 129), (17, 40, 100), (32, 6, 65)]  # (rows, N, K)


@pytest.mark.parametrize("dtype", [torch.float32, HALF], ids=["fp32", "16-bit"])
@pytest.mark.parametrize("rows, n, k", SHAPES)
@pytest.mark.parametrize("split_k", [1, 3])
def test_rows_match_float64(rows: int, n: int, k: int, dtype: torch.dtype, split_k: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, 1, k, generator=gen).to(DEVICE, dtype)  # (B, 1, K), as the decode step passes it
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(DEVICE, dtype)
    out = gr.rows(x, w, split_k=split_k)
    ref = F.linear(x.double().cpu(), w.double().cpu())
    assert out.shape == (rows, 1, n) and out.dtype == dtype
    assert rel_err(out, ref) < TOL[dtype]


def test_a_tile_passed_gives_the_same_product() -> None:
    """The benchmark passes tiles (BLOCK_N, BLOCK_K, num_warps, STAGES) and split counts: more splits than K has
    steps run as many as it has."""
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(4, 333, generator=gen).to(DEVICE), torch.randn(70, 333, generator=gen).to(DEVICE)
    ref = F.linear(x.double().cpu(), w.double().cpu())
    for tile, split_k in (((32, 64, 1, 2), 2), ((16, 16, 1, 3), 64)):
        assert rel_err(gr.rows(x, w, split_k=split_k, tile=tile), ref) < TOL[torch.float32]


def test_bad_operands_are_one_clear_error() -> None:
    x, w = torch.zeros(2, 16, device=DEVICE), torch.zeros(8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=f"1 to {gr.MAX_ROWS} rows"):
        gr.rows(torch.zeros(gr.MAX_ROWS + 1, 16, device=DEVICE), w)
    with pytest.raises(ValueError, match="does not match x's 16 features"):
        gr.rows(x, w[:, :-1])
    with pytest.raises(ValueError, match="split_k must be at least 1"):
        gr.rows(x, w, split_k=0)


@pytest.mark.sm90_offline
def test_the_rows_kernel_compiles_for_sm90(aot_check_rows) -> None:
    """Its GPU form (bf16 dot, the pipelined loop) at every tile the benchmark times, for 16 and 32 rows, and the
    reduce, built by Triton's own ptxas for sm_90 without a GPU (triton_aot_check.py --kernels gemv_rows): no spills."""
    rows = aot_check_rows("--kernels", "gemv_rows")
    built = [r for r in rows if r.startswith("gemv_rows")]
    assert len(built) == 2 * len(gr.TILES) + 1, rows
    assert all(r.split()[-1] == "ok" and r.split()[-3] == "0" for r in built), built  # built, stack bytes 0
