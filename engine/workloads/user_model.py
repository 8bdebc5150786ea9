"""Bring your own model: any `nn.Module` named by an import path, as a Workload every mode, the profiler and the IR
explorer can run.

    --model my_pkg.my_module:make_model                 the factory returns the nn.Module (weights seeded by --seed)
    --model my_pkg.my_module:make_model:make_inputs     ... and make_inputs(batch_size) its example inputs
    --model my_pkg.my_module:make_model --inputs "float32[B,16];int64[B,32]@0-1000" --seed 0
    --model transformers:gpt2-tiny                      a built-in example (`python -m engine ir --list`)

Input spec: inputs separated by ";", each `dtype[dims]` with an optional value range `@low-high`:
  - dtype: float32 float16 bfloat16 float64 int64 int32 int16 int8 uint8 bool (aliases: float, half, double, long, int)
  - dims: integers, or B for the batch dimension (bench sweeps it; without B the shapes are fixed); [] is a scalar
  - floats are standard normal, or uniform in [low, high) with a range; integers need a range (randint: low inclusive,
    high exclusive), e.g. token ids int64[B,32]@0-1000; bool is random bits
An inputs function takes the batch size as its one argument (or no argument: fixed inputs) and returns a tensor or a
tuple of tensors.

The module stays where the user keeps it: jobs record the import path and the folder to put first on sys.path
(--model-path, default: the current directory), and each worker process imports it from there. Nothing is uploaded.

Training step: MSE against a zero target of the output's shape, unless the factory's module defines
`loss_fn(output) -> scalar tensor`. A model returning a tuple, list, dict or transformers ModelOutput is timed and
checked on its first tensor (runs say so in a note). Dropout makes every training step random: set its p to 0, or
the train-phase comparison with eager fails.

Errors are one line (UserModelError): a bad spec, a module that does not import (with its ImportError), a missing or
non-callable attribute, a factory that raises or returns something other than an nn.Module, bad inputs.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.store import settings
from engine.workloads.base import Workload
from engine.workloads.zoo import ZOO, describe, preset_config

ENV_VAR = "MODELAB_USER_MODEL"  # JSON of the spec a worker runs, so that its child processes can rebuild it too
DEFAULT_BATCH_SIZES = (1, 8)
DEFAULT_TRAIN_BATCH_SIZES = (8,)
IR_BATCH_SIZE = 2  # the B of an input spec when the IR is extracted (one static shape)
MAX_INPUT_ELEMENTS = 1 << 28
MAX_DIM = 1 << 20
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
          "bool": torch.bool, "float": torch.float32, "half": torch.float16, "double": torch.float64,
          "long": torch.int64, "int": torch.int32}
_ALIASES = ("float", "half", "double", "long", "int")
_NAME = r"[A-Za-z_]\w*"
_SPEC_RE = re.compile(rf"^({_NAME}(?:\.{_NAME})*):({_NAME})(?::({_NAME}))?$")
_NUM = r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
_INPUT_RE = re.compile(rf"^([A-Za-z0-9_]+)\[([^\]]*)\](?:@({_NUM})-({_NUM}))?$")


class UserModelError(ValueError):
    """A user model or its inputs cannot be used; the message is one line saying why."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: first non-empty line of the message` (library errors often carry pages of context)."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "").rstrip(":")
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- input specs ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputSpec:
    dtype: str
    dims: tuple[int | None, ...]  # None: the batch dimension B
    low: float | None = None
    high: float | None = None

    @property
    def batched(self) -> bool:
        return None in self.dims

    def shape(self, batch_size: int) -> tuple[int, ...]:
        return tuple(batch_size if d is None else d for d in self.dims)

    def make(self, batch_size: int, device: str, gen: torch.Generator) -> torch.Tensor:
        shape, dtype = self.shape(batch_size), DTYPES[self.dtype]
        n = 1
        for d in shape:
            n *= d
        if n > MAX_INPUT_ELEMENTS:
            raise UserModelError(f"input {self.text()} at batch {batch_size} has {n:,} elements, more than "
                                 f"{MAX_INPUT_ELEMENTS:,}; use smaller shapes")
        if device == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        if dtype == torch.bool:
            out = torch.randint(0, 2, shape, generator=gen).bool()
        elif dtype.is_floating_point:
            if self.low is None:
                out = torch.randn(shape, generator=gen)
            else:
                out = self.low + (self.high - self.low) * torch.rand(shape, generator=gen)
            out = out.to(dtype)
        else:
            out = torch.randint(int(self.low), int(self.high), shape, generator=gen, dtype=torch.int64).to(dtype)
        return out.to(device)

    def text(self) -> str:
        dims = ",".join("B" if d is None else str(d) for d in self.dims)
        rng = "" if self.low is None else f"@{self.low:g}-{self.high:g}"
        return f"{self.dtype}[{dims}]{rng}"


def parse_inputs(text: str) -> list[InputSpec]:
    """'float32[B,16];int64[B,32]@0-1000' → InputSpecs; UserModelError naming the bad item."""
    items = [t.strip() for t in str(text).split(";")]
    if not any(items):
        raise UserModelError("--inputs is empty; give e.g. 'float32[B,16]' or 'int64[B,32]@0-1000'")
    specs = []
    for i, item in enumerate(items, 1):
        where = f"--inputs item {i} {item!r}"
        compact = re.sub(r"\s+", "", item)
        m = _INPUT_RE.match(compact)
        if not m:
            raise UserModelError(f"{where}: expected dtype[dims] with an optional @low-high, e.g. float32[B,16] or "
                                 "int64[B,32]@0-1000")
        dtype_name, dims_text, low, high = m.groups()
        if dtype_name not in DTYPES:
            canonical = ", ".join(k for k in DTYPES if k not in _ALIASES)
            raise UserModelError(f"{where}: unknown dtype {dtype_name!r}; use one of {canonical}")
        dtype = DTYPES[dtype_name]
        dims: list[int | None] = []
        for d in (dims_text.split(",") if dims_text else []):
            if d in ("B", "b"):
                dims.append(None)
            elif d.isdigit() and 1 <= int(d) <= MAX_DIM:
                dims.append(int(d))
            else:
                raise UserModelError(f"{where}: dimension {d!r} is not B or a whole number from 1 to {MAX_DIM:,}")
        if dims.count(None) > 1:
            raise UserModelError(f"{where}: B (the batch dimension) may appear once")
        lo = hi = None
        if low is not None:
            lo, hi = float(low), float(high)
            if dtype == torch.bool:
                raise UserModelError(f"{where}: bool inputs take no range (they are random bits)")
            if not hi > lo:
                raise UserModelError(f"{where}: the range {low}-{high} is empty; write @low-high with high > low")
            if not dtype.is_floating_point and (lo != int(lo) or hi != int(hi) or hi - lo < 1):
                raise UserModelError(f"{where}: an integer range needs whole numbers, high > low (high exclusive)")
        elif not dtype.is_floating_point and dtype != torch.bool:
            raise UserModelError(f"{where}: integer inputs need a value range, e.g. {dtype_name}[{dims_text}]@0-1000 "
                                 "(low inclusive, high exclusive)")
        canonical = str(dtype).removeprefix("torch.")
        specs.append(InputSpec(canonical, tuple(dims), lo, hi))
    return specs


# -- built-in examples ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    name: str
    description: str
    build: Callable[[], nn.Module]  # respects torch.device(...) contexts (meta for the IR)
    inputs: Callable[[], str]  # its input spec
    needs: str | None = None  # a package it imports


def _quiet_transformers() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()  # config warnings about token ids are noise for random-weight models
    return transformers


def _tf(kind: str) -> Callable[[], nn.Module]:
    """Small-config transformers models with random weights, dropout off and no KV cache: nothing is downloaded."""
    def build() -> nn.Module:
        t = _quiet_transformers()
        text = dict(vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        if kind == "gpt2":
            cfg = t.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                               attn_pdrop=0.0, use_cache=False, **text)
            return t.GPT2LMHeadModel(cfg)
        if kind == "bert":
            cfg = t.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               **text)
            return t.BertModel(cfg)
        if kind == "llama":
            cfg = t.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **text)
            return t.LlamaForCausalLM(cfg)
        if kind == "t5":
            cfg = t.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, dropout_rate=0.0,
                             use_cache=False, **text)
            return t.T5EncoderModel(cfg)
        if kind == "vit":
            cfg = t.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, num_labels=10)
            return t.ViTForImageClassification(cfg)
        raise ValueError(kind)

    return build


@functools.lru_cache(maxsize=1)
def lab_examples() -> dict[str, Example]:
    """The zoo's models (engine/workloads/zoo.py, the IR explorer's) at their verifiable presets; inputs derived from
    the zoo's, batch dimension as B. (Built on first use: a check of `my_pkg:make` does not need them.)"""
    out = {}
    for name, zm in ZOO.items():
        for preset in zm.presets:
            if preset != zm.default_preset and preset not in ("tiny", "small"):
                continue  # 1B/7B-shaped presets are for meta-device IR only; batch presets are one model
            label = f"lab:{name}" if preset == zm.default_preset else f"lab:{name}-{preset}"

            def build(zm=zm, preset=preset) -> nn.Module:
                return zm.make(preset_config(zm.name, preset)).eval()

            def inputs(zm=zm, preset=preset) -> str:
                cfg = preset_config(zm.name, preset)
                metas = zm.inputs(cfg, "meta", torch.Generator())
                parts = []
                for t in metas:
                    dims = ",".join(["B", *map(str, t.shape[1:])])
                    rng = f"@0-{cfg['vocab']}" if not t.dtype.is_floating_point else ""
                    parts.append(f"{str(t.dtype).removeprefix('torch.')}[{dims}]{rng}")
                return ";".join(parts)

            out[label] = Example(label, f"{zm.description.rstrip('.')} (lab zoo: {describe(name, preset)})", build,
                                 inputs)
    return out


_TEXT = "int64[B,16]@0-256"
TRANSFORMERS_EXAMPLES: dict[str, Example] = {
    "transformers:gpt2-tiny": Example("transformers:gpt2-tiny", "GPT-2 LM head (2 layers, 64 wide, vocab 256)",
                                      _tf("gpt2"), lambda: _TEXT, "transformers"),
    "transformers:bert-tiny": Example("transformers:bert-tiny", "BERT encoder (2 layers, 64 wide, vocab 256)",
                                      _tf("bert"), lambda: _TEXT, "transformers"),
    "transformers:llama-tiny": Example("transformers:llama-tiny", "Llama causal LM (2 layers, 64 wide, GQA 4/2 "
                                       "heads, RoPE, vocab 256)", _tf("llama"), lambda: _TEXT, "transformers"),
    "transformers:t5-encoder-tiny": Example("transformers:t5-encoder-tiny", "T5 encoder (2 layers, 64 wide, "
                                            "relative attention bias, vocab 256)", _tf("t5"), lambda: _TEXT,
                                            "transformers"),
    "transformers:vit-tiny": Example("transformers:vit-tiny", "ViT image classifier (32×32 images, 8×8 patches, "
                                     "2 layers, 10 classes)", _tf("vit"), lambda: "float32[B,3,32,32]",
                                     "transformers"),
}


def examples(installed_only: bool = True) -> dict[str, Example]:
    """Built-in examples: the lab's, then transformers' (only where it is importable, unless installed_only is
    False)."""
    table = {**lab_examples(), **TRANSFORMERS_EXAMPLES}
    return {k: e for k, e in table.items()
            if not installed_only or e.needs is None or importlib.util.find_spec(e.needs) is not None}


def example(name: str) -> Example | None:
    if name.startswith("lab:"):
        return lab_examples().get(name)
    return TRANSFORMERS_EXAMPLES.get(name)


# -- the spec and its resolution -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    model: str  # "pkg.module:factory[:inputs_fn]" or a built-in example name
    inputs: str | None = None  # input spec text (see parse_inputs)
    seed: int = 0
    path: str | None = None  # folder put first on sys.path before importing (the user's directory)

    @property
    def name(self) -> str:
        """The workload name runs are stored under: the import path, plus the input spec when one was given."""
        return self.model if not self.inputs else f"{self.model} {''.join(self.inputs.split())}"

    def params(self) -> dict[str, Any]:
        return {"model": self.model, "inputs": self.inputs, "seed": self.seed, "model_path": self.path}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ModelSpec | None:
        if not params.get("model"):
            return None
        return cls(str(params["model"]), params.get("inputs") or None, int(params.get("seed") or 0),
                   params.get("model_path") or None)


@dataclass
class Resolved:
    spec: ModelSpec
    factory: Callable[[], Any]
    inputs_fn: Callable[..., Any] | None
    input_specs: list[InputSpec] | None
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None
    source: str  # the module's file, or "built-in"
    description: str
    factory_label: str = ""  # "pkg.module:make_model()" in messages
    inputs_label: str = ""  # "pkg.module:make_inputs"

    @property
    def batched(self) -> bool:
        if self.input_specs is not None:
            return any(s.batched for s in self.input_specs)
        return self.inputs_fn is not None and _takes_batch(self.inputs_fn)


def _takes_batch(fn: Callable) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _import(module: str, path: str | None) -> Any:
    if path:
        folder = str(Path(path).expanduser().resolve())
        if not Path(folder).is_dir():
            raise UserModelError(f"--model-path {path!r} is not a folder")
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        where = f" (looked in {path} and the Python path)" if path else ""
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise UserModelError(f"cannot import {module!r}{where}: {one_line(exc)}; run from the folder that holds "
                                 "it or pass --model-path") from exc
        raise UserModelError(f"cannot import {module!r}: {one_line(exc)} (a module it imports is missing)") from exc
    except Exception as exc:  # noqa: BLE001 - a syntax error or an exception at import time: one line with its cause
        raise UserModelError(f"cannot import {module!r}: {one_line(exc)}") from exc


def resolve(spec: ModelSpec) -> Resolved:
    """Import the module and check the names (nothing is built); UserModelError with the reason."""
    text = spec.model.strip()
    ex = example(text)
    if ex is not None:
        if ex.needs and importlib.util.find_spec(ex.needs) is None:
            raise UserModelError(f"{text} needs the {ex.needs} package (pip install -r requirements-dev.txt)")
        if spec.inputs:
            raise UserModelError(f"{text} is a built-in example with its own inputs ({ex.inputs()}); drop --inputs")
        return Resolved(spec, ex.build, None, parse_inputs(ex.inputs()), None, "built-in", ex.description,
                        factory_label=text)
    m = _SPEC_RE.match(text)
    if not m or text.split(":", 1)[0] in ("lab", "transformers"):  # those prefixes name built-in examples only
        known = ", ".join(examples()) or "none"
        if m or text.split(":", 1)[0] in ("lab", "transformers"):
            raise UserModelError(f"unknown built-in example {text!r}; built-in: {known}")
        raise UserModelError(f"--model {text!r}: expected module.path:factory or module.path:factory:inputs_fn "
                             f"(e.g. my_pkg.models:make_model), or a built-in example ({known})")
    module_name, factory_name, inputs_name = m.groups()
    module = _import(module_name, spec.path)
    source = getattr(module, "__file__", None) or module_name

    def attr(name: str, role: str) -> Callable:
        if not hasattr(module, name):
            raise UserModelError(f"module {module_name!r} ({source}) has no attribute {name!r} (the {role})")
        value = getattr(module, name)
        if not callable(value):
            raise UserModelError(f"{module_name}:{name} is a {type(value).__name__}, not a callable {role}")
        return value

    factory = attr(factory_name, "factory")
    inputs_fn = attr(inputs_name, "inputs function") if inputs_name else None
    if inputs_fn is not None and spec.inputs:
        raise UserModelError(f"give example inputs once: {module_name}:{factory_name}:{inputs_name} or --inputs, "
                             "not both")
    if inputs_fn is None and not spec.inputs:
        raise UserModelError(f"no example inputs for {text}: add an inputs function ({text}:make_inputs) or --inputs, "
                             "e.g. --inputs 'float32[B,16]'")
    specs = parse_inputs(spec.inputs) if spec.inputs else None
    loss = getattr(module, "loss_fn", None)
    if loss is not None and not callable(loss):
        raise UserModelError(f"{module_name}.loss_fn is a {type(loss).__name__}, not a function loss_fn(output)")
    doc = (inspect.getdoc(factory) or "").strip().splitlines()
    desc = f"{text} from {source}" + (f": {doc[0]}" if doc else "")
    return Resolved(spec, factory, inputs_fn, specs, loss, source, desc,
                    factory_label=f"{module_name}:{factory_name}()",
                    inputs_label=f"{module_name}:{inputs_name}" if inputs_name else "")


def build_model(res: Resolved, device: str = "cpu") -> nn.Module:
    """Call the factory with weights seeded by spec.seed; on 'meta' nothing is allocated (for the IR)."""
    label = res.factory_label
    torch.manual_seed(res.spec.seed)
    try:
        if device == "meta":
            try:
                with torch.device("meta"):
                    model = res.factory()
            except Exception:  # noqa: BLE001 - factories that compute on weights at init: build real, then move
                model = res.factory()
        else:
            model = res.factory()
    except UserModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code failed: one line with its reason
        raise UserModelError(f"{label} raised {one_line(exc)}") from exc
    if isinstance(model, tuple):
        raise UserModelError(f"{label} returned a tuple, not a torch.nn.Module: return the module alone and give its "
                             "inputs with :inputs_fn or --inputs")
    if not isinstance(model, nn.Module):
        raise UserModelError(f"{label} returned a {type(model).__name__}, not a torch.nn.Module")
    return model.to(device)


def fixed_batch(res: Resolved) -> int | None:
    """The batch size of unbatched (fixed-shape) inputs, None when the inputs take a batch size."""
    if res.batched:
        return None
    first = build_inputs(res, 1, "meta", _fixed_ok=True)
    return int(first[0].shape[0]) if first and first[0].dim() > 0 else 1


def build_inputs(res: Resolved, batch_size: int, device: str = "cpu", *, _fixed_ok: bool = False) -> tuple:
    """Example inputs at this batch size (seed spec.seed + 1); on 'meta', shapes and dtypes only."""
    if res.input_specs is not None:
        if not res.batched and not _fixed_ok:
            fixed = fixed_batch(res)
            if batch_size != fixed:
                raise UserModelError(f"the inputs {';'.join(s.text() for s in res.input_specs)} have fixed shapes "
                                     f"(batch {fixed}); write B for the batch dimension, e.g. float32[B,16], to run "
                                     f"batch size {batch_size}")
        gen = torch.Generator().manual_seed(res.spec.seed + 1)
        return tuple(s.make(batch_size, device, gen) for s in res.input_specs)
    fn = res.inputs_fn
    label = res.inputs_label
    torch.manual_seed(res.spec.seed + 1)
    try:
        out = fn(batch_size) if _takes_batch(fn) else fn()
    except Exception as exc:  # noqa: BLE001 - the user's code failed: one line with its reason
        raise UserModelError(f"{label}({batch_size}) raised {one_line(exc)}") from exc
    if isinstance(out, torch.Tensor):
        out = (out,)
    if not isinstance(out, (tuple, list)) or not out or not all(isinstance(t, torch.Tensor) for t in out):
        raise UserModelError(f"{label} returned {type(out).__name__}, not a tensor or a tuple of tensors (positional "
                             "inputs of forward)")
    if not res.batched and not _fixed_ok:
        fixed = int(out[0].shape[0]) if out[0].dim() > 0 else 1
        if batch_size != fixed:
            raise UserModelError(f"{label}() takes no batch size and returns batch {fixed}; give it a batch_size "
                                 f"parameter to run batch size {batch_size}")
    if device == "meta":
        return tuple(torch.empty_like(t, device="meta") for t in out)
    return tuple(t.to(device) for t in out)


def default_batches(res: Resolved) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(inference batch sizes, training batch sizes, the IR's batch size)."""
    fixed = fixed_batch(res)
    if fixed is not None:
        return (fixed,), (fixed,), fixed
    return DEFAULT_BATCH_SIZES, DEFAULT_TRAIN_BATCH_SIZES, IR_BATCH_SIZE


# -- the output every mode times: one tensor -------------------------------------------------------------------------
def first_tensor(out: Any) -> Any:
    """The first tensor of a (nested) tuple, list, dict or ModelOutput; a tensor (or an FX proxy) as itself."""
    if isinstance(out, (torch.Tensor, torch.fx.Proxy)):
        return out
    values = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (list, tuple)) else []
    for v in values:
        if v is None:
            continue
        found = first_tensor(v)
        if found is not None:
            return found
    return None


def _describe_output(out: Any) -> tuple[str, str]:
    """(kind of adapter needed, a note for the run) for a forward's output."""
    if isinstance(out, torch.Tensor):
        return "tensor", ""
    t = first_tensor(out)
    if t is None:
        raise UserModelError(f"forward returned {type(out).__name__} with no tensor in it; modes need a tensor output")
    shape = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
    if isinstance(out, (tuple, list)) and isinstance(out[0], torch.Tensor):
        return "index0", f"forward returns a {type(out).__name__} of {len(out)}: modes time and check its first " \
                         f"element ({shape}); the training loss uses it too"
    key = next((k for k, v in out.items() if v is not None), "?") if isinstance(out, dict) else "?"
    return "first", f"forward returns a {type(out).__name__}: modes time and check its first tensor ({key!s}, " \
                    f"{shape}); the training loss uses it too"


class FirstOutput(nn.Module):
    """Element 0 of a model's tuple output, for one to four positional inputs (written out so TorchScript can compile
    it whenever it can compile the model)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class _First1(FirstOutput):
    def forward(self, x0):
        return self.model(x0)[0]


class _First2(FirstOutput):
    def forward(self, x0, x1):
        return self.model(x0, x1)[0]


class _First3(FirstOutput):
    def forward(self, x0, x1, x2):
        return self.model(x0, x1, x2)[0]


class _First4(FirstOutput):
    def forward(self, x0, x1, x2, x3):
        return self.model(x0, x1, x2, x3)[0]


class FirstTensor(FirstOutput):
    """The first tensor of any output structure (dicts, ModelOutput, nesting)."""

    def forward(self, *inputs):
        return first_tensor(self.model(*inputs))


def adapt(model: nn.Module, kind: str, n_inputs: int) -> nn.Module:
    if kind == "tensor":
        return model
    if kind == "index0" and 1 <= n_inputs <= 4:
        return (_First1, _First2, _First3, _First4)[n_inputs - 1](model)
    return FirstTensor(model)


# -- the Workload ---------------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """What `prepare` found: the Workload, what the model returns, and the notes a run should carry."""
    workload: Workload
    resolved: Resolved
    notes: list[str] = field(default_factory=list)
    output: str = ""  # e.g. float32[8, 16, 256]


def prepare(spec: ModelSpec, *, probe: bool = True) -> Prepared:
    """Resolve the spec and build its Workload. With `probe`, build the model on the CPU and run one forward at the
    smallest batch size, so a wrong input or a failing forward is one clear error here, not in every mode."""
    res = resolve(spec)
    infer_b, train_b, _ = default_batches(res)
    kind, note, shape = "tensor", "", ""
    if probe:
        model = build_model(res, "cpu").eval()
        inputs = build_inputs(res, min(infer_b))
        try:
            with torch.no_grad():
                out = model(*inputs)
        except Exception as exc:  # noqa: BLE001 - the user's forward failed on the example inputs
            shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in inputs)
            raise UserModelError(f"forward failed on the example inputs ({shapes}): {one_line(exc)}") from exc
        kind, note = _describe_output(out)
        t = first_tensor(out)
        shape = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
        if not t.is_floating_point():
            raise UserModelError(f"forward's output {shape} is not floating point: modes compare it and the "
                                 "training step differentiates it")
        n_inputs = len(inputs)
    else:
        n_inputs = len(build_inputs(res, min(infer_b), "meta"))
    user_loss = res.loss_fn

    def make_model() -> nn.Module:
        return adapt(build_model(res, "cpu"), kind, n_inputs)

    def make_batch(batch_size: int, device: str) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return build_inputs(res, batch_size, device), torch.zeros(0, device=device)  # loss_fn makes its own target

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if user_loss is not None:
            return user_loss(output)
        return F.mse_loss(output, torch.zeros_like(output))  # MSE against a zero target of the output's shape

    loss_text = "its module's loss_fn" if user_loss else "MSE against zeros"
    workload = Workload(name=spec.name, description=f"{res.description} (training step: {loss_text}).",
                        make_model=make_model, make_batch=make_batch, loss_fn=loss_fn, default_batch_sizes=infer_b,
                        default_train_batch_sizes=train_b)
    notes = [note] if note else []
    return Prepared(workload, res, notes, shape)


def export_to_children(spec: ModelSpec) -> None:
    """Put the spec in MODELAB_USER_MODEL, so that child processes (Nsight Compute, depyf) rebuild the same workload
    (engine.workloads.get_workload reads it back with spec_from_env)."""
    os.environ[ENV_VAR] = json.dumps(spec.params())


def spec_from_env(name: str) -> ModelSpec | None:
    """The spec a parent worker exported in MODELAB_USER_MODEL (e.g. for the Nsight Compute child), if it is `name`."""
    params = settings.get(ENV_VAR)
    if not params:
        return None
    spec = ModelSpec.from_params(params)
    return spec if spec is not None and spec.name == name else None


# -- job targets ----------------------------------------------------------------------------------------------------
# A user model's runs are ordinary bench and profile jobs, which register params["model"] themselves
# (engine.bench.run.user_model_job); the dashboard names their targets explicitly.
BENCH_TARGET = "engine.bench.run:bench_job"
PROFILE_TARGET = "engine.profiling.profile:profile_job"


# -- command line and dashboard helpers -----------------------------------------------------------------------------
def spec_from_args(args: argparse.Namespace) -> ModelSpec | None:
    if not getattr(args, "model", None):
        if getattr(args, "inputs", None):
            raise UserModelError("--inputs needs --model")
        return None
    path = args.model_path or os.getcwd()
    return ModelSpec(args.model.strip(), args.inputs, int(getattr(args, "seed", 0) or 0), str(Path(path).resolve()))


@dataclass
class CheckReport:
    ok: bool
    name: str = ""
    description: str = ""
    notes: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    train_batch_sizes: list[int] = field(default_factory=list)
    output: str = ""
    error: str = ""


def check(spec: ModelSpec, sizes: Sequence[int] = (), probe: bool = True) -> CheckReport:
    """Full validation (import, factory, inputs, one forward unless not `probe`, and inputs at each of `sizes`) as a
    report; never raises for the user's errors."""
    try:
        p = prepare(spec, probe=probe)
        for size in dict.fromkeys(sizes):  # fixed-shape inputs take only their own batch size
            build_inputs(p.resolved, size, "meta")
    except UserModelError as exc:
        return CheckReport(ok=False, error=str(exc))
    w = p.workload
    return CheckReport(ok=True, name=w.name, description=w.description, notes=p.notes,
                       batch_sizes=list(w.default_batch_sizes), train_batch_sizes=list(w.default_train_batch_sizes),
                       output=p.output)


# How long a user model's check may take in its child (import, factory, one forward on the CPU).
CHECK_TIMEOUT_S = 180.0


def check_in_subprocess(spec: ModelSpec, timeout_s: float | None = None, sizes: Sequence[int] = (),
                        probe: bool = True) -> CheckReport:
    """check() in a fresh Python process: neither the dashboard nor the CLI imports the user's code (an exit, a crash
    or a hang in it ends that process, not theirs)."""
    from engine.store.db import REPO_ROOT

    timeout_s = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "engine.workloads.user_model", "--json", json.dumps(spec.params()),
           "--sizes", ",".join(str(s) for s in sizes)] + ([] if probe else ["--no-probe"])
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CheckReport(ok=False, error=f"checking {spec.model} took more than {timeout_s:.0f} s (a hang in its "
                                           "import, factory or forward?)")
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            return CheckReport(**json.loads(line))
        except (ValueError, TypeError):
            continue
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
           else f"exited with code {proc.returncode} before reporting")
    return CheckReport(ok=False, error=f"checking {spec.model} {how} (its import, factory or forward): {tail[:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.workloads.user_model",
                                     description="Check a user model spec; prints one JSON line (internal).")
    parser.add_argument("--json", required=True, help="the spec's params as JSON")
    parser.add_argument("--sizes", default="", help="batch sizes the inputs must take, comma-separated")
    parser.add_argument("--no-probe", action="store_true", help="no forward on the CPU (import and inputs only)")
    args = parser.parse_args(argv)
    spec = ModelSpec.from_params(json.loads(args.json))
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = check(spec, sizes, probe=not args.no_probe) if spec else CheckReport(ok=False, error="no model given")
    sys.stdout.flush()
    print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
