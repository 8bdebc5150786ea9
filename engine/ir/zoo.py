"""Models to explore: small graphs that exercise one IR feature each, the house-price MLP, and a Llama-style decoder
with presets from tiny to 7B-shaped.

Every model is built the same two ways: on the meta device for extraction (shapes only, no weight memory, any size)
and on the CPU with a fixed seed for execution and verification (real weights: tiny and small presets only, see
MAX_VERIFY_BYTES).

The models, their presets and example inputs live in engine/workloads/zoo.py (the built-in `lab:` examples of
`--model` use them too); this module builds them for the IR explorer.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.ir.errors import WeightLoadError
from engine.store import settings
from engine.workloads.llama import MLP, Attention, DecoderLayer, RMSNorm  # noqa: F401 - re-exported for the IR's users
from engine.workloads.zoo import (  # noqa: F401 - re-exported for the IR's users
    LLAMA_PRESETS,
    ZOO,
    AttentionBlock,
    LlamaConfig,
    LlamaDecoder,
    ResidualBlock,
    SkipNet,
    TiedLM,
    TwoTower,
    ZooModel,
    describe,
    get_zoo,
    preset_config,
)

# Real weights above this many bytes are not materialised for verification (env MODELAB_IR_VERIFY_MAX_BYTES).
MAX_VERIFY_BYTES = settings.get("MODELAB_IR_VERIFY_MAX_BYTES")


def build(name: str, preset: str | None = None, *, device: str = "meta", seed: int = 0) -> tuple[nn.Module, tuple]:
    """(model in eval mode, example inputs) on `device`; on a real device the weights and inputs come from `seed`."""
    zm = get_zoo(name)
    cfg = preset_config(name, preset)
    if device != "meta":
        check_verify_size(name, preset)
        torch.manual_seed(seed)
    with torch.device(device):
        model = zm.make(cfg)
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    return model, zm.inputs(cfg, device, gen)


def parameter_bytes(name: str, preset: str | None = None) -> tuple[int, int]:
    """(parameter count, bytes of parameters and buffers), measured on meta."""
    model, _ = build(name, preset, device="meta")
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return params, nbytes


def check_verify_size(name: str, preset: str | None) -> None:
    """WeightLoadError when real weights of this preset would exceed MAX_VERIFY_BYTES."""
    params, nbytes = parameter_bytes(name, preset)
    if nbytes > MAX_VERIFY_BYTES:
        small = [p for p in get_zoo(name).presets if p in ("tiny", "small")]
        raise WeightLoadError(
            f"{name}/{preset} has {params / 1e9:.2f} B parameters ({nbytes / 2**30:.1f} GiB of real weights); "
            f"verification materialises them and is limited to {MAX_VERIFY_BYTES / 2**30:.1f} GiB "
            f"(MODELAB_IR_VERIFY_MAX_BYTES). Verify a smaller preset ({', '.join(small)}): it has the same ops per "
            "layer. The meta-device IR of this preset can still be extracted.")
