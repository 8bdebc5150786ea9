"""One LLM-lab run: a preset, a prompt of P tokens, N decode steps, batch B, one mode — checked, timed, profiled.

In order, in one worker process (engine.jobs starts it; it never touches the store):

1. Build the seeded model on the device (bf16 on CUDA, fp32 on CPU), fuse q/k/v and gate/up, allocate the static
   KV cache for P + N positions (rounded up to 16).
2. Reference: eager greedy generation of a few tokens through the static cache, checked once against a full
   recompute without a cache (the plain forward over the whole sequence): the cache itself is verified on the
   device. A float32 twin of the model sets the run's logits tolerance (see TOLERANCE_FACTOR).
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
   measured copy bandwidth (engine.ceilings), datasheet peaks beside them, named. Reports written (engine.llm.report).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine import device_lock as device_phases
from engine import nvtx_ranges
from engine.checks import ToleranceError
from engine.llm import metrics as M
from engine.llm.generate import Decoder, Generation, generate, step_fn
from engine.llm.modes import MODES, Prepared, availability, get_mode, prepare
from engine.store import Artifact, Metric, RunResult, Samples
from engine.timing import summarize
from engine.workloads.llama import PRESETS, LlamaConfig, LlamaDecoder, build_model, parameter_count, preset

Progress = Callable[[float, str], None]
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32}
# How far a mode's logits may be from eager's, as relative L2 error ‖mode − eager‖ / ‖eager‖.
# float32: 1e-4 (rounding stays near 1e-6). bf16/fp16: calibrated per run. bf16 keeps 8 significant bits
# (≤ 2⁻⁹ ≈ 0.2 % per rounding); modes round at different points (Inductor keeps fused elementwise chains in fp32,
# eager rounds after every op; GEMM and attention kernels accumulate in different orders) and the differences
# compound through the residual stream, so the right bound grows with depth and with how peaked attention is.
# It is measured, not guessed: the same model in float32 (the first sequence, fed eager's tokens) gives eager-bf16's
# own error e, and a mode may be TOLERANCE_FACTOR · e from eager (two bf16 evaluations each ~e from float32 are
# ≲ 2e apart; factor 4 leaves room for a less careful kernel). A wrong cache slot or position, or a lost cache,
# lands 10–50 · e away (tests/engine/llm show it on small models), so the check still catches them. Never below
# TOLERANCE_FLOOR.
TOLERANCE_FP32 = 1e-4
TOLERANCE_FACTOR = 4.0
TOLERANCE_FLOOR = 1e-3
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
    sweep: str | None = None  # the swept parameter of this run's group ("batch" or "prompt"), for the page
    tp: int = 1  # tensor parallelism over this many ranks (engine.llm.tp_launch; eager only)
    extra: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        name = self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
        return DTYPES[name]

    @property
    def max_seq(self) -> int:
        """Cache length: P + N rounded up to 16 (aligned rows for the attention kernels' masks)."""
        return 16 * math.ceil((self.prompt_len + self.new_tokens) / 16)

    def validate(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"no Llama preset {self.preset!r}; presets: {', '.join(PRESETS)}")
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

    def model_config(self) -> LlamaConfig:
        return preset(self.preset, **({"layers": self.layers} if self.layers else {}))


def config_from_params(params: dict[str, Any]) -> LLMConfig:
    known = set(LLMConfig.__dataclass_fields__)
    return LLMConfig(**{k: v for k, v in params.items() if k in known})


# -- memory ---------------------------------------------------------------------------------------------------------
def memory_needed(cfg: LLMConfig) -> int:
    """Bytes of weights and KV cache this run allocates at once (activations and logits come on top): the model,
    and during calibration its float32 twin with a one-sequence cache."""
    elem = torch.finfo(cfg.torch_dtype).bits // 8
    mc = cfg.model_config()
    need = elem * parameter_count(mc) + M.kv_bytes(mc, cfg.batch, cfg.max_seq, elem)
    if cfg.torch_dtype != torch.float32:
        need += 4 * parameter_count(mc) + M.kv_bytes(mc, 1, cfg.max_seq, 4)
    return need


def check_memory(cfg: LLMConfig) -> None:
    """A clear error before allocating a model that cannot fit on this GPU."""
    if not cfg.device.startswith("cuda"):
        return
    free, total = torch.cuda.mem_get_info(torch.device(cfg.device))
    need = memory_needed(cfg)
    if need > 0.95 * free:
        raise MemoryError(f"{cfg.preset} with B={cfg.batch}, {cfg.max_seq} cached positions needs "
                          f"{need / 2**30:.1f} GiB of weights and KV cache (the float32 twin that calibrates the "
                          f"check included); {cfg.device} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} "
                          "GiB. Use a smaller preset, batch or length.")


# -- correctness ----------------------------------------------------------------------------------------------------
def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double(), expected.double()
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


@dataclass
class CheckResult:
    prefill_rel_err: float
    decode_rel_err: float | None  # max over the checked decode steps
    max_abs_err: float
    tokens_matched: int  # positions whose tokens were compared and equal (the prefill's included)
    notes: list[str] = field(default_factory=list)


def check_generation(got: Generation, ref: Generation, tol: float, what: str) -> CheckResult:
    """Compare a mode's greedy generation with the reference; raises ToleranceError on a real mismatch."""
    steps = min(len(got.logits), len(ref.logits))
    errs: list[float] = []
    max_abs = 0.0
    notes: list[str] = []
    matched = 0
    for j in range(steps):
        where = "prefill" if j == 0 else f"decode step {j}"
        a, e = got.logits[j], ref.logits[j]
        if a.shape != e.shape:
            raise ToleranceError(f"{what}: {where} logits have shape {tuple(a.shape)}, eager's {tuple(e.shape)}")
        if not torch.isfinite(a).all():
            raise ToleranceError(f"{what}: {where} logits contain NaN or inf")
        err = rel_l2(a, e)
        diff = (a - e).abs()
        max_abs = max(max_abs, float(diff.max()))
        errs.append(err)
        if err > tol:
            raise ToleranceError(f"{what}: {where} logits differ from eager's (relative L2 error {err:.3g} > "
                                 f"tolerance {tol:g}; max abs err {float(diff.max()):.3g})")
        mine, theirs = got.tokens[:, j].cpu(), ref.tokens[:, j].cpu()
        rows = (mine != theirs).nonzero().flatten().tolist()
        if rows:
            r = rows[0]
            margin = float(e[r, theirs[r]] - e[r, mine[r]])  # eager's preference for its own token
            delta = float(diff[r].max())
            if margin <= 2 * delta:
                notes.append(f"{what}: at {where}, sequence {r} picked token {int(mine[r])} instead of eager's "
                             f"{int(theirs[r])}: eager rates them {margin:.3g} apart, within twice the measured "
                             f"logit difference ({delta:.3g}) — a tie within rounding; tokens compared up to here")
                break
            raise ToleranceError(f"{what}: generated token differs from eager's at {where} (sequence {r}: "
                                 f"{int(mine[r])} vs {int(theirs[r])}; eager prefers its token by {margin:.3g}, "
                                 f"more than twice the logit difference {delta:.3g})")
        matched += 1
    return CheckResult(prefill_rel_err=errs[0], decode_rel_err=max(errs[1:]) if len(errs) > 1 else None,
                       max_abs_err=max_abs, tokens_matched=matched, notes=notes)


@torch.no_grad()
def check_cache_against_recompute(model: LlamaDecoder, prompt: torch.Tensor, ref: Generation, tol: float) -> float:
    """The static-cache logits (prefill, first decode step) vs the plain forward over the whole sequence, on the
    first sequence of the batch. Returns the larger relative error; raises ToleranceError past `tol`."""
    seq = torch.cat([prompt[:1], ref.tokens[:1, :1].to(prompt.device)], dim=1)
    full = model(seq)[0].float().cpu()  # (P + 1, V)
    worst = 0.0
    for j, (got, want) in enumerate(((ref.logits[0][0], full[-2]), (ref.logits[1][0], full[-1]))
                                    if len(ref.logits) > 1 else ((ref.logits[0][0], full[-2]),)):
        err = rel_l2(got, want)
        worst = max(worst, err)
        if err > tol:
            where = "prefill" if j == 0 else "the first decode step"
            raise ToleranceError(f"static KV cache: {where} logits differ from a full recompute without a cache "
                                 f"(relative L2 error {err:.3g} > {tol:g})")
    return worst


@torch.no_grad()
def forced_logits(model: LlamaDecoder, prompt: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Logits (float32, CPU) of a prefill and one decode step per given token, fed `tokens` rather than the model's
    own choices (so a second model can be compared position by position with the first one's generation)."""
    step = step_fn(model)
    p = prompt.shape[1]
    _, logits = step(prompt, torch.arange(p, device=prompt.device))
    out = [logits.float().cpu()]
    for i in range(tokens.shape[1] - 1):
        _, logits = step(tokens[:, i:i + 1].to(prompt.device), torch.tensor([p + i], device=prompt.device))
        out.append(logits.float().cpu())
    return out


@dataclass
class Calibration:
    tolerance: float
    eager_fp32_rel_err: float | None  # eager's own distance from float32 (None: the run is float32)
    fp32_logits: list[torch.Tensor] = field(default_factory=list)  # first sequence only


def calibrate(cfg: LLMConfig, model: LlamaDecoder, prompt: torch.Tensor, ref: Generation) -> Calibration:
    """The logits tolerance of this run. float32: TOLERANCE_FP32. Lower precision: a float32 twin of the model (same
    weights, upcast) runs the first sequence with eager's tokens; eager's distance e from it sets the tolerance
    TOLERANCE_FACTOR · e (at least TOLERANCE_FLOOR)."""
    dtype = cfg.torch_dtype
    if dtype == torch.float32:
        return Calibration(TOLERANCE_FP32, None)
    twin = build_model(cfg.model_config(), cfg.device, torch.float32, cfg.seed)
    if cfg.fuse:
        twin.fuse_projections()
    twin.load_state_dict(model.state_dict())  # the low-precision weights, upcast: the same function, exactly
    twin.setup_cache(1, cfg.max_seq)
    fp32 = forced_logits(twin, prompt[:1], ref.tokens[:1])
    del twin
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()
    err = max(rel_l2(ref.logits[j][:1], fp32[j]) for j in range(len(fp32)))
    return Calibration(max(TOLERANCE_FACTOR * err, TOLERANCE_FLOOR), err, fp32)


# -- timing ---------------------------------------------------------------------------------------------------------
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_calls(fn: Callable[[], object], n: int, device: str,
                 before: Callable[[], object] | None = None) -> list[float]:
    """µs per call; on CUDA a pair of events per call, on CPU perf_counter. `before` runs untimed ahead of each
    call (tensor-parallel ranks pass a barrier, so every rank starts together)."""
    out = []
    for _ in range(n):
        _sync(device)
        if before is not None:
            before()
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
    return out


def decode_pass(decoder: Decoder, token: torch.Tensor, start: int, steps: int, device: str,
                 before: Callable[[], object] | None = None) -> list[float]:
    """µs per decode step over `steps` steps: one event between consecutive steps on CUDA (no host sync inside the
    loop), perf_counter on the CPU. `before` runs once ahead of the pass (a barrier across tensor-parallel ranks)."""
    decoder.reset(token, start)
    _sync(device)
    if before is not None:
        before()
    if device.startswith("cuda"):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        events[0].record()
        for i in range(steps):
            decoder.step()
            events[i + 1].record()
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(steps)]
    times, t0 = [], time.perf_counter()
    for _ in range(steps):
        decoder.step()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e6)
        t0 = t1
    return times


def _first_call(fn: Callable[[], object], device: str) -> float:
    """Wall time of the call in µs, less any time it waited for the device (a timed section inside it, such as
    the GEMV's choice, waits while other runs of its group prepare: engine.device_lock)."""
    hold = device_phases.current()
    waited0 = hold.waited_s if hold else 0.0
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0 - ((hold.waited_s - waited0) if hold else 0.0)) * 1e6


def _dynamo_counts() -> dict[str, float]:
    from torch._dynamo.utils import counters

    return {"graphs_compiled": float(counters["stats"]["unique_graphs"]),
            "graph_breaks": float(sum(counters["graph_break"].values())),
            "fxgraph_cache_hits": float(counters["inductor"]["fxgraph_cache_hit"]),
            "fxgraph_cache_misses": float(counters["inductor"]["fxgraph_cache_miss"]),
            # CUDA graph trees fall back to plain kernels (with a log line) when a graph cannot be captured.
            "cudagraph_skips": float(counters["inductor"]["cudagraph_skips"])}


# -- profiling ------------------------------------------------------------------------------------------------------
def _profile(step: Callable[[], object], device: str, path: Path, warmup: int, active: int, phase: str,
             result: RunResult) -> list[dict]:
    from engine.profiling.op_stats import analyze, load_trace
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
    # ncu.build_command ends with `python -m engine.profiling.ncu <args>`: keep its ncu options, run our target.
    options = ncu.build_command(kernels[: cfg.top_k], [], ncu=ncu.ncu_path() or "ncu", log_file=csv_path)[:-3]
    steps = 2
    cmd = [*options, "--launch-count", str(steps * 4 * cfg.top_k * max(1, cfg.model_config().layers)),
           sys.executable, "-m", "engine.llm.run", "--ncu-target", *target_args(cfg, steps)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    import subprocess

    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    except (subprocess.TimeoutExpired, OSError) as exc:
        result.notes.append(f"Nsight Compute did not finish: {exc}")
        return
    log = out_dir / "ncu-decode.log"
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    result.artifacts.append(Artifact(kind="ncu_log", name=log.name, path=str(log)))
    text = csv_path.read_text(errors="replace") if csv_path.exists() else proc.stdout
    if csv_path.exists():
        result.artifacts.append(Artifact(kind="ncu_csv", name=csv_path.name, path=str(csv_path)))
    rows_out = ncu.summarize(ncu.parse_csv(text), "decode")
    result.kernel_metrics.extend(rows_out)
    result.metrics.append(Metric("ncu_kernels", float(len(rows_out)), "", phase="decode"))
    if proc.returncode != 0 or not rows_out:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        result.notes.append(f"Nsight Compute measured {len(rows_out)} decode kernel(s) (exit code "
                            f"{proc.returncode}): {tail}")


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


# -- the run --------------------------------------------------------------------------------------------------------
def build(cfg: LLMConfig) -> tuple[LlamaDecoder, torch.Tensor]:
    """The seeded model with its static cache, and the seeded prompt (B, P) on the device."""
    model = build_model(cfg.model_config(), cfg.device, cfg.torch_dtype, cfg.seed)
    if cfg.fuse:
        model.fuse_projections()
    model.setup_cache(cfg.batch, cfg.max_seq)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    prompt = torch.randint(0, model.cfg.vocab, (cfg.batch, cfg.prompt_len), generator=gen).to(cfg.device)
    return model, prompt


def llm_run(cfg: LLMConfig, progress: Progress = lambda f, m: None) -> RunResult:
    """Check, time and profile one mode; raises when it is unavailable or off tolerance."""
    from engine.ceilings import ceiling_metrics, ceilings_for, dtype_key
    from engine.envinfo import capture_env
    from engine.llm.report import fmt_num, write_reports

    wall0 = time.perf_counter()
    cfg.validate()
    if cfg.tp > 1:  # torchrun subprocesses: world sizes 1 and tp, checked against the unsharded model
        from engine.llm.tp_launch import tp_result

        return tp_result(cfg, cfg.tp, progress)
    mode = get_mode(cfg.mode)
    dtype, device = cfg.torch_dtype, cfg.device
    reason = availability(mode, device, dtype)
    if reason:
        raise RuntimeError(f"mode {mode.name} is not available on {device}: {reason}")
    out_dir = Path(cfg.artifacts_dir or tempfile.mkdtemp(prefix="modelab-llm-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result = RunResult(env=capture_env(device))
    nvtx_ranges.enable(device.startswith("cuda"))
    elem = torch.finfo(dtype).bits // 8
    mc = cfg.model_config()
    B, P, N = cfg.batch, cfg.prompt_len, cfg.new_tokens
    tag_p, tag_d = dict(phase="prefill", batch_size=B), dict(phase="decode", batch_size=B)

    ceilings = None
    hold = device_phases.current()
    if hold is not None and device.startswith("cuda"):
        # compile workers per run: the group shares the machine's cores (16 runs × 16 compile processes otherwise)
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = max(1, (os.cpu_count() or 1) // hold.group_size)
    if cfg.ceilings != "none":
        progress(0.02, "device ceilings")
        ceilings = ceilings_for(device, cfg.db, measure_if_missing=cfg.ceilings == "auto")
        if ceilings is None:
            result.notes.append("no stored ceilings for this device: MFU and MBU left out (run `python -m engine "
                                "ceilings --device ...` first)")

    progress(0.05, f"building {cfg.preset} ({dtype}) on {device}")
    check_memory(cfg)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    with torch.no_grad():
        model, prompt = build(cfg)
        positions = torch.arange(P, device=device)

        # The reference: eager through the static cache, verified once against a full recompute.
        progress(0.1, "eager reference")
        k = min(cfg.check_tokens, N)
        eager = step_fn(model)
        with nvtx_ranges.range("reference"):
            ref = generate(eager, Decoder(eager), prompt, k)
            calib = calibrate(cfg, model, prompt, ref)
            tol = calib.tolerance
            cache_err = check_cache_against_recompute(model, prompt, ref, tol)
        result.metrics += [Metric("cache_vs_recompute_rel_err", cache_err, ""), Metric("tolerance", tol, "")]
        if calib.eager_fp32_rel_err is not None:
            result.metrics.append(Metric("eager_fp32_rel_err", calib.eager_fp32_rel_err, ""))
        if device.startswith("cuda"):  # the float32 twin is gone: peak memory counts this run's own model from here
            torch.cuda.reset_peak_memory_stats(torch.device(device))

        if mode.gemv and device.startswith("cuda"):
            from engine.kernels.triton import gemv as gemv_kernels

            gemv_kernels.defer_tuning(True)  # nothing timed while preparing: tuned below, with the device alone
        progress(0.15, f"{mode.name}: preparing")
        counts_before = _dynamo_counts()  # dynamo's counters are process-wide: this run's are the difference
        prepared: Prepared = prepare(mode, model, device, sdpa=cfg.sdpa, autotune=cfg.autotune)
        result.notes.extend(prepared.notes)
        decoder = prepared.decoder

        progress(0.2, f"{mode.name}: first prefill (compiles)" if mode.prefill == "compile" else "first prefill")
        with nvtx_ranges.range("first_call prefill"):
            first_prefill = _first_call(lambda: prepared.prefill(prompt, positions), device)
        result.metrics.append(Metric("first_call_us", first_prefill, "us", **tag_p))
        token0, _ = prepared.prefill(prompt, positions)
        if decoder is not None:
            progress(0.35, f"{mode.name}: first decode step" + (" (compiles)" if mode.decode != "eager" else ""))

            def first_decode() -> None:
                decoder.reset(token0, P)
                decoder.step()

            with nvtx_ranges.range("first_call decode"):
                first_dec = _first_call(first_decode, device)
            result.metrics.append(Metric("first_call_us", first_dec, "us", **tag_d))

        if mode.gemv and device.startswith("cuda"):
            progress(0.44, f"{mode.name}: compiling the GEMV tiles to tune")
            gemv_kernels.compile_pending()  # untimed: the timing part of tuning waits for the device below
        # -- from here the device is this run's alone (when it prepared beside others, it waits for them) --
        if hold is not None:
            progress(0.45, f"{mode.name}: waiting to time alone")
            hold.exclusive()
        if mode.gemv and device.startswith("cuda"):
            progress(0.47, f"{mode.name}: tuning the GEMVs")
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

        progress(0.5, f"{mode.name}: comparing with eager")
        if mode.name != "eager":
            if decoder is None:
                got = generate(prepared.prefill, Decoder(eager), prompt, 0)
            else:
                got = generate(prepared.prefill, decoder, prompt, k)
            check = check_generation(got, ref if decoder is not None else Generation(ref.tokens[:, :1],
                                                                                    ref.logits[:1]),
                                     tol, mode.name)
        else:
            check = CheckResult(prefill_rel_err=0.0, decode_rel_err=0.0 if k else None, max_abs_err=0.0,
                                tokens_matched=k + 1)
        result.notes.extend(check.notes)
        result.metrics += [Metric("max_rel_err", check.prefill_rel_err, "", **tag_p),
                           Metric("tokens_matched", float(check.tokens_matched), "")]
        if calib.fp32_logits and mode.name != "eager":  # how close the mode itself is to float32 (first sequence)
            steps = min(check.tokens_matched, len(calib.fp32_logits), len(got.logits))
            if steps:
                result.metrics.append(Metric("fp32_rel_err", max(rel_l2(got.logits[j][:1], calib.fp32_logits[j])
                                                                 for j in range(steps)), ""))
        if check.decode_rel_err is not None and decoder is not None:
            result.metrics.append(Metric("max_rel_err", check.decode_rel_err, "", **tag_d))
        result.metrics.append(Metric("max_abs_err", check.max_abs_err, ""))

        progress(0.55, f"{mode.name}: timing prefill")
        for _ in range(2):
            prepared.prefill(prompt, positions)
        with nvtx_ranges.range("prefill"):
            prefill_us = timed_calls(lambda: prepared.prefill(prompt, positions), cfg.prefill_iters, device)
        result.samples.append(Samples(phase="prefill", values=prefill_us, batch_size=B))
        decode_us: list[float] = []
        if decoder is not None:
            progress(0.65, f"{mode.name}: timing decode ({cfg.decode_passes} × {N} steps)")
            token0, _ = prepared.prefill(prompt, positions)
            decode_pass(decoder, token0, P, min(N, 8), device)  # warm: CUDA graph trees record here
            for i in range(cfg.decode_passes):
                token0, _ = prepared.prefill(prompt, positions)
                with nvtx_ranges.range("decode"):
                    decode_us += decode_pass(decoder, token0, P, N, device)
            result.samples.append(Samples(phase="decode", values=decode_us, batch_size=B))
        if mode.compiles:  # after every timed call: a recompile during timing would show here
            counts = {k: v - counts_before[k] for k, v in _dynamo_counts().items()}
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

            picked = [f"{c['N']}×{c['K']} {c['impl']} (Triton {c['triton_us']:.1f} µs, cuBLAS {c['cublas_us']:.1f} "
                      "µs)" for c in choices()]
            if picked:
                result.notes.append("GEMV per weight shape, timed in a CUDA graph over weight copies that exceed L2 "
                                    "(their memory is in peak_memory_bytes): " + "; ".join(picked))

        # -- profiles --
        decode_rows: list[dict] = []
        if cfg.profile:
            progress(0.75, f"{mode.name}: profiling prefill")

            def prefill_step() -> None:
                with nvtx_ranges.range("prefill"):
                    prepared.prefill(prompt, positions)
                _sync(device)  # each step's kernels inside its own profiler step (the device runs behind the host)

            _profile(prefill_step, device, out_dir / "trace-prefill.json.gz", 1, 2, "prefill", result)
            if decoder is not None:
                progress(0.82, f"{mode.name}: profiling decode")
                warm = min(2, max(0, N - 1))
                active = max(1, min(cfg.profile_decode_steps, N - warm))
                token0, _ = prepared.prefill(prompt, positions)
                decoder.reset(token0, P)

                def decode_step() -> None:
                    with nvtx_ranges.range("decode"):
                        decoder.step()
                    # A graph replay returns at once: without the sync the kernels of earlier replays would be
                    # counted in later steps (seen on the H100: 19.5 "per step" of a kernel that runs 16 times).
                    _sync(device)

                decode_rows = _profile(decode_step, device, out_dir / "trace-decode.json.gz", warm, active,
                                       "decode", result)
    if cfg.deep and decoder is not None:
        progress(0.88, f"{mode.name}: Nsight Compute on the top-{cfg.top_k} decode kernels")
        _deep(cfg, decode_rows, out_dir, result)
    elif cfg.deep:
        result.notes.append("deep profile skipped: this mode has no decode phase here")
    if hold is not None:
        hold.shared()  # the rest is arithmetic and files: the next run of the group may time
        group = hold.group_size
        result.metrics += [Metric("prepared_alongside", float(group - 1), ""),
                           Metric("device_wait_s", hold.waited_s, "s")]
        result.notes.append(f"prepared beside up to {group - 1} other run(s) of its group (untimed work only: "
                            "building, checking, compiling), timed and profiled with the device to itself; its "
                            "first-call figures include that CPU contention (its waits for the device taken out): "
                            "--serial gives cold compile times alone")

    # -- figures --
    progress(0.92, "figures and reports")
    prefill_stats = summarize(prefill_us)
    pre = M.prefill_counts(mc, B, P, elem)
    ttft_s = prefill_stats.median * 1e-6
    peak_key = f"matmul_{dtype_key(dtype) if dtype_key(dtype) != 'fp16' else 'bf16'}"
    peak = ceilings.get(peak_key) if ceilings else None
    bw = ceilings.copy_bw if ceilings else None
    sheet = ceilings.datasheet if ceilings else None
    sheet_flops = (sheet.bf16_flops if dtype in (torch.bfloat16, torch.float16) else sheet.fp32_flops) if sheet \
        else None
    result.metrics += [
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
    for name, value in (("mfu_pct", M.utilisation(pre.flops, ttft_s, peak)),
                        ("mfu_datasheet_pct", M.utilisation(pre.flops, ttft_s, sheet_flops))):
        if value is not None:
            result.metrics.append(Metric(name, value, "%", **tag_p))
    if decode_us:
        dec_stats = summarize(decode_us)
        dec = M.decode_counts(mc, B, P, N, elem)
        tpot_s = dec_stats.median * 1e-6
        last_pass = decode_us[-N:]
        generation_s = ttft_s + sum(last_pass) * 1e-6
        result.metrics += [
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
        for name, value in (("mbu_pct", M.utilisation(dec.bytes, tpot_s, bw)),
                            ("mbu_datasheet_pct", M.utilisation(dec.bytes, tpot_s, sheet.mem_bw if sheet else None)),
                            ("decode_mfu_pct", M.utilisation(dec.flops, tpot_s, peak))):
            if value is not None:
                result.metrics.append(Metric(name, value, "%", **tag_d))
    result.metrics += [Metric("params", float(parameter_count(mc)), ""),
                       Metric("weight_bytes", float(M.weight_bytes(mc, B, elem)), "B"),
                       Metric("kv_cache_bytes", float(M.kv_bytes(mc, B, cfg.max_seq, elem)), "B")]
    result.metrics += ceiling_metrics(ceilings, ("copy_bw", peak_key))
    if ceilings is not None:
        result.notes.append(f"MFU divides by the {ceilings.label(peak_key)}"
                            + (f" ({fmt_num(peak, 'FLOP/s', 0)})" if peak else " (not measured)")
                            + f"; MBU by the {ceilings.label('copy_bw')}"
                            + (f" ({fmt_num(bw, 'B/s', 2)})" if bw else " (not measured)")
                            + (f"; datasheet figures: {sheet.name}" if sheet else "; no datasheet for this device"))
    result.metrics.append(Metric("run_wall_s", time.perf_counter() - wall0, "s"))
    # The job runner gives each run the folder artifacts/run_<id>: the reports can name their run.
    folder = re.fullmatch(r"run_(\d+)", out_dir.name)
    result.artifacts += write_reports(cfg, result, out_dir, run_id=int(folder.group(1)) if folder else None)
    progress(1.0, "done")
    return result


def llm_job(params: dict, progress: Progress) -> RunResult:
    """Job-runner entry point (engine.jobs TARGETS['llm'])."""
    return llm_run(config_from_params(params), progress)


def params_of(cfg: LLMConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items() if k not in ("artifacts_dir", "db", "extra")}


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
        _sync(cfg.device)
        torch.cuda.profiler.start()
        for _ in range(a.steps):
            prepared.decoder.step()
        _sync(cfg.device)
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--ncu-target":
        sys.exit(ncu_target(sys.argv[2:]))
    sys.exit("usage: python -m engine.llm.run --ncu-target ... (runs are started by `python -m engine llm`)")
