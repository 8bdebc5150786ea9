"""FLOP and byte counts of the kernel-levels components against hand counts, and the reference modules' basics."""

from __future__ import annotations

import pytest
import torch

from engine.levels import COMPONENTS
from engine.workloads import causal_attention, gnn_message_passing, vit_patch_attention
from engine.workloads.component import rel_l2_error


def test_causal_attention_counts_by_hand() -> None:
    shape = causal_attention.SHAPES["small"]  # B=2 H=2 S=80 D=32 fp32
    # 80·81/2 = 3240 unmasked pairs per head; 2 matmuls × 2·D FLOPs per pair; 4 heads in all.
    assert causal_attention.flops(shape) == 3240 * 4 * 32 * 4
    assert causal_attention.min_bytes(shape) == 4 * (2 * 2 * 80 * 32) * 4  # q, k, v in, out back, fp32
    real = causal_attention.SHAPES["S=4096"]
    assert causal_attention.flops(real) == pytest.approx(2 * 4 * 16 * 4096 ** 2 * 128, rel=1e-3)  # ≈ half of 4BHS²D
    assert causal_attention.min_bytes(real) == 4 * 4 * 16 * 4096 * 128 * 2  # bf16


def test_vit_counts_by_hand() -> None:
    shape = vit_patch_attention.SHAPES["small"]  # B=2, 32 px, patch 8 → 16 patches, S=17, E=64, 2 heads
    patch = 2 * 2 * 16 * 64 * (3 * 8 * 8)
    qkv = 2 * 2 * 17 * 64 * 192
    attention = 4 * 2 * 17 * 17 * 64
    assert vit_patch_attention.flops(shape) == patch + qkv + attention
    assert vit_patch_attention.patch_embed_flops(shape) == patch
    weights = 64 * 192 + 64 + 64 + 17 * 64 + 3 * 64 * 64 + 3 * 64
    assert vit_patch_attention.min_bytes(shape) == (2 * 3 * 32 * 32 + weights + 2 * 17 * 64) * 4
    real = vit_patch_attention.SHAPES["ViT-B/16"]
    assert vit_patch_attention.patch_embed_flops(real) == pytest.approx(14.8e9, rel=0.01)  # ViT-B/16's 14.8 GFLOP


def test_gnn_counts_by_hand() -> None:
    shape = gnn_message_passing.SHAPES["small-sorted"]  # N=300 E=2000 F=48 fp32, int64 indices
    assert gnn_message_passing.flops(shape) == 2 * 2000 * 48
    assert gnn_message_passing.min_bytes(shape) == 2000 * 48 * 4 + 300 * 48 * 4 + 2000 * (8 + 8 + 4)
    real = gnn_message_passing.SHAPES["sorted-fp32"]
    # The figure: 368 µs is ≈ 1.6 TB/s of this count.
    assert gnn_message_passing.min_bytes(real) / 368e-6 / 1e12 == pytest.approx(1.6, abs=0.05)


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_native_matches_naive_on_small_shapes(name: str) -> None:
    component = COMPONENTS[name]
    for shape in component.shapes.values():
        if not shape.runs_on("cpu"):
            continue
        inputs = component.make_inputs(shape, "cpu", 3)
        naive = component.make_naive(shape)
        ref = naive(*inputs)
        assert torch.isfinite(ref).all() and ref.abs().sum() > 0
        assert rel_l2_error(component.make_native(naive, shape)(*inputs), ref) < 1e-5


def test_inputs_are_seeded_and_not_zero() -> None:
    shape = gnn_message_passing.SHAPES["small-sorted"]
    a = gnn_message_passing.make_inputs(shape, "cpu", 0)
    b = gnn_message_passing.make_inputs(shape, "cpu", 0)
    c = gnn_message_passing.make_inputs(shape, "cpu", 1)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    x, src, dst, w, rowptr = a
    assert bool((dst[1:] >= dst[:-1]).all()), "sorted variant: edges sorted by destination"
    assert rowptr[-1] == dst.numel() and rowptr.numel() == shape.dims["N"] + 1
    assert torch.equal(torch.repeat_interleave(torch.arange(shape.dims["N"]), rowptr.diff()), dst)


def test_rel_l2_error_fails_on_nan() -> None:
    ref = torch.ones(4)
    assert rel_l2_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref) == float("inf")
    assert rel_l2_error(ref * 1.01, ref) == pytest.approx(0.01)
