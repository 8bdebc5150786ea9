"""Shared fixtures for the IR tests: each zoo model's smallest preset, extracted once per session (about a second)."""

from __future__ import annotations

import pytest

from engine.ir import zoo
from engine.ir.export import extract_ir
from engine.ir.graph import IR

SMALLEST = {name: next(iter(zm.presets)) for name, zm in zoo.ZOO.items()}


@pytest.fixture(scope="session")
def zoo_irs() -> dict[str, IR]:
    out = {}
    for name, preset in SMALLEST.items():
        model, inputs = zoo.build(name, preset, device="meta")
        out[name] = extract_ir(model, inputs, model_name=f"{name}/{preset}")
    return out


@pytest.fixture(scope="session")
def real_models():
    """name -> (model on the CPU with seeded real weights, real inputs)."""
    return {name: zoo.build(name, preset, device="cpu", seed=0) for name, preset in SMALLEST.items()}
