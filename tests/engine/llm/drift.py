"""A mode whose prefill logits drift from eager's by a factor: what the LLM run's check must refuse."""

from __future__ import annotations

import pytest

from engine.llm import run as llm_run_module


def drift_prefill(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """Every mode prepared from here on returns its prefill logits times `factor`."""
    real_prepare = llm_run_module.prepare

    def drifting(mode, model, device, sdpa=None, autotune=False):
        prepared = real_prepare(mode, model, device, sdpa=sdpa, autotune=autotune)
        inner = prepared.prefill

        def prefill(tokens, pos):
            token, logits = inner(tokens, pos)
            return token, logits * factor

        prepared.prefill = prefill
        return prepared

    monkeypatch.setattr(llm_run_module, "prepare", drifting)
