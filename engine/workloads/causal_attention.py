"""Causal self-attention core of a decoder LM: q, k, v (B, H, S, D) → softmax(q kᵀ / √D + causal mask) v.

FLOPs count the unmasked work only (the convention FlashAttention and SDPA figures use): two matmuls (q kᵀ and p v)
of 2·D FLOPs per (query, key) pair, over S(S+1)/2 causal pairs per head. Minimum bytes: q, k, v read once, out
written once — the scores never need to reach device memory, which is the whole point of a fused kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.workloads.component import Component, Shape, seeded


class NaiveCausalAttention(nn.Module):
    """matmul → mask → softmax → matmul, materialising the (S, S) scores: what a textbook writes."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)


class SdpaCausalAttention(nn.Module):
    """The idiomatic native op: scaled_dot_product_attention picks a fused backend (flash / efficient / cuDNN)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


SHAPES = {
    "small": Shape("small", {"B": 2, "H": 2, "S": 80, "D": 32}, "fp32", note="CPU and tests; S not a tile multiple"),
    "S=1024": Shape("S=1024", {"B": 4, "H": 16, "S": 1024, "D": 128}, "bf16", devices=("cuda",)),
    "S=4096": Shape("S=4096", {"B": 4, "H": 16, "S": 4096, "D": 128}, "bf16", devices=("cuda",)),
}


def make_inputs(shape: Shape, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    d = shape.dims
    gen = seeded(seed, device)
    return tuple(torch.randn(d["B"], d["H"], d["S"], d["D"], device=device, generator=gen).to(shape.torch_dtype)
                 for _ in range(3))


def flops(shape: Shape) -> float:
    d = shape.dims
    pairs = d["S"] * (d["S"] + 1) / 2
    return 4.0 * d["B"] * d["H"] * d["D"] * pairs


def min_bytes(shape: Shape) -> float:
    d = shape.dims
    return 4.0 * d["B"] * d["H"] * d["S"] * d["D"] * shape.torch_dtype.itemsize


COMPONENT = Component(
    name="causal_attention",
    description="An LM's causal self-attention core: q, k, v (B, H, S, D) → out.",
    shapes=SHAPES,
    make_inputs=make_inputs,
    make_naive=lambda shape: NaiveCausalAttention(),
    make_native=lambda naive, shape: SdpaCausalAttention(),
    flops=flops,
    min_bytes=min_bytes,
    flops_formula="4·B·H·D·S(S+1)/2 — q·kᵀ and p·v, 2·D FLOPs each per unmasked (query, key) pair",
    bytes_formula="4·B·H·S·D·itemsize — q, k, v read once and out written once; scores stay on chip",
)
