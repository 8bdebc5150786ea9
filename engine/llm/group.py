"""A group of LLM runs on one device (`llm --mode all`, a sweep, the LLM page's batch): how many prepare side by
side, in which order, and the ceilings they all divide by — measured first, alone, if this device has none.

engine.runner.plan asks it for an LLM group, for the CLI and for the dashboard's detached supervisor alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.llm.modes import MODES
from engine.llm.run import LLMConfig, config_from_params, memory_needed
from engine.measure.ceilings import ensure_ceilings
from engine.store.db import Store

# Device memory a run's process holds beyond memory_needed: the CUDA context, activations, logits, CUDA graph pools
# and the GEMV choice's weight copies (three L2s' worth).
PROCESS_OVERHEAD_BYTES = 2 << 30


def prepare_slots(requested: int | str, cfgs: list[LLMConfig], serial: bool) -> tuple[int, str]:
    """How many runs may prepare at once, and why that many. auto: on CUDA, as many as fit in 90 % of the free
    device memory (each with its model, calibration twin and cache, plus PROCESS_OVERHEAD_BYTES); else one."""
    if serial or len(cfgs) < 2:
        return 1, "one run at a time" + (" (--serial)" if serial else "")
    if any(c.autotune for c in cfgs):
        return 1, "one run at a time: --autotune times candidate kernels while it compiles"
    if any(c.tp > 1 for c in cfgs):
        return 1, "one run at a time: --tp runs its own processes"
    if requested != "auto":
        return min(int(requested), len(cfgs)), f"--prepare-parallel {requested}"
    device = cfgs[0].device
    if not device.startswith("cuda"):
        return 1, "one run at a time on the CPU (the compiles would take the cores the timings need)"
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    need = max(memory_needed(c) for c in cfgs) + PROCESS_OVERHEAD_BYTES
    slots = max(1, min(len(cfgs), int(0.9 * free // need)))
    return slots, (f"{slots} at a time: {free / 2**30:.0f} GiB free, {need / 2**30:.1f} GiB per run "
                   "(model, float32 twin, KV cache, process)")


def plan_group(store: Store, run_ids: Sequence[int], requested: int | str = "auto", serial: bool = False
               ) -> tuple[int, list[int], str]:
    """(runs preparing at once, the order to start them in, why that many) for queued LLM runs; with more than one
    at once the device's ceilings are made sure of first (runs preparing side by side would each wait to measure)."""
    runs = [store.run(i) for i in run_ids]
    if any(r is None or r["kind"] != "llm" for r in runs) or len({r["device"] for r in runs}) > 1:
        return 1, list(run_ids), "one run at a time (not one device's LLM runs)"
    cfgs = [config_from_params(r["params"]) for r in runs]
    slots, why = prepare_slots(requested, cfgs, serial)
    if slots > 1:
        ensure_ceilings(store, runs[0]["device"], float(runs[0]["params"].get("_timeout_s", 1800)))
    # The compiling modes first: they take longest to prepare, and the quick ones fill in behind them.
    order = [i for _, i in sorted(zip(cfgs, run_ids), key=lambda ci: not MODES[ci[0].mode].compiles)]
    return slots, order, why
