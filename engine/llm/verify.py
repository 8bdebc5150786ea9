"""Is a mode's output right? Its logits and greedy tokens against a reference generation, the static KV cache
against a full recompute, and the logits tolerance of a run, calibrated against a float32 twin of the model.

Used by engine.llm.run (every mode against eager) and engine.llm.tp_rank (the sharded model against the unsharded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.llm.config import LLMConfig
from engine.llm.generate import Generation, step_fn
from engine.measure.checks import ToleranceError, nonfinite
from engine.workloads.llama import LlamaDecoder, build_model

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


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖, in float64; inf when either holds a NaN or inf (a NaN error would compare
    False with any tolerance and pass)."""
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all() or not torch.isfinite(e).all():
        return math.inf
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def err_text(err: float) -> str:
    """A relative error for a failure's reason; an infinite one says why (NaN or inf in the logits: rel_l2)."""
    return f"{err:.3g}" if math.isfinite(err) else "inf: NaN or inf in the logits"


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
        for whose, values in (("", a), ("eager's (the reference's) ", e)):
            bad = nonfinite(values)
            if bad:
                raise ToleranceError(f"{what}: {where} {whose}logits contain NaN or inf ({bad})")
        err = rel_l2(a, e)
        diff = (a - e).abs()
        max_abs = max(max_abs, float(diff.max()))
        errs.append(err)
        if not err <= tol:
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
        if not err <= tol:
            where = "prefill" if j == 0 else "the first decode step"
            raise ToleranceError(f"static KV cache: {where} logits differ from a full recompute without a cache "
                                 f"(relative L2 error {err_text(err)} > {tol:g})")
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
    if not math.isfinite(err):  # a tolerance from it would be inf and let every mode pass
        raise ToleranceError("eager's logits against its float32 twin: NaN or inf in the logits; no tolerance "
                             "can be calibrated from them")
    return Calibration(max(TOLERANCE_FACTOR * err, TOLERANCE_FLOOR), err, fp32)
