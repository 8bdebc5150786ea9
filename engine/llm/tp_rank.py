"""One rank of a tensor-parallel LLM run: `python -m torch.distributed.run --standalone --nproc-per-node N
-m engine.llm.tp_rank --config CONFIG.json` (engine.llm.tp_launch starts it).

The config is a JSON object: the LLMConfig fields of engine.llm.config (preset, layers, prompt_len, new_tokens, batch,
device "cpu" or "cuda", dtype, seed, fuse, prefill_iters, decode_passes, check_tokens; mode must be "eager") plus

    result_path   where rank 0 writes the result JSON (required); the logits go to a .pt file beside it
    check         true (default): rank 0 runs the unsharded model first and the sharded logits must match it
    timeout_s     the process group's collective timeout (default 600)
    crash_rank    fault injection for the launcher's tests: that rank raises right after joining the group

Each rank, in order:
1. joins the process group: gloo on the CPU, NCCL on CUDA with device cuda:LOCAL_RANK;
2. builds the seeded full model and prompt (engine.llm.config.build: same seed on every rank → identical weights);
3. rank 0 with `check`: eager greedy generation on the *unsharded* model — the reference — and its tolerance
   (engine.llm.verify.calibrate: 1e-4 relative L2 in float32; calibrated against a float32 twin otherwise);
4. keeps its shard (engine.llm.tp.shard_decoder) and generates greedily through the static cache; rank 0 compares
   logits and tokens with the reference (engine.llm.verify.check_generation: a ToleranceError fails the run), and all
   ranks check they produced the same tokens;
5. times `prefill_iters` prefills (TTFT) and `decode_passes` passes of N decode steps (per-step TPOT), every timed
   call started together (a barrier first), with the all-reduce time of every prefill and decode step;
6. rank 0 writes the result JSON (and the checked logits as a .pt file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from engine.llm.config import LLMConfig, build, config_from_params
from engine.llm.generate import Decoder, Generation, StepFn, generate, step_fn
from engine.llm.timed import decode_pass, sync, timed_calls
from engine.llm.tp import AllReduceTimer, StepComm, shard_decoder, shard_parameter_count, timed_steps
from engine.llm.verify import CheckResult, calibrate, check_generation
from engine.measure.timing import summarize
from engine.workloads.llama import LlamaDecoder


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"{name} is not set: start this module with python -m torch.distributed.run "
                           "(engine.llm.tp_launch.run_tensor_parallel does)")
    return int(value)


def llm_config(params: dict[str, Any], device: str) -> LLMConfig:
    """The LLMConfig of this rank (on `device`), validated; tensor-parallel runs are eager only."""
    cfg = config_from_params({**params, "device": device, "profile": False, "ceilings": "none"})
    if cfg.mode != "eager":
        raise ValueError(f"tensor-parallel runs are eager only, not mode {cfg.mode!r}")
    if "check_tokens" not in params:
        cfg.check_tokens = cfg.new_tokens  # check (and report) every generated token by default
    cfg.validate()
    return cfg


def _stats(values: list[float]) -> dict[str, float]:
    s = summarize(values)
    return {"median": s.median, "p10": s.p10, "p90": s.p90, "mean": s.mean, "min": s.min, "max": s.max}


def run_rank(params: dict[str, Any]) -> dict[str, Any] | None:
    """This rank's part of the run; rank 0 returns the result (other ranks None)."""
    rank, local_rank, world = _env_int("RANK"), _env_int("LOCAL_RANK"), _env_int("WORLD_SIZE")
    wall0 = time.perf_counter()
    on_cuda = str(params.get("device", "cpu")).startswith("cuda")
    if on_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible")
        torch.cuda.set_device(local_rank)
        device, backend = f"cuda:{local_rank}", "nccl"
    else:
        device, backend = "cpu", "gloo"
    cfg = llm_config(params, device)
    timeout = timedelta(seconds=float(params.get("timeout_s", 600)))
    if on_cuda:  # bound to this rank's GPU from the start: barriers and object collectives use it
        dist.init_process_group(backend, timeout=timeout, device_id=torch.device(device))
    else:
        dist.init_process_group(backend, timeout=timeout)
    try:
        if params.get("crash_rank") == rank:
            raise RuntimeError(f"rank {rank}: crash requested by the config (crash_rank)")
        return _run(cfg, params, rank, world, device, backend, wall0)
    finally:
        dist.destroy_process_group()


@dataclass
class _Checked:
    """The sharded generation, checked: its logits (rank 0 keeps them), tokens, and the comparison's figures."""
    got: Generation
    tokens: list[list[int]]  # (B, 1 + checked steps): the prefill's token, then one per decode step
    result: CheckResult | None  # None: no reference (not rank 0, or the config's check is off)
    tolerance: float | None


@dataclass
class _Timings:
    ttft_us: list[float]
    tpot_us: list[float]
    prefill_comm: list[StepComm]  # the all-reduces of each timed prefill
    decode_comm: list[StepComm]  # … of each timed decode step

    @property
    def allreduce_prefill_us(self) -> list[float]:
        return [c.us for c in self.prefill_comm]

    @property
    def allreduce_decode_us(self) -> list[float]:
        return [c.us for c in self.decode_comm]


@torch.no_grad()
def _run(cfg: LLMConfig, params: dict[str, Any], rank: int, world: int, device: str, backend: str,
         wall0: float) -> dict[str, Any] | None:
    k = min(cfg.check_tokens, cfg.new_tokens)
    model, prompt = build(cfg)  # the full model: the same seed gives every rank the same weights and prompt
    full_params = shard_parameter_count(model)
    ref, tol = None, None
    if bool(params.get("check", True)) and rank == 0:  # before sharding (the other ranks wait at the barrier)
        ref, tol = _reference(cfg, model, prompt, k)
    sync(device)
    dist.barrier()
    timer = AllReduceTimer(device)
    step, decoder = _shard(model, rank, world, device, timer)
    checked = _check_sharded(step, decoder, prompt, k, ref, tol, world, timer)
    timings = _time(cfg, step, decoder, prompt, timer, device)
    per_rank = _gather_per_rank(rank, world, timings)
    peak = float(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None
    if rank != 0:
        return None
    return {**_run_facts(cfg, params, world, device, backend), "params_full": full_params,
            "params_per_rank": shard_parameter_count(model),
            **_check_facts(checked, Path(params["result_path"])), **_timing_facts(timings), "per_rank": per_rank,
            "peak_memory_bytes": peak, "max_seq": cfg.max_seq, "wall_s": time.perf_counter() - wall0}


def _reference(cfg: LLMConfig, model: LlamaDecoder, prompt: torch.Tensor, k: int) -> tuple[Generation, float]:
    """The single-device reference: eager greedy generation on the unsharded model, and its tolerance."""
    eager = step_fn(model)
    ref = generate(eager, Decoder(eager), prompt, k)
    return ref, calibrate(cfg, model, prompt, ref).tolerance


def _shard(model: LlamaDecoder, rank: int, world: int, device: str, timer: AllReduceTimer
           ) -> tuple[StepFn, Decoder]:
    """Keep this rank's shard; its step function (all-reduces timed by `timer`) and a decoder over it."""
    if world > 1:  # one rank: the plain single-device model, no all-reduce at all (the scaling baseline)
        shard_decoder(model, rank, world, timer=timer)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the full weights' memory, now unused
        torch.cuda.reset_peak_memory_stats()
    step = timed_steps(step_fn(model), timer)
    return step, Decoder(step)


def _check_sharded(step: StepFn, decoder: Decoder, prompt: torch.Tensor, k: int, ref: Generation | None,
                   tol: float | None, world: int, timer: AllReduceTimer) -> _Checked:
    """Correctness: the sharded greedy generation, compared with the reference; the same tokens on every rank."""
    got = generate(step, decoder, prompt, k)
    timer.take()
    check_result = check_generation(got, ref, tol, f"tensor parallel over {world} ranks") if ref is not None \
        else None
    tokens = got.tokens.cpu().tolist()
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, tokens)
    if any(t != tokens for t in everyone):
        raise RuntimeError(f"the ranks generated different tokens: {everyone}")
    return _Checked(got, tokens, check_result, tol)


def _time(cfg: LLMConfig, step: StepFn, decoder: Decoder, prompt: torch.Tensor, timer: AllReduceTimer,
          device: str) -> _Timings:
    """Prefills (TTFT), then decode passes (TPOT per step), the all-reduce time per forward alongside; every timed
    call starts together on all ranks (a barrier first)."""
    P, N = cfg.prompt_len, cfg.new_tokens
    positions = torch.arange(P, device=device)
    for _ in range(2):
        step(prompt, positions)
    timer.take()
    ttft_us = timed_calls(lambda: step(prompt, positions), cfg.prefill_iters, device, before=dist.barrier)
    prefill_comm = timer.take()
    token0, _ = step(prompt, positions)
    decode_pass(decoder, token0, P, min(N, 8), device, before=dist.barrier)  # warm
    tpot_us: list[float] = []
    decode_comm: list[StepComm] = []
    for _ in range(cfg.decode_passes):
        token0, _ = step(prompt, positions)
        timer.take()  # the untimed prefill's
        tpot_us += decode_pass(decoder, token0, P, N, device, before=dist.barrier)
        decode_comm += timer.take()
    if len(prefill_comm) != len(ttft_us) or len(decode_comm) != len(tpot_us):
        raise RuntimeError("all-reduce groups do not line up with the timed calls")
    return _Timings(ttft_us, tpot_us, prefill_comm, decode_comm)


def _gather_per_rank(rank: int, world: int, timings: _Timings) -> list[Any]:
    """Every rank's own all-reduce medians: a rank that waits much longer than the others marks the slow one."""
    mine = {"rank": rank, "allreduce_prefill_median_us": summarize(timings.allreduce_prefill_us).median,
            "allreduce_decode_median_us": summarize(timings.allreduce_decode_us).median,
            "ttft_median_us": summarize(timings.ttft_us).median, "tpot_median_us": summarize(timings.tpot_us).median}
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, mine)
    return per_rank


# -- rank 0's result ------------------------------------------------------------------------------------------------
def _run_facts(cfg: LLMConfig, params: dict[str, Any], world: int, device: str, backend: str) -> dict[str, Any]:
    return {"world_size": world, "backend": backend, "device": device.split(":")[0],
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "config": {k: v for k, v in params.items() if k not in ("result_path", "crash_rank")},
            "dtype": str(cfg.torch_dtype).removeprefix("torch.")}


def _check_facts(checked: _Checked, result_path: Path) -> dict[str, Any]:
    """The tokens and the check's figures; the checked logits go to a .pt file beside the result."""
    got, c = checked.got, checked.result
    logits_path = result_path.with_suffix(".logits.pt")
    torch.save({"logits": got.logits, "tokens": got.tokens.cpu()}, logits_path)
    return {
        "tokens": checked.tokens,  # (B, 1 + checked steps): the prefill's token, then one per decode step
        "prefill_logits": got.logits[0].tolist() if got.logits[0].numel() <= 4096 else None,
        "logits_path": str(logits_path),
        "check": None if c is None else {
            "tolerance": checked.tolerance, "prefill_rel_err": c.prefill_rel_err,
            "decode_rel_err": c.decode_rel_err, "max_abs_err": c.max_abs_err,
            "tokens_matched": c.tokens_matched, "notes": c.notes},
    }


def _timing_facts(t: _Timings) -> dict[str, Any]:
    ttft, tpot = _stats(t.ttft_us), _stats(t.tpot_us)
    ar_prefill, ar_decode = t.allreduce_prefill_us, t.allreduce_decode_us
    return {
        "ttft_us": ttft["median"], "ttft": ttft, "ttft_samples_us": t.ttft_us,
        "tpot_us": tpot["median"], "tpot": tpot, "tpot_samples_us": t.tpot_us,
        "allreduce_prefill_us": ar_prefill, "allreduce_decode_us": ar_decode,
        "allreduce_prefill_median_us": summarize(ar_prefill).median,
        "allreduce_decode_median_us": summarize(ar_decode).median,
        "allreduce_calls_per_step": t.decode_comm[0].calls,
        "allreduce_bytes_per_decode_step": t.decode_comm[0].bytes,
        "allreduce_bytes_per_prefill": t.prefill_comm[0].bytes,
    }


def write_result(result: dict[str, Any], path: Path) -> None:
    """Atomically: a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, allow_nan=False))
    tmp.replace(path)


@record  # torchrun's failure summary then carries the rank's exception and traceback
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.llm.tp_rank")
    parser.add_argument("--config", required=True, help="JSON file (see the module docstring)")
    args = parser.parse_args(argv)
    params = json.loads(Path(args.config).read_text())
    if "result_path" not in params:
        raise ValueError("the config needs a result_path")
    result = run_rank(params)
    if result is not None:
        write_result(result, Path(params["result_path"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
