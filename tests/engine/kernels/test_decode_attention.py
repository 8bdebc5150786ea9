"""The Triton flash-decoding kernel of the LLM lab's `triton-decode` mode against SDPA's masked math in float64
(interpreted on CPU; see conftest), and a Llama decoder whose decode attention was switched onto it."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels.triton import decode_attention as da  # noqa: E402
from engine.kernels.triton._common import is_interpreted  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
if DEVICE == "cpu" and not is_interpreted(da._split_kernel):
    pytest.skip("the kernel was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)



TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3}  # relative L2; bf16 outputs are rounded (2^-9 per element)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.double().cpu() - ref.cpu()).norm() / ref.cpu().norm())


# (batch, heads, kv heads, head dim, cache length): GQA groups of 4 and of 1 (7B-like), a cache length that is not a
# multiple of the split, batch > 1.
SHAPES = [(1, 8, 2, 16, 40), (2, 4, 4, 32, 33), (1, 8, 1, 64, 24)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,h,kvh,d,s", SHAPES)
def test_matches_masked_sdpa_math_at_every_kind_of_position(b, h, kvh, d, s, dtype) -> None:
    gen = torch.Generator().manual_seed(b * 100 + h + d + s)
    q = torch.randn(b, h, 1, d, generator=gen).to(DEVICE, dtype)
    k = torch.randn(b, kvh, s, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(b, kvh, s, d, generator=gen).to(DEVICE, dtype)
    # Position 0 (one key: the splits past it must add nothing), inside the first split, exactly at a split boundary,
    # and the last slot of the cache.
    splits = (da.INTERPRETER["SPLIT"],) if DEVICE == "cpu" else (da.TILE_ROWS[0], da.TILE_DOT[0])
    for pos in sorted({0, 5, s - 1, *(min(split, s - 1) for split in splits)}):
        p = torch.tensor([pos], device=DEVICE)
        out = da.decode_attention(q, k, v, p)
        assert out.shape == q.shape and out.dtype == dtype
        assert rel_err(out, da._reference(q, k, v, p)) < TOL[dtype], pos


def test_keys_beyond_the_position_do_not_matter() -> None:
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, 1 if i == 0 else 20, 16, generator=gen).to(DEVICE) for i in range(3))
    k, v = k[:, :2], v[:, :2]
    p = torch.tensor([9], device=DEVICE)
    before = da.decode_attention(q, k, v, p)
    k[:, :, 10:], v[:, :, 10:] = 1e4, float("nan")  # garbage in the unwritten part of the static cache
    assert torch.equal(da.decode_attention(q, k, v, p), before)


def test_refuses_shapes_it_does_not_handle() -> None:
    k = torch.zeros(1, 2, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="one query position"):
        da.decode_attention_fwd(torch.zeros(1, 4, 2, 16, device=DEVICE), k, k, torch.tensor([0]))
    with pytest.raises(ValueError, match="does not fit"):
        da.decode_attention_fwd(torch.zeros(1, 3, 1, 16, device=DEVICE), k, k, torch.tensor([0]))
    k12 = torch.zeros(1, 2, 8, 12, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        da.decode_attention_fwd(torch.zeros(1, 4, 1, 12, device=DEVICE), k12, k12, torch.tensor([0]))


def test_a_decoder_on_the_kernel_decodes_like_sdpa() -> None:
    from engine.llm.generate import Decoder, generate, step_fn
    from engine.workloads.llama import build_model, preset

    cfg = preset("tiny")  # 4 heads over 2 kv heads: GQA groups of 2
    model = build_model(cfg, DEVICE, torch.float32, seed=5).eval()
    model.setup_cache(1, 24)
    prompt = torch.randint(0, cfg.vocab, (1, 8), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        ref = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
        for layer in model.layers:
            layer.self_attn.decode_attn = da.decode_attention
        got = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
    assert torch.equal(got.tokens, ref.tokens)
    assert max(rel_err(a, b.double()) for a, b in zip(got.logits, ref.logits)) < 1e-5


@pytest.mark.sm90_offline
def test_the_llm_kernels_compile_for_the_h100_without_one(aot_check_rows) -> None:
    """The interpreter never lowers to the GPU: compile every tile of the GEMV (plain, +norm, +residual,
    +norm +swiglu), the decode-attention kernels (split, split with RoPE and the cache write, the same as one split
    writing the output, combine) and the argmax's five (one row, chunks, final; one row and final in place) for
    sm_90 with Triton's own ptxas
    (benchmarks/triton_aot_check.py), in a process without TRITON_INTERPRET, cache empty. No kernel spills (a stack
    frame in a kernel without calls)."""
    rows = aot_check_rows()
    assert len(rows) == 8 + 5 + 4 * 12 and all(line.endswith("ok") for line in rows), rows
    argmax = [line for line in rows if line.startswith("argmax")]
    assert len(argmax) == 5 and all(line.split()[-3] == "0" for line in argmax), argmax  # stack bytes


def _rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from engine.workloads.llama import _rotate_half

    return x * cos + _rotate_half(x) * sin


@pytest.mark.parametrize("tile", [None, (16, 16, 2), (64, 16, 4), (0, 16, 2)],
                         ids=["default-tile", "tile-passed", "one-split", "rule-splits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,h,kvh,d,s", SHAPES)
def test_qkv_variant_applies_rope_writes_the_cache_and_attends(b, h, kvh, d, s, dtype, tile) -> None:
    """From the qkv product's raw output: RoPE on q and the new k, k and v written at the position (nothing else of
    the cache touched), attention over positions 0..pos — against the model's own ops in float64; through the
    custom op with the default tile, and with a tile passed as the benchmark passes it (16-position splits: two or
    three over the caches here; one 64-position split: the whole cache, the split kernel writes the output, no
    combine kernel; SPLIT 0: the rule's split count with the tile's inner step, as decode_attention_bench.py --long
    passes it)."""
    from dataclasses import replace

    from engine.workloads.llama import preset, rope_tables

    gen = torch.Generator().manual_seed(11)
    cos_t, sin_t = rope_tables(replace(preset("tiny"), dim=h * d, heads=h, kv_heads=kvh), s)
    for pos in (0, s // 2, s - 1):
        qkv = torch.randn(b, 1, (h + 2 * kvh) * d, generator=gen).to(DEVICE, dtype)
        k_cache = torch.randn(b, kvh, s, d, generator=gen).to(DEVICE, dtype)
        v_cache = torch.randn(b, kvh, s, d, generator=gen).to(DEVICE, dtype)
        k_before, v_before = k_cache.clone(), v_cache.clone()
        cos, sin = cos_t[pos:pos + 1].to(DEVICE, dtype), sin_t[pos:pos + 1].to(DEVICE, dtype)  # the reference's row
        input_pos = torch.tensor([pos], device=DEVICE)
        tables = (cos_t.to(DEVICE, dtype), sin_t.to(DEVICE, dtype))  # the whole tables: the kernel reads row pos
        if tile is None:
            out = da.decode_attention_qkv(qkv, *tables, k_cache, v_cache, input_pos)
        else:
            out = da.decode_attention_qkv_fwd(qkv, *tables, k_cache, v_cache, input_pos, tile=tile)

        q, k, v = qkv.double().split([h * d, kvh * d, kvh * d], dim=-1)
        q = _rope_reference(q.view(b, 1, h, d).transpose(1, 2), cos.double(), sin.double())
        k = _rope_reference(k.view(b, 1, kvh, d).transpose(1, 2), cos.double(), sin.double())
        k_ref, v_ref = k_before.double().clone(), v_before.double().clone()
        k_ref[:, :, pos], v_ref[:, :, pos] = k[:, :, 0], v.view(b, kvh, d)
        others = torch.arange(s, device=DEVICE) != pos
        assert torch.equal(k_cache[:, :, others], k_before[:, :, others])
        assert torch.equal(v_cache[:, :, others], v_before[:, :, others])
        assert rel_err(k_cache[:, :, pos], k_ref[:, :, pos]) < TOL[dtype]
        assert torch.equal(v_cache[:, :, pos], v_ref[:, :, pos].to(dtype))
        want = da._reference(q, k_ref, v_ref, input_pos)
        assert out.shape == (b, h, 1, d) and rel_err(out, want) < 2 * TOL[dtype], (pos, rel_err(out, want))


def test_qkv_variant_refuses_shapes_it_does_not_handle() -> None:
    k = torch.zeros(1, 2, 8, 16, device=DEVICE)
    cos = torch.ones(8, 16, device=DEVICE)
    pos = torch.tensor([0], device=DEVICE)
    with pytest.raises(ValueError, match="not one row"):
        da.decode_attention_qkv_fwd(torch.zeros(1, 2, 8 * 16, device=DEVICE), cos, cos, k, k, pos)
    with pytest.raises(ValueError, match="do not fit together"):
        da.decode_attention_qkv_fwd(torch.zeros(1, 1, 8 * 16, device=DEVICE), cos[:, :8], cos, k, k, pos)
    with pytest.raises(ValueError, match=r"want at least 8 × 16"):  # a table shorter than the cache
        da.decode_attention_qkv_fwd(torch.zeros(1, 1, 8 * 16, device=DEVICE), cos[:4], cos[:4], k, k, pos)


def test_a_fused_decoder_with_rope_in_the_kernel_decodes_like_the_original() -> None:
    """triton-fused's decode step: GEMVs with norms and residuals, RoPE and the cache write inside the attention
    kernel; eager and compiled (fullgraph: the cache-writing custom op traces) give the original tokens."""
    from engine.kernels.triton.gemv import FusedDecodeOps
    from engine.llm.generate import Decoder, generate, step_fn
    from engine.workloads.llama import build_model, preset

    cfg = preset("tiny")
    model = build_model(cfg, DEVICE, torch.float32, seed=5).eval()
    model.setup_cache(1, 24)
    prompt = torch.randint(0, cfg.vocab, (1, 8), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        model.fuse_projections()
        ref = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
        model.set_fused_ops(FusedDecodeOps)
        for layer in model.layers:
            layer.self_attn.decode_attn_qkv = da.decode_attention_qkv
        got = generate(step_fn(model), Decoder(step_fn(model)), prompt, 5)
        torch._dynamo.reset()
        compiled = torch.compile(step_fn(model), fullgraph=True, backend="aot_eager")
        graphed = generate(step_fn(model), Decoder(compiled), prompt, 5)
    for out in (got, graphed):
        assert torch.equal(out.tokens, ref.tokens)
        assert max(rel_err(a, b.double()) for a, b in zip(out.logits, ref.logits)) < 1e-5
