"""The Llama-style decoder's static KV-cache path: greedy decode through the cache equals a full recompute without
one, fusing projections changes nothing, the IR zoo serves the same model, and the correctness check catches a
wrong position or a lost cache (in float32 and in bf16 with the calibrated tolerance)."""

from __future__ import annotations

import pytest
import torch

from engine.ir import zoo
from engine.llm.generate import Decoder, generate, recompute_generate, step_fn
from engine.llm.run import LLMConfig, build, calibrate, check_generation, rel_l2
from engine.measure.checks import ToleranceError
from engine.workloads import llama
from engine.workloads.llama import LlamaConfig, build_model, parameter_count, preset


@pytest.fixture(scope="module")
def tiny() -> tuple[llama.LlamaDecoder, torch.Tensor]:
    """The tiny preset in float32 with a cache for two sequences of up to 32 positions, and a 10-token prompt."""
    model = build_model(preset("tiny"), "cpu", torch.float32, seed=0)
    model.setup_cache(batch=2, max_seq=32)
    prompt = torch.randint(0, model.cfg.vocab, (2, 10), generator=torch.Generator().manual_seed(1))
    return model, prompt


def test_static_cache_decode_equals_full_recompute(tiny) -> None:
    model, prompt = tiny
    fn = step_fn(model)
    with torch.no_grad():
        cached = generate(fn, Decoder(fn), prompt, steps=8)
    full = recompute_generate(model, prompt, steps=8)
    assert torch.equal(cached.tokens, full.tokens)
    assert cached.tokens.shape == (2, 9)
    for j, (a, e) in enumerate(zip(cached.logits, full.logits)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=f"position {j}")


def test_a_second_generation_reuses_the_cache_from_the_start(tiny) -> None:
    """The cache is static: a new prefill overwrites it, nothing of the last run leaks into the next."""
    model, prompt = tiny
    fn = step_fn(model)
    other = torch.randint(0, model.cfg.vocab, (2, 10), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        generate(fn, Decoder(fn), other, steps=12)  # fills positions the next run does not reach
        again = generate(fn, Decoder(fn), prompt, steps=4)
    full = recompute_generate(model, prompt, steps=4)
    assert torch.equal(again.tokens, full.tokens)


def test_fused_projections_compute_the_same_function() -> None:
    model = build_model(preset("tiny"), "cpu", torch.float32, seed=3)
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens)
        model.fuse_projections()
        after = model(tokens)
    assert model.layers[0].self_attn.qkv_proj is not None and not hasattr(model.layers[0].self_attn, "q_proj")
    assert model.layers[0].mlp.gate_up_proj.weight.shape == (2 * 128, 64)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_the_ir_zoo_serves_the_same_model_and_presets() -> None:
    assert zoo.LlamaDecoder is llama.LlamaDecoder and zoo.LlamaConfig is llama.LlamaConfig
    assert zoo.preset_config("llama", "1B") == llama.PRESETS["1B"]
    assert list(zoo.get_zoo("llama").presets)[0] == "tiny"  # the IR tests' smallest preset stays first
    cfg = preset("1B")
    assert (cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn) == (2048, 16, 32, 8, 8192)
    # The plain forward the IR exports: unfused projections, no cache.
    model, _ = zoo.build("llama", "tiny", device="meta")
    names = {n for n, _ in model.named_modules()}
    assert "layers.0.self_attn.q_proj" in names and not any("kv_cache" in n or "qkv" in n for n in names)


@pytest.mark.parametrize("name", ["tiny", "1B", "7B"])
def test_parameter_count_matches_the_module(name: str) -> None:
    with torch.device("meta"):
        model = llama.LlamaDecoder(preset(name))
    assert parameter_count(preset(name)) == sum(p.numel() for p in model.parameters())


def test_forward_cached_needs_a_cache() -> None:
    model = build_model(LlamaConfig(), "cpu", torch.float32)
    with pytest.raises(RuntimeError, match="setup_cache"):
        model.forward_cached(torch.zeros(1, 4, dtype=torch.long), torch.arange(4))


def _broken(fn, kind: str, model):
    def off_by_one(tokens, pos):
        return fn(tokens, pos + 1)

    def lost_cache(tokens, pos):
        for layer in model.layers:  # forget every cached key before the current position
            layer.self_attn.kv_cache.k[:, :, : int(pos)].zero_()
        return fn(tokens, pos)

    return {"off_by_one": off_by_one, "lost_cache": lost_cache}[kind]


@pytest.mark.parametrize("kind", ["off_by_one", "lost_cache"])
def test_the_check_catches_cache_and_position_bugs_in_float32(tiny, kind: str) -> None:
    model, prompt = tiny
    fn = step_fn(model)
    with torch.no_grad():
        ref = generate(fn, Decoder(fn), prompt, steps=4)
        bad = generate(fn, Decoder(_broken(fn, kind, model)), prompt, steps=4)
    with pytest.raises(ToleranceError, match="decode step 1 logits differ"):
        check_generation(bad, ref, 1e-4, kind)


@pytest.mark.parametrize("kind", ["off_by_one", "lost_cache"])
def test_the_calibrated_bf16_tolerance_still_catches_them(kind: str) -> None:
    """bf16: the tolerance is 4× eager's own distance from float32; the bugs land well beyond it."""
    cfg = LLMConfig(preset="small", prompt_len=24, new_tokens=4, dtype="bfloat16")
    with torch.no_grad():
        model, prompt = build(cfg)
        fn = step_fn(model)
        ref = generate(fn, Decoder(fn), prompt, steps=2)
        calib = calibrate(cfg, model, prompt, ref)
        bad = generate(fn, Decoder(_broken(fn, kind, model)), prompt, steps=2)
    assert 1e-3 <= calib.tolerance < 0.1  # bf16 rounding over 4 layers: a few percent at most
    assert rel_l2(bad.logits[1], ref.logits[1]) > 3 * calib.tolerance
    with pytest.raises(ToleranceError):
        check_generation(bad, ref, calib.tolerance, kind)


def test_a_token_flip_between_near_tied_candidates_is_a_tie_not_an_error() -> None:
    from engine.llm.generate import Generation

    ref_logits = torch.tensor([[2.0, 1.999, 0.0]])
    ref = Generation(tokens=torch.tensor([[0, 2]]), logits=[ref_logits, torch.tensor([[0.0, 0.0, 1.0]])])
    # The mode's logits differ by 0.002 (within tolerance) and that flips the argmax: a tie, noted.
    got = Generation(tokens=torch.tensor([[1, 0]]), logits=[torch.tensor([[1.999, 2.001, 0.0]]),
                                                            torch.tensor([[1.0, 0.0, 0.0]])])
    check = check_generation(got, ref, 1e-2, "mode")
    assert check.tokens_matched == 0 and "tie within rounding" in check.notes[0]
    # A clear preference for another token with logits still within tolerance is an error.
    ref2 = Generation(tokens=torch.tensor([[0]]), logits=[torch.tensor([[5.0, 1.0, 0.0]])])
    got2 = Generation(tokens=torch.tensor([[1]]), logits=[torch.tensor([[5.0, 1.0, 0.0]])])
    with pytest.raises(ToleranceError, match="generated token differs"):
        check_generation(got2, ref2, 1e-2, "mode")


def test_nan_or_inf_logits_never_pass_a_check() -> None:
    """A NaN error compares False with any tolerance: the checks ask for finite logits first and say so."""
    from engine.llm.generate import Generation
    from engine.llm.verify import err_text

    good = Generation(torch.tensor([[0, 1]]), [torch.tensor([[2.0, 1.0]]), torch.tensor([[1.0, 2.0]])])
    nan = Generation(good.tokens, [good.logits[0], torch.tensor([[float("nan"), 2.0]])])
    inf = Generation(good.tokens, [torch.tensor([[float("inf"), 1.0]]), good.logits[1]])
    assert check_generation(good, good, 1e-4, "same").tokens_matched == 2
    with pytest.raises(ToleranceError, match=r"decode step 1 logits contain NaN or inf \(1 NaN and 0 inf"):
        check_generation(nan, good, 1e-4, "nan")
    with pytest.raises(ToleranceError, match=r"prefill logits contain NaN or inf \(0 NaN and 1 inf"):
        check_generation(inf, good, 1e-4, "inf")
    with pytest.raises(ToleranceError, match="decode step 1 eager's \\(the reference's\\) logits contain NaN"):
        check_generation(good, nan, 1e-4, "nan reference")
    assert rel_l2(nan.logits[1], good.logits[1]) == float("inf") == rel_l2(good.logits[1], nan.logits[1])
    assert not rel_l2(nan.logits[1], good.logits[1]) <= 1e-4
    assert err_text(float("inf")) == "inf: NaN or inf in the logits"
