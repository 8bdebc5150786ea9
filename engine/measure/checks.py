"""Output checks shared by every runner: a mode's (or a native runner's) output against eager's.

Its own module so that whatever checks outputs — bench, the aoti mode's native runner, the LLM lab — imports this
and not engine.bench.run (which imports the modes: aoti importing bench back made a loop).
"""

from __future__ import annotations

import torch


class ToleranceError(AssertionError):
    """A mode's output differs from eager's by more than the workload's tolerance."""


def nonfinite(values: torch.Tensor) -> str | None:
    """None when every element of a floating-point tensor is finite; else how many are NaN and how many ±inf, for a
    check's reason. A NaN compares False with any tolerance, so every check asks this first: an error figure
    computed from such a tensor is NaN, and `err > tol` would let it pass."""
    if not values.is_floating_point() and not values.is_complex():
        return None
    values = values.detach()
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return None
    nan = int(torch.isnan(values).sum())
    inf = int((~finite).sum()) - nan
    return f"{nan} NaN and {inf} inf of {values.numel()} values"


def compare(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> tuple[float, float]:
    """Max abs and rel error of `actual` against `expected`; raises ToleranceError when allclose fails or either
    holds a NaN or inf."""
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    if actual.shape != expected.shape:
        raise ToleranceError(f"{what}: shape {tuple(actual.shape)} differs from eager's {tuple(expected.shape)}")
    bad = nonfinite(actual)
    if bad:
        raise ToleranceError(f"{what}: output has NaN or inf ({bad})")
    bad = nonfinite(expected)
    if bad:
        raise ToleranceError(f"{what}: eager's output, the reference, has NaN or inf ({bad}): nothing to check against")
    diff = (actual - expected).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / expected.abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0
    if not torch.allclose(actual, expected, rtol=rtol, atol=atol):
        raise ToleranceError(f"{what}: differs from eager (max abs err {max_abs:.3g}, max rel err {max_rel:.3g}; "
                             f"tolerance rtol={rtol:g}, atol={atol:g})")
    return max_abs, max_rel
