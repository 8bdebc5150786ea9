"""Hugging Face checkpoints from a local folder (engine.llm.hf): tiny random checkpoints written here with
transformers' save_pretrained load into the lab's decoder and match transformers' own forward and generate; a
sharded checkpoint loads the same; every bad folder is one exact line; one `llm --hf` run end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.cli.main import main
from engine.llm import hf
from engine.llm.generate import Decoder, generate, step_fn
from engine.llm.report import llm_runs
from engine.store.db import Store
from engine.workloads.llama import parameter_count

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
ARCHS = ("llama", "llama3-tied", "qwen2", "qwen3", "mistral")


def _configs() -> dict[str, object]:
    T = transformers
    return {
        "llama": T.LlamaConfig(**SMALL),
        # Llama 3.x: 'llama3' RoPE scaling (a short original context so every band is exercised), tied embeddings
        "llama3-tied": T.LlamaConfig(**SMALL, rope_theta=500000.0, tie_word_embeddings=True, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}),
        "qwen2": T.Qwen2Config(**SMALL),  # q/k/v biases
        "qwen3": T.Qwen3Config(**SMALL, head_dim=32),  # q/k RMSNorm per head, head_dim ≠ hidden / heads
        "mistral": T.MistralConfig(**SMALL, sliding_window=None),
        "gpt2": T.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=2, n_positions=64),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder per architecture (random weights, larger than the default init so attention is peaked and a
    wrong bias, norm or RoPE shows), plus a sharded Llama and the bad folders."""
    root = tmp_path_factory.mktemp("hf")
    out: dict[str, Path] = {}
    torch.manual_seed(0)
    for name, config in _configs().items():
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.2)
        model.save_pretrained(root / name)
        if name == "llama":
            model.save_pretrained(root / "sharded", max_shard_size="40KB")
        out[name] = root / name
    out["sharded"] = root / "sharded"
    return out


def _hf_model(folder: Path) -> object:
    return hf.transformers_model(folder)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_tokens_match_transformers(checkpoints: dict[str, Path], arch: str) -> None:
    ckpt = hf.inspect(checkpoints[arch])
    theirs = _hf_model(checkpoints[arch])
    assert ckpt.parameters == parameter_count(ckpt.model) == theirs.num_parameters()
    lab = hf.load_model(ckpt)
    tokens = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(tokens).logits
        got = lab(tokens)
    assert float((got - want).norm() / want.norm()) < 1e-4
    # greedy generation through the lab's static cache (fused, as runs use it) against transformers' generate
    lab.fuse_projections()
    lab.setup_cache(1, 32)
    prompt = tokens[:1, :10]
    with torch.no_grad():
        mine = generate(step_fn(lab), Decoder(step_fn(lab)), prompt, 5).tokens
        ref = theirs.generate(prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6)[:, 10:]
    assert torch.equal(mine, ref)


def test_bf16_load_is_within_the_calibrated_tolerance(checkpoints: dict[str, Path]) -> None:
    """bf16 lab vs transformers' float32: within 4× the lab's own bf16-vs-fp32 distance (engine.llm.verify)."""
    ckpt = hf.inspect(checkpoints["qwen2"])
    tokens = torch.randint(0, 96, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = _hf_model(checkpoints["qwen2"])(tokens).logits
        fp32 = hf.load_model(ckpt, dtype=torch.float32)(tokens)
        bf16 = hf.load_model(ckpt, dtype=torch.bfloat16)(tokens).float()
    own = float((bf16 - fp32).norm() / fp32.norm())
    assert float((bf16 - want).norm() / want.norm()) <= max(4 * own, 1e-3)


def test_a_sharded_checkpoint_loads_the_same(checkpoints: dict[str, Path]) -> None:
    sharded, single = hf.inspect(checkpoints["sharded"]), hf.inspect(checkpoints["llama"])
    assert len(sharded.files) > 1 and (checkpoints["sharded"] / hf.INDEX).is_file()
    assert sharded.shapes == single.shapes and sharded.hash != single.hash  # the hash covers the index
    a, b = hf.load_model(sharded).state_dict(), hf.load_model(single).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_identity_names_the_checkpoint_and_is_stable(checkpoints: dict[str, Path]) -> None:
    ident = hf.inspect(checkpoints["qwen3"]).identity()
    assert ident["architecture"] == "Qwen3ForCausalLM" and ident["dtype"] == "F32"
    assert ident["folder"].endswith("qwen3") and len(ident["hash"]) == 16
    assert hf.inspect(checkpoints["qwen3"]).hash == ident["hash"]


def test_hf_config_alone_builds_the_architecture_with_seeded_weights(checkpoints: dict[str, Path]) -> None:
    ckpt = hf.inspect(checkpoints["qwen3"] / "config.json", weights=False)
    assert not ckpt.has_weights and ckpt.identity()["weights"].startswith("random")
    a, b = hf.load_model(ckpt, seed=3), hf.load_model(ckpt, seed=3)
    assert a.layers[0].self_attn.q_norm is not None
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _bad(checkpoints: dict[str, Path], tmp_path: Path, case: str) -> Path:
    src = checkpoints["llama"]
    if case == "file":
        return src / "config.json"
    folder = tmp_path / case
    shutil.copytree(src, folder)
    if case == "no-config":
        (folder / "config.json").unlink()
    elif case == "no-weights":
        (folder / "model.safetensors").unlink()
    elif case == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "shapes":
        config = json.loads((folder / "config.json").read_text())
        config["intermediate_size"] = 128
        (folder / "config.json").write_text(json.dumps(config))
    elif case == "architecture":  # GPT-2 takes the transformers route (test_hf_route.py); this one nobody knows
        config = json.loads((folder / "config.json").read_text())
        config.update(architectures=["FooForCausalLM"], model_type="foo")
        (folder / "config.json").write_text(json.dumps(config))
    return folder


BAD = {
    "file": "is a file, not a folder (give the folder that holds config.json and *.safetensors)",
    "no-config": ": no config.json in the folder",
    "no-weights": ": no weights (*.safetensors) in the folder",
    "truncated": ": model.safetensors is truncated (",
    "shapes": ": layers.0.mlp.gate_proj.weight has shape [112, 64] in the weights, config.json says [128, 64]",
    "architecture": ": unknown architecture FooForCausalLM: the lab loads LlamaForCausalLM, MistralForCausalLM, "
                    "Qwen2ForCausalLM, Qwen3ForCausalLM natively (SmolLM and TinyLlama are Llama) and other causal "
                    "LMs of transformers' AutoModelForCausalLM through the transformers route",
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_folder_is_one_exact_line(checkpoints: dict[str, Path], tmp_path: Path, case: str) -> None:
    folder = _bad(checkpoints, tmp_path, case)
    with pytest.raises(hf.CheckpointError) as info:
        hf.inspect(folder)
    assert str(info.value).startswith(f"--hf {folder}") and BAD[case] in str(info.value)
    assert "\n" not in str(info.value)


def test_the_cli_refuses_a_bad_folder_before_queueing(checkpoints: dict[str, Path], tmp_path: Path,
                                                      store: Store, capsys: pytest.CaptureFixture) -> None:
    folder = _bad(checkpoints, tmp_path, "truncated")
    assert main(["llm", "--hf", str(folder), "--device", "cpu", "--db", str(store.path)]) == 2
    err = capsys.readouterr().err
    assert "is truncated" in err and len(err.strip().splitlines()) == 1
    assert llm_runs(store).empty


def test_a_checkpoint_too_big_for_the_device_says_so_before_loading(checkpoints: dict[str, Path]) -> None:
    ckpt = hf.inspect(checkpoints["llama"])
    with pytest.raises(MemoryError, match=r"llama \(LlamaForCausalLM\): 0\.00 B parameters in float32 with a KV "
                                          r"cache of 1×64 positions need 0\.5 GiB \(margin included\); cpu has "
                                          r"0\.0 GiB free"):
        hf.check_fits(ckpt, "cpu", torch.float32, 1, 64, free=1000)
    hf.check_fits(ckpt, "cpu", torch.float32, 1, 64, free=2**40)


def test_the_fused_decode_ops_refuse_qk_norm_with_the_reason(checkpoints: dict[str, Path]) -> None:
    model = hf.load_model(hf.inspect(checkpoints["qwen3"]))
    model.fuse_projections()
    with pytest.raises(RuntimeError, match="q/k RMSNorm per head"):
        model.set_fused_ops(object())


def test_llm_hf_runs_end_to_end_checked_against_transformers(checkpoints: dict[str, Path], store: Store,
                                                             capsys: pytest.CaptureFixture) -> None:
    code = main(["llm", "--hf", str(checkpoints["qwen2"]), "--prompt-len", "6", "--new-tokens", "3",
                 "--mode", "eager", "--device", "cpu", "--prefill-iters", "2", "--decode-passes", "1",
                 "--no-profile", "--db", str(store.path)])
    out = capsys.readouterr().out
    assert code == 0, out
    run = store.run(int(llm_runs(store)["id"].iloc[0]))
    ident = hf.inspect(checkpoints["qwen2"]).identity()
    assert run["params"]["checkpoint"] == ident and run["workload"] == f"hf-qwen2-{ident['hash'][:8]}"
    assert any(n.startswith("reference: transformers' own forward") for n in run["notes"])
    assert llm_runs(store)["checkpoint"].iloc[0] == f"qwen2 (Qwen2ForCausalLM, {ident['hash']})"
    metrics = store.metrics([run["id"]])
    err = float(metrics[metrics["name"] == "hf_reference_rel_err"]["value"].iloc[0])
    assert err < 1e-4
    assert float(metrics[metrics["name"] == "params"]["value"].iloc[0]) == ident["parameters"]
    assert main(["llm-report", str(run["id"]), "--db", str(store.path)]) == 0
    report = capsys.readouterr().out
    assert report.startswith(f"# LLM run #{run['id']}: qwen2 (Qwen2ForCausalLM) · eager")
    assert f"hash {ident['hash']}" in report
