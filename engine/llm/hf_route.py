"""The transformers route: a causal LM the lab's decoder does not have (GPT-2, Phi-3, Gemma 2/3, …) run as
transformers' own module, from its local folder, through transformers' StaticCache.

    python -m engine llm --hf ~/models/gpt2 --mode eager,compile
    python -m engine llm --hf ~/models/Llama-3.2-1B --mode triton-fused,transformers-compile-cudagraph --device cuda

Any --hf folder runs here in modes transformers-eager, transformers-compile and transformers-compile-cudagraph (a
native Llama/Mistral/Qwen folder too: beside its native modes, what the native route buys); on a transformers-route
folder they are its eager, compile and compile-cudagraph (engine.llm.modes.route_mode).

In order (engine.llm.run.llm_run hands a transformers-route run here):

1. Load: AutoModelForCausalLM.from_pretrained(folder, local_files_only=True) with HF_HUB_OFFLINE=1, in the run's
   dtype on the device; a StaticCache of P + N positions (rounded up to 16).
2. Eager through the static cache (prefill, then one step per token: transformers' forward with cache_position,
   logits_to_keep=1, argmax) is checked against transformers' own eager `generate` of the same checkpoint (float32,
   CPU, no static cache) on the first sequence: greedy tokens equal and logits within TOLERANCE_FP32 in float32; in
   a lower precision its distance e from that float32 reference is stored and sets the mode's tolerance
   (TOLERANCE_FACTOR · e, at least TOLERANCE_FLOOR), as the native route's float32 twin does.
3. The mode (eager; compile: the decode step through torch.compile; compile-cudagraph, CUDA only: the decode step
   compiled with mode='reduce-overhead' — CUDA graph trees over the static cache): first prefill and first decode
   step timed on their own, then its greedy generation checked against eager's (engine.llm.verify).
4. TTFT (prefill_iters prefills) and TPOT (decode_passes passes of N steps), as the native route times them.
5. FLOPs and bytes from the loaded module's parameter shapes (`counts`), MFU and MBU against the stored ceilings.

Not on this route: torch.profiler passes and Nsight Compute (noted), --prompts (refused by LLMConfig.validate),
the lab's fused kernels (every mode but the three above is refused: NATIVE_ONLY_REASON).
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.llm import metrics as M
from engine.llm.config import LLMConfig
from engine.llm.generate import Decoder, Generation, StepFn, generate
from engine.llm.modes import TRANSFORMERS_ROUTE_MODES, route_mode, route_unavailable
from engine.llm.timed import decode_pass, sync, timed_calls
from engine.llm.verify import TOLERANCE_FACTOR, TOLERANCE_FLOOR, TOLERANCE_FP32, check_generation, rel_l2
from engine.measure.checks import ToleranceError
from engine.measure.timing import summarize
from engine.store.db import Metric, RunResult, Samples

Progress = Callable[[float, str], None]
ROUTE_NOTE = "route: transformers (transformers' own module and StaticCache; the lab's kernels do not apply)"


# -- loading and the step -------------------------------------------------------------------------------------------
def load(folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
         attn_implementation: str | None = None) -> Any:
    """transformers' module of the checkpoint, from the folder only (eval, on the device)."""
    from engine.llm.hf import _offline

    _offline()
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True,
                                                **kwargs).to(device).eval()


def static_cache(model: Any, max_cache_len: int) -> Any:
    """transformers' StaticCache for the module (its layers allocated at the first prefill, batch from it)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_cache_len)


def rewind(cache: Any) -> None:
    """Back to position 0 without clearing the buffers: transformers 5's static layers keep their write position
    themselves (`cumulative_length`, a tensor at a static address) and take no cache_position; a prefill rewinds
    it, and the causal mask hides what the previous pass left beyond it."""
    for layer in getattr(cache, "layers", []):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            length.zero_()
        elif length is not None:
            layer.cumulative_length = 0
        if hasattr(layer, "cumulative_length_int"):
            layer.cumulative_length_int = 0


def step_fn(model: Any, cache: Any, prefill: bool = False) -> StepFn:
    """(tokens, positions) → (greedy next token, last-position logits) through the module and its static cache; the
    prefill's rewinds the cache to position 0 first (positions must continue the cache's own write position)."""
    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if prefill:
            rewind(cache)
        out = model(input_ids=tokens, past_key_values=cache, position_ids=input_pos[None].expand(tokens.shape[0], -1),
                    use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        return logits.argmax(dim=-1, keepdim=True), logits

    return step


@dataclass
class RoutePrepared:
    prefill: StepFn
    decoder: Decoder
    notes: list[str]


def prepare(mode: str, model: Any, cache: Any, device: str) -> RoutePrepared:
    """The prefill (eager in every mode of the route) and the decoder of `mode` (eager, compile, compile-cudagraph or
    their transformers-* names). Compilation happens at the first decode step."""
    reason = route_unavailable(mode, "transformers", device)
    mode = route_mode(mode)
    if reason:
        raise RuntimeError(f"mode {mode} is not available on the transformers route: {reason}")
    plain = step_fn(model, cache, prefill=True)
    if mode == "eager":
        return RoutePrepared(plain, Decoder(step_fn(model, cache)), [])
    torch._dynamo.reset()
    if mode == "compile":
        step = torch.compile(step_fn(model, cache), dynamic=False, fullgraph=True)
        return RoutePrepared(plain, Decoder(step), ["decode step: torch.compile (Inductor, fullgraph) of "
                                                    "transformers' forward over its StaticCache"])
    # compile-cudagraph: transformers' documented static-cache recipe (mode='reduce-overhead': CUDA graph trees).
    # Written for CUDA, not run on the CPU-only machine it was written on.
    step = torch.compile(step_fn(model, cache), mode="reduce-overhead", dynamic=False, fullgraph=True)
    return RoutePrepared(plain, Decoder(step, before_step=torch.compiler.cudagraph_mark_step_begin),
                         ["decode step: torch.compile mode='reduce-overhead' (CUDA graph trees) of transformers' "
                          "forward over its StaticCache"])


# -- the reference --------------------------------------------------------------------------------------------------
@torch.no_grad()
def reference_generation(folder: str | Path, prompt: torch.Tensor, steps: int) -> Generation:
    """transformers' own greedy `generate` (float32, CPU, eager attention, its default cache) of the first sequence:
    the prefill's token and `steps` more, with the logits of each."""
    model = load(folder, "cpu", torch.float32, attn_implementation="eager")
    p = prompt.shape[1]
    out = model.generate(prompt[:1].cpu(), max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False,
                         output_logits=True, return_dict_in_generate=True,
                         pad_token_id=model.config.eos_token_id if model.config.pad_token_id is None else None)
    return Generation(tokens=out.sequences[:, p:], logits=[x.float() for x in out.logits])


# -- FLOPs and bytes from the module's parameters -------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    """What the counts need, read off the loaded module: matmul weights of the layers, other parameters, the LM
    head, the embedding tables; and the attention's shape from the config."""
    body_matmul: int  # elements of the layers' 2-D (and higher) weights: 2 FLOPs each per token
    other: int  # biases, norm weights and the like: read every step, no FLOPs counted
    head: int  # the LM head's elements (the embedding table when tied): read every step, 2·d·V FLOPs per token
    embed_rows: int  # elements of one row across every embedding table (token, positions): B of them read
    embed_tables: int  # elements of the embedding tables that are not the head
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dim: int
    vocab: int


def shapes_of(model: Any) -> Shapes:
    embeds = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    head = model.get_output_embeddings().weight
    seen: set[int] = {id(head)}
    table_ids = {id(m.weight) for m in embeds}
    body = other = tables = 0
    for p in model.parameters():  # parameters() yields a tied tensor once
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in table_ids:
            tables += p.numel()
        elif p.dim() >= 2:
            body += p.numel()
        else:
            other += p.numel()
    text = model.config.get_text_config(decoder=True)
    heads = int(text.num_attention_heads)
    dim = int(text.hidden_size)
    return Shapes(body_matmul=body, other=other, head=head.numel(),
                  embed_rows=sum(m.weight.shape[1] for m in embeds), embed_tables=tables,
                  layers=int(text.num_hidden_layers), heads=heads,
                  kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                  head_dim=int(getattr(text, "head_dim", None) or dim // heads), dim=dim, vocab=head.shape[0])


def prefill_counts(s: Shapes, batch: int, prompt_len: int, elem: int) -> M.PhaseCounts:
    """As engine.llm.metrics counts the native decoder, from the module's own parameters: 2 FLOPs per matmul weight
    per token, attention over the causal half, the LM head on the last position; bytes: weights once (B rows of
    each embedding table) and the K/V written."""
    attention = s.layers * 2 * batch * s.heads * s.head_dim * prompt_len * (prompt_len + 1)
    flops = 2 * batch * prompt_len * s.body_matmul + attention + 2 * batch * s.dim * s.vocab
    return M.PhaseCounts(float(flops), float(_weight_bytes(s, batch, elem) + _kv_bytes(s, batch, prompt_len, elem)))


def decode_counts(s: Shapes, batch: int, prompt_len: int, steps: int, elem: int) -> M.PhaseCounts:
    """Mean per decode step over `steps` steps (step i has P + i + 1 positions in the cache); a sliding-window
    layer is counted as if it attended to the whole cache (an upper bound, for Gemma 2/3)."""
    contexts = [prompt_len + i + 1 for i in range(steps)]
    flops = sum(2 * batch * s.body_matmul + s.layers * 4 * batch * s.heads * s.head_dim * n + 2 * batch * s.dim
                * s.vocab for n in contexts) / steps
    moved = sum(_weight_bytes(s, batch, elem) + _kv_bytes(s, batch, n, elem) for n in contexts) / steps
    return M.PhaseCounts(float(flops), float(moved))


def _weight_bytes(s: Shapes, batch: int, elem: int) -> int:
    return elem * (s.body_matmul + s.other + s.head + batch * s.embed_rows)


def _kv_bytes(s: Shapes, batch: int, tokens: int, elem: int) -> int:
    return elem * s.layers * 2 * batch * s.kv_heads * s.head_dim * tokens


# -- the run --------------------------------------------------------------------------------------------------------
@dataclass
class _RouteRun:
    """What the steps of one transformers-route run share."""
    cfg: LLMConfig
    progress: Progress
    result: RunResult
    model: Any = None
    cache: Any = None
    prompt: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    check_tokens: int = 0
    tolerance: float = 0.0
    reference: Generation | None = None

    def tag(self, phase: str) -> dict[str, Any]:
        return dict(phase=phase, batch_size=self.cfg.batch)

    @property
    def mode(self) -> str:
        """The route's own name of the run's mode (transformers-compile → compile)."""
        return route_mode(self.cfg.mode)


def route_run(cfg: LLMConfig, progress: Progress = lambda f, m: None) -> RunResult:
    """One run of a transformers-route checkpoint: check, time, figures, reports (see the module's docstring)."""
    wall0 = time.perf_counter()
    run, ceilings = _route_start(cfg, progress)
    with torch.no_grad():
        _route_reference(run)  # 1-2: load; eager through the StaticCache against transformers' own generate
        prepared, graphs0 = _route_compile(run)  # 3: the mode, its first calls, its generation against eager's
        hold = _route_take_device(run)  # from here the device is this run's alone
        prefill_us, decode_us = _route_time(run, prepared, graphs0)  # 4: TTFT and TPOT samples
        _route_give_device_up(run, hold)  # the rest is arithmetic and files: others may time and prepare
        shapes = shapes_of(run.model)
    if cfg.profile:
        run.result.notes.append("profile: torch.profiler and Nsight Compute are not taken on the transformers route "
                                "yet")
    progress(0.92, "figures and reports")  # 5
    _figures(run.result, cfg, shapes, torch.finfo(cfg.torch_dtype).bits // 8, prefill_us, decode_us, ceilings)
    run.result.metrics.append(Metric("run_wall_s", time.perf_counter() - wall0, "s"))
    _route_reports(run)
    progress(1.0, "done")
    return run.result


def _route_start(cfg: LLMConfig, progress: Progress) -> tuple[_RouteRun, Any]:
    """The mode available here? The run's result with the route and checkpoint named; the ceilings."""
    from engine.measure.ceilings import ceilings_for
    from engine.store.envinfo import capture_env

    device, mode = cfg.device, cfg.mode
    if route_mode(mode) not in TRANSFORMERS_ROUTE_MODES or route_unavailable(mode, "transformers", device):
        raise RuntimeError(f"mode {mode} is not available on the transformers route: "
                           f"{route_unavailable(mode, 'transformers', device)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"mode {mode} is not available on {device}: no CUDA device is visible to torch")
    result = RunResult(env=capture_env(device))
    ident = cfg.checkpoint or {}
    result.notes += [ROUTE_NOTE, f"checkpoint: {ident.get('folder')} · {ident.get('architecture')} · "
                     f"{int(ident.get('parameters') or 0):,} parameters · stored as {ident.get('dtype')} · "
                     f"{ident.get('weights')} · hash {ident.get('hash')}"]
    if mode != route_mode(mode):  # on a native folder: transformers' module of it, beside the lab's decoder
        result.notes.append(f"mode {mode}: transformers' own {route_mode(mode)} of the checkpoint, as the "
                            "transformers route runs it (the native modes run the lab's decoder)")
    ceilings = None
    if cfg.ceilings != "none":
        progress(0.02, "device ceilings")
        ceilings = ceilings_for(device, cfg.db, measure_if_missing=cfg.ceilings == "auto")
    return _RouteRun(cfg, progress, result), ceilings


def _route_reference(run: _RouteRun) -> None:
    """Load the checkpoint, seed a prompt, and check eager through the StaticCache against transformers' own
    generate (float32: within TOLERANCE_FP32 or the run fails; bf16: the distance sets the modes' tolerance)."""
    from engine.llm.config import check_memory

    cfg, device, dtype = run.cfg, run.cfg.device, run.cfg.torch_dtype
    B, P = cfg.batch, cfg.prompt_len
    run.progress(0.05, f"loading {cfg.name} with transformers ({dtype}) on {device}")
    check_memory(cfg)
    run.model = load(cfg.hf, device, dtype)
    run.cache = static_cache(run.model, cfg.max_seq)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    vocab = int(run.model.config.get_text_config(decoder=True).vocab_size)
    run.prompt = torch.randint(0, vocab, (B, P), generator=gen).to(device)
    run.positions = torch.arange(P, device=device)
    k = run.check_tokens = min(cfg.check_tokens, cfg.new_tokens)
    run.progress(0.1, "eager through the StaticCache vs transformers' generate")
    ref = run.reference = generate(step_fn(run.model, run.cache, prefill=True), Decoder(step_fn(run.model, run.cache)),
                                   run.prompt, k)
    theirs = reference_generation(cfg.hf, run.prompt, k)
    first = Generation(ref.tokens[:1].cpu(), [x[:1] for x in ref.logits])
    fp32 = dtype == torch.float32
    steps = min(len(first.logits), len(theirs.logits))
    errs = [rel_l2(first.logits[j], theirs.logits[j]) for j in range(steps)]
    if fp32:
        check_generation(first, theirs, TOLERANCE_FP32, f"{cfg.name} (transformers route, eager)")
    elif not all(math.isfinite(e) for e in errs):  # rel_l2's inf: a tolerance from it would let every mode pass
        raise ToleranceError(f"{cfg.name} (transformers route, eager): NaN or inf in eager's or transformers' logits; "
                             "no tolerance can be calibrated from them")
    run.tolerance = TOLERANCE_FP32 if fp32 else max(TOLERANCE_FACTOR * errs[0], TOLERANCE_FLOOR)
    agree = int((first.tokens[0, :steps] == theirs.tokens[0, :steps]).sum())
    run.result.metrics += [Metric("hf_reference_rel_err", max(errs), ""),
                           Metric("hf_reference_tokens_matched", float(agree), ""),
                           Metric("tolerance", run.tolerance, "")]
    run.result.notes.append(f"reference: transformers' own eager generate of the checkpoint (float32, CPU) — eager "
                            f"through the StaticCache within {max(errs):.2g} relative L2 over {steps} position(s), "
                            f"greedy tokens equal at {agree} of them"
                            + ("" if fp32 else f"; the modes' tolerance against eager: {run.tolerance:.3g} "
                               f"({TOLERANCE_FACTOR:g} × eager's prefill distance from float32)"))


def _route_compile(run: _RouteRun) -> tuple[Any, int]:
    """Prepare the mode; time its first prefill and first decode step on their own (compiles happen there); check
    its generation against eager's. Returns the prepared mode and dynamo's graph count before it."""
    from torch._dynamo.utils import counters

    cfg, result, mode, device = run.cfg, run.result, run.mode, run.cfg.device
    prompt, positions, k = run.prompt, run.positions, run.check_tokens
    run.progress(0.2, f"{cfg.mode}: preparing")
    prepared = prepare(mode, run.model, run.cache, device)
    result.notes += prepared.notes
    graphs0 = counters["stats"]["unique_graphs"]
    result.metrics.append(Metric("first_call_us", _first_call(lambda: prepared.prefill(prompt, positions), device),
                                 "us", **run.tag("prefill")))
    token0, _ = prepared.prefill(prompt, positions)

    def first_decode() -> None:
        prepared.decoder.reset(token0, cfg.prompt_len)
        prepared.decoder.step()

    run.progress(0.35, f"{mode}: first decode step" + (" (compiles)" if mode != "eager" else ""))
    result.metrics.append(Metric("first_call_us", _first_call(first_decode, device), "us", **run.tag("decode")))
    if mode == "eager":
        result.metrics += [Metric("max_rel_err", 0.0, "", **run.tag("prefill")),
                           Metric("tokens_matched", float(k + 1), "")]
        return prepared, graphs0
    got = generate(prepared.prefill, prepared.decoder, prompt, k)
    check = check_generation(got, run.reference, run.tolerance, cfg.mode)  # named as the run is
    result.notes += check.notes
    result.metrics += [Metric("max_rel_err", check.prefill_rel_err, "", **run.tag("prefill")),
                       Metric("tokens_matched", float(check.tokens_matched), ""),
                       Metric("max_abs_err", check.max_abs_err, "")]
    if check.decode_rel_err is not None:
        result.metrics.append(Metric("max_rel_err", check.decode_rel_err, "", **run.tag("decode")))
    return prepared, graphs0


def _route_time(run: _RouteRun, prepared: Any, graphs0: int) -> tuple[list[float], list[float]]:
    """Prefill calls and decode passes timed (samples stored); graphs compiled and peak memory beside them."""
    from torch._dynamo.utils import counters

    cfg, result, mode, device = run.cfg, run.result, run.mode, run.cfg.device
    prompt, positions, B, P, N = run.prompt, run.positions, cfg.batch, cfg.prompt_len, cfg.new_tokens
    run.progress(0.55, f"{mode}: timing prefill")
    for _ in range(2):
        prepared.prefill(prompt, positions)
    prefill_us = timed_calls(lambda: prepared.prefill(prompt, positions), cfg.prefill_iters, device)
    result.samples.append(Samples(phase="prefill", values=prefill_us, batch_size=B))
    run.progress(0.65, f"{mode}: timing decode ({cfg.decode_passes} × {N} steps)")
    token0, _ = prepared.prefill(prompt, positions)
    decode_pass(prepared.decoder, token0, P, min(N, 8), device)
    decode_us: list[float] = []
    for _ in range(cfg.decode_passes):
        token0, _ = prepared.prefill(prompt, positions)
        decode_us += decode_pass(prepared.decoder, token0, P, N, device)
    result.samples.append(Samples(phase="decode", values=decode_us, batch_size=B))
    if mode != "eager":
        result.metrics.append(Metric("graphs_compiled", float(counters["stats"]["unique_graphs"] - graphs0), ""))
    if device.startswith("cuda"):
        result.metrics.append(Metric("peak_memory_bytes", float(torch.cuda.max_memory_allocated(device)), "bytes"))
    return prefill_us, decode_us


def _route_take_device(run: _RouteRun) -> Any:
    """When the run prepared beside others of its group (engine.runner.worker: a GPU group, native and
    transformers-route
    runs of one folder alike), wait until it has the device alone; returns the hold (None in an ordinary worker)."""
    from engine.runner import device_lock

    hold = device_lock.current()
    if hold is not None:
        run.progress(0.5, f"{run.cfg.mode}: waiting to time alone")
        hold.exclusive()
    return hold


def _route_give_device_up(run: _RouteRun, hold: Any) -> None:
    """Timed: the run lets the device go (engine.llm.run._give_device_up); what it prepared beside, stated as the
    native route does."""
    if hold is None:
        return
    hold.release()
    run.result.metrics += [Metric("prepared_alongside", float(hold.group_size - 1), ""),
                           Metric("device_wait_s", hold.waited_s, "s")]
    run.result.notes.append(f"prepared beside up to {hold.group_size - 1} other run(s) of its group (untimed work "
                            "only: loading, checking, compiling), timed with the device to itself")


def _route_reports(run: _RouteRun) -> None:
    from engine.llm.report import write_reports

    out_dir = Path(run.cfg.artifacts_dir or tempfile.mkdtemp(prefix="modelab-llm-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = re.fullmatch(r"run_(\d+)", out_dir.name)
    run.result.artifacts += write_reports(run.cfg, run.result, out_dir, run_id=int(folder.group(1)) if folder else None)


def _first_call(fn: Callable[[], object], device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e6


def _figures(result: RunResult, cfg: LLMConfig, s: Shapes, elem: int, prefill_us: list[float],
             decode_us: list[float], ceilings: Any) -> None:
    """TTFT, TPOT, FLOPs and bytes from the module's shapes, MFU and MBU where ceilings are stored."""
    from engine.measure.ceilings import dtype_key

    B, P, N = cfg.batch, cfg.prompt_len, cfg.new_tokens
    tag_p, tag_d = dict(phase="prefill", batch_size=B), dict(phase="decode", batch_size=B)
    key = f"matmul_{dtype_key(cfg.torch_dtype) if dtype_key(cfg.torch_dtype) != 'fp16' else 'bf16'}"
    peak = ceilings.get(key) if ceilings else None
    bw = ceilings.copy_bw if ceilings else None
    pre, dec = prefill_counts(s, B, P, elem), decode_counts(s, B, P, N, elem)
    ps, ds = summarize(prefill_us), summarize(decode_us)
    ttft_s, tpot_s = ps.median * 1e-6, ds.median * 1e-6
    generation_s = ttft_s + sum(decode_us[-N:]) * 1e-6
    result.metrics += [
        Metric("ttft_us", ps.median, "us", **tag_p), Metric("ttft_p10_us", ps.p10, "us", **tag_p),
        Metric("ttft_p90_us", ps.p90, "us", **tag_p), Metric("ttft_mean_us", ps.mean, "us", **tag_p),
        Metric("flops", pre.flops, "FLOP", **tag_p), Metric("bytes", pre.bytes, "B", **tag_p),
        Metric("intensity", pre.intensity, "FLOP/B", **tag_p),
        Metric("achieved_flops", pre.flops / ttft_s, "FLOP/s", **tag_p),
        Metric("achieved_bw", pre.bytes / ttft_s, "B/s", **tag_p),
        Metric("prefill_tokens_per_s", B * P / ttft_s, "tokens/s", **tag_p),
        Metric("tpot_median_us", ds.median, "us", **tag_d), Metric("tpot_p90_us", ds.p90, "us", **tag_d),
        Metric("tpot_p10_us", ds.p10, "us", **tag_d), Metric("tpot_mean_us", ds.mean, "us", **tag_d),
        Metric("tpot_min_us", ds.min, "us", **tag_d), Metric("tpot_max_us", ds.max, "us", **tag_d),
        Metric("flops", dec.flops, "FLOP", **tag_d), Metric("bytes", dec.bytes, "B", **tag_d),
        Metric("intensity", dec.intensity, "FLOP/B", **tag_d),
        Metric("achieved_flops", dec.flops / tpot_s, "FLOP/s", **tag_d),
        Metric("achieved_bw", dec.bytes / tpot_s, "B/s", **tag_d),
        Metric("tokens_per_s", B / tpot_s, "tokens/s", **tag_d),
        Metric("e2e_tokens_per_s", B * (N + 1) / generation_s, "tokens/s"),
        Metric("generation_us", generation_s * 1e6, "us"),
        Metric("params", float((cfg.checkpoint or {}).get("parameters") or 0), ""),
        Metric("weight_bytes", float(_weight_bytes(s, B, elem)), "B"),
        Metric("kv_cache_bytes", float(_kv_bytes(s, B, cfg.max_seq, elem)), "B"),
    ]
    for name, value, tag in (("mfu_pct", M.utilisation(pre.flops, ttft_s, peak), tag_p),
                             ("mbu_pct", M.utilisation(dec.bytes, tpot_s, bw), tag_d),
                             ("decode_mfu_pct", M.utilisation(dec.flops, tpot_s, peak), tag_d)):
        if value is not None:
            result.metrics.append(Metric(name, value, "%", **tag))
    result.notes.append("FLOPs and bytes from the loaded module's parameters (engine.llm.hf_route: every matmul "
                        "weight of the layers 2 FLOPs per token, attention over the cache, the LM head on the last "
                        "position; every weight read once per decode step, B rows of each embedding table)")
