"""A group of LLM runs on one device (`llm --mode all`, a sweep, the LLM page's batch): how many prepare side by
side, and in which order (the llm kind's planner, engine/llm/kind.py; the kind also has the device's ceilings measured
first, alone, when a group starts side by side and the device has none).

Device memory decides how many prepare at once. Each run states what it holds while it prepares (the model, the float32
twin that calibrates its check, the KV caches, quantization and compile workspaces) and while it is timed; once the
store holds a measured peak for the same run on this device (prepare_peak_bytes, peak_memory_bytes), that replaces
the estimate. Runs prepare side by side only while their needs fit the memory the lab may use (the free memory, or
--device-memory), less a margin; a run that cannot fit alone is refused with its bytes before it loads anything.

engine.runner.plan asks it for an LLM group, for the CLI and for the dashboard's detached supervisor alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from engine.llm.config import device_budget, memory_needed
from engine.llm.modes import MODES
from engine.llm.run import LLMConfig, config_from_params
from engine.store.db import Store

# Device memory a run's process holds beyond its tensors: the CUDA context, activations, logits, CUDA graph pools and
# the GEMV choice's weight copies (three L2s' worth).
PROCESS_OVERHEAD_BYTES = 2 << 30
# The share of the memory the lab may use that a group fills at most: the rest absorbs the caching allocator's
# fragmentation and other processes' growth.
MEMORY_MARGIN = 0.9
# A measured peak is taken with this headroom (the next run of the same key may fragment differently).
MEASURED_HEADROOM = 1.1


@dataclass(frozen=True)
class MemoryNeed:
    """Device bytes one run holds while it prepares and while it is timed, and where the figures come from."""

    prepare: int
    timed: int
    source: str  # "estimate" or "measured in run N"

    @property
    def most(self) -> int:
        return max(self.prepare, self.timed)


# The share of a model's weights in its q/k/v and gate/up projections: fusing them (fuse_projections) allocates the
# fused copies while the separate ones still exist.
FUSED_SHARE = 0.8


def estimate(cfg: LLMConfig) -> MemoryNeed:
    """What a run of `cfg` holds, from its parameter and cache bytes. Preparing: the model with its float32 twin and
    both caches (calibration), the twin's fused copies while they are made; then the model with the quantization
    workspace (a second copy of the weights, at most) and the compile's (a quarter of the weights: Inductor's buffers
    and CUDA graph pools). Timed: the model, its cache and the compile's workspace. Each plus PROCESS_OVERHEAD_BYTES.
    Conservative on purpose: a measured peak (measured()) replaces it after the first run."""
    from engine.llm import metrics as M
    from engine.workloads.llama import parameter_count

    mode = MODES[cfg.mode]
    mc = cfg.model_config()
    elem = cfg.torch_dtype.itemsize
    weights = elem * parameter_count(mc)
    own = weights + M.kv_bytes(mc, cfg.batch, cfg.max_seq, elem)
    with_twin = memory_needed(cfg)
    largest = 4 * parameter_count(mc) if with_twin > own else weights  # the copy that fuse_projections doubles
    fusing = int(FUSED_SHARE * largest) if cfg.fuse else 0
    quant_ws = weights if mode.quant else 0
    compile_ws = weights // 4 if mode.compiles else 0
    prepare = max(with_twin + fusing, own + quant_ws + compile_ws) + PROCESS_OVERHEAD_BYTES
    return MemoryNeed(prepare, own + compile_ws + PROCESS_OVERHEAD_BYTES, "estimate")


def measured(store: Store, run: dict) -> MemoryNeed | None:
    """The peaks an earlier finished run of the same model, mode, shape and dtype measured on this device, with
    MEASURED_HEADROOM; None where there is none."""
    keys = ("preset", "layers", "hf", "hf_config", "batch", "prompt_len", "new_tokens", "dtype", "fuse")
    mine = {k: run["params"].get(k) for k in keys}
    frame = store.query("""
        SELECT r.id, r.params,
               max(CASE WHEN m.name = 'prepare_peak_bytes' THEN m.value END) AS prepare,
               max(CASE WHEN m.name = 'peak_memory_bytes' THEN m.value END) AS timed
        FROM runs r JOIN metrics m ON m.run_id = r.id
        WHERE r.kind = 'llm' AND r.status = 'ok' AND r.workload = ? AND r.mode = ? AND r.device = ?
          AND m.name IN ('prepare_peak_bytes', 'peak_memory_bytes')
        GROUP BY r.id, r.params ORDER BY r.id DESC LIMIT 50""", [run["workload"], run["mode"], run["device"]])
    for row in frame.itertuples():
        params = json.loads(row.params) if isinstance(row.params, str) else dict(row.params or {})
        if row.prepare is None or row.prepare != row.prepare or {k: params.get(k) for k in keys} != mine:
            continue
        timed = row.timed if row.timed == row.timed and row.timed is not None else 0.0
        return MemoryNeed(int(MEASURED_HEADROOM * row.prepare) + (1 << 30),
                          int(MEASURED_HEADROOM * timed) + (1 << 30), f"measured in run {row.id}")
    return None


def need_of(store: Store, run: dict) -> MemoryNeed:
    return measured(store, run) or estimate(config_from_params(run["params"]))


def prepare_slots(requested: int | str, cfgs: list[LLMConfig], serial: bool,
                  needs: Sequence[MemoryNeed] | None = None) -> tuple[int, str]:
    """How many runs may prepare at once, and why that many: on CUDA, as many as fit in MEMORY_MARGIN of the memory
    the lab may use there (each at its need; a requested count is held to that too); else one."""
    if serial or len(cfgs) < 2:
        return 1, "one run at a time" + (" (--serial)" if serial else "")
    if any(c.autotune for c in cfgs):
        return 1, "one run at a time: --autotune times candidate kernels while it compiles"
    if any(c.tp > 1 for c in cfgs):
        return 1, "one run at a time: --tp runs its own processes"
    device = cfgs[0].device
    if not device.startswith("cuda"):
        if requested != "auto":
            return min(int(requested), len(cfgs)), f"--prepare-parallel {requested}"
        return 1, "one run at a time on the CPU (the compiles would take the cores the timings need)"
    needs = list(needs) if needs is not None else [estimate(c) for c in cfgs]
    free, _total, capped = device_budget(cfgs[0])
    need = max(n.most for n in needs)
    fit = max(1, int(MEMORY_MARGIN * free // need))
    slots = min(len(cfgs), fit) if requested == "auto" else min(int(requested), len(cfgs), fit)
    asked = "" if requested == "auto" else f"--prepare-parallel {requested}, "
    return slots, (f"{slots} at a time ({asked}{free / 2**30:.0f} GiB free{capped}, up to {need / 2**30:.1f} GiB "
                   "per run: model, float32 twin, KV cache, workspaces, process)")


def too_big(store: Store, run: dict, need: MemoryNeed) -> str | None:
    """Why this run cannot prepare even alone on its device, or None."""
    cfg = config_from_params(run["params"])
    if not cfg.device.startswith("cuda"):
        return None
    free, total, capped = device_budget(cfg)
    if need.most <= free:
        return None
    return (f"needs {need.most / 2**30:.1f} GiB of device memory alone ({need.source}: model, float32 twin, KV "
            f"cache, workspaces); {cfg.device} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB{capped}. "
            "Use a smaller preset, batch or length.")


def plan_group(store: Store, run_ids: Sequence[int], requested: int | str = "auto", serial: bool = False
               ) -> tuple[int, list[int], str]:
    """(runs preparing at once, the order to start them in, why that many) for queued LLM runs. A run that cannot fit
    alone is failed here with its bytes, before anything loads."""
    runs = [store.run(i) for i in run_ids]
    if any(r is None or r["kind"] != "llm" for r in runs) or len({r["device"] for r in runs}) > 1:
        return 1, list(run_ids), "one run at a time (not one device's LLM runs)"
    cfgs = [config_from_params(r["params"]) for r in runs]
    needs = [need_of(store, r) for r in runs] if cfgs[0].device.startswith("cuda") else None
    keep = list(range(len(runs)))
    if needs is not None:
        for i, (run, need) in enumerate(zip(runs, needs)):
            reason = too_big(store, run, need)
            if reason:
                store.fail_run(int(run["id"]), f"MemoryError: {reason}")
                keep.remove(i)
        if not keep:
            return 1, [], "no run fits the device's memory"
    cfgs, ids = [cfgs[i] for i in keep], [run_ids[i] for i in keep]
    slots, why = prepare_slots(requested, cfgs, serial, [needs[i] for i in keep] if needs else None)
    # The compiling modes first: they take longest to prepare, and the quick ones fill in behind them.
    order = [i for _, i in sorted(zip(cfgs, ids), key=lambda ci: not MODES[ci[0].mode].compiles)]
    return slots, order, why
