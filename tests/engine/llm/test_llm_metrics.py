"""FLOP and byte formulas against hand counts for the tiny config, and against what torch counts and allocates."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from engine.llm import metrics as M
from engine.workloads.llama import build_model, preset

# tiny: V=256, d=64, L=2, H=4, G=2, h=16, f=128.
# Linear weights per layer: q/k/v 64·(4+2+2)·16 = 8192, o 64·64 = 4096, gate/up/down 3·64·128 = 24576 → 36864.
TINY = preset("tiny")


def test_prefill_flops_by_hand() -> None:
    # B=1, P=8. Matmuls: 2 FLOPs × 36864 weights × 2 layers × 8 tokens = 1,179,648.
    # Attention (causal half): 2 layers × 2·B·H·h·P·(P+1) = 2 × 2·1·4·16·8·9 = 18,432. LM head: 2·64·256 = 32,768.
    assert M.matmul_flops_per_token(TINY) == 147_456
    assert M.prefill_attention_flops(TINY, 1, 8) == 18_432
    assert M.lm_head_flops(TINY, 1) == 32_768
    assert M.prefill_flops(TINY, 1, 8) == 1_179_648 + 18_432 + 32_768
    assert M.prefill_flops(TINY, 3, 8) == 3 * (1_179_648 + 18_432 + 32_768)  # linear in the batch


def test_decode_flops_and_bytes_by_hand() -> None:
    # One step, B=1, 9 tokens in the cache: matmuls 147,456 + attention 2 layers × 4·H·h·n = 2·4·4·16·9 = 4,608
    # + LM head 32,768.
    assert M.decode_flops(TINY, 1, 9) == 147_456 + 4_608 + 32_768
    # Weights in fp32 (s=4): per layer 36864 + 2·64 norms = 36992; × 2 = 73,984; + final norm 64 + LM head 16,384
    # = 90,432 parameters read, + the one embedding row (64) = 90,496 elements = 361,984 bytes.
    assert M.weight_bytes(TINY, 1, 4) == 361_984
    # K/V read: s·L·2·B·G·h·n = 4·2·2·1·2·16·9 = 4,608 bytes.
    assert M.kv_bytes(TINY, 1, 9, 4) == 4_608
    assert M.decode_bytes(TINY, 1, 9, 4) == 361_984 + 4_608
    # Mean over steps: after P=8, steps see n = 9, 10, 11 → mean K/V of n = 10.
    mean = M.decode_counts(TINY, 1, 8, 3, 4)
    assert mean.bytes == pytest.approx(361_984 + M.kv_bytes(TINY, 1, 10, 4))
    assert mean.intensity == pytest.approx(mean.flops / mean.bytes)


def test_prefill_bytes_and_utilisation() -> None:
    # Weights once (bf16, s=2; B=2 embedding rows) + the K/V written for P=8 tokens of 2 sequences.
    assert M.prefill_bytes(TINY, 2, 8, 2) == 2 * (90_432 + 2 * 64) + 2 * 2 * 2 * 2 * 2 * 16 * 8
    assert M.utilisation(100.0, 2.0, 50.0) == pytest.approx(100.0)  # 100 FLOP in 2 s on a 50 FLOP/s ceiling
    assert M.utilisation(100.0, 2.0, None) is None
    assert M.utilisation(100.0, 0.0, 50.0) is None
    with pytest.raises(ValueError):
        M.decode_counts(TINY, 1, 8, 0, 4)


def _mm_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    counts = counter.get_flop_counts()["Global"]
    return int(sum(v for op, v in counts.items() if op in (torch.ops.aten.mm, torch.ops.aten.addmm)))


def test_matmul_flops_agree_with_torch_flop_counter() -> None:
    """What torch counts for the model's matrix products (attention aside) equals the formula's matmul part."""
    model = build_model(TINY, "cpu", torch.float32)
    model.setup_cache(2, 16)
    prompt = torch.randint(0, TINY.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        prefill = _mm_flops(lambda: model.forward_cached(prompt, torch.arange(8)))
        decode = _mm_flops(lambda: model.forward_cached(prompt[:, :1], torch.tensor([8])))
    assert prefill == 2 * 8 * M.matmul_flops_per_token(TINY) + M.lm_head_flops(TINY, 2)
    assert decode == 2 * M.matmul_flops_per_token(TINY) + M.lm_head_flops(TINY, 2)


def test_weight_and_cache_bytes_agree_with_the_tensors() -> None:
    model = build_model(TINY, "cpu", torch.bfloat16)
    model.fuse_projections()
    model.setup_cache(3, 32)
    table = model.embed_tokens.weight
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert M.weight_bytes(TINY, 3, 2) == params - table.numel() * table.element_size() + 3 * TINY.dim * 2
    cache = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "kv_cache" in n)
    assert M.kv_bytes(TINY, 3, 32, 2) == cache  # a full cache of 32 positions
