"""Output checks shared by every runner: a mode's (or a native runner's) output against eager's.

Its own module so that whatever checks outputs — bench, the aoti mode's native runner, the LLM lab — imports this
and not engine.bench.run (which imports the modes: aoti importing bench back made a loop).
"""

from __future__ import annotations

import torch


class ToleranceError(AssertionError):
    """A mode's output differs from eager's by more than the workload's tolerance."""


def compare(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> tuple[float, float]:
    """Max abs and rel error of `actual` against `expected`; raises ToleranceError when allclose fails."""
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    if actual.shape != expected.shape:
        raise ToleranceError(f"{what}: shape {tuple(actual.shape)} differs from eager's {tuple(expected.shape)}")
    diff = (actual - expected).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / expected.abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0
    if not torch.isfinite(actual).all():
        raise ToleranceError(f"{what}: output has NaN or inf")
    if not torch.allclose(actual, expected, rtol=rtol, atol=atol):
        raise ToleranceError(f"{what}: differs from eager (max abs err {max_abs:.3g}, max rel err {max_rel:.3g}; "
                             f"tolerance rtol={rtol:g}, atol={atol:g})")
    return max_abs, max_rel
