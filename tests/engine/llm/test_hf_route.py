"""The transformers route (engine.llm.hf_route): a tiny GPT-2 checkpoint written with save_pretrained runs as
transformers' own module through its StaticCache — eager and compiled greedy tokens and logits against transformers'
own generate, `llm --hf` end to end naming the route, a native-only mode refused with the reason. The transformers-*
modes: a tiny Llama folder run natively and as transformers' module in one group (distinct stored modes, both
checked, the headline printed); the names on a transformers-route folder; refused without --hf."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.cli.llm import _resolve_modes
from engine.cli.main import main
from engine.llm import hf, hf_route
from engine.llm.config import LLMConfig
from engine.llm.generate import generate
from engine.llm.modes import MODES, NATIVE_ONLY_REASON, NEEDS_FOLDER_REASON, TRANSFORMERS_MODES, availability
from engine.llm.report import llm_runs
from engine.store.db import RunResult, Store

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


# -- transformers' own module of any --hf folder: the transformers-* modes ------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A native-route folder, one layer (the compiled mode's compile is most of the test's time)."""
    folder = tmp_path_factory.mktemp("route") / "llama"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    return folder


def test_a_native_folder_runs_natively_and_as_transformers_module_in_one_group(
        llama: Path, store: Store, capsys: pytest.CaptureFixture) -> None:
    """Prepared side by side (as a GPU group would be), each timed with the device to itself."""
    code = main(["llm", "--hf", str(llama), "--prompt-len", "6", "--new-tokens", "3", "--mode",
                 "eager,transformers-eager,transformers-compile", "--device", "cpu", "--prefill-iters", "2",
                 "--decode-passes", "1", "--no-profile", "--prepare-parallel", "3", "--db", str(store.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    runs = llm_runs(store).set_index("mode")
    assert sorted(runs.index) == ["eager", "transformers-compile", "transformers-eager"]  # stored apart
    assert runs["group_id"].nunique() == 1 and runs["workload"].nunique() == 1  # one checkpoint, the same run
    alongside = store.metrics(list(runs["id"])).query("name == 'prepared_alongside'")
    assert sorted(alongside["run_id"]) == sorted(runs["id"]) and set(alongside["value"]) == {2.0}
    assert runs.loc["eager", "route"] == "native"
    for mode in ("transformers-eager", "transformers-compile"):
        run = store.run(int(runs.loc[mode, "id"]))
        assert run["params"]["checkpoint"]["route"] == "transformers" and run["params"]["mode"] == mode
        assert "route: transformers" in run["notes"][0]
        assert any(n.startswith("reference: transformers' own eager generate") for n in run["notes"])
        metrics = store.metrics([run["id"]])
        get = lambda name, m=metrics: m[m["name"] == name]["value"]  # noqa: E731
        assert float(get("hf_reference_rel_err").iloc[0]) < 1e-4 and float(get("tokens_matched").iloc[0]) == 4
        assert (get("flops") > 0).all() and float(get("tpot_median_us").iloc[0]) > 0
    compiled = store.metrics([int(runs.loc["transformers-compile", "id"])])
    assert float(compiled[(compiled["name"] == "max_rel_err") & (compiled["phase"] == "decode")]["value"].iloc[0]) \
        < 1e-4  # its generation checked against transformers-eager's
    native = store.run(int(runs.loc["eager", "id"]))
    assert native["params"]["checkpoint"]["route"] == "native"
    assert any(n.startswith("reference: transformers' own forward") for n in native["notes"])
    line = next(x for x in out.splitlines() if x.startswith("what the native route buys: eager TPOT "))
    assert "transformers' fastest mode in the group" in line  # no compile-cudagraph on the CPU


def test_all_and_the_transformers_names_per_route(llama: Path, gpt2: Path) -> None:
    native = _resolve_modes("all", "cpu", torch.float32, str(llama))
    assert {"eager", "compile", "transformers-eager", "transformers-compile"} <= set(native)
    assert "transformers-compile-cudagraph" not in native  # CUDA only, as compile-cudagraph
    # on a transformers-route folder the transformers-* names are its own modes: one run each, stored as before
    assert _resolve_modes("all", "cpu", torch.float32, str(gpt2)) == ["eager", "compile"]
    assert _resolve_modes("eager,transformers-eager,transformers-compile", "cpu", torch.float32, str(gpt2)) == [
        "eager", "compile"]
    assert set(TRANSFORMERS_MODES) == {n for n, m in MODES.items() if m.route == "transformers"}
    assert "CUDA graphs" in availability(MODES["transformers-compile-cudagraph"], "cpu", torch.float32)


def test_a_transformers_mode_without_a_folder_is_refused_in_one_line(store: Store,
                                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["llm", "--preset", "tiny", "--mode", "eager,transformers-eager", "--device", "cpu",
                 "--db", str(store.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.endswith(f"mode transformers-eager is not available for preset tiny: {NEEDS_FOLDER_REASON}")
    assert llm_runs(store).empty
    with pytest.raises(ValueError, match="needs|has none"):  # the page and the job runner validate the same way
        LLMConfig(preset="tiny", mode="transformers-compile").validate()


def test_a_route_run_times_with_the_device_to_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prepared beside other runs of its group (native ones of the same folder too), it takes the device alone to
    time and gives it back after, as the native route does."""
    from engine.runner import device_lock

    calls: list[str] = []

    class Hold:
        group_size, waited_s = 3, 0.5

        def exclusive(self) -> None:
            calls.append("exclusive")

        def release(self) -> None:
            calls.append("release")

    monkeypatch.setattr(device_lock, "current", lambda: Hold())
    run = hf_route._RouteRun(LLMConfig(mode="transformers-compile"), lambda f, m: None, RunResult())
    assert run.mode == "compile"
    hold = hf_route._route_take_device(run)
    hf_route._route_give_device_up(run, hold)
    assert calls == ["exclusive", "release"]
    assert {m.name: m.value for m in run.result.metrics} == {"prepared_alongside": 2.0, "device_wait_s": 0.5}
