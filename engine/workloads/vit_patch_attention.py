"""The front of a ViT block: image → 16×16 patch embedding (+ class token, + position embedding) → qkv projection →
non-causal multi-head attention over the 1 + (H/P)·(W/P) tokens. Output: the merged heads (B, S, E).

FLOPs: the patch GEMM 2·B·Np·E·(C·P·P), the qkv GEMM 2·B·S·E·3E and attention 4·B·S²·E (q kᵀ and p v over all heads).
Minimum bytes: the images, every weight and the output once each.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.workloads.component import Component, Shape, seeded


class NaiveViTFront(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, heads: int, channels: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.patch, self.heads = patch, heads
        n_patches = (image // patch) ** 2
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1 + n_patches, dim) * 0.02)
        self.qkv = nn.Linear(dim, 3 * dim)

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Patch embedding: a strided conv, flattened to (B, Np, E), the class token in front, positions added."""
        x = self.proj(images).flatten(2).transpose(1, 2)
        cls = self.cls.to(x.dtype).expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.pos.to(x.dtype)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, e = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)

    @staticmethod
    def merge_heads(out: torch.Tensor) -> torch.Tensor:
        b, h, s, d = out.shape
        return out.transpose(1, 2).reshape(b, s, h * d)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(self.tokens(images))
        return self.merge_heads(self.attend(q, k, v))


class SdpaViTFront(nn.Module):
    """The same parameters, attention through scaled_dot_product_attention."""

    def __init__(self, naive: NaiveViTFront) -> None:
        super().__init__()
        self.naive = naive

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        q, k, v = self.naive.split_heads(self.naive.tokens(images))
        return self.naive.merge_heads(F.scaled_dot_product_attention(q, k, v))


SHAPES = {
    "small": Shape("small", {"B": 2, "image": 32, "patch": 8, "E": 64, "heads": 2}, "fp32",
                   note="CPU and tests: 17 tokens"),
    "ViT-B/16": Shape("ViT-B/16", {"B": 64, "image": 224, "patch": 16, "E": 768, "heads": 12}, "bf16",
                      devices=("cuda",), note="224 px: 196 patches + cls = 197 tokens"),
}


def _tokens(shape: Shape) -> tuple[int, int]:
    n_patches = (shape.dims["image"] // shape.dims["patch"]) ** 2
    return n_patches, n_patches + 1


def make_naive(shape: Shape) -> NaiveViTFront:
    d = shape.dims
    return NaiveViTFront(d["image"], d["patch"], d["E"], d["heads"])


def make_inputs(shape: Shape, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    d = shape.dims
    gen = seeded(seed, device)
    return (torch.randn(d["B"], 3, d["image"], d["image"], device=device, generator=gen).to(shape.torch_dtype),)


def flops(shape: Shape) -> float:
    d = shape.dims
    n_patches, s = _tokens(shape)
    patch_gemm = 2.0 * d["B"] * n_patches * d["E"] * (3 * d["patch"] ** 2)
    qkv_gemm = 2.0 * d["B"] * s * d["E"] * 3 * d["E"]
    attention = 4.0 * d["B"] * s * s * d["E"]
    return patch_gemm + qkv_gemm + attention


def patch_embed_flops(shape: Shape) -> float:
    n_patches, _ = _tokens(shape)
    return 2.0 * shape.dims["B"] * n_patches * shape.dims["E"] * (3 * shape.dims["patch"] ** 2)


def min_bytes(shape: Shape) -> float:
    d = shape.dims
    _, s = _tokens(shape)
    e, size = d["E"], shape.torch_dtype.itemsize
    images = d["B"] * 3 * d["image"] ** 2
    weights = e * 3 * d["patch"] ** 2 + e + e + s * e + 3 * e * e + 3 * e
    return float((images + weights + d["B"] * s * e) * size)


def patch_embed_bytes(shape: Shape) -> float:
    d = shape.dims
    _, s = _tokens(shape)
    e = d["E"]
    return float((d["B"] * 3 * d["image"] ** 2 + e * 3 * d["patch"] ** 2 + 2 * e + s * e + d["B"] * s * e)
                 * shape.torch_dtype.itemsize)


COMPONENT = Component(
    name="vit_patch_attention",
    description="A ViT block's front: image → 16×16 patch embedding (+cls, +pos) → qkv → attention over the patches.",
    shapes=SHAPES,
    make_inputs=make_inputs,
    make_naive=make_naive,
    make_native=lambda naive, shape: SdpaViTFront(naive),
    flops=flops,
    min_bytes=min_bytes,
    flops_formula="2·B·Np·E·3P² (patch GEMM) + 2·B·S·E·3E (qkv) + 4·B·S²·E (attention), S = Np + 1",
    bytes_formula="(images + all weights + B·S·E output) · itemsize",
    stages={"patch_embed": "image → tokens (B, S, E): the conv as a GEMM, cls row, bias and positions"},
)
