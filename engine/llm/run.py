"""One LLM-lab run: a preset, a prompt of P tokens, N decode steps, batch B, one mode — checked, timed, profiled.

In order, in one worker process (engine.runner.jobs starts it; it never touches the store):

1. Build the seeded model on the device (bf16 on CUDA, fp32 on CPU), fuse q/k/v and gate/up, allocate the static
   KV cache for P + N positions (rounded up to 16).
2. Reference: eager greedy generation of a few tokens through the static cache, checked once against a full
   recompute without a cache (the plain forward over the whole sequence): the cache itself is verified on the
   device. A float32 twin of the model sets the run's logits tolerance (engine.llm.verify: TOLERANCE_FACTOR).
   The first run of a key (model, seed, prompt, shape, dtype, device, torch) computes it and stores it; the others
   of its group load it once their own eager prefill agrees with it (engine.llm.reference).
3. The mode: its first prefill and first decode step are timed on their own (compilation, CUDA-graph capture).
   Its greedy generation is then compared with eager's: logits at every checked step within the tolerance
   (relative L2 error) and the same tokens. A mismatch fails the run (ToleranceError), except a token flip where
   eager's two candidates are closer than twice the measured logit difference (a tie within rounding; noted, and
   the comparison stops there since the sequences then diverge).
4. Timing: `prefill_iters` prefills bracketed by CUDA events (perf_counter on CPU): TTFT. Then, after a warm decode
   pass, `decode_passes` passes of N steps with an event between consecutive steps and no host sync inside the
   loop: every per-step sample is kept (TPOT median, p90). Peak device memory over the run.
5. torch.profiler over one phase at a time (NVTX ranges `prefill` / `decode`): op_stats rows per phase.
   `deep`: Nsight Compute on the top-k decode kernels (a subprocess: this module's `--ncu-target`).
6. FLOPs and bytes from engine.llm.metrics; MFU against the measured bf16 (or fp32) matmul ceiling, MBU against the
   measured copy bandwidth (engine.measure.ceilings), datasheet peaks beside them, named. Reports written
   (engine.llm.report).

llm_run reads as those steps, one function each. What it shares with the tensor-parallel ranks (engine.llm.tp_rank)
lives below both: engine.llm.config (LLMConfig, build), engine.llm.verify (the checks, the tolerance) and
engine.llm.timed (the timers); the names others import from here are re-exported (__all__).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.llm import metrics as M
from engine.llm import reference as reference_cache
from engine.llm.config import (
    DTYPES,
    MAX_POSITIONS,
    LLMConfig,
    build,
    cap_device_memory,
    check_memory,
    config_from_params,
    memory_needed,
    params_of,
)
from engine.llm.generate import Decoder, Generation, StepFn, generate, step_fn
from engine.llm.modes import MODES, LLMMode, Prepared, availability, get_mode, on_device, prepare
from engine.llm.report import fmt_num, write_reports
from engine.llm.timed import decode_pass, sync, timed_calls
from engine.llm.verify import (
    TOLERANCE_FACTOR,
    TOLERANCE_FLOOR,
    TOLERANCE_FP32,
    Calibration,
    CheckResult,
    calibrate,
    check_cache_against_recompute,
    check_generation,
    err_text,
    rel_l2,
)
from engine.measure import energy, nvtx_ranges
from engine.measure.ceilings import Ceilings, Datasheet, ceiling_metrics, ceilings_for, dtype_key
from engine.measure.timing import summarize
from engine.runner import device_lock as device_phases
from engine.store.db import Artifact, Metric, RunResult, Samples
from engine.store.envinfo import capture_env
from engine.workloads.llama import LlamaDecoder, parameter_count

# Names other modules, the page and the tests import from here (they live in engine.llm.config, .verify, .timed).
__all__ = ["DTYPES", "MAX_POSITIONS", "TOLERANCE_FACTOR", "TOLERANCE_FLOOR", "TOLERANCE_FP32", "CheckResult",
           "LLMConfig", "build", "calibrate", "check_generation", "config_from_params", "decode_pass", "llm_job",
           "llm_run", "memory_needed", "ncu_target", "params_of", "rel_l2", "timed_calls"]

Progress = Callable[[float, str], None]


# -- the run --------------------------------------------------------------------------------------------------------
def llm_run(cfg: LLMConfig, progress: Progress = lambda f, m: None) -> RunResult:
    """Check, time and profile one mode; raises when it is unavailable or off tolerance."""
    wall0 = time.perf_counter()
    cfg.validate()
    if cfg.tp > 1:  # torchrun subprocesses: world sizes 1 and tp, checked against the unsharded model
        from engine.llm.tp_launch import tp_result

        return tp_result(cfg, cfg.tp, progress)
    if cfg.route == "transformers":  # another causal LM: transformers' own module and static cache
        from engine.llm.hf_route import route_run

        return route_run(cfg, progress)
    from engine.measure import conditions, noise  # the timing's surroundings, judged with its samples

    conditions.reset()
    run = _start(cfg, progress, wall0)  # the mode available here? the run's folder, result, ceilings
    with torch.no_grad():
        ref = _reference(run)  # 1-2: build; eager's generation, checked against a recompute; the tolerance
        compiled = _compile(run, ref)  # 3: prepare the mode; its first calls timed on their own
        _take_device(run, compiled)  # from here the device is this run's alone (GEMV tiles tuned here)
        _check(run, ref, compiled.prepared)  # 3: the mode's generation against eager's
        with conditions.window(run.device):  # what else the machine did meanwhile (engine.measure.conditions)
            timings = _time(run, ref, compiled)  # 4: TTFT and TPOT samples
        if cfg.prompts:
            _prompt_set(run, ref, compiled)  # 4: TTFT and TPOT across the --prompts file's prompts
        decode_rows = _profile_phases(run, ref, compiled.prepared) if cfg.profile else []  # 5: torch.profiler
    _deep_profile(run, compiled.prepared, decode_rows)  # 5: Nsight Compute (`deep`)
    _give_device_up(run)  # the rest is arithmetic and files: the group's next runs may time and prepare
    progress(0.92, "figures and reports")
    _figures(run, timings)  # 6: MFU, MBU, throughput
    run.result.conditions = noise.record(run.result.samples, conditions.take_windows())
    _write_reports(run)
    progress(1.0, "done")
    return run.result


def llm_job(params: dict, progress: Progress) -> RunResult:
    """Job-runner entry point: the llm run kind's target (engine/llm/kind.py)."""
    return llm_run(config_from_params(params), progress)


@dataclass
class _Run:
    """What the steps of one run share: its config and mode, the result they fill in, where its files go."""
    cfg: LLMConfig
    mode: LLMMode
    result: RunResult
    out_dir: Path
    hold: device_phases.PhaseHold | None  # set when the run prepares beside others of its group (engine.runner.worker)
    ceilings: Ceilings | None
    progress: Progress
    wall0: float
    reference_peak: int = 0  # device bytes reserved at most while building and calibrating (the float32 twin's phase)

    @property
    def device(self) -> str:
        return self.cfg.device

    @property
    def gemv_tuning(self) -> bool:
        """The mode's GEMVs choose their tiles by timing them (CUDA only): deferred until the device is ours."""
        return self.mode.gemv and self.device.startswith("cuda")

    def tag(self, phase: str) -> dict[str, object]:
        return dict(phase=phase, batch_size=self.cfg.batch)


@dataclass
class _Reference:
    """The built model and prompt, and eager's greedy generation through the static cache: what a mode must match."""
    model: LlamaDecoder
    prompt: torch.Tensor
    positions: torch.Tensor
    eager: StepFn
    generation: Generation
    calibration: Calibration
    check_tokens: int  # k: the decode steps compared with eager
    gate_generation: Generation | None = None  # a quantized mode's: eager over the accuracy gate's steps
    computed: bool = True  # this run computed the reference (else loaded it: engine.llm.reference)

    @property
    def tolerance(self) -> float:
        return self.calibration.tolerance


@dataclass
class _Compiled:
    prepared: Prepared
    dynamo_before: dict[str, float]  # dynamo's counters are process-wide: this run's are the difference


@dataclass
class _Timings:
    prefill_us: list[float]
    decode_us: list[float] = field(default_factory=list)


def _start(cfg: LLMConfig, progress: Progress, wall0: float) -> _Run:
    """The mode available here? Then the run's folder, its result, and the ceilings its percentages divide by."""
    mode = on_device(get_mode(cfg.mode), cfg.device)  # a quantized mode off CUDA runs eagerly
    device = cfg.device
    reason = availability(mode, device, cfg.torch_dtype)
    if reason:
        raise RuntimeError(f"mode {mode.name} is not available on {device}: {reason}")
    out_dir = Path(cfg.artifacts_dir or tempfile.mkdtemp(prefix="modelab-llm-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result = RunResult(env=capture_env(device))
    nvtx_ranges.enable(device.startswith("cuda"))
    hold = device_phases.current()
    if hold is not None and device.startswith("cuda"):
        # compile workers per run: the group shares the machine's cores (16 runs × 16 compile processes otherwise)
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = max(1, (os.cpu_count() or 1) // hold.group_size)
    if hold is not None:
        # Inductor's lowering and code generation and Triton's compiles give the device up (others of the group time
        # meanwhile); only Inductor's timings of candidate kernels take it alone (engine.measure.inductor_timing)
        from engine.measure.inductor_timing import install

        install()
    ceilings = None
    if cfg.ceilings != "none":
        progress(0.02, "device ceilings")
        ceilings = ceilings_for(device, cfg.db, measure_if_missing=cfg.ceilings == "auto")
        if ceilings is None:
            result.notes.append("no stored ceilings for this device: MFU and MBU left out (run `python -m engine "
                                "ceilings --device ...` first)")
    return _Run(cfg, mode, result, out_dir, hold, ceilings, progress, wall0)


def _reference(run: _Run) -> _Reference:
    """Build the model and give it its reference: eager's greedy generation through the static cache, verified once
    against a full recompute, its distance from a float32 twin setting the run's tolerance. The first run of a key
    computes it and stores it; the others load it (engine.llm.reference: no twin, no eager generation) once their own
    eager prefill agrees with it, and check their mode against it exactly as against a computed one."""
    cfg, device, result = run.cfg, run.device, run.result
    run.progress(0.05, f"building {cfg.name} ({cfg.torch_dtype}) on {device}")
    cap_device_memory(cfg)
    with reference_cache.Claim(cfg, _who(run)) as claim:
        stored, why = _stored_reference(run, claim)  # None: this run computes it, holding the key's claim
        computed = False
        check_memory(cfg, twin=stored is None)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(torch.device(device))
        model, prompt = build(cfg)
        positions = torch.arange(cfg.prompt_len, device=device)
        eager = step_fn(model)
        if stored is not None and (stale := _disagreement(stored, eager, prompt, positions)):
            why = f"{stored.key} disagrees with this model's eager prefill ({stale})"
            claim.acquire(lambda holder: run.progress(0.06, f"waiting for {holder} (the reference)"),
                          device_phases.released)
            stored, _ = reference_cache.load(cfg)  # recomputed meanwhile by the run that held the claim?
            if stored is not None and _disagreement(stored, eager, prompt, positions):
                stored = None
            if stored is None:
                check_memory(cfg)
        if stored is None:
            stored = _compute_reference(run, model, prompt, eager)
            computed = True
            try:
                kept = f"stored as {reference_cache.save(cfg, stored).stem} for the other runs of its key"
            except OSError as exc:  # the run goes on; the next run of the key computes it again
                kept = f"not stored ({type(exc).__name__}: {exc})"
            result.notes.append("reference: computed (eager's generation, the tolerance's calibration and the cache "
                                f"check), {kept}"
                                + ("" if why == "none stored" else f"; the stored one was not used: {why}"))
        else:
            by = f"run {stored.run_id}" if stored.run_id is not None else "a run outside the job runner"
            result.notes.append(f"reference: loaded from {stored.key} (computed by {by})")
    k = reference_cache.check_steps(cfg)
    full, calib = stored.generation, stored.calibration
    ref = Generation(full.tokens[:, :k + 1].to(device), full.logits[:k + 1])
    gate_ref = Generation(full.tokens.to(device), full.logits) if run.mode.quant else None
    result.metrics += [Metric("cache_vs_recompute_rel_err", stored.cache_err, ""),
                       Metric("tolerance", calib.tolerance, ""),
                       Metric("reference_computed", float(computed), "")]
    if calib.eager_fp32_rel_err is not None:
        result.metrics.append(Metric("eager_fp32_rel_err", calib.eager_fp32_rel_err, ""))
    if cfg.hf or cfg.hf_config:
        _checkpoint_reference(run, prompt, ref, calib)
    if device.startswith("cuda"):  # the float32 twin is gone: peak memory counts this run's own model from here
        run.reference_peak = torch.cuda.max_memory_reserved(torch.device(device))
        torch.cuda.empty_cache()  # the twin's blocks back to the device, for the runs preparing beside this one
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    return _Reference(model, prompt, positions, eager, ref, calib, k, gate_ref, computed)


def _stored_reference(run: _Run, claim: reference_cache.Claim) -> tuple[reference_cache.Reference | None, str]:
    """The key's stored reference, or None and why (then `claim` is held: this run computes it). Where another run
    of the key is computing it, waits for it (its device hold given up meanwhile) and loads what it stored."""
    stored, why = reference_cache.load(run.cfg)
    if stored is not None:
        return stored, why
    claim.acquire(lambda holder: run.progress(0.06, f"waiting for {holder} (the reference)"), device_phases.released)
    stored, _ = reference_cache.load(run.cfg)  # stored meanwhile by the run that held the claim
    if stored is not None:
        claim.release()
        return stored, ""
    return None, why


def _disagreement(stored: reference_cache.Reference, eager: StepFn, prompt: torch.Tensor,
                  positions: torch.Tensor) -> str | None:
    """Why a loaded reference is not this model's (its eager prefill's logits beyond the tolerance from the stored
    ones: the model or eager changed under the same key), or None."""
    _, logits = eager(prompt, positions)
    err = rel_l2(logits.float().cpu(), stored.generation.logits[0])
    tol = stored.calibration.tolerance
    return None if err <= tol else f"prefill relative L2 error {err_text(err)} > {tol:g}"


def _compute_reference(run: _Run, model: LlamaDecoder, prompt: torch.Tensor, eager: StepFn
                       ) -> reference_cache.Reference:
    """Eager's generation over the check's and the quantization gate's steps, the tolerance from the float32 twin,
    the static cache against a full recompute (a ToleranceError fails the run)."""
    cfg = run.cfg
    run.progress(0.1, "eager reference")
    k = reference_cache.check_steps(cfg)
    with nvtx_ranges.range("reference"):
        # the gate's positions too (greedy: its first k steps are the check's), so every mode can load it
        full = generate(eager, Decoder(eager), prompt, reference_cache.steps(cfg))
        ref = Generation(full.tokens[:, :k + 1], full.logits[:k + 1])
        calib = calibrate(cfg, model, prompt, ref)
        cache_err = check_cache_against_recompute(model, prompt, ref, calib.tolerance)
    return reference_cache.Reference(Generation(full.tokens.cpu(), full.logits), calib, cache_err, "", _run_id(run))


def _run_id(run: _Run) -> int | None:
    """The run's id where the job runner gave it its folder (artifacts/run_<id>)."""
    folder = re.fullmatch(r"run_(\d+)", run.out_dir.name)
    return int(folder.group(1)) if folder else None


def _who(run: _Run) -> str:
    run_id = _run_id(run)
    return f"run {run_id}" if run_id is not None else f"process {os.getpid()}"


def _checkpoint_reference(run: _Run, prompt: torch.Tensor, ref: Generation, calib: Calibration) -> None:
    """A checkpoint run: named in the notes; for --hf, eager's logits against transformers' own float32 forward of
    the same checkpoint (before any time is shown): within TOLERANCE_FP32 in float32, the calibrated tolerance
    otherwise. A mismatch fails the run (ToleranceError)."""
    from engine.llm import hf
    from engine.measure.checks import ToleranceError

    cfg, result = run.cfg, run.result
    ident = cfg.checkpoint or {}
    result.notes.append("route: native (the lab's decoder, engine/workloads/llama.py)")
    result.notes.append(f"checkpoint: {ident.get('folder')} · {ident.get('architecture')} · "
                        f"{int(ident.get('parameters') or 0):,} parameters · stored as {ident.get('dtype')} · "
                        f"{ident.get('weights')} · hash {ident.get('hash')} (config.json and the weights' index or "
                        "safetensors headers)")
    if not cfg.hf:
        return
    run.progress(0.12, "transformers' forward of the checkpoint (the reference)")
    want = hf.reference_logits(cfg.hf, prompt, ref.tokens)
    tol = TOLERANCE_FP32 if cfg.torch_dtype == torch.float32 else calib.tolerance
    errs = [rel_l2(ref.logits[j][:1], want[j]) for j in range(len(want))]
    worst = max(range(len(errs)), key=errs.__getitem__)
    result.metrics.append(Metric("hf_reference_rel_err", errs[worst], ""))
    if not errs[worst] <= tol:  # rel_l2 is inf where either side has a NaN or inf
        where = "prefill" if worst == 0 else f"decode step {worst}"
        raise ToleranceError(f"{hf.checkpoint_of(cfg.hf, None).label()}: the lab's logits differ from transformers' "
                             f"forward of the same checkpoint at {where} (relative L2 error {err_text(errs[worst])} > "
                             f"{tol:g})")
    agree = sum(int(torch.equal(want[j].argmax(-1), ref.tokens[:1, j].cpu())) for j in range(len(want)))
    result.metrics.append(Metric("hf_reference_tokens_matched", float(agree), ""))
    result.notes.append(f"reference: transformers' own forward of the checkpoint (float32, CPU) — the lab's eager "
                        f"logits within {errs[worst]:.2g} relative L2 (tolerance {tol:g}) over {len(want)} "
                        f"position(s); greedy tokens equal to transformers' argmax at {agree} of them")


def _compile(run: _Run, ref: _Reference) -> _Compiled:
    """Prepare the mode (wrap, compile, capture), then time its first prefill and first decode step on their own:
    compilation and CUDA-graph capture happen there."""
    mode, device, result = run.mode, run.device, run.result
    prompt, positions, P = ref.prompt, ref.positions, run.cfg.prompt_len
    if run.gemv_tuning:
        from engine.kernels.triton import gemv as gemv_kernels

        gemv_kernels.defer_tuning(True)  # nothing timed while preparing: tuned below, with the device alone
    run.progress(0.15, f"{mode.name}: preparing")
    dynamo_before = _dynamo_counts()
    prepared: Prepared = prepare(mode, ref.model, device, sdpa=run.cfg.sdpa, autotune=run.cfg.autotune)
    result.notes.extend(prepared.notes)
    if prepared.quantize_s is not None:
        result.metrics.append(Metric("quantize_s", prepared.quantize_s, "s"))
    decoder = prepared.decoder

    run.progress(0.2, f"{mode.name}: first prefill (compiles)" if mode.prefill == "compile" else "first prefill")
    with nvtx_ranges.range("first_call prefill"):
        first_prefill = _first_call(lambda: prepared.prefill(prompt, positions), device)
    result.metrics.append(Metric("first_call_us", first_prefill, "us", **run.tag("prefill")))
    token0, _ = prepared.prefill(prompt, positions)
    if decoder is not None:
        run.progress(0.35, f"{mode.name}: first decode step" + (" (compiles)" if mode.decode != "eager" else ""))

        def first_decode() -> None:
            decoder.reset(token0, P)
            decoder.step()

        with nvtx_ranges.range("first_call decode"):
            first_dec = _first_call(first_decode, device)
        result.metrics.append(Metric("first_call_us", first_dec, "us", **run.tag("decode")))
    return _Compiled(prepared, dynamo_before)


def _take_device(run: _Run, compiled: _Compiled) -> None:
    """From here the device is this run's alone (when it prepared beside others, it waits for them). The GEMV
    tiles compile before the wait (untimed) and are tuned after it (timed)."""
    mode, result, decoder = run.mode, run.result, compiled.prepared.decoder
    if run.gemv_tuning:
        from engine.kernels.triton import gemv as gemv_kernels

        run.progress(0.44, f"{mode.name}: compiling the GEMV tiles to tune")
        gemv_kernels.compile_pending()  # untimed: the timing part of tuning waits for the device below
    if run.device.startswith("cuda"):  # what preparing held at most, for the group planner's next admission
        device = torch.device(run.device)
        result.metrics.append(Metric("prepare_peak_bytes", float(max(run.reference_peak,
                                                                     torch.cuda.max_memory_reserved(device))), "B"))
    if run.hold is not None:
        run.progress(0.45, f"{mode.name}: waiting to time alone")
        run.hold.exclusive()
    if run.gemv_tuning:
        run.progress(0.47, f"{mode.name}: tuning the GEMVs")
        t_tune = time.perf_counter()
        tuned = gemv_kernels.tune_pending()
        gemv_kernels.defer_tuning(False)
        if tuned and decoder is not None:
            decoder.recapture()  # the graph recorded the untimed stand-ins: record it again with the choices
        result.metrics.append(Metric("gemv_tune_s", time.perf_counter() - t_tune, "s"))
        if tuned:
            result.notes.append("GEMV tiles and cuBLAS-or-Triton choices timed after the first decode step (which "
                                "ran untimed stand-ins, so its first-call time leaves tuning out: gemv_tune_s): "
                                + "; ".join(tuned))


def _quant_gate(run: _Run, ref: _Reference) -> None:
    """A quantized mode's accuracy gate: its model (quantized in place by prepare) teacher-forced through eager's
    tokens, top-1 agreement and mean KL against eager's logits (engine.llm.quant; a miss fails the run with both)."""
    from engine.llm.quant import gate_model

    gate_ref = ref.gate_generation or ref.generation
    gate = gate_model(ref.model, ref.prompt, gate_ref.tokens, gate_ref.logits, run.mode.quant, run.mode.name)
    run.result.notes.append(f"accuracy gate: {gate.describe()}")
    run.result.metrics += [Metric("quant_top1_agreement", gate.top1, ""), Metric("quant_mean_kl_nats", gate.kl, ""),
                           Metric("quant_gate_min_top1", gate.gate.min_top1, ""),
                           Metric("quant_gate_max_kl", gate.gate.max_kl, ""),
                           Metric("quant_gate_positions", float(gate.positions), "")]


def _check(run: _Run, ref: _Reference, prepared: Prepared) -> None:
    """The mode's greedy generation against eager's: logits within the tolerance, the same tokens (a ToleranceError
    fails the run). Eager that computed the reference is the reference itself: it matches by definition; eager that
    loaded it is compared with it like any mode."""
    mode, result, decoder, k = run.mode, run.result, prepared.decoder, ref.check_tokens
    run.progress(0.5, f"{mode.name}: comparing with eager")
    got: Generation | None = None
    if mode.name != "eager" or not ref.computed:
        if decoder is None:  # prefill only: its first token and logits
            got = generate(prepared.prefill, Decoder(ref.eager), ref.prompt, 0)
            want = Generation(ref.generation.tokens[:, :1], ref.generation.logits[:1])
        elif mode.quant:  # its own gate (top-1 agreement and KL), not the logits tolerance of unquantized modes
            _quant_gate(run, ref)
            return
        else:
            got = generate(prepared.prefill, decoder, ref.prompt, k)
            want = ref.generation
        check = check_generation(got, want, ref.tolerance, mode.name)
    else:
        check = CheckResult(prefill_rel_err=0.0, decode_rel_err=0.0 if k else None, max_abs_err=0.0,
                            tokens_matched=k + 1)
    result.notes.extend(check.notes)
    result.metrics += [Metric("max_rel_err", check.prefill_rel_err, "", **run.tag("prefill")),
                       Metric("tokens_matched", float(check.tokens_matched), "")]
    fp32_logits = ref.calibration.fp32_logits
    if fp32_logits and got is not None:  # how close the mode itself is to float32 (first sequence)
        steps = min(check.tokens_matched, len(fp32_logits), len(got.logits))
        if steps:
            result.metrics.append(Metric("fp32_rel_err", max(rel_l2(got.logits[j][:1], fp32_logits[j])
                                                             for j in range(steps)), ""))
    if check.decode_rel_err is not None and decoder is not None:
        result.metrics.append(Metric("max_rel_err", check.decode_rel_err, "", **run.tag("decode")))
    result.metrics.append(Metric("max_abs_err", check.max_abs_err, ""))


def _time(run: _Run, ref: _Reference, compiled: _Compiled) -> _Timings:
    """`prefill_iters` timed prefills (TTFT); after a warm pass, `decode_passes` passes of N decode steps (TPOT per
    step); then what the timing says about the mode (recompiles, peak memory, GEMV choices)."""
    cfg, mode, device, result = run.cfg, run.mode, run.device, run.result
    prepared, decoder = compiled.prepared, compiled.prepared.decoder
    prompt, positions, B, P, N = ref.prompt, ref.positions, cfg.batch, cfg.prompt_len, cfg.new_tokens
    meter = energy.open_for_run(device, cfg.db, result)  # the energy counter read around each timed region
    run.progress(0.55, f"{mode.name}: timing prefill")
    for _ in range(2):
        prepared.prefill(prompt, positions)

    def prefills() -> list[float]:
        return timed_calls(lambda: prepared.prefill(prompt, positions), cfg.prefill_iters, device)

    with nvtx_ranges.range("prefill"):
        prefill_us, prefill_energy = energy.measure(meter, prefills, cfg.prefill_iters, again=lambda: len(prefills()))
    timings = _Timings(prefill_us)
    result.samples.append(Samples(phase="prefill", values=timings.prefill_us, batch_size=B))
    _energy_figures(run, prefill_energy, "prefill", "prefill", B * P)
    if decoder is not None:
        run.progress(0.65, f"{mode.name}: timing decode ({cfg.decode_passes} × {N} steps)")
        token0, _ = prepared.prefill(prompt, positions)
        decode_pass(decoder, token0, P, min(N, 8), device)  # warm: CUDA graph trees record here

        last_token = [token0]

        def decode_passes() -> list[float]:
            """The timed passes of N steps, each after an untimed prefill of the prompt."""
            us: list[float] = []
            for _ in range(cfg.decode_passes):
                last_token[0], _ = prepared.prefill(prompt, positions)
                with nvtx_ranges.range("decode"):
                    us += decode_pass(decoder, last_token[0], P, N, device)
            return us

        def again() -> float:  # the last pass once more (same cache contents, same work), without its prefill
            return len(decode_pass(decoder, last_token[0], P, N, device)) * B

        timings.decode_us, window = energy.measure(meter, decode_passes, units=lambda us: len(us) * B, again=again)
        result.samples.append(Samples(phase="decode", values=timings.decode_us, batch_size=B))
        if window is not None and prefill_energy is not None:  # the prefill before each timed pass taken out
            window = window.less(prefill_energy, count=cfg.decode_passes, units=window.units)
            if window is None:
                result.notes.append("energy of the decode left out: the prefills between its timed passes took "
                                    "over half of its energy window")
        _energy_figures(run, window, "decode", "token", 1)
    _after_timing(run, compiled)
    return timings


def _energy_figures(run: _Run, window: energy.EnergyWindow | None, phase: str, per: str, tokens: float) -> None:
    """J per prefill or per decoded token (whole board, and above the stored idle draw), tokens per joule, power and
    clocks over the window (engine.measure.energy); nothing where the run has no meter."""
    run.result.metrics += energy.energy_metrics(window, per, tokens_per_unit=tokens, **run.tag(phase))
    note = energy.window_note(window, f"the timed {phase}")
    if note:
        run.result.notes.append(note)


def _prompt_set(run: _Run, ref: _Reference, compiled: _Compiled) -> None:
    """--prompts: each prompt (repeated over the batch) prefilled and decoded N steps, timed; TTFT and TPOT across
    prompts (p50/p90/p99) and one row per prompt (prompts.csv, and the samples prompt_ttft / prompt_tpot in file
    order). A mode whose prefill is compiled for the run's fixed length prefills the prompts eagerly (a compiled
    prefill would recompile per length): its prompt TTFTs are left out, its TPOTs kept."""
    from engine.llm.prompts import percentiles

    cfg, mode, device, result = run.cfg, run.mode, run.device, run.result
    prompts = cfg.prompt_ids()
    run.progress(0.7, f"{mode.name}: {len(prompts)} prompts")
    prepared, decoder = compiled.prepared, compiled.prepared.decoder
    prefill = ref.eager if mode.prefill == "compile" else prepared.prefill
    rows = []
    for i, ids in enumerate(prompts):
        tokens = torch.tensor(ids, device=device)[None].expand(cfg.batch, -1).contiguous()
        positions = torch.arange(len(ids), device=device)
        prefill(tokens, positions)  # warm for this length
        ttft = timed_calls(lambda: prefill(tokens, positions), 1, device)[0]
        tpot = None
        if decoder is not None:
            token0, _ = prefill(tokens, positions)
            tpot = summarize(decode_pass(decoder, token0, len(ids), cfg.new_tokens, device)).median
        rows.append((i + 1, len(ids), ttft, tpot))
    if mode.prefill != "compile":
        result.samples.append(Samples(phase="prompt_ttft", values=[r[2] for r in rows], batch_size=cfg.batch))
        result.metrics += [Metric(f"prompts_ttft_{k}_us", v, "us", **run.tag("prefill"))
                           for k, v in percentiles([r[2] for r in rows]).items()]
    if decoder is not None:
        result.samples.append(Samples(phase="prompt_tpot", values=[r[3] for r in rows], batch_size=cfg.batch))
        result.metrics += [Metric(f"prompts_tpot_{k}_us", v, "us", **run.tag("decode"))
                           for k, v in percentiles([r[3] for r in rows]).items()]
    result.metrics.append(Metric("prompts", float(len(rows)), ""))
    path = run.out_dir / "prompts.csv"
    path.write_text("prompt,tokens,ttft_us,tpot_median_us\n" + "".join(
        f"{n},{t},{'' if mode.prefill == 'compile' else f'{a:.1f}'},{'' if b is None else f'{b:.1f}'}\n"
        for n, t, a, b in rows))
    result.artifacts.append(Artifact(kind="prompt_rows", name=path.name, path=str(path)))
    result.notes.append(f"prompt set {cfg.prompts}: {len(rows)} prompts of {min(r[1] for r in rows)}–"
                        f"{max(r[1] for r in rows)} tokens, each prefilled and decoded {cfg.new_tokens} steps "
                        f"(batch {cfg.batch}); per-prompt rows in prompts.csv"
                        + ("; the compiled prefill is specialised to one length, so the prompts were prefilled "
                           "eagerly and their TTFTs left out" if mode.prefill == "compile" else ""))


def _after_timing(run: _Run, compiled: _Compiled) -> None:
    """Compile counters (after every timed call: a recompile during timing would show here), peak memory, and the
    GEMV choices the mode made."""
    mode, device, result, decoder = run.mode, run.device, run.result, compiled.prepared.decoder
    if mode.compiles:
        counts = {k: v - compiled.dynamo_before[k] for k, v in _dynamo_counts().items()}
        expected = (mode.prefill == "compile") + (decoder is not None and mode.decode != "eager")
        counts["recompiles"] = max(0.0, counts["graphs_compiled"] - expected)
        if counts["cudagraph_skips"]:
            result.notes.append(f"CUDA graphs were skipped {int(counts['cudagraph_skips'])} time(s): the step ran "
                                "as plain compiled kernels (the worker log says why)")
        result.metrics += [Metric(name, value, "") for name, value in counts.items()]
    if device.startswith("cuda"):
        result.metrics.append(Metric("peak_memory_bytes", float(torch.cuda.max_memory_allocated(device)),
                                     "bytes"))
    if mode.gemv:
        from engine.kernels.triton.gemv import choices

        picked = [f"{c['N']}×{c['K']}{' ' + c['fusion'] if c['fusion'] else ''} {c['impl']} (Triton "
                  f"{c['triton_us']:.1f} µs, cuBLAS{' with the ops unfused' if c['fusion'] else ''} "
                  f"{c['cublas_us']:.1f} µs)" for c in choices()]
        if picked:
            result.notes.append("GEMV per weight shape and fusion, timed in a CUDA graph over weight copies that "
                                "exceed L2 (their memory is in peak_memory_bytes): " + "; ".join(picked))


def _profile_phases(run: _Run, ref: _Reference, prepared: Prepared) -> list[dict]:
    """torch.profiler over one phase at a time (NVTX ranges `prefill` / `decode`); the decode phase's op_stats rows
    (what the deep profile picks its kernels from)."""
    mode, device, out_dir, result = run.mode, run.device, run.out_dir, run.result
    prompt, positions, decoder = ref.prompt, ref.positions, prepared.decoder
    P, N = run.cfg.prompt_len, run.cfg.new_tokens
    run.progress(0.75, f"{mode.name}: profiling prefill")

    def prefill_step() -> None:
        with nvtx_ranges.range("prefill"):
            prepared.prefill(prompt, positions)
        sync(device)  # each step's kernels inside its own profiler step (the device runs behind the host)

    _profile(prefill_step, device, out_dir / "trace-prefill.json.gz", 1, 2, "prefill", result)
    if decoder is None:
        return []
    run.progress(0.82, f"{mode.name}: profiling decode")
    warm = min(2, max(0, N - 1))
    active = max(1, min(run.cfg.profile_decode_steps, N - warm))
    token0, _ = prepared.prefill(prompt, positions)
    decoder.reset(token0, P)

    def decode_step() -> None:
        with nvtx_ranges.range("decode"):
            decoder.step()
        # A graph replay returns at once: without the sync the kernels of earlier replays would be
        # counted in later steps (a kernel that runs 16 times a step would show more than 16 "per step").
        sync(device)

    return _profile(decode_step, device, out_dir / "trace-decode.json.gz", warm, active, "decode", result)


def _deep_profile(run: _Run, prepared: Prepared, decode_rows: list[dict]) -> None:
    """`deep`: Nsight Compute on the top-k decode kernels; a note where the mode has no decode phase."""
    if run.cfg.deep and prepared.decoder is not None:
        run.progress(0.88, f"{run.mode.name}: Nsight Compute on the top-{run.cfg.top_k} decode kernels")
        _deep(run.cfg, decode_rows, run.out_dir, run.result)
    elif run.cfg.deep:
        run.result.notes.append("deep profile skipped: this mode has no decode phase here")


def _give_device_up(run: _Run) -> None:
    """The rest is arithmetic and files: the run lets the device go altogether. (Taking it back shared would queue
    behind every run of the group waiting to time, holding its slot and memory until the last of them had timed.)"""
    if run.hold is None:
        return
    run.hold.release()
    group = run.hold.group_size
    run.result.metrics += [Metric("prepared_alongside", float(group - 1), ""),
                           Metric("device_wait_s", run.hold.waited_s, "s")]
    run.result.notes.append(f"prepared beside up to {group - 1} other run(s) of its group (untimed work only: "
                            "building, checking, compiling), timed and profiled with the device to itself; its "
                            "first-call figures include that CPU contention (its waits for the device taken out): "
                            "--serial gives cold compile times alone")


# -- figures --------------------------------------------------------------------------------------------------------
@dataclass
class _Peaks:
    """What MFU and MBU divide by: the measured matmul ceiling and copy bandwidth, and the datasheet's figures."""
    key: str  # the matmul ceiling's name, matmul_bf16 or matmul_fp32
    flops: float | None
    bw: float | None
    sheet: Datasheet | None
    sheet_flops: float | None


def _peaks(run: _Run) -> _Peaks:
    dtype, ceilings = run.cfg.torch_dtype, run.ceilings
    key = f"matmul_{dtype_key(dtype) if dtype_key(dtype) != 'fp16' else 'bf16'}"
    sheet = ceilings.datasheet if ceilings else None
    sheet_flops = (sheet.bf16_flops if dtype in (torch.bfloat16, torch.float16) else sheet.fp32_flops) if sheet \
        else None
    return _Peaks(key, ceilings.get(key) if ceilings else None, ceilings.copy_bw if ceilings else None, sheet,
                  sheet_flops)


def _figures(run: _Run, timings: _Timings) -> None:
    """FLOPs and bytes from engine.llm.metrics against the measured times: throughput, MFU, MBU, sizes."""
    peaks = _peaks(run)
    ttft_s = _prefill_figures(run, timings.prefill_us, peaks)
    if timings.decode_us:
        _decode_figures(run, timings.decode_us, ttft_s, peaks)
    _size_and_ceiling_figures(run, peaks)


def _prefill_figures(run: _Run, prefill_us: list[float], peaks: _Peaks) -> float:
    """TTFT and the prefill's FLOP/s, bandwidth and MFU; returns the TTFT in seconds."""
    cfg, tag_p = run.cfg, run.tag("prefill")
    B, P = cfg.batch, cfg.prompt_len
    prefill_stats = summarize(prefill_us)
    pre = M.prefill_counts(cfg.model_config(), B, P, _elem(cfg))
    ttft_s = prefill_stats.median * 1e-6
    run.result.metrics += [
        Metric("ttft_us", prefill_stats.median, "us", **tag_p),
        Metric("ttft_p10_us", prefill_stats.p10, "us", **tag_p),
        Metric("ttft_p90_us", prefill_stats.p90, "us", **tag_p),
        Metric("ttft_mean_us", prefill_stats.mean, "us", **tag_p),
        Metric("flops", pre.flops, "FLOP", **tag_p),
        Metric("bytes", pre.bytes, "B", **tag_p),
        Metric("intensity", pre.intensity, "FLOP/B", **tag_p),
        Metric("achieved_flops", pre.flops / ttft_s, "FLOP/s", **tag_p),
        Metric("achieved_bw", pre.bytes / ttft_s, "B/s", **tag_p),
        Metric("prefill_tokens_per_s", B * P / ttft_s, "tokens/s", **tag_p),
    ]
    for name, value in (("mfu_pct", M.utilisation(pre.flops, ttft_s, peaks.flops)),
                        ("mfu_datasheet_pct", M.utilisation(pre.flops, ttft_s, peaks.sheet_flops))):
        if value is not None:
            run.result.metrics.append(Metric(name, value, "%", **tag_p))
    return ttft_s


def _decode_figures(run: _Run, decode_us: list[float], ttft_s: float, peaks: _Peaks) -> None:
    """TPOT (every step a sample), tokens/s, the decode's FLOP/s, bandwidth, MBU; end-to-end generation time."""
    cfg, tag_d = run.cfg, run.tag("decode")
    B, P, N = cfg.batch, cfg.prompt_len, cfg.new_tokens
    dec_stats = summarize(decode_us)
    unquantized = M.decode_counts(cfg.model_config(), B, P, N, _elem(cfg))
    dec = unquantized
    if run.mode.quant:  # the bytes the quantized step moves: packed weights, scales, the KV read
        from engine.llm.quant import decode_counts as quant_decode_counts

        dec = quant_decode_counts(cfg.model_config(), run.mode.quant, B, P, N, _elem(cfg))
        # the same step unquantized, for "× fewer bytes" on the page
        run.result.metrics.append(Metric("bytes_unquantized", unquantized.bytes, "B", **tag_d))
    tpot_s = dec_stats.median * 1e-6
    last_pass = decode_us[-N:]
    generation_s = ttft_s + sum(last_pass) * 1e-6
    run.result.metrics += [
        Metric("tpot_median_us", dec_stats.median, "us", **tag_d),
        Metric("tpot_p90_us", dec_stats.p90, "us", **tag_d),
        Metric("tpot_p10_us", dec_stats.p10, "us", **tag_d),
        Metric("tpot_mean_us", dec_stats.mean, "us", **tag_d),
        Metric("tpot_min_us", dec_stats.min, "us", **tag_d),
        Metric("tpot_max_us", dec_stats.max, "us", **tag_d),
        Metric("flops", dec.flops, "FLOP", **tag_d),
        Metric("bytes", dec.bytes, "B", **tag_d),
        Metric("intensity", dec.intensity, "FLOP/B", **tag_d),
        Metric("achieved_flops", dec.flops / tpot_s, "FLOP/s", **tag_d),
        Metric("achieved_bw", dec.bytes / tpot_s, "B/s", **tag_d),
        Metric("tokens_per_s", B / tpot_s, "tokens/s", **tag_d),
        Metric("e2e_tokens_per_s", B * (N + 1) / generation_s, "tokens/s"),
        Metric("generation_us", generation_s * 1e6, "us"),
    ]
    sheet_bw = peaks.sheet.mem_bw if peaks.sheet else None
    for name, value in (("mbu_pct", M.utilisation(dec.bytes, tpot_s, peaks.bw)),
                        ("mbu_datasheet_pct", M.utilisation(dec.bytes, tpot_s, sheet_bw)),
                        ("decode_mfu_pct", M.utilisation(dec.flops, tpot_s, peaks.flops))):
        if value is not None:
            run.result.metrics.append(Metric(name, value, "%", **tag_d))


def _size_and_ceiling_figures(run: _Run, peaks: _Peaks) -> None:
    """The model's sizes, and the ceilings the percentages divided by (named in a note)."""
    cfg, result, ceilings = run.cfg, run.result, run.ceilings
    mc, elem = cfg.model_config(), _elem(cfg)
    result.metrics += [Metric("params", float(parameter_count(mc)), ""),
                       Metric("weight_bytes", float(M.weight_bytes(mc, cfg.batch, elem)), "B"),
                       Metric("kv_cache_bytes", float(M.kv_bytes(mc, cfg.batch, cfg.max_seq, elem)), "B")]
    result.metrics += ceiling_metrics(ceilings, ("copy_bw", peaks.key))
    if ceilings is not None:
        result.notes.append(f"MFU divides by the {ceilings.label(peaks.key)}"
                            + (f" ({fmt_num(peaks.flops, 'FLOP/s', 0)})" if peaks.flops else " (not measured)")
                            + f"; MBU by the {ceilings.label('copy_bw')}"
                            + (f" ({fmt_num(peaks.bw, 'B/s', 2)})" if peaks.bw else " (not measured)")
                            + (f"; datasheet figures: {peaks.sheet.name}" if peaks.sheet
                               else "; no datasheet for this device"))


def _elem(cfg: LLMConfig) -> int:
    """Bytes per element of the run's dtype."""
    return torch.finfo(cfg.torch_dtype).bits // 8


def _write_reports(run: _Run) -> None:
    run.result.metrics.append(Metric("run_wall_s", time.perf_counter() - run.wall0, "s"))
    # The job runner gives each run the folder artifacts/run_<id>: the reports can name their run.
    run.result.artifacts += write_reports(run.cfg, run.result, run.out_dir, run_id=_run_id(run))


# -- helpers: first calls, compile counters, profiles ---------------------------------------------------------------
def _first_call(fn: Callable[[], object], device: str) -> float:
    """Wall time of the call in µs, less any time it waited for the device (a timed section inside it, such as
    the GEMV's choice, waits while other runs of its group prepare: engine.runner.device_lock)."""
    hold = device_phases.current()
    waited0 = hold.waited_s if hold else 0.0
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - t0 - ((hold.waited_s - waited0) if hold else 0.0)) * 1e6


def _dynamo_counts() -> dict[str, float]:
    from torch._dynamo.utils import counters

    return {"graphs_compiled": float(counters["stats"]["unique_graphs"]),
            "graph_breaks": float(sum(counters["graph_break"].values())),
            "fxgraph_cache_hits": float(counters["inductor"]["fxgraph_cache_hit"]),
            "fxgraph_cache_misses": float(counters["inductor"]["fxgraph_cache_miss"]),
            # CUDA graph trees fall back to plain kernels (with a log line) when a graph cannot be captured.
            "cudagraph_skips": float(counters["inductor"]["cudagraph_skips"])}


def _profile(step: Callable[[], object], device: str, path: Path, warmup: int, active: int, phase: str,
             result: RunResult) -> list[dict]:
    from engine.measure.op_stats import analyze, load_trace
    from engine.profiling.profile import ProfileConfig, profile_step

    cfg = ProfileConfig(device=device, wait=0, warmup=warmup, active=active, record_shapes=True)
    profile_step(step, device, path, cfg)
    analysis = analyze(load_trace(path), phase)
    for name, value in analysis.metrics.items():
        unit = "" if name in ("steps", "op_calls", "kernel_launches", "launches_per_step", "kernels",
                              "kernels_per_step", "idle_fraction") else "us"
        result.metrics.append(Metric(f"prof_{name}", float(value), unit, phase=phase))
    result.artifacts.append(Artifact(kind="chrome_trace", name=path.name, path=str(path)))
    result.op_stats.extend(analysis.op_stats)
    result.notes.extend(f"{phase} profile: {n}" for n in analysis.notes)
    return analysis.op_stats


def _deep(cfg: LLMConfig, rows: list[dict], out_dir: Path, result: RunResult) -> None:
    """Nsight Compute on the top-k decode kernels, in a subprocess (this module's --ncu-target); notes, not
    failures, when it cannot run."""
    from engine.profiling import ncu

    kernels, reason = ncu.deep_targets(cfg.device, rows, "decode")
    if reason:
        result.notes.append(reason)
        return
    csv_path = out_dir / "ncu-decode.csv"
    steps = 2
    cmd = [*ncu.ncu_options(kernels[: cfg.top_k], ncu=ncu.ncu_path() or "ncu", log_file=csv_path),
           "--launch-count", str(steps * 4 * cfg.top_k * max(1, cfg.model_config().layers)),
           sys.executable, "-m", "engine.llm.run", "--ncu-target", *target_args(cfg, steps)]
    ncu.run_ncu(cmd, csv_path, "decode", timeout_s=600).add_to(result, "decode")


def target_args(cfg: LLMConfig, steps: int) -> list[str]:
    args = ["--preset", cfg.preset, "--mode", cfg.mode, "--device", cfg.device, "--prompt-len", str(cfg.prompt_len),
            "--new-tokens", str(cfg.new_tokens), "--batch", str(cfg.batch), "--seed", str(cfg.seed),
            "--steps", str(steps)]
    if cfg.layers:
        args += ["--layers", str(cfg.layers)]
    if cfg.dtype:
        args += ["--dtype", cfg.dtype]
    if cfg.sdpa:
        args += ["--sdpa", cfg.sdpa]
    if not cfg.fuse:
        args += ["--no-fuse"]
    return args


# -- the target Nsight Compute runs ---------------------------------------------------------------------------------
def ncu_target(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.llm.run --ncu-target")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--mode", default="eager", choices=list(MODES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--sdpa", default=None)
    parser.add_argument("--no-fuse", action="store_true")
    parser.add_argument("--layers", type=int, default=None)
    a = parser.parse_args(argv)
    cfg = LLMConfig(preset=a.preset, layers=a.layers, mode=a.mode, device=a.device, prompt_len=a.prompt_len,
                    new_tokens=max(a.new_tokens, a.steps + 4), batch=a.batch, seed=a.seed, dtype=a.dtype,
                    sdpa=a.sdpa, fuse=not a.no_fuse)
    cfg.validate()
    with torch.no_grad():
        model, prompt = build(cfg)
        prepared = prepare(get_mode(cfg.mode), model, cfg.device, sdpa=cfg.sdpa)
        if prepared.decoder is None:
            return 0
        positions = torch.arange(cfg.prompt_len, device=cfg.device)
        token, _ = prepared.prefill(prompt, positions)
        prepared.decoder.reset(token, cfg.prompt_len)
        for _ in range(3):  # warm: compiled, graphs recorded
            prepared.decoder.step()
        token, _ = prepared.prefill(prompt, positions)
        prepared.decoder.reset(token, cfg.prompt_len)
        sync(cfg.device)
        torch.cuda.profiler.start()
        for _ in range(a.steps):
            prepared.decoder.step()
        sync(cfg.device)
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--ncu-target":
        sys.exit(ncu_target(sys.argv[2:]))
    sys.exit("usage: python -m engine.llm.run --ncu-target ... (runs are started by `python -m engine llm`)")
