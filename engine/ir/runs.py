"""IR extractions and verifications as runs in the results store.

An extraction is a run (kind "ir", mode "export", device "meta") whose artifacts are the IR JSON and its mermaid
graph, under artifacts_root/run_<id>/. It runs in the calling process: on the meta device it allocates no weights
(a 7B-shaped model peaks well under 1 GB), takes seconds, and every failure is a Python exception that fails the
run — nothing a worker process would protect the dashboard from. Verification materialises real weights, so it is a
job (mode "verify", device "cpu") that engine.runner.jobs runs in a worker process; an OOM kill ends the worker only.

User models (engine.workloads.user_model, `--model pkg.module:factory`) are extractions too, with the import path
in the run's params; the dashboard extracts them in a worker (`extract_job`), so it never imports user code, and
verification rebuilds them in the worker from the same params.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine.ir.errors import IRError, WeightLoadError
from engine.ir.graph import IR
from engine.runner.jobs import JobSpec, artifacts_root
from engine.runner.kinds import RunKind, register
from engine.store.db import Artifact, Metric, RunResult, Store

KIND = "ir"
VERIFY_TARGET = "engine.ir.verify:verify_job"
EXTRACT_TARGET = "engine.ir.runs:extract_job"
# The `ir` run kind: each run names its target (an extraction in a worker, or a verification), holding the device
# from start to end.
register(RunKind(KIND, None))


@dataclass
class Extraction:
    run_id: int
    ir: IR
    ir_path: Path
    mermaid_path: Path
    metrics: dict[str, float]


def _extract_to(folder: Path, model: Any, inputs: tuple, model_name: str) -> tuple[IR, list[Artifact], dict]:
    """Export (meta), convert, save the JSON and the mermaid graphs under `folder`; (IR, artifacts, metrics)."""
    from engine.ir.export import convert, export_meta
    from engine.ir.mermaid import default_view, to_mermaid
    from engine.ir.serialize import save_ir

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ep = export_meta(model, inputs)
    t1 = time.perf_counter()
    ir = convert(ep, model_name)
    t2 = time.perf_counter()
    ir_path = folder / "ir.json"
    json_bytes = save_ir(ir, ir_path)
    t3 = time.perf_counter()
    depth = default_view(ir)
    graph = to_mermaid(ir, depth=depth)
    mmd_path = folder / "graph.mmd"
    mmd_path.write_text(graph.text)
    artifacts = [Artifact("ir_json", "ir.json", str(ir_path)), Artifact("mermaid", "graph.mmd", str(mmd_path))]
    if depth is not None:  # the default view is collapsed: keep every op too, for offline tools
        full = folder / "graph_full.mmd"
        full.write_text(to_mermaid(ir).text)
        artifacts.append(Artifact("mermaid", "graph_full.mmd", str(full)))
    metrics = {"nodes": len(ir.nodes), "export_s": t1 - t0, "convert_s": t2 - t1, "json_s": t3 - t2,
               "json_bytes": json_bytes, "parameters": ir.parameter_count(), "op_types": len(ir.op_histogram()),
               "weights": len(ir.weights)}
    return ir, artifacts, metrics


def _result(ir: IR, artifacts: list[Artifact], metrics: dict, notes: list[str] = ()) -> RunResult:
    from engine.store.envinfo import capture_env

    units = {"export_s": "s", "convert_s": "s", "json_s": "s", "json_bytes": "B"}
    return RunResult(metrics=[Metric(k, float(v), units.get(k, "")) for k, v in metrics.items()], artifacts=artifacts,
                     env=capture_env("cpu"), notes=[ir.summary(), *notes])


def user_model_on_meta(spec: Any) -> tuple[Any, tuple, int]:
    """(the user model built on meta in eval mode, meta example inputs, their batch size) from a ModelSpec."""
    from engine.workloads.user_model import build_inputs, build_model, default_batches, resolve

    res = resolve(spec)
    batch = default_batches(res)[2]
    return build_model(res, "meta").eval(), build_inputs(res, batch, "meta"), batch


def extract_run(store: Store, workload: str | None = None, preset: str | None = None, *,
                spec: Any = None) -> Extraction:
    """Build the model on meta — a zoo model, or the user model of `spec` (engine.workloads.user_model.ModelSpec) —
    export, convert and save it, recorded as a run. On failure the run is marked failed with the reason, and the
    exception is raised again. A user model is imported into this process: the dashboard uses `extract_job`."""
    from engine.ir import zoo

    if spec is None:
        preset = preset or zoo.get_zoo(workload).default_preset
        zoo.preset_config(workload, preset)  # an unknown name or preset fails before a run is created
        params = {"workload": workload, "preset": preset, "config": zoo.describe(workload, preset)}
        name = workload
    else:
        from engine.workloads.user_model import resolve

        resolve(spec)  # a bad spec fails before a run is created
        name = spec.name
        params = {"workload": name, **spec.params()}
    store.init()
    run_id = store.create_run(KIND, name, "export", "meta", params)
    store.start_run(run_id, "exporting on meta")
    try:
        folder = artifacts_root(store) / f"run_{run_id}"
        if spec is None:
            model, inputs = zoo.build(workload, preset, device="meta")
            model_name = f"{workload}/{preset}"
        else:
            model, inputs, batch = user_model_on_meta(spec)
            model_name = spec.model
            store.update_progress(run_id, 0.1, f"exporting on meta (batch {batch})")
        ir, artifacts, metrics = _extract_to(folder, model, inputs, model_name)
        store.record_result(run_id, _result(ir, artifacts, metrics))
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, (IRError, ValueError)):
            reason += "\n--- traceback ---\n" + "".join(traceback.format_exception(exc)[-6:])
        store.fail_run(run_id, reason)
        raise
    return Extraction(run_id, ir, folder / "ir.json", folder / "graph.mmd", metrics)


def extract_job(params: dict[str, Any], progress: Callable[[float, str], None]) -> RunResult:
    """Worker entry point: extract a user model's IR (the dashboard never imports user code itself)."""
    from engine.workloads.user_model import ModelSpec

    spec = ModelSpec.from_params(params)
    if spec is None:
        raise ValueError("the extraction job has no 'model' parameter")
    progress(0.05, f"importing {spec.model}")
    model, inputs, batch = user_model_on_meta(spec)
    progress(0.2, f"exporting on meta (batch {batch})")
    ir, artifacts, metrics = _extract_to(Path(params["artifacts_dir"]), model, inputs, spec.model)
    progress(0.95, ir.summary()[:200])
    return _result(ir, artifacts, metrics)


def extract_spec(spec: Any, timeout_s: float = 900) -> JobSpec:
    """The job that extracts a user model's IR in a worker process."""
    return JobSpec(KIND, spec.name, "export", "meta", {"workload": spec.name, **spec.params()},
                   target=EXTRACT_TARGET, timeout_s=timeout_s)


def extraction_of(store: Store, run_id: int) -> Extraction:
    """A finished extraction run read back from the store: its IR, files and metrics."""
    from engine.ir.serialize import load_ir

    arts = store.artifacts(run_id)
    path = {row.name: Path(row.path) for row in arts.itertuples()}
    metrics = {row.name: float(row.value) for row in store.metrics([run_id]).itertuples()}
    return Extraction(run_id, load_ir(path["ir.json"]), path["ir.json"], path["graph.mmd"], metrics)


def ir_bytes(ir: IR) -> int:
    """Bytes of real parameters and buffers the IR's model needs."""
    import torch

    return sum(t.numel * torch.empty((), dtype=getattr(torch, t.dtype)).element_size() for t in ir.weights.values())


def verify_refusal(store: Store, ir_run_id: int) -> str | None:
    """Why an extraction cannot be verified (too large, gone from the zoo…), or None."""
    try:
        verify_spec(store, ir_run_id)
    except (WeightLoadError, ValueError) as exc:
        return str(exc)
    return None


def verify_spec(store: Store, ir_run_id: int, *, seed: int = 0, rtol: float = 1e-4, atol: float = 1e-4,
                timeout_s: float = 900) -> JobSpec:
    """The job that verifies an extraction run's IR; WeightLoadError if its model is too large to materialise."""
    from engine.ir import zoo

    run = store.run(ir_run_id)
    if run is None or run["kind"] != KIND or run["mode"] != "export":
        raise ValueError(f"run {ir_run_id} is not an IR extraction")
    if run["status"] != "ok":
        raise ValueError(f"run {ir_run_id} did not produce an IR (status {run['status']})")
    path = ir_json_path(store, ir_run_id)
    if path is None:
        raise ValueError(f"run {ir_run_id} has no ir.json artifact")
    workload, preset = run["workload"], run["params"].get("preset")
    params = {"ir_run_id": int(ir_run_id), "ir_path": str(path), "workload": workload, "preset": preset, "seed": seed,
              "rtol": rtol, "atol": atol}
    if run["params"].get("model"):  # a user model: rebuilt in the worker from its import path
        from engine.ir.serialize import load_ir

        try:
            nbytes = ir_bytes(load_ir(path))
        except IRError as exc:
            raise ValueError(f"run {ir_run_id}'s IR cannot be read: {exc}") from exc
        if nbytes > zoo.MAX_VERIFY_BYTES:
            limit = zoo.MAX_VERIFY_BYTES / 2**30
            raise WeightLoadError(f"{run['params']['model']} has {nbytes / 2**30:.1f} GiB of real weights; "
                                  f"verification materialises them and is limited to {limit:.1f} GiB "
                                  "(MODELAB_IR_VERIFY_MAX_BYTES)")
        params.update({k: run["params"].get(k) for k in ("model", "inputs", "model_path")})
    else:
        zoo.check_verify_size(workload, preset)
    return JobSpec(KIND, workload, "verify", "cpu", params, target=VERIFY_TARGET, timeout_s=timeout_s)


# -- queries ------------------------------------------------------------------------------------------------------
def ir_json_path(store: Store, run_id: int) -> Path | None:
    frame = store.query("SELECT path FROM artifacts WHERE run_id = ? AND kind = 'ir_json' LIMIT 1", [int(run_id)])
    return None if frame.empty else Path(frame["path"].iloc[0])


def extractions(store: Store, limit: int = 100, status: str | None = "ok") -> pd.DataFrame:
    """IR extraction runs, newest first, with their headline metrics as columns."""
    where = "r.kind = ? AND r.mode = 'export'" + (" AND r.status = ?" if status else "")
    args: list[Any] = [KIND] + ([status] if status else [])
    return store.query(f"""
        SELECT r.id AS run_id, r.workload, json_extract_string(r.params, '$.preset') AS preset,
               json_extract_string(r.params, '$.model') AS model, r.status,
               r.created_at, r.finished_at, r.error,
               max(CASE WHEN m.name = 'nodes' THEN m.value END) AS nodes,
               max(CASE WHEN m.name = 'parameters' THEN m.value END) AS parameters,
               max(CASE WHEN m.name = 'export_s' THEN m.value END) AS export_s,
               max(CASE WHEN m.name = 'convert_s' THEN m.value END) AS convert_s,
               max(CASE WHEN m.name = 'json_bytes' THEN m.value END) AS json_bytes
        FROM runs r LEFT JOIN metrics m ON m.run_id = r.id
        WHERE {where}
        GROUP BY ALL ORDER BY r.id DESC LIMIT {int(limit)}
    """, args)


def verifications(store: Store, ir_run_id: int, limit: int = 20) -> pd.DataFrame:
    """Verification runs of one extraction, newest first, with their verdict and errors."""
    return store.query(f"""
        SELECT r.id AS run_id, r.status, r.error, r.message, r.progress, r.finished_at, r.notes,
               max(CASE WHEN m.name = 'verify_ok' THEN m.value END) AS verify_ok,
               max(CASE WHEN m.name = 'max_abs_err' THEN m.value END) AS max_abs_err,
               max(CASE WHEN m.name = 'max_rel_err' THEN m.value END) AS max_rel_err,
               max(a.path) AS report_path
        FROM runs r LEFT JOIN metrics m ON m.run_id = r.id
             LEFT JOIN artifacts a ON a.run_id = r.id AND a.kind = 'verify_report'
        WHERE r.kind = ? AND r.mode = 'verify' AND json_extract(r.params, '$.ir_run_id')::BIGINT = ?
        GROUP BY ALL ORDER BY r.id DESC LIMIT {int(limit)}
    """, [KIND, int(ir_run_id)])
