"""A run's reference, cached on disk: what every mode of a group is checked against, computed by one run and loaded by
the others (engine.llm.run's _reference).

What it holds: eager's greedy tokens and logits through the static cache over the steps the check compares and, for
a quantized mode, the accuracy gate's steps (`steps`); the calibration (the logits tolerance, eager's error against
its float32 twin, the twin's logits: engine.llm.verify.calibrate); and the static cache's error against a full
recompute. None of it depends on the mode, only on the key.

The key is everything the reference depends on: the model (its LlamaConfig, the preset and --layers, the
checkpoint's folder and hash), the seed and the prompt's own tokens (hashed; the seed, batch and prompt length make
them, a --prompts file only lengthens P), the steps compared, the cache length, the dtype, fused projections, the
device's name, the torch (and CUDA) version and the source of the modules that compute it (SOURCES). An entry is
in `$MODELAB_BUILD_DIR/llm-reference/<key>.pt` (else `.build/`): a few tensors, the first sequence's float32 logits
and every sequence's eager logits over the steps. A file that does not load, misses a field, names other key fields,
or holds a tensor of another shape or a non-finite value is recomputed and overwritten, never trusted;
engine.llm.run also recomputes one that disagrees with the run's own eager prefill.

One run of a key computes at a time (`Claim`, a file lock beside the entry): the others of its group wait for it and
load what it stored, so a group holds at most one float32 twin per key — what the group planner counts
(engine.llm.group).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import json
import math
import os
import platform
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.llm.config import LLMConfig, prompt_tokens
from engine.llm.generate import Generation
from engine.llm.verify import Calibration

FORMAT = 1  # the stored layout's version: an entry of another is recomputed
FOLDER = "llm-reference"


@dataclass
class Reference:
    """A run's reference: eager's generation over `steps(cfg)` decode steps, the calibration, the cache's error."""
    generation: Generation
    calibration: Calibration
    cache_err: float
    key: str
    run_id: int | None = None  # the run that computed it (None: outside the job runner)


def check_steps(cfg: LLMConfig) -> int:
    """k: the decode steps a mode's generation is compared with eager's over."""
    return min(cfg.check_tokens, cfg.new_tokens)


def steps(cfg: LLMConfig) -> int:
    """The decode steps the reference holds: the check's, or the quantization gate's where that is more (greedy: the
    first k of them are the check's), so that one reference serves every mode of the group."""
    from engine.llm.quant import GATE_STEPS

    return max(check_steps(cfg), min(GATE_STEPS, cfg.new_tokens))


def device_name(device: str) -> str:
    """The device's model: the GPU's name, or the CPU's (eager's logits are the device's own rounding)."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu {line.partition(':')[2].strip()}"
    except OSError:
        pass
    return f"cpu {platform.machine()} {platform.processor()}".strip()


# The modules that compute a reference (the decoder, greedy generation, the calibration): their source is part of
# the key, so an entry never outlives a change to how it is computed.
SOURCES = ("engine.workloads.llama", "engine.llm.generate", "engine.llm.verify")


@functools.cache
def code_hash() -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(Path(importlib.import_module(name).__file__).read_bytes())
    return h.hexdigest()[:16]


def key_fields(cfg: LLMConfig) -> dict:
    """Everything the reference depends on (module docstring), as JSON-ready values."""
    mc = cfg.model_config()
    prompt = prompt_tokens(cfg, mc.vocab)
    checkpoint = cfg.hf or cfg.hf_config
    return {"format": FORMAT, "model": asdict(mc), "preset": None if checkpoint else cfg.preset,
            "layers": cfg.layers, "hf": cfg.hf, "hf_config": cfg.hf_config,
            "checkpoint_hash": (cfg.checkpoint or {}).get("hash") if checkpoint else None,
            "seed": cfg.seed, "batch": cfg.batch, "prompt_len": cfg.prompt_len,
            "prompt_sha256": hashlib.sha256(prompt.numpy().tobytes()).hexdigest()[:16],
            "check_steps": check_steps(cfg), "steps": steps(cfg), "max_seq": cfg.max_seq,
            "dtype": str(cfg.torch_dtype), "fuse": bool(cfg.fuse), "device": device_name(cfg.device),
            "torch": torch.__version__, "cuda": torch.version.cuda, "code": code_hash()}


def _stored_fields(cfg: LLMConfig) -> dict:
    """key_fields as they read back from JSON (tuples as lists): what an entry stores and is compared with."""
    return json.loads(json.dumps(key_fields(cfg), default=str))


def key(cfg: LLMConfig) -> str:
    text = json.dumps(_stored_fields(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def folder() -> Path:
    from engine.runner.worker_env import build_root

    return build_root() / FOLDER


def path_of(cfg: LLMConfig) -> Path:
    return folder() / f"{key(cfg)}.pt"


# -- storing and loading --------------------------------------------------------------------------------------------
def save(cfg: LLMConfig, ref: Reference) -> Path:
    """Write the entry (a temporary file, then an atomic rename: a reader never sees half of it)."""
    gen, cal = ref.generation, ref.calibration
    path = path_of(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"fields": _stored_fields(cfg), "tokens": gen.tokens.detach().cpu(),
               "logits": torch.stack([t.float().cpu() for t in gen.logits]),
               "tolerance": float(cal.tolerance), "eager_fp32_rel_err": cal.eager_fp32_rel_err,
               "fp32_logits": torch.stack([t.float().cpu() for t in cal.fp32_logits]) if cal.fp32_logits
               else torch.empty(0), "cache_err": float(ref.cache_err), "run_id": ref.run_id}
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load(cfg: LLMConfig) -> tuple[Reference | None, str]:
    """The stored reference of cfg's key, or None and why not (none stored, unreadable, or not what this key needs)."""
    path = path_of(cfg)
    if not path.exists():
        return None, "none stored"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: recomputed and overwritten
        return None, f"{path.name} is unreadable ({type(exc).__name__})"
    reason = _invalid(cfg, saved)
    if reason:
        return None, f"{path.name} {reason}"
    fp32 = list(saved["fp32_logits"].unbind(0)) if saved["fp32_logits"].numel() else []
    calibration = Calibration(float(saved["tolerance"]), saved["eager_fp32_rel_err"], fp32)
    generation = Generation(saved["tokens"], list(saved["logits"].unbind(0)))
    run_id = saved["run_id"]
    return Reference(generation, calibration, float(saved["cache_err"]), path.stem,
                     int(run_id) if run_id is not None else None), ""


def _invalid(cfg: LLMConfig, saved: object) -> str | None:
    """Why a loaded payload is not this key's reference, or None."""
    names = ("fields", "tokens", "logits", "tolerance", "eager_fp32_rel_err", "fp32_logits", "cache_err", "run_id")
    if not isinstance(saved, dict):
        return "holds no entry"
    missing = [n for n in names if n not in saved]
    if missing:
        return f"lacks {', '.join(missing)}"
    if saved["fields"] != _stored_fields(cfg):
        return "was computed for other key fields"
    b, s, vocab, k = cfg.batch, steps(cfg), cfg.model_config().vocab, check_steps(cfg)
    fp32_shape = (0,) if cfg.torch_dtype == torch.float32 else (k + 1, 1, vocab)
    for name, tensor, shape, dtype in (("tokens", saved["tokens"], (b, s + 1), torch.int64),
                                       ("logits", saved["logits"], (s + 1, b, vocab), torch.float32),
                                       ("fp32_logits", saved["fp32_logits"], fp32_shape, torch.float32)):
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape or tensor.dtype != dtype:
            got = f"{tuple(tensor.shape)} {tensor.dtype}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            return f"holds {name} of {got}, not {shape} {dtype}"
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return f"holds NaN or inf in {name}"
    if saved["tokens"].numel() and not (0 <= int(saved["tokens"].min()) and int(saved["tokens"].max()) < vocab):
        return "holds tokens outside the vocabulary"
    tol, err, cache = saved["tolerance"], saved["eager_fp32_rel_err"], saved["cache_err"]
    if not (_finite(tol) and tol > 0 and _finite(cache) and 0 <= cache <= tol):
        return f"holds tolerance {tol!r} and cache error {cache!r} (a positive tolerance the error is within)"
    if (err is None) != (cfg.torch_dtype == torch.float32) or (err is not None and not (_finite(err) and err >= 0)):
        return f"holds eager_fp32_rel_err {err!r} for a {cfg.torch_dtype} run"
    if saved["run_id"] is not None and not isinstance(saved["run_id"], int):
        return f"names run {saved['run_id']!r}"
    return None


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def cached(cfg: LLMConfig) -> bool:
    """Whether a valid reference of cfg's key is stored (the group planner: such runs need no float32 twin)."""
    return load(cfg)[0] is not None


# -- one run of a key computes at a time ----------------------------------------------------------------------------
class Claim:
    """The key's lock, a file beside the entry (`who` holds it: "run N"). A run that finds no valid entry takes it
    before computing and keeps it until the entry is stored; another run of the same key that finds it taken waits,
    then finds the entry stored. The lock goes with the process: a run that dies computing leaves it to the next."""

    def __init__(self, cfg: LLMConfig, who: str):
        self.path = path_of(cfg).with_suffix(".lock")
        self.who = who
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, on_wait: Callable[[str], None] = lambda holder: None,
                waiting: Callable[[], AbstractContextManager] = nullcontext) -> None:
        """Take the lock; where another run holds it, on_wait(who) and wait inside `waiting()` (the run gives its
        device hold up meanwhile: engine.runner.device_lock.released)."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                on_wait(os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run")
                with waiting():
                    fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, self.who.encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
