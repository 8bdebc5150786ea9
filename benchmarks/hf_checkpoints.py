"""Your own LLM checkpoints on this machine: write three public-shaped Hugging Face checkpoints with random weights
(`save_pretrained`, safetensors, bf16) and run the LLM lab on each, printing the lab's tables.

    python benchmarks/hf_checkpoints.py --out /tmp/ckpts [--device cuda] [--only llama,qwen,gpt2] [--write-only]

Checkpoints (shapes of the public models; nothing is downloaded, the weights are random):
    llama   Llama-3.2-1B: 16 layers, width 2048, 32 heads / 8 k/v heads of 64, FFN 8192, vocab 128256, llama3 RoPE
            scaling (factor 32), tied embeddings
    qwen    Qwen2.5-1.5B: 28 layers, width 1536, 12 heads / 2 k/v heads of 128, FFN 8960, vocab 151936, q/k/v biases,
            tied embeddings
    gpt2    GPT-2 medium: 24 layers, width 1024, 16 heads, vocab 50257 (the transformers route)

Runs (P = 512 prompt tokens, N = 128 new tokens, B = 1 on CUDA; P = 32, N = 16 on the CPU):
    native folders   --hf FOLDER: the lab's fast modes beside transformers' own compile-cudagraph of the same folder
                     (one group: the "what the native route buys" line), then --hf-config FOLDER/config.json
                     triton-fused: the same shape with the lab's seeded weights, as a preset runs (the ≤ 3 % check);
                     Qwen's q/k/v biases keep it out of triton-fused, so it runs triton-decode instead
    gpt2             --hf FOLDER: transformers' eager, compile and compile-cudagraph
Each run is checked against its reference before its time is printed (docs/llm-checkpoints.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "llama": ("LlamaConfig", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                                  rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=True,
                                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "qwen": ("Qwen2Config", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                                 max_position_embeddings=32768, tie_word_embeddings=True)),
    "gpt2": ("GPT2Config", dict(vocab_size=50257, n_embd=1024, n_layer=24, n_head=16, n_positions=1024)),
}
NATIVE_MODES = "eager,compile-cudagraph,triton-fused,transformers-compile-cudagraph"
# triton-fused folds the projections into x @ W.T and refuses biases: Qwen's fastest native mode is triton-decode
BIASED_MODES = "eager,compile-cudagraph,triton-decode,transformers-compile-cudagraph"
CPU_NATIVE_MODES = "eager,compile,transformers-eager"
GPT2_MODES = "eager,compile,compile-cudagraph"


def write_checkpoint(name: str, folder: Path, device: str) -> float:
    """Random bf16 weights of the shape (initialised on `device`: a 1.5B init on the CPU takes minutes), saved with
    save_pretrained; returns the seconds it took. An existing folder with a config is kept."""
    import torch
    import transformers

    if (folder / "config.json").exists():
        return 0.0
    start = time.perf_counter()
    config_cls, fields = SHAPES[name]
    config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    return time.perf_counter() - start


def llm(args: list[str], db: str) -> tuple[int, float]:
    start = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", "engine", "llm", *args, "--db", db]).returncode
    return rc, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the checkpoints (a local disk)")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    parser.add_argument("--only", default="llama,qwen,gpt2")
    parser.add_argument("--db", default=None, help="results store (default: OUT/results.duckdb)")
    parser.add_argument("--write-only", action="store_true")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in SHAPES]
    if bad:
        parser.error(f"unknown checkpoint {', '.join(bad)}; known: {', '.join(SHAPES)}")
    db = args.db or str(args.out / "results.duckdb")
    cuda = args.device.startswith("cuda")
    size = ["--prompt-len", "512", "--new-tokens", "128"] if cuda else ["--prompt-len", "32", "--new-tokens", "16"]
    rows = []
    for name in names:
        folder = args.out / name
        seconds = write_checkpoint(name, folder, args.device)
        rows.append((f"write {name}", 0, seconds))
    if args.write_only:
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in names:
        folder = str(args.out / name)
        if name == "gpt2":
            modes = GPT2_MODES if cuda else "eager,compile"
            rows.append((f"{name} --hf", *llm(["--hf", folder, "--mode", modes, "--device", args.device, *size], db)))
            continue
        biased = name == "qwen"
        modes = (BIASED_MODES if biased else NATIVE_MODES) if cuda else CPU_NATIVE_MODES
        rows.append((f"{name} --hf", *llm(["--hf", folder, "--mode", modes, "--device", args.device, *size], db)))
        preset_mode = ("triton-decode" if biased else "triton-fused") if cuda else "eager"
        rows.append((f"{name} --hf-config", *llm(["--hf-config", f"{folder}/config.json", "--mode", preset_mode,
                                                  "--device", args.device, *size], db)))
    print(f"\n{'step':<22}{'rc':>4}{'seconds':>10}")
    for step, rc, seconds in rows:
        print(f"{step:<22}{rc:>4}{seconds:>10.1f}")
    return max(rc for _, rc, _ in rows)


if __name__ == "__main__":
    sys.exit(main())
