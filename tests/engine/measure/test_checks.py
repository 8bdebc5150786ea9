"""No output check passes on a NaN or inf: a NaN error figure compares False with any tolerance (`err > tol` lets it
through), so every check asks for finite values first and names what it found."""

from __future__ import annotations

import pytest
import torch

from engine.measure.checks import ToleranceError, compare, nonfinite

NAN, INF = float("nan"), float("inf")


def test_nonfinite_counts_nan_and_inf() -> None:
    assert nonfinite(torch.ones(4)) is None
    assert nonfinite(torch.arange(4)) is None  # integers are always finite
    assert nonfinite(torch.tensor([1.0, NAN, INF, -INF])) == "1 NaN and 2 inf of 4 values"


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_compare_fails_an_output_with_nan_or_inf(bad: float) -> None:
    expected = torch.ones(3, 3)
    actual = expected.clone()
    actual[1, 1] = bad
    with pytest.raises(ToleranceError, match=r"mode: output has NaN or inf \(\d NaN and \d inf of 9 values\)"):
        compare(actual, expected, rtol=1e-3, atol=1e-3, what="mode")


def test_compare_fails_when_the_reference_has_nan_even_where_the_output_matches_it() -> None:
    expected = torch.tensor([1.0, NAN])
    with pytest.raises(ToleranceError, match="output has NaN"):
        compare(expected.clone(), expected, rtol=1e-3, atol=1e-3, what="mode")
    with pytest.raises(ToleranceError, match="eager's output, the reference, has NaN or inf"):
        compare(torch.tensor([1.0, 2.0]), expected, rtol=1e-3, atol=1e-3, what="mode")


def test_compare_passes_finite_outputs_within_tolerance() -> None:
    expected = torch.ones(3)
    assert compare(expected + 1e-3, expected, rtol=1e-2, atol=1e-2, what="mode")[0] == pytest.approx(1e-3, rel=1e-3)
