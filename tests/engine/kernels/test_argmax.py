"""engine.kernels.triton.argmax: torch.argmax's answer on every row (ties, NaN, -inf, one and two kernels), under
Triton's interpreter on CPU (conftest) or compiled on a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.triton import argmax as am

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one


def _check(x: torch.Tensor) -> None:
    got = am.argmax_rows_fwd(x)
    want = torch.argmax(x, dim=-1, keepdim=True)
    assert got.shape == want.shape and got.dtype == torch.int64
    assert torch.equal(got.cpu(), want.cpu()), (got.flatten().tolist(), want.flatten().tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 7, 1000, am.ONE_PROGRAM_MAX, am.ONE_PROGRAM_MAX + 1, 32000, 128256])
def test_random_rows_match_torch(dtype, n):
    torch.manual_seed(n)
    _check(torch.randn(3, n, dtype=torch.float32).to(dtype).to(DEVICE))


@pytest.mark.parametrize("n", [500, am.ONE_PROGRAM_MAX + 100])  # one kernel; chunks and the final kernel
def test_ties_nan_and_minus_inf_are_what_torch_says(n):
    rows = torch.randn(6, n)
    rows[0, [17, 300, n - 1]] = 9.0  # a tie: the first index wins (across chunks too)
    rows[1, [3, n - 2]] = float("nan")  # NaN is the largest: the first NaN wins
    rows[1, 10] = float("inf")
    rows[2] = float("-inf")  # nothing larger than -inf: index 0
    rows[3, n - 1] = float("inf")  # the last element
    rows[4] = 1.0  # every element equal
    rows[5, n // 2] = float("nan")  # a NaN after the maximum
    rows[5, 0] = 50.0
    _check(rows.to(torch.bfloat16).to(DEVICE))
    _check(rows.to(DEVICE))


def test_a_strided_row_is_read_through_its_stride():
    x = torch.randn(4, 2 * 3000).to(DEVICE)[:, ::2]  # a column stride of 2: copied, then read
    _check(x)
    wide = torch.randn(2, 9000).to(DEVICE)[:, :5000]  # rows 9000 apart
    _check(wide)


def test_bad_shapes_are_refused_with_the_shape():
    with pytest.raises(ValueError, match=r"\(B, V\).*\(5,\)"):
        am.argmax_rows_fwd(torch.randn(5).to(DEVICE))
    with pytest.raises(ValueError, match=r"V > 0"):
        am.argmax_rows_fwd(torch.randn(2, 0).to(DEVICE))


@pytest.mark.parametrize("b,n", [(1, 32000), (3, 500), (2, am.ONE_PROGRAM_MAX + 100)])
def test_in_place_the_token_lands_in_the_buffer_and_the_position_moves_one(b, n):
    """argmax_rows_into (the graph-decoded step's last kernels): each row's argmax into the decoder's token buffer,
    and its position one on — once, whatever the rows or chunks — with one kernel (a short row) or two."""
    torch.manual_seed(b + n)
    x = torch.randn(b, n).to(torch.bfloat16).to(DEVICE)
    x[0, 7] = 100.0  # row 0 also has a known answer
    token = torch.full((b, 1), -1, dtype=torch.int64, device=DEVICE)
    pos = torch.tensor([41], device=DEVICE)
    for step in range(2):
        am.argmax_rows_into(x, token, pos)
        assert torch.equal(token.cpu(), torch.argmax(x, -1, keepdim=True).cpu()) and int(token[0, 0]) == 7
        assert pos.tolist() == [42 + step]


def test_in_place_refuses_buffers_that_do_not_fit():
    x = torch.randn(2, 300).to(DEVICE)
    pos = torch.tensor([0], device=DEVICE)
    for token in (torch.zeros(2, 1, device=DEVICE), torch.zeros(1, 1, dtype=torch.int64, device=DEVICE),
                  torch.zeros(2, 2, dtype=torch.int64, device=DEVICE)[:, :1]):  # (2, 1), rows 2 apart
        with pytest.raises(ValueError, match=r"token must be \(2, 1\) contiguous int64"):
            am.argmax_rows_into(x, token, pos)
    token = torch.zeros(2, 1, dtype=torch.int64, device=DEVICE)
    for bad in (torch.tensor([0, 1], device=DEVICE), torch.tensor([0], dtype=torch.int32, device=DEVICE)):
        with pytest.raises(ValueError, match="pos must be one int64"):
            am.argmax_rows_into(x, token, bad)
    assert pos.tolist() == [0] and not token.any()  # nothing written by a refused call


def test_the_custom_op_traces_with_its_fake_and_runs_inside_torch_compile():
    x = torch.randn(2, 1500).to(DEVICE)
    assert torch.equal(torch.ops.modelab.argmax_rows(x).cpu(), torch.argmax(x, -1, keepdim=True).cpu())
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.ops.modelab.argmax_rows(torch.empty(3, 77))
    assert fake.shape == (3, 1) and fake.dtype == torch.int64
    step = torch.compile(lambda t: torch.ops.modelab.argmax_rows(t * -1.0), fullgraph=True, dynamic=False)
    assert torch.equal(step(x).cpu(), torch.argmax(-x, -1, keepdim=True).cpu())
