"""Proof that an IR computes what its model computes: run both on the same real weights and inputs, compare.

`verify_ir` needs the real model in memory, so the dashboard and the CLI run it through `verify_job` in a worker
process (engine.runner.jobs): an out-of-memory kill ends the worker, not the dashboard.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.ir.errors import IRError
from engine.ir.execute import execute_ir
from engine.ir.graph import IR
from engine.measure.checks import nonfinite


@dataclass
class OutputCheck:
    name: str
    shape: list[int]
    dtype: str
    max_abs_err: float
    max_rel_err: float
    ok: bool
    message: str = ""


@dataclass
class VerifyReport:
    ok: bool
    model_name: str
    rtol: float
    atol: float
    outputs: list[OutputCheck] = field(default_factory=list)
    error: str | None = None  # the IR could not be run at all (ExecutionError, WeightLoadError…)
    ir_seconds: float = 0.0
    model_seconds: float = 0.0

    @property
    def max_abs_err(self) -> float:
        return max((o.max_abs_err for o in self.outputs), default=float("nan"))

    @property
    def max_rel_err(self) -> float:
        return max((o.max_rel_err for o in self.outputs), default=float("nan"))

    def summary(self) -> str:
        if self.error:
            return f"{self.model_name}: FAILED to run the IR: {self.error}"
        verdict = "OK" if self.ok else "MISMATCH"
        return (f"{self.model_name}: {verdict} — {len(self.outputs)} output(s), max abs err {self.max_abs_err:.3g}, "
                f"max rel err {self.max_rel_err:.3g} (rtol {self.rtol:g}, atol {self.atol:g})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_abs_err"], d["max_rel_err"] = self.max_abs_err, self.max_rel_err
        return d


def model_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters, buffers (non-persistent ones too) and tensor attributes, keyed by their dotted path."""
    out: dict[str, torch.Tensor] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                out[f"{mod_name}.{attr}" if mod_name else attr] = value
    out.update(dict(model.named_buffers(remove_duplicate=False)))
    out.update(dict(model.named_parameters(remove_duplicate=False)))
    return {k: v.detach() for k, v in out.items()}


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> OutputCheck:
    if list(got.shape) != list(want.shape) or got.dtype != want.dtype:
        return OutputCheck(name, list(want.shape), str(want.dtype).removeprefix("torch."), float("inf"), float("inf"),
                           False, f"IR gives {got.dtype} {list(got.shape)}, model {want.dtype} {list(want.shape)}")
    if not want.is_floating_point():
        same = bool(torch.equal(got, want))
        err = 0.0 if same else float((got != want).sum())
        return OutputCheck(name, list(want.shape), str(want.dtype).removeprefix("torch."), err, err, same,
                           "" if same else f"{int(err)} element(s) differ")
    g, w = got.double(), want.double()
    diff = (g - w).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / w.abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0
    # A NaN or inf is never a match, even where both sides have it: there is no value to compare.
    bad = {whose: nonfinite(t) for whose, t in (("IR's", g), ("model's", w))}
    ok = not any(bad.values()) and bool(torch.allclose(g, w, rtol=rtol, atol=atol))
    msg = ("" if ok else "; ".join(f"the {whose} output has NaN or inf ({b})" for whose, b in bad.items() if b)
           or f"exceeds rtol {rtol:g} / atol {atol:g}")
    return OutputCheck(name, list(want.shape), str(want.dtype).removeprefix("torch."), max_abs, max_rel, ok, msg)


@torch.no_grad()
def verify_ir(ir: IR, model: nn.Module, inputs: Sequence[torch.Tensor], rtol: float = 1e-4, atol: float = 1e-4, *,
              weights: Mapping[str, torch.Tensor] | None = None) -> VerifyReport:
    """Run the IR with the model's real parameters and buffers (or `weights`, to test a change) and compare its outputs
    with the model's own. Never raises for a mismatch or an IR that fails to run: the report says so.

    State the model writes in forward (IR.mutations: a step counter, running statistics) is copied before the model
    runs, the IR starts from that copy, and each written tensor's final value is compared too ("state:<key>")."""
    report = VerifyReport(ok=False, model_name=ir.model_name, rtol=rtol, atol=atol)
    weights = dict(model_weights(model) if weights is None else weights)
    inputs = tuple(inputs)
    written = {ir.weight_name_mapping.get(m.target, m.target) for m in ir.mutations}
    input_names = [t.name for t in ir.graph_inputs]
    if written:  # the model is about to change these: the IR must start from their values before it does
        weights.update({k: v.clone() for k, v in weights.items() if k in written})
        ir_inputs = tuple(x.clone() if n in written and isinstance(x, torch.Tensor) else x
                          for n, x in zip(input_names, inputs))
    else:
        ir_inputs = inputs
    start = time.perf_counter()
    expected = model(*inputs)
    report.model_seconds = time.perf_counter() - start
    expected = list(torch.utils._pytree.tree_leaves(expected))
    expected = [e for e in expected if isinstance(e, torch.Tensor)]
    state: dict[str, torch.Tensor] = {}
    start = time.perf_counter()
    try:
        got = execute_ir(ir, weights, ir_inputs, state_out=state)
    except IRError as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        return report
    report.ir_seconds = time.perf_counter() - start
    if len(got) != len(expected):
        report.error = f"the IR has {len(got)} output(s), the model returns {len(expected)}"
        return report
    report.outputs = [_compare(name, g, w, rtol, atol) for name, g, w in zip(ir.graph_outputs, got, expected)]
    after = model_weights(model)
    after.update(dict(zip(input_names, inputs)))
    for key, value in state.items():
        if key in after:
            report.outputs.append(_compare(f"state:{key}", value, after[key], rtol, atol))
    report.ok = all(o.ok for o in report.outputs)
    return report


# -- the worker-process job (engine.runner.jobs target "engine.ir.verify:verify_job")
# -----------------------------------
def verify_job(params: dict[str, Any], progress: Callable[[float, str], None]):
    """Verify a stored IR (params["ir_path"]) against its zoo model built on the CPU with real, seeded weights."""
    from engine.ir.serialize import load_ir
    from engine.ir.zoo import build as build_zoo_model
    from engine.store.db import Artifact, Metric, RunResult
    from engine.store.envinfo import capture_env

    workload, preset, seed = params["workload"], params.get("preset"), int(params.get("seed", 0))
    rtol, atol = float(params.get("rtol", 1e-4)), float(params.get("atol", 1e-4))
    progress(0.05, "loading the IR")
    ir = load_ir(params["ir_path"])
    if params.get("model"):  # a user model, imported here from where the user keeps it
        from engine.workloads.user_model import ModelSpec, build_inputs, build_model, default_batches, resolve

        spec = ModelSpec.from_params({**params, "seed": seed})
        progress(0.2, f"building {spec.model} on the CPU (seed {seed})")
        res = resolve(spec)
        model = build_model(res, "cpu").eval()
        inputs = build_inputs(res, default_batches(res)[2], "cpu")  # the batch size the extraction used
    else:
        progress(0.2, f"materialising {workload}/{preset} on the CPU (seed {seed})")
        # zoo.build refuses presets over the size limit
        model, inputs = build_zoo_model(workload, preset, device="cpu", seed=seed)
    progress(0.5, "running the model and the IR")
    report = verify_ir(ir, model, inputs, rtol=rtol, atol=atol)
    out = Path(params["artifacts_dir"]) / "verify.json"
    out.write_text(json.dumps(report.to_dict(), indent=1, default=str))
    progress(0.95, report.summary()[:200])
    if report.error:
        raise RuntimeError(f"verification could not run the IR: {report.error}")
    metrics = [Metric("verify_ok", float(report.ok)), Metric("max_abs_err", report.max_abs_err),
               Metric("max_rel_err", report.max_rel_err), Metric("ir_s", report.ir_seconds, "s"),
               Metric("model_s", report.model_seconds, "s")]
    notes = [] if report.ok else [f"{o.name}: {o.message}" for o in report.outputs if not o.ok]
    return RunResult(metrics=metrics, artifacts=[Artifact("verify_report", "verify.json", str(out))],
                     env=capture_env("cpu"), notes=notes)
