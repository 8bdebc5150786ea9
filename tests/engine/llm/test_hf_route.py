"""The transformers route (engine.llm.hf_route): a tiny GPT-2 checkpoint written with save_pretrained runs as
transformers' own module through its StaticCache — eager and compiled greedy tokens and logits against transformers'
own generate, `llm --hf` end to end naming the route, a native-only mode refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.cli import main
from engine.llm import hf, hf_route
from engine.llm.generate import generate
from engine.llm.modes import NATIVE_ONLY_REASON
from engine.llm.report import llm_runs
from engine.store import Store

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("route") / "gpt2"
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return folder


def test_gpt2_takes_the_transformers_route(gpt2: Path) -> None:
    ckpt = hf.inspect(gpt2)
    assert ckpt.route == "transformers" and not ckpt.native and ckpt.identity()["route"] == "transformers"
    assert ckpt.architecture == "GPT2LMHeadModel"
    assert ckpt.parameters == hf.transformers_model(gpt2).num_parameters()
    assert (ckpt.model.dim, ckpt.model.layers, ckpt.model.heads, ckpt.model.vocab) == (32, 2, 2, 100)
    assert hf.inspect(gpt2.parent / "gpt2").hash == ckpt.hash


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_static_cache_generation_matches_transformers_generate(gpt2: Path, mode: str) -> None:
    model = hf_route.load(gpt2)
    cache = hf_route.static_cache(model, 32)
    prepared = hf_route.prepare(mode, model, cache, "cpu")
    prompt = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mine = generate(prepared.prefill, prepared.decoder, prompt, 5)
    theirs = hf_route.reference_generation(gpt2, prompt, 5)
    assert torch.equal(mine.tokens, theirs.tokens)
    for a, b in zip(mine.logits, theirs.logits):
        assert float((a - b).norm() / b.norm()) < 1e-4


def test_counts_come_from_the_module_parameters(gpt2: Path) -> None:
    s = hf_route.shapes_of(hf_route.load(gpt2))
    d, L = 32, 2
    assert s.body_matmul == L * 12 * d * d and s.head == 100 * d and s.embed_rows == 2 * d
    pre = hf_route.prefill_counts(s, 1, 4, 4)
    assert pre.flops == 2 * 4 * L * 12 * d * d + L * 2 * 2 * 16 * 4 * 5 + 2 * d * 100


def test_a_native_only_mode_is_refused_with_the_reason(gpt2: Path, store: Store,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert main(["llm", "--hf", str(gpt2), "--mode", "sdpa-math", "--device", "cpu", "--db", str(store.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"mode sdpa-math is not available for gpt2 (GPT2LMHeadModel): {NATIVE_ONLY_REASON}")
    assert NATIVE_ONLY_REASON == ("the lab's fused kernels need the native decoder; this architecture runs as "
                                  "transformers' module")
    assert llm_runs(store).empty


def test_llm_hf_gpt2_runs_end_to_end_on_the_transformers_route(gpt2: Path, store: Store,
                                                               capsys: pytest.CaptureFixture) -> None:
    code = main(["llm", "--hf", str(gpt2), "--prompt-len", "6", "--new-tokens", "3", "--mode", "eager",
                 "--device", "cpu", "--prefill-iters", "2", "--decode-passes", "1", "--no-profile",
                 "--db", str(store.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    run = store.run(int(llm_runs(store)["id"].iloc[0]))
    assert run["params"]["checkpoint"]["route"] == "transformers"
    assert "route: transformers" in run["notes"][0]
    assert any(n.startswith("reference: transformers' own eager generate") for n in run["notes"])
    metrics = store.metrics([run["id"]])
    get = lambda name: metrics[metrics["name"] == name]["value"]  # noqa: E731
    assert float(get("hf_reference_rel_err").iloc[0]) < 1e-4
    assert float(get("hf_reference_tokens_matched").iloc[0]) == 4
    assert (get("flops") > 0).all() and float(get("tpot_median_us").iloc[0]) > 0
    assert main(["llm-report", str(run["id"]), "--db", str(store.path)]) == 0
