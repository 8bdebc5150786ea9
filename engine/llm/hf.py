"""Hugging Face checkpoints from a local folder, for the LLM lab: read, validate, name, load, check.

    python -m engine llm --hf PATH ...          config.json and *.safetensors (one file, or shards with
                                                model.safetensors.index.json), maybe tokenizer files
    python -m engine llm --hf-config PATH ...   a config.json alone (or a folder holding one): the same architecture
                                                with seeded random weights

Nothing is ever downloaded: only the folder's own files are read (transformers, where it is used, runs with
HF_HUB_OFFLINE=1 and local_files_only=True).

The native route: Llama (Llama 3.x 'llama3' RoPE scaling included), Mistral, Qwen2/2.5 (q/k/v biases) and Qwen3
(q/k RMSNorm per head) — SmolLM and TinyLlama are Llama — load into engine.workloads.llama's decoder, so every LLM
mode applies. `inspect` validates a folder without loading any weight (headers only), so the CLI refuses a bad
folder before any run is queued, each problem in one line (CheckpointError).

The transformers route (engine.llm.hf_route): any other causal LM transformers knows (its AutoModelForCausalLM
mapping: GPT-2, Phi-3, Gemma 2/3, …) runs as transformers' own module with its static KV cache, in modes eager,
compile and (CUDA) compile-cudagraph; `Checkpoint.route` says which route a folder takes. Its `model` is the shape
the store and the reports keep (width, layers, heads, FFN width, vocabulary), not a decoder the lab builds.

The reference check of an --hf run (`reference_logits`): transformers' own forward of the same checkpoint, float32 on
the CPU, fed the prompt and the lab's greedy tokens; the lab's logits must match it within the run's tolerance.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.workloads.llama import LlamaConfig, LlamaDecoder, build_model, parameter_count, rope_tables

# Hugging Face architecture → the native route's name for it.
NATIVE = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
          "Qwen3ForCausalLM": "qwen3"}
INDEX = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}
# Tensors a checkpoint may hold that the lab recomputes (RoPE tables) rather than loads.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A folder or config the lab cannot run: one line that says what is wrong and where."""


@dataclass
class Checkpoint:
    """A validated checkpoint folder (or a config alone): what the lab builds from it and how runs name it."""
    folder: Path
    config: dict[str, Any]
    architecture: str
    model: LlamaConfig
    files: list[Path] = field(default_factory=list)  # safetensors files (none for a config alone)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # lab name → shape, from the headers
    weight_dtype: str | None = None  # the safetensors' dtype (the most common one)
    hash: str = ""
    route: str = "native"  # native: the lab's decoder; transformers: transformers' own module (engine.llm.hf_route)

    @property
    def native(self) -> bool:
        return self.route == "native"

    @property
    def has_weights(self) -> bool:
        return bool(self.files)

    @property
    def parameters(self) -> int:
        if not self.native:  # the weights' own shapes (a tied head is stored once)
            return sum(_numel(shape) for shape in self.shapes.values())
        return parameter_count(self.model)

    def identity(self) -> dict[str, Any]:
        """What every run of this checkpoint stores: folder, architecture, parameters, dtype, hash."""
        return {"folder": str(self.folder), "architecture": self.architecture, "parameters": self.parameters,
                "dtype": self.weight_dtype or str(self.config.get("torch_dtype") or self.config.get("dtype") or "—"),
                "weights": "safetensors" if self.has_weights else "random (seeded; config only)", "hash": self.hash,
                "route": self.route}

    def label(self) -> str:
        """A short name for tables and titles: folder name and architecture."""
        return f"{self.folder.name or self.folder} ({self.architecture})"


# -- reading and validating -----------------------------------------------------------------------------------------
def _read_config(path: Path, flag: str) -> tuple[dict[str, Any], bytes]:
    """The config's JSON object and its bytes (hashed into the checkpoint's identity)."""
    try:
        data = path.read_bytes()
        config = json.loads(data)
    except RecursionError:  # arrays or objects nested thousands deep: no config is
        raise CheckpointError(f"{flag} {path}: config.json nests too deeply to be a model config") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise CheckpointError(f"{flag} {path}: config.json is not readable JSON ({reason})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{flag} {path}: config.json is not a JSON object")
    return config, data


def _shown(value: Any) -> str:
    """A config value for a message, as JSON would write it, cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "…"


MAX_SIZE = 2**24  # no real width, head count, layer count, context or vocabulary comes near it


def _size(config: dict[str, Any], key: str, where: str, required: bool = True) -> int | None:
    """config[key] as a whole number from 1 to MAX_SIZE (None when absent and not required); CheckpointError
    naming the field otherwise (a zero head count would divide by zero further on)."""
    value = config.get(key)
    if value is None:
        if required:
            raise CheckpointError(f"{where}: config.json lacks {key!r}")
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise CheckpointError(f"{where}: config.json's {key} is {_shown(value)}; it must be a whole number "
                              f"from 1 to {MAX_SIZE:,}")
    return value


def _positive_number(config: dict[str, Any], key: str, where: str) -> None:
    """CheckpointError unless config[key], when present, is a finite number greater than 0."""
    value = config.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise CheckpointError(f"{where}: config.json's {key} is {_shown(value)}; it must be a finite number "
                              "greater than 0")


def _check_heads(dim: int, heads: int, head_dim: int | None, where: str) -> None:
    if head_dim is None and dim % heads:
        raise CheckpointError(f"{where}: config.json's hidden_size {dim} is not a multiple of num_attention_heads "
                              f"{heads} (and it gives no head_dim)")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def transformers_causal_lm(model_type: str) -> str | None:
    """transformers' causal-LM class name for a config's model_type (its AutoModelForCausalLM mapping), or None."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return None
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def _architecture(config: dict[str, Any], where: str) -> tuple[str, str]:
    """The architecture's name and its route: native (the lab's decoder) or transformers (its own module)."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"{where}: config.json's architectures is {_shown(archs)}; it must be a list of "
                              "names, e.g. [\"LlamaForCausalLM\"]")
    arch = archs[0] if archs else None
    if arch is None:  # some configs name only a model_type
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM"}.get(str(config.get("model_type")))
    if arch in NATIVE:
        return arch, "native"
    known = transformers_causal_lm(str(config.get("model_type")))
    if known is None:
        raise CheckpointError(f"{where}: unknown architecture {arch or config.get('model_type') or '(none named)'}: "
                              f"the lab loads {', '.join(NATIVE)} natively (SmolLM and TinyLlama are Llama) and other "
                              "causal LMs of transformers' AutoModelForCausalLM through the transformers route")
    return arch or known, "transformers"


def shape_config(config: dict[str, Any], where: str = "config.json") -> LlamaConfig:
    """The shape of a transformers-route model as the lab's LlamaConfig (width, layers, heads, k/v heads, head width,
    FFN width, vocabulary): what the store and the reports keep of it, and the KV cache's size. Its FLOPs and bytes
    come from the loaded module's parameters (engine.llm.hf_route), not from this."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise CheckpointError(f"{where}: config.json's text_config is not a JSON object")
    c = dict(text or config)

    def first(*keys: str, required: bool = True) -> int | None:
        for k in keys:
            if c.get(k) is not None:
                return _size(c, k, where)
        return _size(c, keys[0], where, required)

    dim = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head")
    assert dim is not None and heads is not None  # required: _size raised otherwise
    given_head_dim = first("head_dim", required=False)
    _check_heads(dim, heads, given_head_dim, where)
    head_dim = given_head_dim or dim // heads
    ffn = first("intermediate_size", "n_inner", required=False) or 4 * dim
    vocab, layers = first("vocab_size"), first("num_hidden_layers", "n_layer")
    kv_heads = first("num_key_value_heads", required=False) or heads
    seq = min(first("max_position_embeddings", "n_positions", required=False) or 2048, 2048)
    try:
        return LlamaConfig(vocab=vocab, dim=dim, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn, seq=seq,
                           head_size=head_dim if head_dim != dim // heads else None,
                           tie_embeddings=bool(c.get("tie_word_embeddings", True)))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: config.json has an unreadable shape ({exc})") from None


def _rope(config: dict[str, Any]) -> tuple[float, tuple[tuple[str, Any], ...] | None]:
    """RoPE theta and scaling from either layout: rope_theta + rope_scaling, or transformers 5's rope_parameters."""
    params = config.get("rope_parameters") or {}
    scaling = dict(config.get("rope_scaling") or {})
    if params:
        scaling = {**scaling, **{k: v for k, v in params.items() if k != "rope_theta"}}
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    if kind not in ("linear", "llama3"):
        raise ValueError(f"RoPE scaling {kind!r} is not supported natively (default, linear and llama3 are)")
    return theta, tuple(sorted((k, v) for k, v in scaling.items() if isinstance(v, (int, float, str))))


def model_config(config: dict[str, Any], architecture: str, where: str = "config.json") -> LlamaConfig:
    """The lab's LlamaConfig for a Hugging Face config (native architectures); CheckpointError when an option of the
    config is one the lab's decoder does not have."""
    kind = NATIVE[architecture]
    sizes = {key: _size(config, key, where) for key in ("hidden_size", "num_attention_heads", "num_hidden_layers",
                                                          "vocab_size", "intermediate_size")}
    for key in ("num_key_value_heads", "max_position_embeddings"):
        _size(config, key, where, required=False)
    for key in ("rms_norm_eps", "rope_theta"):
        _positive_number(config, key, where)
    _check_heads(sizes["hidden_size"], sizes["num_attention_heads"], _size(config, "head_dim", where, False), where)
    try:
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"activation {config.get('hidden_act')!r} (the lab's MLP is SwiGLU with SiLU)")
        if config.get("mlp_bias"):
            raise ValueError("mlp_bias=true (the lab's MLP has no biases)")
        theta, scaling = _rope(config)
        heads = int(config["num_attention_heads"])
        dim = int(config["hidden_size"])
        head_dim = config.get("head_dim") or dim // heads
        attention_bias = bool(config.get("attention_bias", False))
        cfg = LlamaConfig(
            vocab=int(config["vocab_size"]), dim=dim, layers=int(config["num_hidden_layers"]), heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads), ffn=int(config["intermediate_size"]),
            seq=min(int(config.get("max_position_embeddings") or 2048), 2048),
            rope_theta=theta, eps=float(config.get("rms_norm_eps", 1e-6)),
            head_size=int(head_dim) if int(head_dim) != dim // heads else None,
            qkv_bias=kind == "qwen2" or attention_bias, o_bias=kind != "qwen2" and attention_bias,
            qk_norm=kind == "qwen3", tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_scaling=scaling)
    except KeyError as exc:
        raise CheckpointError(f"{where}: config.json lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: {architecture} with {exc} cannot load natively") from None
    if cfg.heads % cfg.kv_heads:
        raise CheckpointError(f"{where}: {cfg.heads} attention heads are not a multiple of {cfg.kv_heads} k/v heads")
    return cfg


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The lab's parameter names (unfused) and their shapes: what a checkpoint must hold."""
    with torch.device("meta"):
        model = LlamaDecoder(cfg)
    return {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)
            if not (cfg.tie_embeddings and name == "lm_head.weight")}


def lab_name(hf_name: str) -> str:
    """A Hugging Face parameter name in the lab's decoder: `model.layers.0.self_attn.q_proj.weight` →
    `layers.0.self_attn.q_proj.weight`; `lm_head.weight` stays."""
    return hf_name[len("model."):] if hf_name.startswith("model.") else hf_name


def read_header(path: Path, where: str) -> dict[str, Any]:
    """A safetensors file's header (name → dtype, shape, data_offsets); CheckpointError when it is cut short."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{where}: {path.name} is truncated ({size} bytes: not even a safetensors header)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(f"{where}: {path.name} is truncated (its header says {n} bytes of header, the "
                                  f"file holds {size})")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CheckpointError(f"{where}: {path.name} is not a safetensors file (unreadable header)") from None
    header.pop("__metadata__", None)
    end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    if 8 + n + end > size:
        raise CheckpointError(f"{where}: {path.name} is truncated ({size:,} bytes; its header needs "
                              f"{8 + n + end:,})")
    return header


def inspect(path: str | Path, weights: bool = True) -> Checkpoint:
    """Validate a checkpoint folder (weights=True: --hf) or a config (weights=False: --hf-config, a config.json or
    a folder holding one) without loading a weight. Raises CheckpointError with one line on any problem."""
    flag = "--hf" if weights else "--hf-config"
    folder = Path(path).expanduser()
    where = f"{flag} {folder}"
    if not folder.exists():
        raise CheckpointError(f"{where}: no such {'folder' if weights else 'file or folder'}")
    if weights and not folder.is_dir():
        raise CheckpointError(f"{where}: is a file, not a folder (give the folder that holds config.json and "
                              "*.safetensors)")
    config_path = folder if folder.is_file() else folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{where}: no config.json in the folder")
    folder = config_path.parent
    config, config_bytes = _read_config(config_path, flag)
    arch, route = _architecture(config, where)
    if route == "transformers" and not weights:
        raise CheckpointError(f"{where}: {arch} runs through the transformers route, which loads a checkpoint's own "
                              "weights: give --hf FOLDER (--hf-config builds the native architectures only)")
    cfg = model_config(config, arch, where) if route == "native" else shape_config(config, where)
    ckpt = Checkpoint(folder=folder.resolve(), config=config, architecture=arch, model=cfg, route=route)
    digest = hashlib.sha256(config_bytes)
    if weights:
        files, index_bytes = _weight_files(folder, where)
        ckpt.files = files
        if index_bytes is not None:
            digest.update(index_bytes)
        dtypes: dict[str, int] = {}
        for file in files:
            header = read_header(file, where)
            if index_bytes is None:
                digest.update(json.dumps(header, sort_keys=True).encode())
            for name, info in header.items():
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                lab = lab_name(name)
                if lab in ckpt.shapes:
                    raise CheckpointError(f"{where}: {name} is stored twice ({file.name})")
                ckpt.shapes[lab] = tuple(int(d) for d in info["shape"])
                dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + 1
        ckpt.weight_dtype = max(dtypes, key=dtypes.__getitem__) if dtypes else None
        if ckpt.native:  # the transformers route: transformers' from_pretrained checks its own module's shapes
            _check_shapes(ckpt, where)
    ckpt.hash = digest.hexdigest()[:16]
    return ckpt


def _weight_files(folder: Path, where: str) -> tuple[list[Path], bytes | None]:
    """The safetensors files (the index's shards when there is one) and the index's bytes."""
    index = folder / INDEX
    if index.is_file():
        index_bytes = index.read_bytes()
        try:
            weight_map = json.loads(index_bytes)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{where}: {INDEX} has no readable weight_map") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise CheckpointError(f"{where}: {INDEX} names {len(missing)} missing shard(s): {', '.join(missing[:3])}")
        return [folder / s for s in shards], index_bytes
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        other = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf")]
        raise CheckpointError(f"{where}: no weights (*.safetensors) in the folder"
                              + (f"; {', '.join(other[:2])} is not read: convert to safetensors" if other else ""))
    return files, None


def _check_shapes(ckpt: Checkpoint, where: str) -> None:
    want = expected_shapes(ckpt.model)
    got = dict(ckpt.shapes)
    if ckpt.model.tie_embeddings:
        got.pop("lm_head.weight", None)  # some tied checkpoints store the head too: the table is what counts
    for name, shape in want.items():
        if name not in got:
            raise CheckpointError(f"{where}: the weights lack {name} (config.json's {ckpt.architecture} needs it)")
        if got[name] != shape:
            raise CheckpointError(f"{where}: {name} has shape {list(got[name])} in the weights, config.json says "
                                  f"{list(shape)}")
    extra = sorted(set(got) - set(want))
    if extra:
        raise CheckpointError(f"{where}: the weights hold {len(extra)} tensor(s) config.json's {ckpt.architecture} "
                              f"has no place for, e.g. {extra[0]}")


# -- memory ---------------------------------------------------------------------------------------------------------
MARGIN_BYTES = 512 * 2**20  # activations, logits, allocator slack
MARGIN_FRACTION = 0.10


def bytes_needed(ckpt: Checkpoint, dtype: torch.dtype, batch: int, max_seq: int) -> int:
    """Weights + KV cache in the run's dtype, plus a margin (10 % and 512 MiB)."""
    cfg = ckpt.model
    elem = torch.finfo(dtype).bits // 8
    kv = elem * cfg.layers * 2 * batch * cfg.kv_heads * cfg.head_dim * max_seq
    return int((elem * ckpt.parameters + kv) * (1 + MARGIN_FRACTION)) + MARGIN_BYTES


def available_bytes(device: str) -> int | None:
    """Free memory on the device (CUDA: the driver's free figure; CPU: MemAvailable), None when unknown."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(ckpt: Checkpoint, device: str, dtype: torch.dtype, batch: int, max_seq: int,
               free: int | None = None) -> None:
    """One line (MemoryError) when the checkpoint will not fit the device, before anything is loaded."""
    need = bytes_needed(ckpt, dtype, batch, max_seq)
    free = available_bytes(device) if free is None else free
    if free is not None and need > free:
        raise MemoryError(f"{ckpt.label()}: {ckpt.parameters / 1e9:.2f} B parameters in {str(dtype)[6:]} with a "
                          f"KV cache of {batch}×{max_seq} positions need {need / 2**30:.1f} GiB (margin included); "
                          f"{device} has {free / 2**30:.1f} GiB free")


# -- loading --------------------------------------------------------------------------------------------------------
def load_state_dict(ckpt: Checkpoint, dtype: torch.dtype, device: str | torch.device = "cpu"
                    ) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the lab's names, in `dtype` on `device`."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in ckpt.files:
        for name, tensor in load_file(str(file), device="cpu").items():
            if name.endswith(IGNORED_SUFFIXES):
                continue
            out[lab_name(name)] = tensor.to(device=device, dtype=dtype)
    if ckpt.model.tie_embeddings:
        out.pop("lm_head.weight", None)
    return out


def load_model(ckpt: Checkpoint, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0) -> LlamaDecoder:
    """The lab's decoder of the checkpoint (eval mode, unfused): its weights, or seeded random ones for a config
    alone."""
    if not ckpt.has_weights:
        return build_model(ckpt.model, device, dtype, seed)
    with torch.device("meta"):
        model = LlamaDecoder(ckpt.model)
    state = load_state_dict(ckpt, dtype, device)
    model.load_state_dict(state, strict=not ckpt.model.tie_embeddings, assign=True)
    if ckpt.model.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    cos, sin = rope_tables(ckpt.model, ckpt.model.seq)
    model.rope_cos, model.rope_sin = cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)
    return model.eval()


# -- transformers: the reference and the tokenizer ------------------------------------------------------------------
def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def transformers_model(folder: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """transformers' own module of the checkpoint, from the folder only (eval, CPU)."""
    _offline()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True,
                                                attn_implementation="eager").eval()


@torch.no_grad()
def reference_logits(folder: str | Path, prompt: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """transformers' float32 logits on the CPU (one forward, no cache) for the prompt's last position and each of
    the given next tokens but the last: [prefill, decode step 1, …], each (1, V), to compare with the lab's
    generation fed the same tokens (first sequence)."""
    model = transformers_model(folder)
    seq = torch.cat([prompt[:1].cpu(), tokens[:1, :-1].cpu()], dim=1) if tokens.shape[1] > 1 else prompt[:1].cpu()
    logits = model(seq).logits[0].float()
    p = prompt.shape[1]
    return [logits[p - 1 + j][None] for j in range(tokens.shape[1])]


def tokenizer(folder: str | Path) -> Any | None:
    """The checkpoint's tokenizer from its own files, or None where the folder has none."""
    folder = Path(folder)
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    _offline()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError):
        return None


def checkpoint_of(hf: str | None, hf_config: str | None) -> Checkpoint | None:
    """The run's checkpoint (None for a preset run); cached per path within the process."""
    if hf:
        return _cached(str(hf), True)
    if hf_config:
        return _cached(str(hf_config), False)
    return None


_CACHE: dict[tuple[str, bool], Checkpoint] = {}


def _cached(path: str, weights: bool) -> Checkpoint:
    key = (path, weights)
    if key not in _CACHE:
        _CACHE[key] = inspect(path, weights)
    return _CACHE[key]


def model_dict(cfg: LlamaConfig) -> dict[str, Any]:
    """A LlamaConfig as JSON-friendly values (stored with the run; LlamaConfig(**from_dict(d)) rebuilds it)."""
    d = asdict(cfg)
    if d["rope_scaling"] is not None:
        d["rope_scaling"] = [list(kv) for kv in d["rope_scaling"]]
    return d


def from_dict(d: dict[str, Any]) -> LlamaConfig:
    d = dict(d)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = tuple(tuple(kv) for kv in d["rope_scaling"])
    known = set(LlamaConfig.__dataclass_fields__)
    return LlamaConfig(**{k: v for k, v in d.items() if k in known})
