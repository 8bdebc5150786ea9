"""What one LLM-lab run is: its LLMConfig (preset, shape, mode, device, …), the params dict the store keeps of it,
the device memory it needs, and the seeded model and prompt it builds.

The bottom of the LLM lab's layers: engine.llm.verify and engine.llm.timed sit beside it, engine.llm.tp_rank,
engine.llm.tp_launch, engine.llm.report and engine.llm.run build on it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from engine.llm import metrics as M
from engine.llm.modes import get_mode, route_unavailable, run_route
from engine.workloads.llama import PRESETS, LlamaConfig, LlamaDecoder, build_model, parameter_count, preset

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32}
MAX_POSITIONS = 32768


@dataclass
class LLMConfig:
    preset: str = "tiny"
    layers: int | None = None  # override the preset's layer count (same shapes per layer, shorter model)
    prompt_len: int = 32
    new_tokens: int = 16
    batch: int = 1
    mode: str = "eager"
    device: str = "cpu"
    dtype: str | None = None  # None: bfloat16 on CUDA, float32 on CPU
    seed: int = 0
    fuse: bool = True  # q/k/v and gate/up as one matmul each (gpt-fast's layout)
    sdpa: str | None = None  # force an SDPA backend in every mode (the sdpa-* modes force their own)
    autotune: bool = False  # compile with max-autotune-no-cudagraphs
    prefill_iters: int = 10
    decode_passes: int = 2
    check_tokens: int = 8  # greedy tokens compared with eager (at most new_tokens)
    profile: bool = True
    profile_decode_steps: int = 6
    deep: bool = False
    top_k: int = 5
    ceilings: str = "auto"  # auto: stored or measured now | stored: only stored ones | none
    artifacts_dir: str | None = None
    db: str | None = None
    sweep: str | None = None  # the swept parameters of its group ("batch", "prompt" or "batch,prompt"), for the page
    tp: int = 1  # tensor parallelism over this many ranks (engine.llm.tp_launch; eager only)
    device_memory: int | None = None  # bytes the lab may use on the device (--device-memory): a smaller card rehearsed
    hf: str | None = None  # a Hugging Face checkpoint folder (engine.llm.hf): its weights instead of a preset's
    hf_config: str | None = None  # a Hugging Face config.json: its architecture with seeded random weights
    prompts: str | None = None  # a JSONL prompt file (engine.llm.prompts): validated; the timing runs prompt_len
    checkpoint: dict | None = None  # the checkpoint's identity (folder, architecture, parameters, dtype, hash)
    model: dict | None = None  # the checkpoint's LlamaConfig as a dict (the reports rebuild it from the store)
    extra: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        name = self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
        return DTYPES[name]

    @property
    def route(self) -> str:
        """native (the lab's decoder: presets and Llama/Mistral/Qwen checkpoints) or transformers (another causal
        LM, or any --hf folder in a transformers-* mode, run as transformers' own module: engine.llm.hf_route).
        validate() records it in `checkpoint`."""
        return str((self.checkpoint or {}).get("route") or "native")

    @property
    def max_seq(self) -> int:
        """Cache length: P + N rounded up to 16 (aligned rows for the attention kernels' masks)."""
        return 16 * math.ceil((self.prompt_len + self.new_tokens) / 16)

    def validate(self) -> None:
        """Raises ValueError (one line) on anything wrong; for a checkpoint run it also fills in `checkpoint` and
        `model` (what the store keeps of the checkpoint)."""
        if self.hf or self.hf_config:
            self._validate_checkpoint()
        elif self.preset not in PRESETS:
            raise ValueError(f"no Llama preset {self.preset!r}; presets: {', '.join(PRESETS)}")
        else:
            self._refuse_route_mode(f"preset {self.preset}")
        if self.prompts:  # the cache holds the longest prompt and its new tokens
            self.prompt_len = max(int(self.prompt_len), max(len(p) for p in self.prompt_ids()))
        get_mode(self.mode)
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be at least 1, not {self.layers}")
        for name in ("prompt_len", "new_tokens", "batch", "prefill_iters", "decode_passes", "top_k"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.check_tokens < 0 or self.profile_decode_steps < 1:
            raise ValueError("check_tokens must be ≥ 0 and profile_decode_steps ≥ 1")
        if self.prompt_len + self.new_tokens > MAX_POSITIONS:
            raise ValueError(f"prompt_len + new_tokens = {self.prompt_len + self.new_tokens} exceeds "
                             f"{MAX_POSITIONS} positions")
        if self.sdpa is not None and self.sdpa not in ("flash", "efficient", "math"):
            raise ValueError(f"sdpa must be flash, efficient or math, not {self.sdpa!r}")
        if int(self.tp) < 1:
            raise ValueError(f"tp must be at least 1, not {self.tp}")
        if self.tp > 1 and self.mode != "eager":
            raise ValueError(f"tensor-parallel runs are eager only, not mode {self.mode!r}")
        if self.tp > 1:
            from engine.llm.tp import check_divisible

            check_divisible(self.model_config(), int(self.tp))
        if self.ceilings not in ("auto", "stored", "none"):
            raise ValueError("ceilings must be auto, stored or none")
        self.torch_dtype  # noqa: B018 - raises on an unknown dtype

    def _validate_checkpoint(self) -> None:
        from engine.llm import hf

        if self.hf and self.hf_config:
            raise ValueError("give --hf (a checkpoint folder) or --hf-config (a config.json), not both")
        if self.layers is not None:
            raise ValueError("--layers overrides a preset's depth: a checkpoint's layers are its own")
        if int(self.tp) > 1:
            raise ValueError("tensor parallelism is for presets only, not checkpoints (--hf, --hf-config)")
        ckpt = hf.checkpoint_of(self.hf, self.hf_config)
        assert ckpt is not None
        self.checkpoint = ckpt.identity()
        self.model = hf.model_dict(ckpt.model)
        self._refuse_route_mode(ckpt.label(), ckpt.route)
        if run_route(self.mode, ckpt.route) == "transformers":  # its own attention (sliding windows included)
            self.checkpoint["route"] = "transformers"  # this run's route (a native folder in a transformers-* mode)
            if self.prompts:
                raise ValueError(f"{ckpt.label()}: --prompts is not built for the transformers route yet")
            return
        window = ckpt.config.get("sliding_window")
        if window and (ckpt.config.get("use_sliding_window", True)) and int(window) < self.max_seq:
            raise hf.CheckpointError(f"{ckpt.label()}: sliding-window attention ({window} positions) is shorter than "
                                     f"this run's {self.max_seq} cached positions; the lab's attention is full")
        self.checkpoint = ckpt.identity()
        self.model = hf.model_dict(ckpt.model)

    def _refuse_route_mode(self, label: str, route: str = "native") -> None:
        """One line when the mode cannot run this model's route: a native-only mode on a transformers-route folder,
        a transformers-* mode without an --hf folder."""
        reason = route_unavailable(self.mode, route, self.device, folder=bool(self.hf))
        if reason:
            raise ValueError(f"mode {self.mode} is not available for {label}: {reason}")

    def prompt_ids(self) -> list[list[int]]:
        """The --prompts file's prompts as token ids (the checkpoint's tokenizer for text; PromptError, a
        ValueError, on a bad line)."""
        from engine.llm.prompts import load_prompts

        tokenizer = None
        if self.hf:
            from engine.llm import hf

            tokenizer = hf.tokenizer(self.hf)
        assert self.prompts is not None
        return load_prompts(self.prompts, tokenizer, self.model_config().vocab)

    @property
    def name(self) -> str:
        """The model's name in tables and titles: the preset, or the checkpoint's folder and architecture."""
        if self.hf or self.hf_config:
            from engine.llm import hf

            ckpt = hf.checkpoint_of(self.hf, self.hf_config)
            return ckpt.label() if ckpt else self.preset
        return self.preset

    def model_config(self) -> LlamaConfig:
        if self.hf or self.hf_config:
            from engine.llm import hf

            ckpt = hf.checkpoint_of(self.hf, self.hf_config)
            assert ckpt is not None
            return ckpt.model
        return preset(self.preset, **({"layers": self.layers} if self.layers else {}))


def config_from_params(params: dict[str, Any]) -> LLMConfig:
    known = set(LLMConfig.__dataclass_fields__)
    return LLMConfig(**{k: v for k, v in params.items() if k in known})


def params_of(cfg: LLMConfig) -> dict[str, Any]:
    """The run's parameters as the store keeps them (the local paths and `extra` left out)."""
    params = {k: v for k, v in asdict(cfg).items() if k not in ("artifacts_dir", "db", "extra")}
    if params.get("device_memory") is None:  # runs without a cap keep the params they always had
        params.pop("device_memory", None)
    if not (cfg.hf or cfg.hf_config or cfg.prompts):  # preset runs keep the params they always had
        for key in ("hf", "hf_config", "prompts", "checkpoint", "model"):
            params.pop(key)
    return params


# -- memory ---------------------------------------------------------------------------------------------------------
def memory_needed(cfg: LLMConfig, twin: bool = True) -> int:
    """Bytes of weights and KV cache this run allocates at once (activations and logits come on top): the model,
    and, where it computes its reference (twin), during calibration its float32 twin with a one-sequence cache."""
    elem = torch.finfo(cfg.torch_dtype).bits // 8
    mc = cfg.model_config()
    need = elem * parameter_count(mc) + M.kv_bytes(mc, cfg.batch, cfg.max_seq, elem)
    if twin and cfg.torch_dtype != torch.float32:
        need += 4 * parameter_count(mc) + M.kv_bytes(mc, 1, cfg.max_seq, 4)
    return need


def device_budget(cfg: LLMConfig) -> tuple[int, int, str]:
    """(free bytes the lab may use on the run's GPU, total, how it is capped): the free memory, or less where
    --device-memory caps it (what a smaller card would have, less what other processes hold now)."""
    free, total = torch.cuda.mem_get_info(torch.device(cfg.device))
    if cfg.device_memory:
        used_elsewhere = total - free
        return max(0, min(free, cfg.device_memory - used_elsewhere)), min(total, cfg.device_memory), (
            f" (--device-memory {cfg.device_memory / 2**30:.0f} GiB)")
    return free, total, ""


def check_memory(cfg: LLMConfig, twin: bool = True) -> None:
    """A clear error before allocating a model that cannot fit on this GPU, in what --device-memory leaves of it, or
    in the memory this machine has available for a CPU run (or, for a checkpoint, on its device); twin: the run
    computes its reference (engine.llm.reference) with the float32 twin."""
    if cfg.hf or cfg.hf_config:
        from engine.llm import hf

        ckpt = hf.checkpoint_of(cfg.hf, cfg.hf_config)
        assert ckpt is not None
        hf.check_fits(ckpt, cfg.device, cfg.torch_dtype, cfg.batch, cfg.max_seq)
    if cfg.device == "cpu":
        check_host_memory(cfg, twin)
        return
    if not cfg.device.startswith("cuda"):
        return
    free, total, capped = device_budget(cfg)
    need = memory_needed(cfg, twin)
    if need > 0.95 * free:
        raise MemoryError(f"{cfg.preset} with B={cfg.batch}, {cfg.max_seq} cached positions needs "
                          f"{need / 2**30:.1f} GiB of weights and KV cache"
                          + (" (the float32 twin that calibrates the check included)" if twin else "")
                          + f"; {cfg.device} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} "
                          f"GiB{capped}. Use a smaller preset, batch or length.")


def check_host_memory(cfg: LLMConfig, twin: bool = True) -> None:
    """check_memory for a CPU run: its weights and KV cache (twin: and the float32 twin) against the memory the
    machine has available now (/proc/meminfo's MemAvailable; no check where that is unknown), with the same 5 %
    margin as on a GPU."""
    from engine.llm import hf

    available = hf.available_bytes("cpu")
    need = memory_needed(cfg, twin)
    if available is None or need <= 0.95 * available:
        return
    raise MemoryError(f"{cfg.name} with B={cfg.batch}, {cfg.max_seq} cached positions needs {need:,} bytes "
                      f"({need / 2**30:.1f} GiB) of weights and KV cache"
                      + (" (the float32 twin that calibrates the check included)" if twin else "")
                      + f"; this machine has {available:,} bytes ({available / 2**30:.1f} GiB) available "
                      "(MemAvailable). Use a smaller preset, batch or length.")


def cap_device_memory(cfg: LLMConfig) -> None:
    """Hold this process to --device-memory on its GPU, so that a run rehearsing a smaller card fails where that card
    would (torch's caching allocator refuses beyond the fraction)."""
    if cfg.device_memory and cfg.device.startswith("cuda"):
        device = torch.device(cfg.device)
        # the fraction's setter wants an index: "cuda" alone means the current device
        index = torch.cuda.current_device() if device.index is None else device.index
        _free, total = torch.cuda.mem_get_info(index)
        torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.device_memory / total), index)


# -- the model ------------------------------------------------------------------------------------------------------
def build(cfg: LLMConfig) -> tuple[LlamaDecoder, torch.Tensor]:
    """The seeded model with its static cache, and the seeded prompt (B, P) on the device."""
    if cfg.hf or cfg.hf_config:
        from engine.llm import hf

        ckpt = hf.checkpoint_of(cfg.hf, cfg.hf_config)
        assert ckpt is not None
        model = hf.load_model(ckpt, cfg.device, cfg.torch_dtype, cfg.seed)
    else:
        model = build_model(cfg.model_config(), cfg.device, cfg.torch_dtype, cfg.seed)
    if cfg.fuse:
        model.fuse_projections()
    model.setup_cache(cfg.batch, cfg.max_seq)
    return model, prompt_tokens(cfg, model.cfg.vocab).to(cfg.device)


def prompt_tokens(cfg: LLMConfig, vocab: int) -> torch.Tensor:
    """The seeded prompt (B, P) on the CPU: the same for every mode of one seed and shape."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(0, vocab, (cfg.batch, cfg.prompt_len), generator=gen)
