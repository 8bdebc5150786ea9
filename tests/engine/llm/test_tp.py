"""Tensor parallelism of the Llama-style decoder: shards that add up to the full layer (in one process), two gloo
ranks under torchrun whose logits and greedy tokens match the unsharded model run here, and the failure paths (a
world size the heads do not split over, a crashed rank)."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch

from engine.llm.generate import Decoder, generate, step_fn
from engine.llm.run import LLMConfig, build, rel_l2
from engine.llm.tp import RowParallelLinear, shard_decoder
from engine.llm.tp_launch import TensorParallelError, run_tensor_parallel, scaling_efficiency
from engine.llm.tp_rank import llm_config
from engine.workloads.llama import build_model, preset, rope_tables

# float32: the shards only change the order of the sums in o_proj and down_proj (two partial sums added by the
# all-reduce), so the logits stay within rounding, ~1e-7 relative. A wrong head, k/v group or FFN slice is O(1) off.
FP32_REL_TOL = 1e-5
FP32_ABS_TOL = 1e-4
CFG = dict(preset="tiny", prompt_len=12, new_tokens=5, batch=2, prefill_iters=2, decode_passes=2)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("world, overrides", [(2, {}), (4, {"kv_heads": 4})])
@torch.no_grad()
def test_layer_shards_add_up_to_the_full_layer(fused: bool, world: int, overrides: dict) -> None:
    """Each rank's attention and MLP output (its partial sum, before the all-reduce) summed over the ranks is the
    unsharded output; each rank keeps heads/N query heads and kv_heads/N k/v heads (in its KV cache too)."""
    cfg = preset("tiny", **overrides)
    full = build_model(cfg, seed=3)
    if fused:
        full.fuse_projections()
    full.setup_cache(2, 16)
    shards = [shard_decoder(copy.deepcopy(full), r, world, reduce=lambda t: t) for r in range(world)]
    x = torch.randn(2, 7, cfg.dim, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(cfg, 7)
    for i, layer in enumerate(full.layers):
        want_attn, want_mlp = layer.self_attn(x, cos, sin), layer.mlp(x)
        got_attn = sum(s.layers[i].self_attn(x, cos, sin) for s in shards)
        got_mlp = sum(s.layers[i].mlp(x) for s in shards)
        assert rel_l2(got_attn, want_attn) < FP32_REL_TOL and rel_l2(got_mlp, want_mlp) < FP32_REL_TOL
        # one rank alone is far off: the all-reduce is doing real work
        assert rel_l2(shards[0].layers[i].mlp(x), want_mlp) > 0.1
    attn = shards[1].layers[0].self_attn
    assert (attn.heads, attn.kv_heads) == (cfg.heads // world, cfg.kv_heads // world)
    assert attn.kv_cache.k.shape == (2, cfg.kv_heads // world, 16, cfg.head_dim)
    assert isinstance(attn.o_proj, RowParallelLinear) and attn.o_proj.weight.shape == (cfg.dim, cfg.dim // world)
    assert shards[1].lm_head.weight.shape == full.lm_head.weight.shape  # replicated


def test_heads_that_do_not_split_evenly_are_refused(tmp_path: Path) -> None:
    model = build_model(preset("tiny"))  # heads=4, kv_heads=2, ffn=128
    with pytest.raises(ValueError, match="heads divisible by 3; this model has heads=4"):
        shard_decoder(model, 0, 3)
    with pytest.raises(ValueError, match="kv_heads divisible by 4; this model has kv_heads=2"):
        shard_decoder(model, 0, 4)
    assert model.layers[0].self_attn.heads == 4  # refused before anything was sliced
    with pytest.raises(ValueError, match="heads divisible by 3"):
        run_tensor_parallel(CFG, 3, "cpu", tmp_path)
    assert not list(tmp_path.iterdir())  # nothing was launched
    with pytest.raises(ValueError, match="cpu .gloo. or cuda"):
        run_tensor_parallel(CFG, 2, "mps", tmp_path)
    with pytest.raises(ValueError, match="eager only"):
        llm_config({**CFG, "mode": "compile"}, "cpu")


def test_two_gloo_ranks_match_the_unsharded_model(tmp_path: Path) -> None:
    result = run_tensor_parallel(CFG, 2, "cpu", tmp_path, timeout_s=240)
    assert (result["world_size"], result["backend"], result["dtype"]) == (2, "gloo", "float32")

    # The reference, computed here: the same seeded model and prompt, unsharded, greedy through the static cache.
    cfg = LLMConfig(**CFG)
    with torch.no_grad():
        model, prompt = build(cfg)
        eager = step_fn(model)
        ref = generate(eager, Decoder(eager), prompt, cfg.new_tokens)
    saved = torch.load(result["logits_path"], weights_only=True)
    assert len(saved["logits"]) == 1 + cfg.new_tokens
    for got, want in zip(saved["logits"], ref.logits):
        assert got.shape == want.shape == (2, 256)
        assert rel_l2(got, want) < FP32_REL_TOL
        assert float((got - want).abs().max()) < FP32_ABS_TOL
    assert torch.equal(saved["tokens"], ref.tokens)
    assert result["tokens"] == ref.tokens.tolist()
    assert torch.allclose(torch.tensor(result["prefill_logits"]), saved["logits"][0])
    # rank 0's own check against the unsharded model agrees
    assert result["check"]["tokens_matched"] == 1 + cfg.new_tokens
    assert result["check"]["prefill_rel_err"] < FP32_REL_TOL

    # Timing: every timed call kept, an all-reduce figure per prefill and per decode step.
    layers, dim = preset("tiny").layers, preset("tiny").dim
    assert len(result["ttft_samples_us"]) == len(result["allreduce_prefill_us"]) == cfg.prefill_iters
    assert len(result["tpot_samples_us"]) == len(result["allreduce_decode_us"]) == cfg.decode_passes * cfg.new_tokens
    assert all(v > 0 for v in result["tpot_samples_us"] + result["allreduce_decode_us"])
    # the all-reduce time sits inside the step's time
    assert all(a < t for a, t in zip(result["allreduce_decode_us"], result["tpot_samples_us"]))
    assert result["allreduce_calls_per_step"] == 2 * layers  # one per block half
    assert result["allreduce_bytes_per_decode_step"] == 2 * layers * cfg.batch * dim * 4
    assert result["allreduce_bytes_per_prefill"] == 2 * layers * cfg.batch * cfg.prompt_len * dim * 4
    assert [r["rank"] for r in result["per_rank"]] == [0, 1]
    assert result["params_per_rank"] < result["params_full"]


def test_a_crashed_rank_fails_the_run_with_the_log_tail(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError) as info:
        run_tensor_parallel({**CFG, "crash_rank": 1}, 2, "cpu", tmp_path, timeout_s=240)
    message = str(info.value)
    assert "failed (exit code" in message
    assert "rank 1: crash requested by the config" in message  # the rank's own error, from the log's tail
    assert "Traceback" in message
    assert time.monotonic() - t0 < 120  # rank 0, waiting on rank 1, was stopped: no hang until the timeout
    assert not (tmp_path / "tp2-result.json").exists()


def test_scaling_efficiency_is_speedup_over_device_count() -> None:
    assert scaling_efficiency(100.0, 50.0, 2) == pytest.approx(1.0)
    assert scaling_efficiency(100.0, 40.0, 4) == pytest.approx(0.625)
    assert scaling_efficiency(100.0, 100.0, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        scaling_efficiency(100.0, 0.0, 2)
    with pytest.raises(ValueError):
        scaling_efficiency(100.0, 50.0, 0)
