"""The model zoo: small models that exercise one IR feature each, the house-price MLP, and a Llama-style decoder
with presets from tiny to 7B-shaped, each with its example inputs.

The IR explorer (engine/ir/zoo.py adds building them on meta or with real weights) and the built-in `lab:` examples of
`--model` (engine/workloads/user_model.py) both take their models from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# The Llama-style decoder is defined once in engine/workloads/llama.py (the LLM lab runs the same model).
from engine.workloads.llama import PRESETS as LLAMA_PRESETS
from engine.workloads.llama import LlamaConfig, LlamaDecoder


# -- small models, one IR feature each ----------------------------------------------------------------------------
class AttentionBlock(nn.Module):
    """Pre-norm multi-head self-attention with a residual: matmul, softmax, reshape and transpose."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm(x)
        q, k, v = (proj(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for proj in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        attn = scores.softmax(dim=-1) @ v
        return x + self.out(attn.transpose(1, 2).reshape(b, t, d))


class TwoTower(nn.Module):
    """Two inputs (dense features, a sequence) and two outputs (class logits, a score)."""

    def __init__(self, features: int = 8, channels: int = 6, hidden: int = 32, classes: int = 5):
        super().__init__()
        self.dense = nn.Sequential(nn.Linear(features, hidden), nn.GELU())
        self.seq = nn.Sequential(nn.Linear(channels, hidden), nn.Tanh())
        self.classify = nn.Linear(2 * hidden, classes)
        self.score = nn.Linear(2 * hidden, 1)

    def forward(self, features: torch.Tensor, sequence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.seq(sequence).mean(dim=1)
        joint = torch.cat([self.dense(features), pooled], dim=-1)
        return self.classify(joint), torch.sigmoid(self.score(joint))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))  # the skip connection


class SkipNet(nn.Module):
    """Conv stem, residual blocks (skip connections, BatchNorm buffers), pooling and a classifier."""

    def __init__(self, channels: int = 8, blocks: int = 2, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TiedLM(nn.Module):
    """Shared weights: the embedding is the output projection, and one MLP block is applied twice."""

    def __init__(self, vocab: int = 64, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + self.block(h)
        h = h + self.block(h)  # the same parameters again
        return self.head(h)


# -- the registry -------------------------------------------------------------------------------------------------
def _randn(shape: tuple[int, ...], device: str, gen: torch.Generator) -> torch.Tensor:
    if device == "meta":
        return torch.empty(shape, device="meta")
    return torch.randn(shape, generator=gen).to(device)


def _tokens(shape: tuple[int, ...], vocab: int, device: str, gen: torch.Generator) -> torch.Tensor:
    if device == "meta":
        return torch.empty(shape, dtype=torch.long, device="meta")
    return torch.randint(0, vocab, shape, generator=gen).to(device)


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    presets: dict[str, dict[str, Any]]
    make: Callable[[dict[str, Any]], nn.Module]
    # preset config -> model (it picks the keys it needs); (preset config, device, generator) -> example inputs
    inputs: Callable[[dict[str, Any], str, torch.Generator], tuple[torch.Tensor, ...]]
    default_preset: str = "tiny"
    notes: dict[str, str] = field(default_factory=dict)


def _llama_presets() -> dict[str, dict[str, Any]]:
    return {name: dict(cfg) for name, cfg in LLAMA_PRESETS.items()}


def _house_price(cfg: dict[str, Any]) -> nn.Module:
    from engine.workloads.house_price import HousePriceNN

    return HousePriceNN()


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("llama", "Llama-style decoder: RoPE, grouped-query causal attention, SwiGLU, RMSNorm (tiny … 7B-shaped).",
             _llama_presets(), lambda c: LlamaDecoder(LlamaConfig(**c)),
             lambda c, d, g: (_tokens((1, c["seq"]), c["vocab"], d, g),)),
    ZooModel("attention", "One pre-norm multi-head self-attention block with a residual.",
             {"tiny": dict(dim=32, heads=4, seq=8), "small": dict(dim=256, heads=8, seq=128)},
             lambda c: AttentionBlock(c["dim"], c["heads"]),
             lambda c, d, g: (_randn((2, c["seq"], c["dim"]), d, g),)),
    ZooModel("multi_io", "Two inputs (features, a sequence) and two outputs (class logits, a score).",
             {"tiny": dict(features=8, channels=6, hidden=32, classes=5, seq=7),
              "small": dict(features=64, channels=32, hidden=256, classes=20, seq=50)},
             lambda c: TwoTower(c["features"], c["channels"], c["hidden"], c["classes"]),
             lambda c, d, g: (_randn((4, c["features"]), d, g), _randn((4, c["seq"], c["channels"]), d, g))),
    ZooModel("skip", "Residual conv net: skip connections, BatchNorm (buffers), pooling.",
             {"tiny": dict(channels=8, blocks=2, size=8), "small": dict(channels=32, blocks=4, size=32)},
             lambda c: SkipNet(c["channels"], c["blocks"]),
             lambda c, d, g: (_randn((2, 3, c["size"], c["size"]), d, g),)),
    ZooModel("shared_weights", "Tied embedding / output weights and one MLP block applied twice.",
             {"tiny": dict(vocab=64, dim=32, seq=8), "small": dict(vocab=4096, dim=256, seq=64)},
             lambda c: TiedLM(c["vocab"], c["dim"]),
             lambda c, d, g: (_tokens((2, c["seq"]), c["vocab"], d, g),)),
    ZooModel("house_price", "The house-price MLP (5→256→256→1) of the Benchmark and Predict pages.",
             {"batch64": dict(batch=64), "batch1024": dict(batch=1024)},
             _house_price, lambda c, d, g: (_randn((c["batch"], 5), d, g),), default_preset="batch64"),
)}


def get_zoo(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}") from None


def preset_config(name: str, preset: str | None) -> dict[str, Any]:
    model = get_zoo(name)
    preset = preset or model.default_preset
    if preset not in model.presets:
        raise ValueError(f"{name} has no preset {preset!r}; presets: {', '.join(model.presets)}")
    return dict(model.presets[preset])


def describe(name: str, preset: str | None = None) -> str:
    cfg = preset_config(name, preset)
    return ", ".join(f"{k}={v}" for k, v in cfg.items()) or "default"
