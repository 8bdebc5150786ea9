"""Launching tensor-parallel LLM runs: torchrun (torch.distributed.run) in a subprocess, one rank per GPU (NCCL) or
several CPU processes (gloo), and the scaling figures across world sizes.

    run_tensor_parallel(cfg, world_size, device, workdir)   one run; rank 0's result dict (engine.llm.tp_rank)
    run_scaling(cfg, world_sizes, device, workdir)          one run per world size (1 first: the baseline)
    scaling_rows(results) / format_scaling(rows)            TTFT, TPOT, all-reduce time, speedup, efficiency
    tp_result(cfg, world_size, progress)                    the job runner's view: a RunResult for the store

Scaling efficiency is speedup / N with speedup = TPOT(1) / TPOT(N): 1.0 is perfect; decode at small batch is
bound by reading the weights, so splitting them over N devices is the ideal and the all-reduces (two per layer,
latency-bound at B·d elements) are the loss. World size 1 runs the unsharded model (no all-reduce at all).

On the CPU the ranks share the machine's cores: every world size gets OMP_NUM_THREADS = cores // N (unless set), so
all runs use the same number of cores; CPU scaling shows the mechanism, not a GPU's figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.llm.config import LLMConfig, params_of
from engine.llm.tp import check_divisible
from engine.llm.tp_rank import llm_config
from engine.llm.verify import rel_l2
from engine.store.db import Artifact, Metric, RunResult, Samples

ROOT = Path(__file__).resolve().parents[2]
# NVLink SHARP / multicast stay off on the lent multi-GPU hosts (see the device notes); set for every launch.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LOG_TAIL_LINES = 60


class TensorParallelError(RuntimeError):
    """A tensor-parallel launch failed (a rank crashed, a check failed, or it timed out); the message ends with the
    tail of its log."""


def _tail(path: Path, lines: int = LOG_TAIL_LINES, chars: int = 6000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:] or "(empty log)"


def _first_error(tail: str) -> str:
    """The last line of the tail that names an exception (the ranks' tracebacks end with it), else ''."""
    for line in reversed(tail.splitlines()):
        stripped = line.strip()
        body = stripped.split("]:", 1)[-1].strip() if stripped.startswith("[") else stripped
        head = body.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return body
    return ""


def _device_type(device: str) -> str:
    kind = str(device).split(":")[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"tensor parallelism runs on cpu (gloo) or cuda (NCCL), not {device!r}")
    return kind


def validate(cfg: dict[str, Any], world_size: int, device: str) -> LLMConfig:
    """Every check that can fail before a process starts: the config, the world size, the GPUs."""
    kind = _device_type(device)
    llm = llm_config(cfg, "cpu")  # device-independent checks (the ranks redo them on their device)
    check_divisible(llm.model_config(), world_size)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("no CUDA device is visible to torch on this machine")
        if world_size > torch.cuda.device_count():
            raise ValueError(f"tensor parallelism over {world_size} GPUs, but {torch.cuda.device_count()} visible")
    return llm


def launch_env(world_size: int, device: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NO_MULTICAST_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if _device_type(device) == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world_size))
    return env


def run_tensor_parallel(cfg: dict[str, Any], world_size: int, device: str, workdir: str | Path,
                        timeout_s: float = 900.0) -> dict[str, Any]:
    """Run `cfg` (LLMConfig fields, see engine.llm.tp_rank) over `world_size` ranks on `device` ("cpu": gloo
    processes; "cuda": one rank per GPU, cuda:0 … cuda:N−1, NCCL) and return rank 0's result, with `log_path`.

    Raises ValueError for a bad config or world size (before starting anything) and TensorParallelError, ending
    with the tail of the log, when torchrun exits non-zero (a crashed rank, a failed logits check) or runs past
    `timeout_s` (then its whole process group is terminated)."""
    validate(cfg, world_size, device)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path, result_path = workdir / f"tp{world_size}-config.json", workdir / f"tp{world_size}-result.json"
    log_path = workdir / f"tp{world_size}.log"
    result_path.unlink(missing_ok=True)
    config_path.write_text(json.dumps({**cfg, "device": _device_type(device), "result_path": str(result_path)},
                                      indent=1))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
           "-m", "engine.llm.tp_rank", "--config", str(config_path)]
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        # Its own session: on a timeout the launcher and every rank go down together, by process-group id.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=launch_env(world_size, device), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise TensorParallelError(f"tensor-parallel run over {world_size} ranks did not finish in {timeout_s:g} s "
                                      f"(stopped); log {log_path}, its tail:\n{_tail(log_path)}") from None
    if rc != 0:
        tail = _tail(log_path)
        first = _first_error(tail)
        raise TensorParallelError(f"tensor-parallel run over {world_size} ranks failed (exit code {rc})"
                                  + (f": {first}" if first else "") + f"; log {log_path}, its tail:\n{tail}")
    if not result_path.exists():
        raise TensorParallelError(f"tensor-parallel run over {world_size} ranks exited 0 without a result; log "
                                  f"{log_path}, its tail:\n{_tail(log_path)}")
    result = json.loads(result_path.read_text())
    result["log_path"] = str(log_path)
    return result


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launch's process group (torchrun forwards it to the ranks), SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# -- scaling --------------------------------------------------------------------------------------------------------
def scaling_efficiency(tpot_1: float, tpot_n: float, n: int) -> float:
    """Speedup over one device divided by the device count: (tpot_1 / tpot_n) / n (1.0 = linear scaling)."""
    if tpot_1 <= 0 or tpot_n <= 0:
        raise ValueError(f"times must be positive, not {tpot_1} and {tpot_n}")
    if n < 1:
        raise ValueError(f"device count must be at least 1, not {n}")
    return tpot_1 / tpot_n / n


def _logits(result: dict[str, Any]) -> list[torch.Tensor]:
    return torch.load(result["logits_path"], weights_only=True)["logits"]


def scaling_rows(results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per world size: TTFT and TPOT (medians, µs), all-reduce time per decode step (median, µs, and its
    share of the TPOT), speedups and efficiency against world size 1, and each run's logits against world size 1's
    (relative L2, largest over the checked positions; tokens equal or not)."""
    if 1 not in results:
        raise ValueError("scaling needs the world-size-1 run as its baseline")
    base = results[1]
    base_logits = _logits(base)
    rows = []
    for n in sorted(results):
        r = results[n]
        logits = _logits(r)
        steps = min(len(logits), len(base_logits))
        rows.append({
            "world_size": n, "ttft_us": r["ttft_us"], "tpot_us": r["tpot_us"],
            "allreduce_decode_us": r["allreduce_decode_median_us"],
            "allreduce_share_pct": 100.0 * r["allreduce_decode_median_us"] / r["tpot_us"],
            "ttft_speedup": base["ttft_us"] / r["ttft_us"], "tpot_speedup": base["tpot_us"] / r["tpot_us"],
            "efficiency": scaling_efficiency(base["tpot_us"], r["tpot_us"], n),
            "rel_err_vs_1": max(rel_l2(logits[j], base_logits[j]) for j in range(steps)),
            "tokens_equal_1": r["tokens"] == base["tokens"],
        })
    return rows


def format_scaling(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'N':>3} {'TTFT':>10} {'TPOT':>10} {'all-reduce':>11} {'share':>6} {'TTFT ×':>7} {'TPOT ×':>7} "
            f"{'eff.':>6} {'rel err vs 1':>13} {'tokens':>7}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['world_size']:>3} {r['ttft_us']:>8.0f}µs {r['tpot_us']:>8.0f}µs "
                     f"{r['allreduce_decode_us']:>9.0f}µs {r['allreduce_share_pct']:>5.1f}% "
                     f"{r['ttft_speedup']:>7.2f} {r['tpot_speedup']:>7.2f} {r['efficiency']:>6.2f} "
                     f"{r['rel_err_vs_1']:>13.2e} {'same' if r['tokens_equal_1'] else 'DIFFER':>7}")
    return "\n".join(lines)


def run_scaling(cfg: dict[str, Any], world_sizes: Sequence[int], device: str, workdir: str | Path,
                timeout_s: float = 900.0, progress: Callable[[float, str], None] = lambda f, m: None
                ) -> dict[int, dict[str, Any]]:
    """run_tensor_parallel for world size 1 and each of `world_sizes`, one after another; results by world size."""
    sizes = sorted({1, *world_sizes})
    for n in sizes:  # every size checked before the first launch
        validate(cfg, n, device)
    results = {}
    for i, n in enumerate(sizes):
        progress(i / len(sizes), f"tensor parallel: {n} rank(s) on {device}")
        results[n] = run_tensor_parallel(cfg, n, device, workdir, timeout_s)
    return results


# -- the job runner's view --------------------------------------------------------------------------------------------
def tp_result(cfg: LLMConfig, world_size: int, progress: Callable[[float, str], None] = lambda f, m: None,
              timeout_s: float = 1800.0) -> RunResult:
    """One LLM-lab run with tensor parallelism: world sizes 1 and `world_size`; the run's headline metrics
    (ttft_us, tpot_*) are the sharded run's, beside the baseline's (tp1_*), the all-reduce time per step, the
    speedup and the scaling efficiency. Fails (TensorParallelError) when the sharded logits miss the unsharded
    model's (each rank checks) or a rank crashes."""
    from engine.store.envinfo import capture_env

    wall0 = time.perf_counter()
    workdir = Path(cfg.artifacts_dir or tempfile.mkdtemp(prefix="modelab-tp-"))
    params = params_of(cfg)
    results = run_scaling(params, [world_size], cfg.device, workdir, timeout_s, progress)
    progress(0.95, "figures")
    rows = {r["world_size"]: r for r in scaling_rows(results)}
    top, base, row = results[world_size], results[1], rows[world_size]
    B = cfg.batch
    result = RunResult(env=capture_env(cfg.device))
    result.metrics += _scaling_metrics(world_size, top, base, row, B)
    if top.get("check"):
        result.metrics += _check_metrics(top["check"], B)
        result.notes += top["check"]["notes"]
    if top.get("peak_memory_bytes") is not None:
        result.metrics.append(Metric("peak_memory_bytes", top["peak_memory_bytes"], "bytes"))
    result.samples += [Samples(phase="prefill", values=top["ttft_samples_us"], batch_size=B),
                       Samples(phase="decode", values=top["tpot_samples_us"], batch_size=B),
                       Samples(phase="allreduce_decode", values=top["allreduce_decode_us"], batch_size=B),
                       Samples(phase="tp1_decode", values=base["tpot_samples_us"], batch_size=B)]
    for r in results.values():
        result.artifacts.append(Artifact(kind="log", name=Path(r["log_path"]).name, path=r["log_path"]))
    result.notes.append(f"tensor parallel over {world_size} {top['backend']} ranks ({top['device_name']}); "
                        f"baseline: the unsharded model on one device. Each rank holds "
                        f"{top['params_per_rank'] / top['params_full']:.0%} of the parameters (embedding and LM "
                        "head replicated).\n" + format_scaling(list(rows.values())))
    result.metrics.append(Metric("run_wall_s", time.perf_counter() - wall0, "s"))
    progress(1.0, "done")
    return result


def _scaling_metrics(world_size: int, top: dict[str, Any], base: dict[str, Any], row: dict[str, Any], B: int
                     ) -> list[Metric]:
    """The sharded run's figures (`top`), the world-size-1 baseline's (tp1_*) and the scaling row between them."""
    tag_p, tag_d = dict(phase="prefill", batch_size=B), dict(phase="decode", batch_size=B)
    return [
        Metric("tp_world_size", float(world_size), ""),
        Metric("ttft_us", top["ttft_us"], "us", **tag_p),
        Metric("ttft_p10_us", top["ttft"]["p10"], "us", **tag_p),
        Metric("ttft_p90_us", top["ttft"]["p90"], "us", **tag_p),
        Metric("tpot_median_us", top["tpot_us"], "us", **tag_d),
        Metric("tpot_p10_us", top["tpot"]["p10"], "us", **tag_d),
        Metric("tpot_p90_us", top["tpot"]["p90"], "us", **tag_d),
        Metric("tokens_per_s", B / (top["tpot_us"] * 1e-6), "tokens/s", **tag_d),
        Metric("tp1_ttft_us", base["ttft_us"], "us", **tag_p),
        Metric("tp1_tpot_median_us", base["tpot_us"], "us", **tag_d),
        Metric("allreduce_us", top["allreduce_prefill_median_us"], "us", **tag_p),
        Metric("allreduce_us", top["allreduce_decode_median_us"], "us", **tag_d),
        Metric("allreduce_share_pct", row["allreduce_share_pct"], "%", **tag_d),
        Metric("allreduce_calls_per_step", float(top["allreduce_calls_per_step"]), ""),
        Metric("allreduce_bytes", float(top["allreduce_bytes_per_prefill"]), "B", **tag_p),
        Metric("allreduce_bytes", float(top["allreduce_bytes_per_decode_step"]), "B", **tag_d),
        Metric("ttft_speedup", row["ttft_speedup"], "", **tag_p),
        Metric("tpot_speedup", row["tpot_speedup"], "", **tag_d),
        Metric("scaling_efficiency", row["efficiency"], "", **tag_d),
        Metric("rel_err_vs_tp1", row["rel_err_vs_1"], ""),
        Metric("params_per_rank", float(top["params_per_rank"]), ""),
    ]


def _check_metrics(c: dict[str, Any], B: int) -> list[Metric]:
    """Rank 0's check of the sharded logits against the unsharded model's."""
    out = [Metric("tolerance", c["tolerance"], ""), Metric("tokens_matched", float(c["tokens_matched"]), ""),
           Metric("max_rel_err", c["prefill_rel_err"], "", phase="prefill", batch_size=B),
           Metric("max_abs_err", c["max_abs_err"], "")]
    if c["decode_rel_err"] is not None:
        out.append(Metric("max_rel_err", c["decode_rel_err"], "", phase="decode", batch_size=B))
    return out
