"""The LLM lab's reports and read-back: one run → report.md, operators.md, metrics.json, env.json, inputs.json,
assumptions.md; and the queries the LLM page and `python -m engine llm-report` use.

A report is built from a `RunView`: the figures of one run, either fresh from the worker's RunResult (the worker
writes the files as run artifacts) or read back from the store (to rebuild them later). Pure text in, text out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from engine.llm import metrics as M
from engine.llm.config import LLMConfig, params_of
from engine.llm.modes import MODES, TRANSFORMERS_MODES, route_mode
from engine.store.db import Artifact, RunResult, Store
from engine.store.report import fmt_joules, run_state
from engine.workloads.llama import PRESETS, LlamaConfig

REPORT_FILES = ("report.md", "operators.md", "metrics.json", "env.json", "inputs.json", "assumptions.md")
HEADLINE = {  # (phase, name) -> column of the page's and CLI's tables
    ("prefill", "ttft_us"): "ttft_us", ("decode", "tpot_median_us"): "tpot_median_us",
    ("decode", "tpot_p90_us"): "tpot_p90_us", ("decode", "tokens_per_s"): "tokens_per_s",
    (None, "e2e_tokens_per_s"): "e2e_tokens_per_s", ("prefill", "mfu_pct"): "mfu_pct",
    ("decode", "mbu_pct"): "mbu_pct", ("prefill", "first_call_us"): "first_call_prefill_us",
    ("decode", "first_call_us"): "first_call_decode_us", (None, "peak_memory_bytes"): "peak_memory_bytes",
    ("prefill", "max_rel_err"): "prefill_rel_err", ("decode", "max_rel_err"): "decode_rel_err",
    ("prefill", "intensity"): "prefill_intensity", ("decode", "intensity"): "decode_intensity",
    ("prefill", "achieved_flops"): "prefill_flops_per_s", ("decode", "achieved_flops"): "decode_flops_per_s",
    ("decode", "achieved_bw"): "decode_bw", (None, "ceiling_copy_bw"): "ceiling_copy_bw",
    (None, "ceiling_matmul_bf16"): "ceiling_matmul_bf16", (None, "ceiling_matmul_fp32"): "ceiling_matmul_fp32",
    ("prefill", "mfu_datasheet_pct"): "mfu_datasheet_pct", ("decode", "mbu_datasheet_pct"): "mbu_datasheet_pct",
    ("decode", "bytes"): "decode_bytes", ("decode", "bytes_unquantized"): "decode_bytes_unquantized",
    (None, "tolerance"): "tolerance", (None, "quant_top1_agreement"): "quant_top1",
    (None, "quant_mean_kl_nats"): "quant_kl", (None, "quant_gate_min_top1"): "gate_min_top1",
    (None, "quant_gate_max_kl"): "gate_max_kl", (None, "quantize_s"): "quantize_s",
    # energy (engine.measure.energy): whole board, and above the device's stored idle draw
    ("decode", "energy_per_token"): "j_per_token", ("decode", "energy_above_idle_per_token"): "j_per_token_above_idle",
    ("decode", "tokens_per_j"): "tokens_per_j", ("decode", "avg_power_w"): "decode_power_w",
    ("prefill", "energy_per_prefill"): "j_per_prefill", ("prefill", "energy_above_idle_per_prefill"):
    "j_per_prefill_above_idle", ("prefill", "avg_power_w"): "prefill_power_w",
}


@dataclass
class RunView:
    """One run's figures, wherever they come from."""
    run_id: int | None
    params: dict[str, Any]
    metrics: pd.DataFrame  # phase, batch_size, name, value, unit
    op_stats: pd.DataFrame = field(default_factory=pd.DataFrame)
    kernel_metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    samples: pd.DataFrame = field(default_factory=pd.DataFrame)  # phase, idx, value (µs)
    env: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def get(self, name: str, phase: str | None = None) -> float | None:
        m = self.metrics
        if m.empty:
            return None
        sel = m[(m["name"] == name) & (m["phase"].isna() if phase is None else m["phase"] == phase)]
        if sel.empty:
            return None
        value = float(sel["value"].iloc[-1])
        return None if math.isnan(value) else value

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        """A checkpoint run's identity (folder, architecture, parameters, dtype, hash); None for a preset run."""
        ckpt = self.params.get("checkpoint")
        return ckpt if isinstance(ckpt, dict) else None

    @property
    def model_name(self) -> str:
        ckpt = self.checkpoint
        if ckpt:
            return f"{Path(str(ckpt.get('folder'))).name} ({ckpt.get('architecture')})"
        return str(self.params.get("preset"))

    @property
    def model_config(self) -> LlamaConfig | None:
        if isinstance(self.params.get("model"), dict):  # a checkpoint's own shape, as the run stored it
            from engine.llm.hf import from_dict

            return from_dict(self.params["model"])
        name = self.params.get("preset")
        if name not in PRESETS:
            return None
        layers = self.params.get("layers")
        return LlamaConfig(**{**PRESETS[name], **({"layers": int(layers)} if layers else {})})


def from_result(params: dict[str, Any], result: RunResult, run_id: int | None = None) -> RunView:
    metrics = pd.DataFrame([m.__dict__ for m in result.metrics],
                           columns=["name", "value", "unit", "phase", "batch_size"])
    samples = pd.DataFrame([{"phase": s.phase, "idx": i, "value": v} for s in result.samples
                            for i, v in enumerate(s.values)], columns=["phase", "idx", "value"])
    return RunView(run_id=run_id, params=dict(params), metrics=metrics, op_stats=pd.DataFrame(result.op_stats),
                   kernel_metrics=pd.DataFrame(result.kernel_metrics), samples=samples, env=dict(result.env),
                   notes=list(result.notes))


def from_store(store: Store, run_id: int) -> RunView:
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in {store.path}")
    if run["kind"] != "llm":
        raise ValueError(f"run {run_id} is a {run['kind']} run, not an LLM run")
    if run["status"] != "ok":
        first = next((line for line in str(run["error"] or "").splitlines() if line.strip()), "no result yet")
        raise ValueError(f"run {run_id} is {run['status']}: {first}")
    params = {k: v for k, v in run["params"].items() if not k.startswith("_")}
    params.setdefault("mode", run["mode"])
    params.setdefault("device", run["device"])
    return RunView(run_id=run_id, params=params, metrics=store.metrics([run_id]), op_stats=store.op_stats([run_id]),
                   kernel_metrics=store.kernel_metrics([run_id]), samples=store.samples([run_id]),
                   env=store.environment(run_id) or {}, notes=run["notes"] or [])


# -- formatting -----------------------------------------------------------------------------------------------------
def fmt_time(us: float | None) -> str:
    if us is None:
        return "—"
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    return f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.1f} µs"


def fmt_num(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "—"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}f} {prefix}{unit}".rstrip()
    return f"{value:.{digits}f} {unit}".rstrip()


def fmt_pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} %"


def peak_key(view: RunView) -> str:
    dtype = str(view.params.get("dtype") or ("bfloat16" if str(view.params.get("device", "")).startswith("cuda")
                                               else "float32"))
    return "matmul_fp32" if dtype in ("float32", "fp32") else "matmul_bf16"


def ceiling_text(view: RunView, which: str) -> str:
    """'the measured bf16 matmul rate (774 TFLOP/s) on NVIDIA H100 80GB HBM3, ceilings run #3' or why none."""
    from engine.measure.ceilings import CEILINGS

    name = peak_key(view) if which == "peak" else "copy_bw"
    value = view.get(f"ceiling_{name}")
    device = view.env.get("device_name") or view.params.get("device", "")
    if value is None:
        return f"no {CEILINGS[name][1]} stored for {device}"
    run = view.get("ceilings_run_id")
    shown = fmt_num(value, "FLOP/s", 0) if name.startswith("matmul") else fmt_num(value, "B/s", 2)
    return (f"the {CEILINGS[name][1]} ({shown}) on {device}"
            + (f", ceilings run #{int(run)}" if run is not None else ""))


def _of(view: RunView, which: str) -> str:
    text = ceiling_text(view, which)
    return text if text.startswith("no ") else f"of {text}"


def what_was_run(view: RunView) -> str:
    p = view.params
    cfg = view.model_config
    shape = (f"d={cfg.dim}, {cfg.layers} layers, {cfg.heads}/{cfg.kv_heads} heads, ffn {cfg.ffn}, vocab {cfg.vocab}"
             if cfg else "unknown shape")
    ckpt = view.checkpoint
    if ckpt:
        shape += (f"; checkpoint {ckpt.get('folder')}, {ckpt.get('architecture')}, "
                  f"{int(ckpt.get('parameters') or 0):,} parameters, stored as {ckpt.get('dtype')}, "
                  f"{ckpt.get('weights')}, hash {ckpt.get('hash')}")
    return (f"{view.model_name} ({shape}), prompt P={p.get('prompt_len')}, N={p.get('new_tokens')} decode steps, "
            f"batch B={p.get('batch')}, mode {p.get('mode')} on {p.get('device')} "
            f"({p.get('dtype') or ('bfloat16' if str(p.get('device', '')).startswith('cuda') else 'float32')}"
            f"{', SDPA ' + p['sdpa'] if p.get('sdpa') else ''}"
            f"{', q/k/v and gate/up fused' if p.get('fuse', True) and not _transformers_module(view) else ''}"
            f"{', max-autotune' if p.get('autotune') else ''})")


def _transformers_module(view: RunView) -> bool:
    """The run took the transformers route: transformers' own module, not the lab's decoder."""
    return (view.checkpoint or {}).get("route") == "transformers"


def bound_sentences(view: RunView) -> list[str]:
    """Which resource bounds each phase, from its arithmetic intensity against the ridge point of the measured roofs,
    and the figure that follows from it: a compute-bound phase is judged by MFU (achieved FLOP/s / the matmul rate),
    a memory-bound one by MBU (bytes it must move / its time / the copy bandwidth), whichever phase it is."""
    peak, bw = view.get(f"ceiling_{peak_key(view)}"), view.get("ceiling_copy_bw")
    out = []
    if not (peak and bw):
        return ["No measured ceilings for this device, so no roofline verdict (run `python -m engine ceilings`)."]
    ridge = peak / bw
    for phase in ("prefill", "decode"):
        ai = view.get("intensity", phase)
        if ai is None:
            continue
        head = f"{phase.capitalize()}: {ai:,.1f} FLOP/byte, {'above' if ai >= ridge else 'below'} the ridge point " \
               f"of {ridge:,.0f} FLOP/byte (measured matmul rate / copy bandwidth)"
        if ai >= ridge:
            flops = view.get("achieved_flops", phase)
            out.append(f"{head}: compute-bound, so judged by MFU (achieved FLOP/s / the matmul rate): "
                       f"{fmt_pct(100 * flops / peak if flops else None)}.")
        else:
            moved = view.get("achieved_bw", phase)
            out.append(f"{head}: memory-bound, so judged by MBU (the bytes it must move / its time / the copy "
                       f"bandwidth): {fmt_pct(100 * moved / bw if moved else None)}.")
    return out


def top_operators(view: RunView, phase: str, k: int = 5) -> pd.DataFrame:
    """The phase's top-k by self time per profiled step: kernels on a GPU, operators on the CPU."""
    ops = view.op_stats
    if ops.empty or "phase" not in ops:
        return pd.DataFrame(columns=["name", "kind", "calls_per_step", "us_per_step", "share"])
    sel = ops[ops["phase"] == phase]
    kinds = ("kernel", "memcpy", "memset") if (sel["device"] != "cpu").any() else ("operator",)
    sel = sel[sel["kind"].isin(kinds)]
    steps = view.get("prof_steps", phase) or 1.0
    total = float(sel["self_us"].sum()) or 1.0
    top = sel.nlargest(k, "self_us")
    return pd.DataFrame({"name": top["name"].values, "kind": top["kind"].values,
                         "calls_per_step": (top["calls"] / steps).values,
                         "us_per_step": (top["self_us"] / steps).values,
                         "share": (100 * top["self_us"] / total).values})


def _md_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)\n"
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines) + "\n"


def _ops_md(view: RunView, phase: str, k: int) -> str:
    from engine.measure.op_stats import short_name

    top = top_operators(view, phase, k)
    if top.empty:
        return "(not profiled)\n"
    shown = pd.DataFrame({"operator / kernel": [f"`{short_name(n, 90)}`" for n in top["name"]],
                          "kind": top["kind"], "calls/step": top["calls_per_step"].map(lambda v: f"{v:.1f}"),
                          "time/step": top["us_per_step"].map(fmt_time),
                          "share": top["share"].map(lambda v: f"{v:.1f} %")})
    return _md_table(shown)


# -- rendering ------------------------------------------------------------------------------------------------------
def render(view: RunView) -> dict[str, str]:
    """The six report files, name → text."""
    p = view.params
    title = f"LLM run{' #' + str(view.run_id) if view.run_id is not None else ''}: {view.model_name} · {p.get('mode')}"
    g = view.get
    tol = g("tolerance")
    rows = [
        ("TTFT (prefill latency, median)", fmt_time(g("ttft_us", "prefill")),
         f"p10 {fmt_time(g('ttft_p10_us', 'prefill'))}, p90 {fmt_time(g('ttft_p90_us', 'prefill'))}"),
        ("TPOT (per decode step, median)", fmt_time(g("tpot_median_us", "decode")),
         f"p90 {fmt_time(g('tpot_p90_us', 'decode'))}"),
        ("Decode throughput", fmt_num(g("tokens_per_s", "decode"), "tokens/s"), "B / TPOT median"),
        ("End-to-end throughput", fmt_num(g("e2e_tokens_per_s"), "tokens/s"), "B·(N+1) / (TTFT + N decode steps)"),
        ("MFU (prefill)", fmt_pct(g("mfu_pct", "prefill")), _of(view, "peak")),
        ("MFU vs datasheet", fmt_pct(g("mfu_datasheet_pct", "prefill")), "of the datasheet dense peak"),
        ("MBU (decode)", fmt_pct(g("mbu_pct", "decode")), _of(view, "bw")),
        ("MBU vs datasheet", fmt_pct(g("mbu_datasheet_pct", "decode")), "of the datasheet memory bandwidth"),
        ("First prefill (compile)", fmt_time(g("first_call_us", "prefill")), "timed on its own"),
        ("First decode step (compile, capture)", fmt_time(g("first_call_us", "decode")), "timed on its own"),
        ("Peak device memory", fmt_num(g("peak_memory_bytes"), "B"), "torch.cuda.max_memory_allocated"),
    ]
    if g("prompts") is not None:
        n = int(g("prompts") or 0)
        for phase, what in (("prefill", "ttft"), ("decode", "tpot")):
            if g(f"prompts_{what}_p50_us", phase) is not None:
                rows.append((f"{what.upper()} across {n} prompts (p50)", fmt_time(g(f"prompts_{what}_p50_us", phase)),
                             f"p90 {fmt_time(g(f'prompts_{what}_p90_us', phase))}, "
                             f"p99 {fmt_time(g(f'prompts_{what}_p99_us', phase))}; per prompt: prompts.csv"))
    rows.insert(4, ("Bytes per decode step", fmt_num(g("bytes", "decode"), "B", 2), _bytes_note(view)))
    head = pd.DataFrame(rows, columns=["figure", "value", "note"])
    eager_err = g("eager_fp32_rel_err")
    check = (f"Logits vs eager: relative L2 error {g('max_rel_err', 'prefill') or 0:.2g} at prefill, "
             f"{(g('max_rel_err', 'decode') or 0):.2g} at most over the checked decode steps (tolerance "
             f"{f'{tol:.3g}' if tol is not None else '—'}"
             + (f" = 4 × eager's own distance from float32, {eager_err:.2g}" if eager_err is not None else "")
             + f"); {int(g('tokens_matched') or 0)} greedy token position(s) equal to eager's."
             + ("" if g("cache_vs_recompute_rel_err") is None else  # the transformers route does not take it
                f" Static cache vs a full recompute: {g('cache_vs_recompute_rel_err'):.2g}."))
    if quant_scheme(view.params.get("mode")):  # gated by top-1 and KL, not by the logits tolerance
        check = f"{gate_text(g)} (engine/llm/quant.py: the accuracy gate of weight-only quantized modes)."
    if g("hf_reference_rel_err") is not None:
        check += (f" Eager vs transformers' own float32 forward of the checkpoint: {g('hf_reference_rel_err'):.2g} "
                  f"relative L2; greedy tokens equal to its argmax at {int(g('hf_reference_tokens_matched') or 0)} "
                  "position(s).")
    report = [f"# {title}", "", f"**What was run.** {what_was_run(view)}.", "",
              f"Device: {view.env.get('device_name', '—')} · torch {view.env.get('torch', '—')} · "
              f"git {view.env.get('git_commit') or '—'}", "", "## Headline figures", "", _md_table(head),
              "## Correctness", "", check, "", "## Where the time goes", ""]
    report += ["**Top operators, prefill** (per profiled prefill)", "", _ops_md(view, "prefill", 5),
               "**Top operators, decode** (per profiled step)", "", _ops_md(view, "decode", 5)]
    report += ["## Bound", "", *(f"- {s}" for s in bound_sentences(view)), ""]
    if view.notes:
        report += ["## Notes", "", *(f"- {n}" for n in view.notes), ""]
    report += ["Formulas and the peaks used: assumptions.md. Every operator: operators.md.", ""]

    ops = [f"# Operators: {title}", "",
           "Self time per profiled step (torch.profiler; prefill and decode profiled apart, each inside its NVTX "
           "range). On a GPU: device kernels and copies; on the CPU: host operators.", ""]
    for phase in ("prefill", "decode"):
        ops += [f"## {phase.capitalize()}", "", _ops_md(view, phase, 25)]
    km = view.kernel_metrics
    if not km.empty:
        ops += ["## Nsight Compute (top decode kernels)", "",
                _md_table(km[["kernel", "launches", "duration_us", "mem_throughput_pct", "sm_throughput_pct"]]
                          .assign(kernel=lambda f: f["kernel"].map(lambda n: f"`{str(n)[:90]}`"))
                          .round(2))]

    metrics_json = json.dumps([{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                for k, v in row.items() if k != "run_id"}
                               for row in view.metrics.to_dict("records")], indent=1, default=str)
    cfg = view.model_config
    inputs = {"run_id": view.run_id, "params": p,
              "model": cfg.__dict__ if cfg else None,
              "parameters": g("params"), "weight_bytes": g("weight_bytes"), "kv_cache_bytes": g("kv_cache_bytes")}
    return {"report.md": "\n".join(report), "operators.md": "\n".join(ops), "metrics.json": metrics_json,
            "env.json": json.dumps(view.env, indent=1, default=str), "inputs.json": json.dumps(inputs, indent=1,
                                                                                           default=str),
            "assumptions.md": assumptions(view)}


TIED = (", LM head tied to the embedding table (stored once: the parameter count counts it once; a decode step still "
        "reads its d·V once, as the LM head)")


def assumptions(view: RunView) -> str:
    p, g, cfg = view.params, view.get, view.model_config
    lines = ["# Assumptions: formulas and peaks", "", "## FLOP and byte formulas (engine/llm/metrics.py)", "",
             "```", (M.__doc__ or "").strip(), "```", ""]
    if cfg is not None:
        B, P, N = int(p.get("batch", 1)), int(p.get("prompt_len", 1)), int(p.get("new_tokens", 1))
        elem = 4 if peak_key(view) == "matmul_fp32" else 2
        dec = M.decode_counts(cfg, B, P, N, elem)
        scheme = quant_scheme(p.get("mode"))
        lines += ["## This run's numbers", "",
                  f"- B={B}, P={P}, N={N}, d={cfg.dim}, L={cfg.layers}, H={cfg.heads}, G={cfg.kv_heads}, "
                  f"h={cfg.head_dim}, f={cfg.ffn}, V={cfg.vocab}, s={elem} bytes",
                  f"- prefill: {M.prefill_flops(cfg, B, P):,} FLOPs (matmuls "
                  f"{B * P * M.matmul_flops_per_token(cfg):,}, "
                  f"attention {M.prefill_attention_flops(cfg, B, P):,}, LM head {M.lm_head_flops(cfg, B):,}); "
                  f"{M.prefill_bytes(cfg, B, P, elem):,} bytes",
                  f"- decode, mean over the N steps: {dec.flops:,.0f} FLOPs and {dec.bytes:,.0f} bytes per step "
                  f"(weights {M.weight_bytes(cfg, B, elem):,} + K/V read "
                  f"{dec.bytes - M.weight_bytes(cfg, B, elem):,.0f})",
                  ""]
        if scheme:
            from engine.llm.quant import decode_counts as quant_decode_counts

            moved = quant_decode_counts(cfg, scheme, B, P, N, elem).bytes
            lines[-1:-1] = [
                f"- {scheme}: the decode step moves {moved:,.0f} bytes per step on average, {dec.bytes / moved:.2f}× "
                "fewer than the line above (the quantized linears' codes and scales, the LM head's too; the "
                "embedding rows, norms and K/V in the model's dtype: engine.llm.quant.decode_bytes_per_token); its "
                "MBU counts these"]
        if view.checkpoint:
            lines[-1:-1] = [
                f"- the shapes above are the loaded checkpoint's own ({view.model_name}: h={cfg.head_dim}"
                f"{', q/k/v biases' if cfg.qkv_bias else ''}{', o bias' if cfg.o_bias else ''}"
                f"{', q/k RMSNorm per head' if cfg.qk_norm else ''}"
                f"{TIED if cfg.tie_embeddings else ''}"
                f"); biases and q/k norm weights are counted in the parameters, left out of the FLOPs and bytes "
                "(O(d) per layer against O(d²))"]
    lines += ["## Peaks", "",
              f"- MFU divides by {ceiling_text(view, 'peak')}.",
              f"- MBU divides by {ceiling_text(view, 'bw')} (bytes read + written by a large device-to-device copy).",
              "- The `*_datasheet_pct` figures divide by the vendor's dense datasheet peak for the device "
              "(engine/measure/ceilings.py DATASHEETS), named as such; the measured ceilings come first.", "",
              "## Timing and correctness", "",
              "- TTFT: median of the timed prefills (CUDA events around each; perf_counter on CPU), the greedy "
              "first token included. TPOT: per decode step, one event between consecutive steps, no host sync "
              "inside the loop; every step of every timed pass is a sample.",
              f"- Logits of every mode are compared with eager's by relative L2 error (tolerance "
              f"{g('tolerance') if g('tolerance') is not None else '—'}: bf16 5e-2, fp32 1e-4; why in "
              "engine/llm/verify.py TOLERANCE) and the greedy tokens must match (a flip between candidates closer than "
              "twice the measured logit difference is a tie, noted, not a failure).",
              ("- Weights: the checkpoint's own, checked against transformers' forward of it before timing."
               if (view.checkpoint or {}).get("weights") == "safetensors" else
               "- Random weights from a fixed seed: the figures depend on shapes only, not on what the weights say."),
              ""]
    return "\n".join(lines)


def write_reports(cfg: LLMConfig, result: RunResult, out_dir: Path, run_id: int | None = None) -> list[Artifact]:
    """Render from a fresh RunResult into out_dir; the artifacts to record with the run."""
    files = render(from_result(params_of(cfg), result, run_id))
    return write_files(files, out_dir)


def write_files(files: dict[str, str], out_dir: Path) -> list[Artifact]:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        out.append(Artifact(kind="report", name=name, path=str(path)))
    return out


def report_files(store: Store, run_id: int, out_dir: Path | None = None) -> dict[str, Path]:
    """The run's report files: the ones it wrote, or (missing, or out_dir given) rebuilt from the store."""
    arts = store.artifacts(run_id)
    found = {} if arts.empty else {str(r.name): Path(r.path) for r in arts.itertuples() if r.kind == "report"}
    if out_dir is None and found and all(found.get(n) and found[n].exists() for n in REPORT_FILES):
        return {n: found[n] for n in REPORT_FILES}
    view = from_store(store, run_id)
    recorded = next(iter(found.values())).parent if found else None
    if out_dir is None:  # beside the files it recorded, or (a store copied from another machine) under ours
        from engine.runner.jobs import artifacts_root

        out_dir = recorded if recorded is not None and recorded.exists() else artifacts_root(store) / f"run_{run_id}"
    target = out_dir
    written = write_files(render(view), target)
    return {a.name: Path(a.path) for a in written}


def quant_scheme(mode: str | None) -> str | None:
    """The weight-only scheme of a mode ("int8-wo" for both int8-wo and triton-int8-wo); None if unquantized."""
    found = MODES.get(str(mode)) if mode is not None else None
    return found.quant if found is not None else None


def gate_text(g: Any, short: bool = False) -> str:
    """A quantized run's accuracy gate in words, from its metrics (`g(name)`: RunView.get or a row lookup)."""
    top1, kl = g("quant_top1_agreement"), g("quant_mean_kl_nats")
    if top1 is None or kl is None:
        return "accuracy gate: not recorded"
    low, high = g("quant_gate_min_top1"), g("quant_gate_max_kl")
    top1_text = f"top-1 {top1:.2f}" if short else f"greedy top-1 agreement with the unquantized model {top1:.2f}"
    kl_text = f"KL {kl:.2g}" if short else f"mean KL of the next-token distribution {kl:.2g} nats"
    return (("" if short else "accuracy gate: ") + top1_text + (f" (≥ {low:g})" if low is not None else "")
            + f", {kl_text}" + (f" (≤ {high:g})" if high is not None else ""))


def _bytes_note(view: RunView) -> str:
    """What the decode step's byte count holds, and the gain where the run is quantized."""
    per_step, unquantized = view.get("bytes", "decode"), view.get("bytes_unquantized", "decode")
    scheme = quant_scheme(view.params.get("mode"))
    if scheme and per_step and unquantized:
        return (f"{scheme}: codes + scales, K/V and the rest in the model's dtype; {unquantized / per_step:.2f}× "
                f"fewer than unquantized ({fmt_num(unquantized, 'B', 2)})")
    return "weights + K/V read, mean over the decode steps (MBU's numerator)"


QUANT_COLUMNS = {"quant_top1_agreement": "quant_top1", "quant_mean_kl_nats": "quant_kl",
                 "quant_gate_min_top1": "gate_min_top1", "quant_gate_max_kl": "gate_max_kl"}  # metric → column


def _cell(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _dtype(row: Mapping[str, Any]) -> str:
    """The run's dtype: its own, or the default it ran in (LLMConfig.torch_dtype: bf16 on CUDA, fp32 elsewhere)."""
    if row.get("dtype"):
        return str(row["dtype"])
    return "bfloat16" if str(row.get("device") or "").startswith("cuda") else "float32"


def timing_text(conditions: Any) -> str:
    """A run's timing state in a table cell: 'clean', 'interfered: <its first flag> (+N)', '—' where never judged."""
    state, flags = run_state(conditions)
    if not state:
        return "—"
    return state + (f": {flags[0]}" + (f" (+{len(flags) - 1})" if len(flags) > 1 else "") if flags else "")


def modes_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a group (llm_runs rows with the headline figures), as text: its weights, TTFT (a quantized
    prefill dequantizes each weight, then F.linear), TPOT, bytes per generated token and how many times fewer than
    the unquantized step, MBU, the lab's quantized GEMV against the plain dequantize-then-matmul way of the same
    scheme (same group), the check it passed (the logits tolerance, or a quantized mode's own accuracy gate) and how
    long quantizing took (or loading the codes from the quantization cache), the energy per generated token (the
    whole board's, where the device reads it) and its timing's noise state (a flagged run is no headline:
    engine.measure.noise)."""
    if runs.empty:
        return pd.DataFrame(columns=["run", "mode", "weights", "TTFT", "TPOT", "J/token", "bytes / token",
                                     "vs unquantized", "MBU", "vs plain", "accuracy", "quantized in", "timing"])
    rows = runs.to_dict("records")
    tpot = {(r["mode"], r.get("batch"), r.get("prompt_len")): _cell(r, "tpot_median_us") for r in rows}
    unquantized = {(r.get("batch"), r.get("prompt_len")): _cell(r, "decode_bytes") for r in rows
                   if not quant_scheme(r["mode"]) and _cell(r, "decode_bytes")}
    out = []
    for r in rows:
        scheme, mode = quant_scheme(r["mode"]), str(r["mode"])
        per_step, batch = _cell(r, "decode_bytes"), int(r.get("batch") or 1)
        full = _cell(r, "decode_bytes_unquantized") or unquantized.get((r.get("batch"), r.get("prompt_len")))
        vs_plain = "—"
        if scheme and mode != scheme and _cell(r, "tpot_median_us"):
            plain = tpot.get((scheme, r.get("batch"), r.get("prompt_len")))
            if plain:
                vs_plain = f"{plain / _cell(r, 'tpot_median_us'):.2f}× faster than {scheme}"
        if scheme:
            accuracy = gate_text(lambda name, r=r: _cell(r, QUANT_COLUMNS[name]), short=True)
        elif mode == "eager":
            accuracy = "the reference"
        else:
            errs = [e for e in (_cell(r, "prefill_rel_err"), _cell(r, "decode_rel_err")) if e is not None]
            tol = _cell(r, "tolerance")
            accuracy = (f"logits rel. error {max(errs):.2g}" + (f" (≤ {tol:.2g})" if tol is not None else "")
                        if errs else "—")
        out.append({
            "run": f"#{int(r['id'])}", "mode": mode,
            "weights": f"{scheme} ({'lab GEMV' if mode != scheme else 'plain'})" if scheme else _dtype(r),
            "TTFT": fmt_time(_cell(r, "ttft_us")), "TPOT": fmt_time(_cell(r, "tpot_median_us")),
            "J/token": fmt_joules(_cell(r, "j_per_token")),
            "bytes / token": fmt_num(per_step / batch, "B", 2) if per_step else "—",
            "vs unquantized": f"{full / per_step:.2f}× fewer" if scheme and full and per_step else
            ("1×" if per_step and not scheme else "—"),
            "MBU": fmt_pct(_cell(r, "mbu_pct")), "vs plain": vs_plain, "accuracy": accuracy,
            "quantized in": f"{_cell(r, 'quantize_s'):.2f} s" if _cell(r, "quantize_s") is not None else "—",
            "timing": timing_text(r.get("conditions"))})
    return pd.DataFrame(out)


# -- queries for the page and the CLI -------------------------------------------------------------------------------
def llm_runs(store: Store, status: str | None = "ok", limit: int = 500) -> pd.DataFrame:
    """LLM runs, newest first, with their parameters spread into columns and the headline figures."""
    runs = store.runs(kind="llm", status=[status] if status else None, limit=limit)
    if runs.empty:
        return runs
    params = [json.loads(p) if isinstance(p, str) and p else {} for p in runs["params"]]
    for key in ("preset", "prompt_len", "new_tokens", "batch", "dtype", "sdpa", "sweep"):
        runs[key] = [q.get(key) for q in params]
    # a checkpoint run: its folder name, architecture and hash (runs of one checkpoint share it); None for presets
    runs["checkpoint"] = [f"{Path(str(c.get('folder'))).name} ({c.get('architecture')}, {c.get('hash')})"
                          if isinstance(c := q.get("checkpoint"), dict) else None for q in params]
    # the route the run took: native (the lab's decoder) or transformers (its own module); None for presets
    runs["route"] = [c.get("route") if isinstance(c := q.get("checkpoint"), dict) else None for q in params]
    ok = runs[runs["status"] == "ok"]
    if not ok.empty:
        figures = headline(store, [int(i) for i in ok["id"]])
        runs = runs.merge(figures, left_on="id", right_index=True, how="left")
    return runs


def headline(store: Store, run_ids: list[int]) -> pd.DataFrame:
    """run_id-indexed headline figures (the HEADLINE columns) of these runs."""
    cols = list(dict.fromkeys(HEADLINE.values()))
    if not run_ids:
        return pd.DataFrame(columns=cols)
    m = store.metrics(run_ids)
    if m.empty:
        return pd.DataFrame(index=pd.Index(run_ids, name="run_id"), columns=cols)
    rows: dict[int, dict[str, float]] = {int(r): {} for r in run_ids}
    for r in m.itertuples():
        phase = None if r.phase is None or (isinstance(r.phase, float) and math.isnan(r.phase)) else r.phase
        col = HEADLINE.get((phase, r.name))
        if col:
            rows[int(r.run_id)][col] = float(r.value)
    return pd.DataFrame.from_dict(rows, orient="index").reindex(columns=cols)


ENERGY_PHASES = {  # phase -> (latency column, energy column, the energy's unit)
    "decode": ("tpot_median_us", "j_per_token", "J/token"),
    "prefill": ("ttft_us", "j_per_prefill", "J/prefill"),
}


SAME_SETUP = ("preset", "checkpoint", "device", "dtype", "batch", "prompt_len", "new_tokens")


def same_setup(runs: pd.DataFrame, row: dict[str, Any]) -> pd.DataFrame:
    """The runs (llm_runs rows) of the same model, device, dtype, B, P and N as `row`: the modes one may set side
    by side (their newest run each)."""
    if runs.empty:
        return runs
    keep = pd.Series(True, index=runs.index)
    for key in SAME_SETUP:
        if key in runs:
            want = row.get(key)
            keep &= runs[key].isna() if want is None or (isinstance(want, float) and math.isnan(want)) else \
                runs[key] == want
    return runs[keep].sort_values("id", ascending=False).drop_duplicates("mode")


def energy_points(runs: pd.DataFrame, phase: str) -> pd.DataFrame:
    """One point per run (llm_runs rows) that measured energy in `phase`: its latency (TPOT or TTFT, µs), its joules
    per token or per prefill, and whether it is on the Pareto front (no other run both faster and cheaper)."""
    from engine.store.report import pareto_front

    latency, joules, _ = ENERGY_PHASES[phase]
    columns = ["run_id", "mode", "batch", "prompt_len", "latency_us", "joules", "pareto"]
    if runs.empty or joules not in runs or latency not in runs:
        return pd.DataFrame(columns=columns)
    sel = runs[runs[joules].notna() & runs[latency].notna()]
    points = pd.DataFrame({"run_id": sel["id"].astype(int), "mode": sel["mode"], "batch": sel["batch"],
                           "prompt_len": sel["prompt_len"], "latency_us": sel[latency].astype(float),
                           "joules": sel[joules].astype(float)})
    points["pareto"] = pareto_front(points, "latency_us", "joules")
    return points.reset_index(drop=True)[columns]


def roofline_points(store: Store, run_ids: list[int]) -> pd.DataFrame:
    """One point per (run, phase): arithmetic intensity (FLOP/B) and achieved FLOP/s, with B and P to label it."""
    runs = llm_runs(store, status="ok", limit=100000)
    runs = runs[runs["id"].isin(run_ids)] if not runs.empty else runs
    out = []
    for r in runs.itertuples():
        for phase in ("prefill", "decode"):
            ai, fl = getattr(r, f"{phase}_intensity", None), getattr(r, f"{phase}_flops_per_s", None)
            if ai is None or fl is None or (isinstance(ai, float) and math.isnan(ai)):
                continue
            out.append({"run_id": int(r.id), "phase": phase, "mode": r.mode, "batch": r.batch,
                        "prompt_len": r.prompt_len, "intensity": float(ai), "flops_per_s": float(fl)})
    return pd.DataFrame(out, columns=["run_id", "phase", "mode", "batch", "prompt_len", "intensity", "flops_per_s"])


# -- what the native route buys -------------------------------------------------------------------------------------
# A native checkpoint (Llama, Mistral, Qwen) run in the lab's modes and, in the same group, as transformers' own
# module (transformers-*): the headline figure is the ratio of their decode TPOTs. Runs compare only within one
# configuration: the same checkpoint, device, dtype, B, P and N.
SAME_RUN = ("checkpoint", "device", "dtype", "batch", "prompt_len", "new_tokens")


@dataclass(frozen=True)
class NativeVsTransformers:
    """The fastest native mode of a checkpoint against transformers' own module of it, by median decode TPOT."""
    native_mode: str
    native_tpot_us: float
    transformers_mode: str  # as stored: transformers-compile-cudagraph (eager … on a transformers-route folder)
    transformers_tpot_us: float
    graphed: bool  # the transformers side is its compile-cudagraph; False: its fastest mode in the group
    native_run: int | None = None
    transformers_run: int | None = None

    @property
    def ratio(self) -> float:
        """How many times faster the native route decodes (above 1: faster)."""
        return self.transformers_tpot_us / self.native_tpot_us

    def line(self) -> str:
        which = "" if self.graphed else (" (no transformers-compile-cudagraph run beside it: transformers' fastest "
                                         "mode in the group)")
        return (f"what the native route buys: {self.native_mode} TPOT {fmt_time(self.native_tpot_us)} vs "
                f"transformers' {route_mode(self.transformers_mode)} {fmt_time(self.transformers_tpot_us)}: "
                f"{self.ratio:.2f}×{which}")


def _plain(value: Any) -> Any:
    """NaN and pandas' missing values as None (so rows of one configuration group together)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA else value


def native_vs_transformers(rows: pd.DataFrame | Iterable[Mapping[str, Any]]) -> list[NativeVsTransformers]:
    """What the native route buys, one per configuration (SAME_RUN) in `rows` that has both sides: the fastest
    native mode by median decode TPOT among the runs that passed their checks (status ok; a failed check fails its
    run), against transformers' compile-cudagraph of the same checkpoint — its fastest transformers-route mode where
    there is none. Rows carry llm_runs' columns: id, mode, status, route, tpot_median_us and SAME_RUN's; a row
    without a route is native unless its mode is a transformers-* one. Empty where either side is missing."""
    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else [dict(r) for r in rows]
    sides: dict[tuple, dict[str, list[tuple[float, dict[str, Any]]]]] = {}
    for r in records:
        tpot = _plain(r.get("tpot_median_us"))
        if tpot is None or (_plain(r.get("status")) or "ok") != "ok":  # failed, or no decode measured
            continue
        route = _plain(r.get("route")) or ("transformers" if r.get("mode") in TRANSFORMERS_MODES else "native")
        key = tuple(_plain(r.get(k)) for k in SAME_RUN)
        sides.setdefault(key, {"native": [], "transformers": []}).setdefault(route, []).append((float(tpot), r))
    out = []
    for side in sides.values():
        if not side["native"] or not side["transformers"]:
            continue
        n_tpot, n = min(side["native"], key=lambda tr: tr[0])
        graphed = [tr for tr in side["transformers"] if route_mode(str(tr[1].get("mode"))) == "compile-cudagraph"]
        t_tpot, t = min(graphed or side["transformers"], key=lambda tr: tr[0])
        out.append(NativeVsTransformers(str(n.get("mode")), n_tpot, str(t.get("mode")), t_tpot, bool(graphed),
                                        _run_id(n), _run_id(t)))
    return out


def _run_id(row: Mapping[str, Any]) -> int | None:
    value = _plain(row.get("id"))
    return None if value is None else int(value)


def latest_native_vs_transformers(runs: pd.DataFrame, checkpoint: str) -> list[NativeVsTransformers]:
    """The headline of the newest group of `checkpoint`'s runs (llm_runs' checkpoint label) that has both sides
    (the LLM page shows it); empty where no group has."""
    if runs.empty or "group_id" not in runs:
        return []
    mine = runs[(runs["checkpoint"] == checkpoint) & runs["group_id"].notna()]
    newest_first = sorted(mine.groupby("group_id"), key=lambda gf: -int(gf[1]["id"].max()))
    for _, frame in newest_first:
        found = native_vs_transformers(frame)
        if found:
            return found
    return []
