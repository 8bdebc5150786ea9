"""engine.kernels.choice: which products and how many decode-attention splits for which (B, P); the decode
attention under the interpreter (see conftest) with split counts that do not divide the cache and ragged batches,
against float64 SDPA math; the fused ops taking plain torch ops above the GEMV's batch."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import choice


def test_products_take_the_gemv_up_to_the_threshold_and_the_gemm_above() -> None:
    assert choice.decode_products(1) == "gemv"
    assert choice.decode_products(choice.GEMV_MAX_BATCH) == "gemv"
    assert choice.decode_products(choice.GEMV_MAX_BATCH + 1) == "gemm"
    assert choice.decode_products(8) == "gemm" and choice.decode_products(32) == "gemm"
    with pytest.raises(ValueError, match="batch"):
        choice.decode_products(0)


def test_splits_grow_with_context_shrink_with_batch_and_are_one_at_short_contexts() -> None:
    sms, kvh = 132, 8
    at = lambda b, p: choice.attention_splits(b, p, sms, kvh)  # noqa: E731
    assert at(1, 32) == 1 and at(1, 127) == 1  # a short cache: no split of at least 64 positions to spare
    assert choice.attention_splits(32, 8192, sms, 32) == 1  # the 7B's 32 kv heads at B=32 fill the device
    assert at(1, 512) == 512 // choice.MIN_SPLIT_POSITIONS  # short splits capped at the minimum length
    assert at(1, 640) == 8  # 10 positions' worth of splits, rounded down to a power of two
    assert at(1, 8192) > at(1, 512) and at(1, 8192) >= at(8, 8192) >= at(32, 8192)
    # where the context allows, batch × kv heads × splits is the power of two just within the target programs
    for b in (1, 8, 32):
        s = at(b, 1 << 20)
        assert s & (s - 1) == 0
        assert b * kvh * s <= max(b * kvh, sms * choice.PROGRAMS_PER_SM) < b * kvh * 2 * s
    # the 7B (32 kv heads) on 132 SMs: 17 programs' worth at B=1 → 16; 9 at B=2 → 8; 3 at B=8 → 2
    assert [choice.attention_splits(b, 8320, sms, 32) for b in (1, 2, 8, 32)] == [16, 8, 2, 1]
    with pytest.raises(ValueError, match="context"):
        choice.attention_splits(1, 0, sms)


def test_the_note_names_the_choice() -> None:
    assert choice.describe(8, 8192, 4, ("gate_up",)) == ("B=8: gate_up via GEMM (cuBLAS); decode attention 4 splits "
                                                         "over 8192 positions")
    assert choice.describe(1, 640, 1) == "B=1: decode attention 1 split over 640 positions"
    assert "fused Triton GEMV" in choice.describe(1, 640, 10, ("qkv",))
    assert "fused Triton GEMV" in choice.describe(1, 640, 10, ("qkv",), int4=True)  # one row: the quantized GEMV
    assert "via the int4 rows kernel" in choice.describe(choice.QUANT_ROWS_MAX_BATCH, 640, 2, ("qkv",), int4=True)
    more = choice.QUANT_ROWS_MAX_BATCH + 1
    assert "via the weight dequantized each step, then GEMM" in choice.describe(more, 640, 2, ("qkv",), int4=True)


triton = pytest.importorskip("triton")
from engine.kernels.triton import decode_attention as da  # noqa: E402
from engine.kernels.triton._common import is_interpreted  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
interpreted_only = pytest.mark.skipif(DEVICE == "cpu" and not is_interpreted(da._split_kernel),
                                      reason="the kernel was imported before TRITON_INTERPRET=1 was set")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.double().cpu() - ref.cpu()).norm() / ref.cpu().norm())


@interpreted_only
@pytest.mark.parametrize("splits", [1, 3, 5])
def test_split_counts_that_do_not_divide_the_cache_match_float64(splits: int) -> None:
    gen = torch.Generator().manual_seed(splits)
    b, h, kvh, d, s = 2, 4, 2, 16, 50  # 50 positions: 3 splits of 24, 24 and 2; 5 of 16, 16, 16 and 2 (4 run)
    q = torch.randn(b, h, 1, d, generator=gen).to(DEVICE)
    k, v = (torch.randn(b, kvh, s, d, generator=gen).to(DEVICE) for _ in range(2))
    plan = da.split_plan(b, kvh, h // kvh, s, k.dtype, DEVICE, splits)
    assert plan[1] <= splits and (plan[1] - 1) * plan[0] < s <= plan[1] * plan[0]
    for pos in (0, 23, 24, 47, 49):
        p = torch.tensor([pos], device=DEVICE)
        out = da.decode_attention_fwd(q, k, v, p, splits=splits)
        assert _rel(out, da._reference(q, k, v, p)) < 1e-6, pos


@interpreted_only
@pytest.mark.parametrize("splits", [1, 3])
def test_ragged_batches_attend_each_sequence_to_its_own_length(splits: int) -> None:
    gen = torch.Generator().manual_seed(11)
    b, h, kvh, d, s = 3, 4, 1, 16, 40
    q = torch.randn(b, h, 1, d, generator=gen).to(DEVICE)
    k, v = (torch.randn(b, kvh, s, d, generator=gen).to(DEVICE) for _ in range(2))
    positions = torch.tensor([0, 17, 39], device=DEVICE)
    out = da.decode_attention_fwd(q, k, v, torch.tensor([39], device=DEVICE), splits=splits, positions=positions)
    ref = da._reference(q, k, v, torch.tensor([39]), positions)
    assert _rel(out, ref) < 1e-6
    # each sequence alone at its position: the same rows
    for i, pos in enumerate(positions.tolist()):
        alone = da._reference(q[i:i + 1], k[i:i + 1], v[i:i + 1], torch.tensor([pos]))
        assert _rel(out[i:i + 1], alone) < 1e-6
    with pytest.raises(ValueError, match="positions"):
        da.decode_attention_fwd(q, k, v, torch.tensor([39]), positions=positions[:2])


@interpreted_only
def test_ragged_qkv_variant_writes_each_sequence_at_its_position() -> None:
    from engine.workloads.llama import LlamaConfig, rope_tables

    gen = torch.Generator().manual_seed(5)
    b, h, kvh, d, s = 2, 4, 2, 16, 36
    cfg = LlamaConfig(dim=h * d, layers=1, heads=h, kv_heads=kvh, ffn=32, vocab=32)
    cos, sin = rope_tables(cfg, s)
    qkv = torch.randn(b, 1, (h + 2 * kvh) * d, generator=gen).to(DEVICE)
    k, v = (torch.randn(b, kvh, s, d, generator=gen).to(DEVICE) for _ in range(2))
    positions = torch.tensor([3, 30], device=DEVICE)
    k_ref, v_ref = k.clone(), v.clone()
    out = da.decode_attention_qkv_fwd(qkv, cos.to(DEVICE), sin.to(DEVICE), k, v, torch.tensor([30]), splits=3,
                                      positions=positions)
    # the reference: RoPE at each sequence's own position, the cache written there, then masked attention
    qh = qkv.reshape(b, h + 2 * kvh, d).double()
    for i, pos in enumerate(positions.tolist()):
        c, sn = cos[pos].double(), sin[pos].double()
        rot = lambda x: x * c + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sn  # noqa: E731
        k_ref[i, :, pos] = rot(qh[i, h:h + kvh]).to(k.dtype)
        v_ref[i, :, pos] = qh[i, h + kvh:].to(v.dtype)
        q_i = rot(qh[i, :h])[None, :, None]
        ref = da._reference(q_i, k_ref[i:i + 1], v_ref[i:i + 1], torch.tensor([pos]))
        assert _rel(out[i:i + 1], ref) < 1e-6, pos
    assert torch.allclose(k, k_ref, atol=1e-6) and torch.equal(v, v_ref)


def test_fused_ops_above_the_threshold_are_the_plain_torch_ops() -> None:
    """B > GEMV_MAX_BATCH: FusedDecodeOps computes rms_norm + F.linear (+ SwiGLU / the residual) as torch ops, no
    custom op in between (so Inductor sees and fuses them)."""
    from engine.kernels.triton import gemv
    from engine.workloads.llama import rms_norm

    gen = torch.Generator().manual_seed(3)
    b = choice.GEMV_MAX_BATCH + 7
    x = torch.randn(b, 1, 32, generator=gen)
    g = torch.rand(32, generator=gen) + 0.5
    proj = torch.nn.Linear(32, 24, bias=False)
    residual = torch.randn(b, 1, 24, generator=gen)
    hidden = torch.nn.functional.linear(rms_norm(x, g, 1e-5), proj.weight)
    assert torch.equal(gemv.FusedDecodeOps.norm_linear(x, g, 1e-5, proj), hidden)
    gate, up = hidden.chunk(2, -1)
    assert torch.equal(gemv.FusedDecodeOps.norm_swiglu(x, g, 1e-5, proj), torch.nn.functional.silu(gate) * up)
    assert torch.equal(gemv.FusedDecodeOps.linear_add(x, proj, residual), residual + proj(x))
    from torch.fx.experimental.proxy_tensor import make_fx

    def ops(rows: int) -> set[str]:
        graph = make_fx(lambda t, r: gemv.FusedDecodeOps.linear_add(t, proj, r))(x[:rows], residual[:rows]).graph
        return {str(n.target) for n in graph.nodes if n.op == "call_function"}

    assert not any("modelab" in op for op in ops(b))
    assert any("modelab" in op for op in ops(1))  # one row: the fused custom op
