"""Execution modes of the LLM lab: how prefill and the decode step run.

| mode                    | prefill       | decode step                                                             |
| ----------------------- | ------------- | ----------------------------------------------------------------------- |
| eager                   | eager         | eager (a Python call and a kernel launch per op)                        |
| sdpa-flash, -efficient, | eager, SDPA   | eager, the same SDPA backend where it applies                           |
|   -math                 | forced        |                                                                         |
| compile                 | torch.compile | torch.compile (no CUDA graphs)                                          |
| compile-reduce-overhead | torch.compile | torch.compile mode="reduce-overhead" (CUDA graph trees)                 |
| compile-cudagraph       | torch.compile | torch.compile, then the whole step captured by hand into one CUDA graph |
|                         |               | (gpt-fast's loop)                                                       |
| triton-gemv             | torch.compile | compile-cudagraph, every linear of the step (B=1) the hand-written      |
|                         |               | Triton GEMV (engine/kernels/triton/gemv.py) or cuBLAS, whichever is     |
|                         |               | faster for that weight shape here (timed once per process)              |
| triton-decode           | torch.compile | triton-gemv, and the step's attention a Triton flash-decoding kernel    |
|                         |               | (engine/kernels/triton/decode_attention.py) instead of SDPA             |
| triton-fused            | torch.compile | triton-decode, and the RMSNorms, residual adds and SwiGLU inside the    |
|                         |               | GEMVs next to them (norm_linear / norm_swiglu / linear_add in           |
|                         |               | engine/kernels/triton/gemv.py), RoPE and the cache write inside the     |
|                         |               | decode attention (decode_attention_qkv)                                 |
| int8-wo, fp8-wo,        | torch.compile | compile-cudagraph over weight-only quantized decoder layers and LM head |
|   int4-wo               | (CPU: eager)  | (int8 / fp8 per channel, int4 in groups of 64; engine/llm/quant.py),    |
|                         |               | dequantized in PyTorch before each product (CPU: eager)                 |
| triton-int8-wo, -fp8-wo | torch.compile | triton-fused over the same quantized weights: each one-row product the  |
|   -int4-wo              | (CPU: eager)  | Triton GEMV that dequantizes inside its weight loads, with the norms,   |
|                         |               | residual adds and SwiGLU fused as in triton-fused (engine/kernels/      |
|                         |               | triton/quant_gemv.py; CPU: interpreted, correctness only)               |
| transformers-eager,     | eager         | --hf folders only: transformers' own module of the checkpoint through   |
|   -compile,             | (transformers'| its StaticCache, as the transformers route runs eager / compile /       |
|   -compile-cudagraph    | module)       | compile-cudagraph (engine/llm/hf_route.py); beside the native modes of  |
|                         |               | a Llama/Mistral/Qwen folder: what the native route buys                 |

Every compiled function is compiled with dynamic=False and fullgraph=True after torch._dynamo.reset(): the static
cache keeps every shape fixed, so one graph per phase, and a graph break would be a bug worth failing on.

SDPA backends: the prefill calls SDPA with is_causal=True and no mask, which every backend takes. The decode step
passes a boolean mask (keys beyond the current position are not written yet: the cache has a fixed length so the
shapes stay static); FlashAttention on CUDA takes no mask, so in `sdpa-flash` the decode phase is not measured and
the run says why. Whether a backend applies is asked of torch itself (a tiny probe call), not hard-coded.

Quantized modes (`LLMMode.quant`): on CUDA they compile and graph the step like compile-cudagraph; on CPU they run
eagerly (`on_device`), so their numbers can be checked without a GPU. fp8 needs sm_89+ on CUDA. They are gated by
top-1 agreement and KL against the unquantized reference (engine.llm.quant.check_gate, called by engine.llm.run),
not by the logits tolerance of the other modes.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.llm.generate import Decoder, GraphDecoder, StepFn, greedy, pick_into_after, step_fn
from engine.workloads.llama import LlamaDecoder

SDPA_NAMES = ("flash", "efficient", "math")


@dataclass(frozen=True)
class LLMMode:
    name: str
    description: str
    prefill: str = "eager"  # eager | compile
    decode: str = "eager"  # eager | compile | reduce-overhead | cudagraph
    sdpa: str | None = None  # a forced SDPA backend, else torch chooses
    gemv: bool = False  # linears through engine.kernels.triton.gemv (one-row products; F.linear otherwise)
    decode_attn: bool = False  # the decode step's attention through engine.kernels.triton.decode_attention
    fused: bool = False  # norms and residual adds inside the GEMVs (engine.kernels.triton.gemv.FusedDecodeOps)
    quant: str | None = None  # weight-only quantization scheme of the decoder layers (engine.llm.quant.SCHEMES)
    quant_impl: str = "plain"  # plain: dequantize in PyTorch; triton: engine.kernels.triton.quant_gemv
    route: str = "native"  # transformers: transformers' own module of an --hf folder (engine.llm.hf_route)

    @property
    def compiles(self) -> bool:
        return self.prefill == "compile" or self.decode != "eager"


# -- the transformers route (engine.llm.hf_route) -------------------------------------------------------------------
# A checkpoint whose architecture the lab's decoder does not have runs as transformers' own module with its static
# KV cache: eager, its decode step compiled, and on CUDA that compiled step replayed from CUDA graph trees.
TRANSFORMERS_ROUTE_MODES = {
    "eager": "transformers' module eagerly, prefill and decode, through its StaticCache.",
    "compile": "Prefill eager; the decode step (transformers' forward over its StaticCache, argmax) compiled with "
               "torch.compile (Inductor, fullgraph, static shapes); no CUDA graphs.",
    "compile-cudagraph": "Prefill eager; the decode step compiled with mode='reduce-overhead' over the StaticCache "
                         "(the static-cache + torch.compile path transformers documents: Inductor kernels replayed "
                         "from CUDA graph trees). CUDA only.",
}
NATIVE_ONLY_REASON = ("the lab's fused kernels need the native decoder; this architecture runs as transformers' "
                      "module")
# The same three on any --hf folder, named apart: on a native folder (Llama, Mistral, Qwen) they run transformers'
# module of the checkpoint beside the lab's decoder in one group — what the native route buys is their ratio
# (engine.llm.report.native_vs_transformers). Stored under these names, so their series stay apart from the native
# modes'; on a transformers-route folder they are the route's own eager / compile / compile-cudagraph.
TRANSFORMERS_MODES = {f"transformers-{name}": name for name in TRANSFORMERS_ROUTE_MODES}
NEEDS_FOLDER_REASON = ("transformers' own module is loaded from a checkpoint folder (--hf FOLDER); a preset or "
                       "--hf-config has none")
_ROUTE_DECODE = {"eager": "eager", "compile": "compile", "compile-cudagraph": "reduce-overhead"}




_QUANT_MODES = (
    ("int8-wo", "int8 per output channel", ""),
    ("fp8-wo", "fp8 (e4m3) per output channel", " CUDA: sm_89+."),
    ("int4-wo", "int4, symmetric, groups of 64 along K", ""),
)
# engine/llm/run.py checks every mode's logits against eager's within the bf16 tolerance, which a quantized model
# misses by design; the quantized modes are gated by engine.llm.quant.check_gate instead (docs/quantization.md,
# "The accuracy gate").
MODES: dict[str, LLMMode] = {m.name: m for m in (
    LLMMode("eager", "PyTorch eager, op by op; SDPA picks its backend (on an H100 with torch 2.11: cuDNN attention "
            "for both the causal prefill and the masked decode)."),
    LLMMode("sdpa-flash", "Eager with SDPA forced to FlashAttention (CUDA: prefill only, it takes no mask; CPU: "
            "its flash kernel also takes the decode's mask).", sdpa="flash"),
    LLMMode("sdpa-efficient", "Eager with SDPA forced to the memory-efficient kernel (CUDA only).", sdpa="efficient"),
    LLMMode("sdpa-math", "Eager with SDPA forced to the math reference (matmul, softmax, matmul).", sdpa="math"),
    LLMMode("compile", "torch.compile (Inductor) for prefill and for the decode step; no CUDA graphs.",
            prefill="compile", decode="compile"),
    LLMMode("compile-reduce-overhead", "Prefill compiled; the decode step compiled with mode='reduce-overhead' "
            "(Inductor kernels replayed from CUDA graph trees) over the static cache.",
            prefill="compile", decode="reduce-overhead"),
    LLMMode("compile-cudagraph", "gpt-fast style: prefill compiled; the compiled decode step, argmax and the "
            "token/position update captured by hand into one CUDA graph, replayed once per token.",
            prefill="compile", decode="cudagraph"),
    LLMMode("triton-gemv", "compile-cudagraph with every linear layer of the decode step through the project's "
            "Triton GEMV (row blocks per program, fp32 accumulation, tiles autotuned per shape) or cuBLAS, "
            "whichever streams that weight shape faster here (both timed in a CUDA graph at the first step): the "
            "decode step at B=1 is a chain of weight-streaming GEMVs. Prefill and B > 1 take F.linear.",
            prefill="compile", decode="cudagraph", gemv=True),
    LLMMode("triton-decode", "triton-gemv, and the decode step's attention over the static cache a Triton "
            "flash-decoding kernel (every (kv head, 64 cached positions) its own program, then one combine per "
            "head) instead of SDPA, whose kernel gives each kv head one program at B=1.",
            prefill="compile", decode="cudagraph", gemv=True, decode_attn=True),
    LLMMode("triton-fused", "triton-decode, and each RMSNorm, residual add and SwiGLU of the decode step inside "
            "the GEMV next to it (the norm's sum of squares taken in the GEMV's own pass over x, the residual added "
            "in its epilogue), RoPE and the KV-cache write inside the decode attention kernel: six kernels per "
            "layer, programmatic dependent launch between them on sm_90+.",
            prefill="compile", decode="cudagraph", gemv=True, decode_attn=True, fused=True),
    *(LLMMode(f"{scheme}", f"Weight-only {what} (engine/llm/quant.py; decoder layers and LM head quantized, the "
              "embedding kept in the model's dtype): each weight dequantized in PyTorch before its product; on CUDA "
              "compile-cudagraph with the decode step compiled the gpt-fast way (coordinate-descent tuning on, so "
              "Inductor writes each one-row product as a multiply and a sum and fuses the dequantization into "
              "its weight loads), on CPU eager dequantize-then-matmul." + extra,
              prefill="compile", decode="cudagraph", quant=scheme)
      for scheme, what, extra in _QUANT_MODES),
    *(LLMMode(f"triton-{scheme}", f"Weight-only {what} in the triton-fused step: each one-row product the Triton "
              "GEMV that dequantizes inside its weight loads (engine/kernels/triton/quant_gemv.py: codes and scales "
              "loaded with the tile, fp32 accumulation), with triton-fused's fusions kept (RMSNorm, residual adds "
              "and SwiGLU inside the GEMVs, RoPE and the cache write inside the decode attention); the prefill "
              "(several rows) dequantizes each weight in one Triton kernel, then F.linear (cuBLAS); on "
              "CPU interpreted (correctness only)." + extra
              + (" On an H100 the products of K >= 2048 take the tensor-core int4 kernel instead "
                 "(engine/kernels/cuda_quant.py; $MODELAB_INT4_GEMV: auto, cuda or triton)." if scheme == "int4-wo"
                 else ""),
              prefill="compile", decode="cudagraph", gemv=True, decode_attn=True, fused=True, quant=scheme,
              quant_impl="triton")
      for scheme, what, extra in _QUANT_MODES),
    *(LLMMode(name, f"--hf folders only: transformers' own module of the checkpoint (engine/llm/hf_route.py), run "
              f"as the transformers route runs {base}: {TRANSFORMERS_ROUTE_MODES[base]} On a Llama, Mistral or "
              "Qwen folder it sits beside the native modes: what the native route buys.",
              decode=_ROUTE_DECODE[base], route="transformers")
      for name, base in TRANSFORMERS_MODES.items()),
)}


def get_mode(name: str) -> LLMMode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown LLM mode {name!r}; modes: {', '.join(MODES)}") from None


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[name]


@functools.lru_cache(maxsize=64)
def sdpa_unavailable(backend: str, device: str, dtype: torch.dtype, phase: str) -> str | None:
    """Why this SDPA backend cannot run this phase's attention call here (None: it can). Asks torch: a tiny call
    shaped like the phase's (prefill: causal, no mask; decode: one query row per head against a masked cache)."""
    if backend not in SDPA_NAMES:
        raise ValueError(f"unknown SDPA backend {backend!r}; use one of {', '.join(SDPA_NAMES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA device is visible to torch on this machine"
    if backend == "efficient" and not device.startswith("cuda"):
        return "SDPA's memory-efficient kernel is built for CUDA only"
    from torch.nn.attention import sdpa_kernel

    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(1, 2, 4 if phase == "decode" else 16, 64, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(1, 2, 16, 64, generator=gen).to(device=device, dtype=dtype)
    kwargs = ({"attn_mask": (torch.arange(16, device=device) <= 5)[None, :]} if phase == "decode"
              else {"is_causal": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(_backend(backend)):
                torch.nn.functional.scaled_dot_product_attention(q, k, k, **kwargs)
            return None
        except RuntimeError as exc:
            # torch explains the refusal in warnings ("Flash attention does not support non-null attn_mask.");
            # the exception itself only says that no backend was left.
            why = [str(w.message).strip() for w in caught if "attention" in str(w.message).lower()]
            text = "; ".join(dict.fromkeys(why)) or str(exc).splitlines()[0]
            return f"SDPA {backend} does not apply to the {phase} on {device} ({dtype}): {text[:300]}"


def _compiler_missing(device: str) -> str | None:
    from engine.modes.compile import compiler_missing

    return compiler_missing(device)


def on_device(mode: LLMMode, device: str) -> LLMMode:
    """The mode as it runs on `device`: a quantized mode off CUDA runs eagerly (no compile, no CUDA graph)."""
    if mode.quant and not device.startswith("cuda"):
        return dataclasses.replace(mode, prefill="eager", decode="eager")
    return mode


def quant_unavailable(mode: LLMMode, device: str) -> str | None:
    """Why a quantized mode cannot run here (None: it can)."""
    if not mode.quant:
        return None
    from engine.llm.quant import get_scheme

    scheme = get_scheme(mode.quant)
    if device.startswith("cuda"):
        index = torch.device(device).index
        cap = torch.cuda.get_device_capability(index if index is not None else torch.cuda.current_device())
        if cap < scheme.cuda_capability:
            need = "{}.{}".format(*scheme.cuda_capability)
            return f"{mode.quant} needs compute capability {need}+ (this GPU: {cap[0]}.{cap[1]})"
    elif mode.quant_impl == "triton":
        from engine.kernels.triton._common import is_interpreted
        from engine.kernels.triton.decode_attention import _split_kernel
        from engine.kernels.triton.quant_gemv import _wo_channel_kernel

        if not is_interpreted(_wo_channel_kernel) or not is_interpreted(_split_kernel):
            return ("the quantized Triton GEMV and the fused step's decode attention run on CPU only under "
                    "TRITON_INTERPRET=1 (set before triton loads)")
    return None


def availability(mode: LLMMode, device: str, dtype: torch.dtype) -> str | None:
    """Why the mode cannot run at all here (None: it can run, at least its prefill)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA device is visible to torch on this machine"
    if mode.quant:
        try:
            import triton  # noqa: F401
        except ImportError:
            if mode.quant_impl == "triton":
                return "Triton is not installed (the mode's kernels are written in Triton)"
        reason = quant_unavailable(mode, device)
        if reason:
            return reason
        mode = on_device(mode, device)
    if mode.decode in ("reduce-overhead", "cudagraph") and not device.startswith("cuda"):
        return "CUDA graphs need a CUDA device (on CPU this would be the plain compile mode again)"
    if mode.compiles:
        reason = _compiler_missing(device)
        if reason:
            return reason
    if mode.gemv or mode.decode_attn:
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (the mode's kernels are written in Triton)"
    if mode.sdpa:
        return sdpa_unavailable(mode.sdpa, device, dtype, "prefill")
    return None


def phase_unavailable(mode: LLMMode, phase: str, device: str, dtype: torch.dtype, sdpa: str | None = None
                      ) -> str | None:
    """Why one phase of an otherwise available mode cannot run (the flash backend and the masked decode)."""
    backend = mode.sdpa or sdpa
    return sdpa_unavailable(backend, device, dtype, phase) if backend else None


@dataclass
class Prepared:
    prefill: StepFn
    decoder: Decoder | None  # None where the decode phase does not apply (see notes)
    notes: list[str] = field(default_factory=list)
    quantize_s: float | None = None  # a quantized mode: seconds spent quantizing (or loading the cached codes)


def _with_sdpa(fn: StepFn, backend: str | None) -> StepFn:
    if backend is None:
        return fn
    from torch.nn.attention import sdpa_kernel

    def call(tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with sdpa_kernel(_backend(backend)):
            return fn(tokens, input_pos)

    return call


def _compile(fn: StepFn, mode: str | None, fuse_gemv_loads: bool = False) -> StepFn:
    """torch.compile of a step. fuse_gemv_loads: coordinate-descent tuning on for this compile only, as gpt-fast
    sets it globally. With it, Inductor's mm decomposition writes a one-row product as (x · Wᵀ).sum, a reduction
    kernel that fuses whatever produces W — the plain quantized modes' dequantization — into its loads; without it
    the mm is cuBLAS and the dequantized bf16 weight is written to memory and read back every step, at a fraction of
    the copy bandwidth."""
    if not fuse_gemv_loads:
        return torch.compile(fn, mode=mode, dynamic=False, fullgraph=True)
    from torch._inductor import list_mode_options

    options = {**(list_mode_options(mode) if mode else {}), "coordinate_descent_tuning": True}  # mode= or options=
    return torch.compile(fn, options=options, dynamic=False, fullgraph=True)


def configure_inductor() -> None:
    """Kernel names that say which ops they fused (readable operator tables), as gpt-fast sets. gpt-fast also turns
    on coordinate-descent tuning; here it is left off globally, since it about doubles the first prefill's and the
    first decode step's compile time (cold caches). The plain quantized modes turn it on for their decode step
    alone (`_compile`'s fuse_gemv_loads): without it their dequantization is not fused."""
    import torch._inductor.config as inductor_config

    inductor_config.triton.unique_kernel_names = True


def prepare(mode: LLMMode, model: LlamaDecoder, device: str, sdpa: str | None = None, autotune: bool = False
            ) -> Prepared:
    """The prefill callable and the decoder of `mode` over `model` (whose cache is set up). Compilation happens
    lazily, at the first call (timed by the caller as the first-call cost). Steps: reset the compiler → transform the
    model (fuse, quantize, swap in the lab's kernels) → pick the next-token kernel → the prefill → the decoder."""
    mode = on_device(mode, device)
    dtype = model.lm_head.weight.dtype  # before quantization replaces the head
    notes: list[str] = []
    if mode.compiles:
        torch._dynamo.reset()
        configure_inductor()
    quantize_s = _transform_model(mode, model, device, notes)
    build = _Build(mode, model, device, dtype, sdpa, backend=mode.sdpa or sdpa, pick=_next_token_kernel(mode, notes),
                   compile_mode="max-autotune-no-cudagraphs" if autotune else None,
                   # the peer line of a quantized mode is gpt-fast's: its decode step compiled with coordinate-descent
                   # tuning
                   fuse_gemv_loads=bool(mode.quant) and mode.quant_impl == "plain" and device.startswith("cuda"))
    if build.fuse_gemv_loads:
        notes.append("decode step compiled with coordinate-descent tuning (gpt-fast's setting): one-row products "
                     "become reductions that dequantize inside their weight loads")
    plain = step_fn(model)
    prefill = _compile(plain, build.compile_mode) if mode.prefill == "compile" else plain
    decoder = _decoder(build, notes)
    return Prepared(prefill=_with_sdpa(prefill, build.backend), decoder=decoder, notes=notes, quantize_s=quantize_s)


def _transform_model(mode: LLMMode, model: LlamaDecoder, device: str, notes: list[str]) -> float | None:
    """Change the model in place as the mode asks: fused projections, quantized weights, the lab's GEMV, decode
    attention and fused decode ops. Returns the quantization's seconds (None when the mode does not quantize)."""
    quantize_s: float | None = None
    if mode.fused:
        model.fuse_projections()  # before the swap, so the fused projections are GEMV linears too (prefill aside)
    if mode.quant:  # before the swap: quantize_model takes exactly nn.Linear (the fused projections included)
        from engine.llm.quant import quantize_model

        report = quantize_model(model, mode.quant, mode.quant_impl)
        quantize_s = report.seconds
        notes.append(report.note())
        if mode.quant == "int4-wo" and mode.quant_impl == "triton" and device.startswith("cuda"):
            from engine.llm.quant import use_tensor_core_int4

            notes += use_tensor_core_int4(model, device)  # the tensor-core int4 GEMV where it is faster, or why not
        if not device.startswith("cuda"):
            notes.append("CPU: eager, no compile or CUDA graph" + (" (the Triton GEMV interpreted: correctness "
                                                                   "only)" if mode.quant_impl == "triton" else ""))
    if mode.gemv:
        from engine.kernels.triton.gemv import swap_linears

        notes.append(f"{swap_linears(model)} linear layers run through the Triton GEMV "
                     "(engine/kernels/triton/gemv.py) when given one row")
    if mode.decode_attn:
        from engine.kernels.triton.decode_attention import decode_attention

        for layer in model.layers:
            layer.self_attn.decode_attn = decode_attention
        notes.append("decode attention: the Triton flash-decoding kernel (engine/kernels/triton/decode_attention.py)")
    if mode.fused:
        from engine.kernels.triton.decode_attention import decode_attention_qkv
        from engine.kernels.triton.gemv import FusedDecodeOps

        model.set_fused_ops(FusedDecodeOps)
        for layer in model.layers:
            layer.self_attn.decode_attn_qkv = decode_attention_qkv
        notes.append("decode step: RMSNorm inside the qkv, gate_up and lm_head GEMVs, SwiGLU in the gate_up GEMV's "
                     "epilogue, residual adds inside the o and down GEMVs (engine.kernels.triton.gemv.norm_linear / "
                     "norm_swiglu / linear_add); RoPE and the KV-cache write inside the decode attention "
                     "kernel (decode_attention_qkv)")
    if mode.decode_attn:
        notes.extend(_shape_choice(model, fused=mode.fused, int4=mode.quant == "int4-wo"))
    return quantize_s


def _shape_choice(model: LlamaDecoder, fused: bool, int4: bool = False) -> list[str]:
    """The note of what engine.kernels.choice picks for this run's batch and cache: the products' kernel (the fused
    modes) and the decode attention's split count."""
    cache = model.layers[0].self_attn.kv_cache if model.layers else None
    if cache is None:
        return []
    from engine.kernels.choice import describe
    from engine.kernels.triton.decode_attention import split_plan

    batch, kv_heads, context, _ = cache.k.shape
    rep = model.layers[0].self_attn.heads // kv_heads
    splits = split_plan(batch, kv_heads, rep, context, cache.k.dtype, cache.k.device)[1]
    products = ("qkv", "o", "gate_up", "down", "lm_head") if fused else ()
    return [describe(batch, context, splits, products, int4=int4) + " (engine/kernels/choice.py)"]


@dataclass
class _Build:
    """What the decoder builders share: the mode, its model and device, and the choices prepare made."""

    mode: LLMMode
    model: LlamaDecoder
    device: str
    dtype: torch.dtype  # the model's before quantization
    sdpa: str | None
    backend: str | None
    pick: Callable[[torch.Tensor], torch.Tensor]
    compile_mode: str | None
    fuse_gemv_loads: bool


def _eager_decoder(b: _Build, notes: list[str]) -> Decoder:
    return Decoder(_with_sdpa(step_fn(b.model, b.pick), b.backend))


def _compiled_decoder(b: _Build, notes: list[str]) -> Decoder:
    # A separate compiled function from the prefill's: each gets its own graph (t = P vs t = 1).
    return Decoder(_with_sdpa(_compile(step_fn(b.model, b.pick), b.compile_mode), b.backend))


def _reduce_overhead_decoder(b: _Build, notes: list[str]) -> Decoder:
    return Decoder(_with_sdpa(_compile(step_fn(b.model, b.pick), "reduce-overhead"), b.backend),
                   before_step=torch.compiler.cudagraph_mark_step_begin)


def _graph_decoder(b: _Build, notes: list[str]) -> Decoder:
    if b.pick is greedy:
        return GraphDecoder(_with_sdpa(_compile(step_fn(b.model), b.compile_mode, b.fuse_gemv_loads), b.backend))
    # the lab's own argmax after the compiled forward, in the same graph (_next_token_kernel says why), in its in-place
    # form: the token into the graph's token buffer and the position on, in its own kernel
    from engine.kernels.triton.argmax import argmax_rows_into

    forward = _with_sdpa(_compile(step_fn(b.model, _no_pick), b.compile_mode, b.fuse_gemv_loads), b.backend)
    notes.append("the argmax writes the next token into the graph's token buffer and moves the position in its last "
                 "kernel (argmax_rows_into): no copy or add kernels in the step")
    return GraphDecoder(pick_into_after(forward, argmax_rows_into), advances=True)


# How each decode kind builds its decoder.
DECODERS: dict[str, Callable[[_Build, list[str]], Decoder]] = {
    "eager": _eager_decoder, "compile": _compiled_decoder, "reduce-overhead": _reduce_overhead_decoder,
    "cudagraph": _graph_decoder,
}


def _decoder(b: _Build, notes: list[str]) -> Decoder | None:
    """The mode's decoder, or None (with the reason in the notes) where its decode cannot run here."""
    reason = phase_unavailable(b.mode, "decode", b.device, b.dtype, b.sdpa)
    if reason:
        notes.append(f"decode not measured: {reason}")
        return None
    if b.mode.decode not in DECODERS:
        raise ValueError(f"unknown decode kind {b.mode.decode!r}")
    return DECODERS[b.mode.decode](b, notes)


def _next_token_kernel(mode: LLMMode, notes: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    """How the decode step takes its next token: in the lab's own Triton modes engine.kernels.triton.argmax, called
    after the compiled forward, inside the step's CUDA graph — as a custom op inside the compiled step, Inductor's
    compile of the int4 step takes minutes (the recursive str() of the step's IR nodes), so it runs outside the
    compiled forward. It makes the 1B step faster than torch's argmax (docs/figures.md). The peer modes always keep
    torch's (compiled with the step)."""
    if not (mode.gemv or mode.fused or mode.quant_impl == "triton"):
        return greedy
    from engine.kernels.triton import argmax  # noqa: F401 - registers modelab::argmax_rows (Triton already loaded)

    notes.append("next token: the Triton argmax (engine/kernels/triton/argmax.py), after the compiled forward in "
                 "the step's CUDA graph")
    return torch.ops.modelab.argmax_rows


def _no_pick(logits: torch.Tensor) -> torch.Tensor:
    """A compiled forward's stand-in token when the step's pick runs after it (pick_into_after): nothing computed."""
    return logits[:, :1]


def runnable_modes(device: str, dtype: torch.dtype) -> list[str]:
    return [name for name, m in MODES.items() if availability(m, device, dtype) is None]


def mode_table(device: str, dtype: torch.dtype) -> list[dict[str, str | None]]:
    """Every mode with its description and, where it cannot run here, why (for the CLI's --list and the page)."""
    return [{"mode": name, "description": m.description, "unavailable": availability(m, device, dtype),
             "decode_unavailable": (phase_unavailable(m, "decode", device, dtype)
                                    if availability(m, device, dtype) is None else None)}
            for name, m in MODES.items()]



def route_mode(name: str) -> str:
    """The transformers route's own name of a mode (transformers-compile → compile; others as they are)."""
    return TRANSFORMERS_MODES.get(name, name)


def run_route(name: str, route: str) -> str:
    """The route a run of mode `name` takes on a checkpoint of `route`: a transformers-* mode takes transformers'
    module whatever the folder's own route."""
    return "transformers" if name in TRANSFORMERS_MODES else route


def route_unavailable(name: str, route: str, device: str, folder: bool = True) -> str | None:
    """Why mode `name` cannot run a checkpoint of `route` (None: it can, as far as the route goes). `folder`: the
    run has an --hf folder (a transformers-* mode needs one)."""
    if name in TRANSFORMERS_MODES:
        if not folder:
            return NEEDS_FOLDER_REASON
        name, route = TRANSFORMERS_MODES[name], "transformers"
    if route != "transformers":
        return None
    if name not in TRANSFORMERS_ROUTE_MODES:
        return NATIVE_ONLY_REASON
    if name == "compile-cudagraph" and not device.startswith("cuda"):
        return "CUDA graphs need a CUDA device (on CPU this would be the plain compile mode again)"
    return None
