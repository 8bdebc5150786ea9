"""A group of LLM runs on one device (`llm --mode all`, a sweep, the LLM page's batch): how many prepare side by
side, and in which order (the llm kind's planner, engine/llm/kind.py; the kind also has the device's ceilings measured
first, alone, when a group starts side by side and the device has none).

Device memory decides how many prepare at once. Each run states what it holds while it prepares (the model, the KV
caches, quantization and compile workspaces, and — only where it computes its reference — the float32 twin that
calibrates the check) and while it is timed; once the store holds a measured peak for the same run on this device
(prepare_peak_bytes, peak_memory_bytes, taken from a run that computed its reference or from one that loaded it, as
its metric reference_computed says), that replaces the estimate. The reference is the same for every run of a key
(engine.llm.reference): the first run of a key to claim it computes it, the others load it, and a key whose reference
is stored already needs no twin at all; so a group holds at most one twin per key not yet stored. Runs prepare side
by side only while their needs fit the memory the lab may use (the free memory, or --device-memory), less a margin:
the twins of the keys to compute, and the rest at their needs without one. A run that cannot fit alone is refused with
its bytes before it loads anything.

The order: eager first (it computes the reference every other run of its key loads, and waits for nothing), then the
other modes that compile nothing (sdpa-*), then the compiling ones. The runs behind eager wait for its reference
anyway, so the quick ones start beside it; the quick runs' results (and their measured peaks) come first, so a group
cut short (a time limit, Ctrl-C) has the reference and the cheap modes rather than half of its compiles; and the
compiles, host-bound, overlap the cheap runs' timings. The last compile may finish alone: a tail of one compile.

engine.runner.plan asks it for an LLM group, for the CLI and for the dashboard's detached supervisor alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from engine.llm.config import device_budget, memory_needed
from engine.llm.modes import MODES
from engine.llm.run import LLMConfig, config_from_params
from engine.runner.device_lock import TIMING_CORES
from engine.runner.plan import MAX_GPU_SLOTS
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


def estimate(cfg: LLMConfig, twin: bool = True) -> MemoryNeed:
    """What a run of `cfg` holds, from its parameter and cache bytes. Preparing: the model with its float32 twin and
    both caches (calibration; only where it computes its reference: twin), the twin's fused copies while they are
    made (else the model's own); then the model with the quantization workspace (a second copy of the weights, at
    most) and the compile's (a quarter of the weights: Inductor's buffers and CUDA graph pools). Timed: the model, its
    cache and the compile's workspace. Each plus PROCESS_OVERHEAD_BYTES. Conservative on purpose: a measured peak
    (measured()) replaces it after the first run."""
    from engine.llm import metrics as M
    from engine.workloads.llama import parameter_count

    mode = MODES[cfg.mode]
    mc = cfg.model_config()
    elem = cfg.torch_dtype.itemsize
    weights = elem * parameter_count(mc)
    own = weights + M.kv_bytes(mc, cfg.batch, cfg.max_seq, elem)
    with_twin = memory_needed(cfg, twin)
    largest = 4 * parameter_count(mc) if with_twin > own else weights  # the copy that fuse_projections doubles
    fusing = int(FUSED_SHARE * largest) if cfg.fuse else 0
    quant_ws = weights if mode.quant else 0
    compile_ws = weights // 4 if mode.compiles else 0
    prepare = max(with_twin + fusing, own + quant_ws + compile_ws) + PROCESS_OVERHEAD_BYTES
    return MemoryNeed(prepare, own + compile_ws + PROCESS_OVERHEAD_BYTES, "estimate")


def measured(store: Store, run: dict, computes: bool = True) -> MemoryNeed | None:
    """The peaks an earlier finished run of the same model, mode, shape and dtype measured on this device, with
    MEASURED_HEADROOM, from a run that computed its reference (computes: with the float32 twin) or one that loaded it;
    None where there is none. A run stored without the metric reference_computed computed its reference."""
    keys = ("preset", "layers", "hf", "hf_config", "batch", "prompt_len", "new_tokens", "dtype", "fuse")
    mine = {k: run["params"].get(k) for k in keys}
    frame = store.query("""
        SELECT r.id, r.params,
               max(CASE WHEN m.name = 'prepare_peak_bytes' THEN m.value END) AS prepare,
               max(CASE WHEN m.name = 'peak_memory_bytes' THEN m.value END) AS timed,
               max(CASE WHEN m.name = 'reference_computed' THEN m.value END) AS computed
        FROM runs r JOIN metrics m ON m.run_id = r.id
        WHERE r.kind = 'llm' AND r.status = 'ok' AND r.workload = ? AND r.mode = ? AND r.device = ?
          AND m.name IN ('prepare_peak_bytes', 'peak_memory_bytes', 'reference_computed')
        GROUP BY r.id, r.params ORDER BY r.id DESC LIMIT 50""", [run["workload"], run["mode"], run["device"]])
    for row in frame.itertuples():
        params = json.loads(row.params) if isinstance(row.params, str) else dict(row.params or {})
        if row.prepare is None or row.prepare != row.prepare or {k: params.get(k) for k in keys} != mine:
            continue
        if (row.computed is None or row.computed != row.computed or row.computed >= 0.5) != computes:
            continue
        timed = row.timed if row.timed == row.timed and row.timed is not None else 0.0
        return MemoryNeed(int(MEASURED_HEADROOM * row.prepare) + (1 << 30),
                          int(MEASURED_HEADROOM * timed) + (1 << 30), f"measured in run {row.id}")
    return None


def need_of(store: Store, run: dict, computes: bool = True) -> MemoryNeed:
    """What the run holds where it computes its reference (computes) or loads it: measured, else estimated."""
    return measured(store, run, computes) or estimate(config_from_params(run["params"]), computes)


def prepare_slots(requested: int | str, cfgs: list[LLMConfig], serial: bool,
                  needs: Sequence[MemoryNeed] | None = None,
                  computing: Sequence[MemoryNeed] | None = None) -> tuple[int, str]:
    """How many runs may prepare at once, and why that many: on CUDA, as many as fit in MEMORY_MARGIN of the memory
    the lab may use there (a requested count is held to that too); else one. needs: each run's (all with the float32
    twin, the estimate's default, unless `computing` is given); computing: where given, the needs of the runs that
    compute a reference (one per key not stored, at most one at a time each: engine.llm.reference), and `needs` are
    then the runs' needs without the twin. Any `slots` runs preparing at once hold at most the `slots` largest of
    them, each key's computing run among them."""
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
    fit = 1
    while fit < len(cfgs) and held_at_most(fit + 1, needs, computing) <= MEMORY_MARGIN * free:
        fit += 1
    slots = fit if requested == "auto" else min(int(requested), len(cfgs), fit)
    asked = "" if requested == "auto" else f"--prepare-parallel {requested}, "
    head = f"{slots} at a time ({asked}{free / 2**30:.0f} GiB free{capped}, "
    need = max(n.most for n in needs)
    if computing is None:
        return slots, head + (f"up to {need / 2**30:.1f} GiB per run: model, float32 twin, KV cache, workspaces, "
                              "process)")
    if not computing:
        return slots, head + (f"up to {need / 2**30:.1f} GiB per run: model, KV cache, workspaces, process; the "
                              "reference is stored: no float32 twin)")
    big = max(n.most for n in computing)
    who = "the run computing the reference" if len(computing) == 1 else \
        f"each of the {len(computing)} runs computing a reference"
    return slots, head + (f"up to {big / 2**30:.1f} GiB for {who}: model, float32 twin, KV cache, workspaces, "
                          f"process; up to {need / 2**30:.1f} GiB per other run: model, KV cache, workspaces, process)")


def held_at_most(slots: int, needs: Sequence[MemoryNeed], computing: Sequence[MemoryNeed] | None) -> int:
    """The most `slots` runs preparing at once can hold: the largest computing needs (one per key, up to `slots`),
    the rest the largest of the other needs."""
    big = sorted((n.most for n in computing or ()), reverse=True)[:slots]
    rest = sorted((n.most for n in needs), reverse=True)[:slots - len(big)]
    return sum(big) + sum(rest)


def too_big(store: Store, run: dict, need: MemoryNeed, twin: bool = True) -> str | None:
    """Why this run cannot prepare even alone on its device (twin: computing its reference), or None."""
    cfg = config_from_params(run["params"])
    if not cfg.device.startswith("cuda"):
        return None
    free, total, capped = device_budget(cfg)
    if need.most <= free:
        return None
    return (f"needs {need.most / 2**30:.1f} GiB of device memory alone ({need.source}: model, "
            + ("float32 twin, " if twin else "")
            + f"KV cache, workspaces); {cfg.device} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} "
            f"GiB{capped}. Use a smaller preset, batch or length.")


def start_rank(cfg: LLMConfig) -> int:
    """Where a run starts in its group (module docstring): eager 0, the other modes that compile nothing 1, the
    compiling ones 2."""
    mode = MODES[cfg.mode]
    return 0 if cfg.mode == "eager" else 1 if not (mode.compiles or cfg.autotune) else 2


def reference_key(cfg: LLMConfig) -> str | None:
    """The key of the reference the run loads or computes (engine.llm.reference); None where it has none to share
    (a tensor-parallel or transformers-route run checks against its own)."""
    if cfg.tp > 1 or cfg.route == "transformers":
        return None
    from engine.llm import reference

    return reference.key(cfg)


def plan_group(store: Store, run_ids: Sequence[int], requested: int | str = "auto", serial: bool = False
               ) -> tuple:
    """(runs preparing at once, the order to start them in, why that many[, (each run's device bytes, the bytes the
    runs under way may hold together)]) for queued LLM runs; the runner admits the next run only while its bytes fit
    beside those of the runs under way (engine.runner.jobs.run_jobs). A run that cannot fit alone is failed here with
    its bytes, before anything loads."""
    runs = [store.run(i) for i in run_ids]
    if any(r is None or r["kind"] != "llm" for r in runs) or len({r["device"] for r in runs}) > 1:
        return 1, list(run_ids), "one run at a time (not one device's LLM runs)"
    cfgs = [config_from_params(r["params"]) for r in runs]
    # The cheap modes first, eager (the reference) at the head (module docstring); stable within a rank.
    by_rank = sorted(range(len(runs)), key=lambda i: start_rank(cfgs[i]))
    runs, cfgs, ids = [runs[i] for i in by_rank], [cfgs[i] for i in by_rank], [run_ids[i] for i in by_rank]
    if not cfgs[0].device.startswith("cuda"):
        slots, why = prepare_slots(requested, cfgs, serial)
        return slots, ids, why
    keys = [reference_key(c) for c in cfgs]
    stored: dict[str, bool] = {}
    for k, c in zip(keys, cfgs):
        if k is not None and k not in stored:
            stored[k] = _stored(c)
    computes = [k is None or not stored[k] for k in keys]  # a run of a key not stored may be the one to compute it
    needs = [need_of(store, r, twin) for r, twin in zip(runs, computes)]
    keep = []
    for i, (run, need) in enumerate(zip(runs, needs)):
        reason = too_big(store, run, need, computes[i])
        if reason:
            store.fail_run(int(run["id"]), f"MemoryError: {reason}")
        else:
            keep.append(i)
    if not keep:
        return 1, [], "no run fits the device's memory"
    loading = [need_of(store, runs[i], False) if computes[i] else needs[i] for i in keep]
    computing: dict[object, MemoryNeed] = {}  # per key to compute (a run without a key is its own), the largest
    for i in keep:
        if computes[i]:
            key = keys[i] if keys[i] is not None else ("own", i)
            if key not in computing or needs[i].most > computing[key].most:
                computing[key] = needs[i]
    kept = [cfgs[i] for i in keep]
    slots, why = prepare_slots(requested, kept, serial, loading, list(computing.values()))
    order = [ids[i] for i in keep]
    if slots < 2:
        return slots, order, why
    # Admission by each run's own need: the first run of a key to compute counts the float32 twin, the others what
    # they hold loading it; a run starts while the needs of the runs under way and its own fit, so once the big
    # ones end, more of the small ones prepare at once than the largest needs alone would allow.
    weights: dict[int, int] = {}
    first_of: set[object] = set()
    for i in keep:
        key = keys[i] if keys[i] is not None else ("own", i)
        twin = computes[i] and key not in first_of
        first_of.add(key)
        weights[int(ids[i])] = (needs[i] if twin else loading[keep.index(i)]).most
    free, _total, _capped = device_budget(kept[0])
    cores = os.cpu_count() or 1
    lanes = min(len(keep), MAX_GPU_SLOTS, max(1, (cores - TIMING_CORES) // 2))
    lanes = max(slots, lanes if requested == "auto" else min(int(requested), len(keep)))
    if lanes > slots:
        why = f"{slots}–{lanes} at a time as their memory fits" + why[why.index(" at a time") + len(" at a time"):]
    return slots if lanes == slots else lanes, order, why, (weights, int(MEMORY_MARGIN * free))


def _stored(cfg: LLMConfig) -> bool:
    from engine.llm import reference

    return reference.cached(cfg)
