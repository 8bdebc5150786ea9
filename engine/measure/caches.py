"""What a first call found in the caches: Inductor's and AOTAutograd's counters, and native builds done or reused.

Runs keep these as metrics of each (phase, batch size), beside `first_call`, so a page can say "first call 3.5 s:
FX graph cache 2 hits, 0 misses" instead of leaving a user to guess why one run compiled for a minute and the next
did not. Where the caches live and how they are keyed: engine.native.build (configure_compile_caches, build_tag) and
engine.native.aoti (the package digest).

Metric names (unit "", counts of this phase's prepare + first call):
    cache_fxgraph_hit / _miss / _bypass      Inductor's FX graph cache (one lookup per compiled graph: fwd, bwd)
    cache_aotautograd_hit / _miss / _bypass  AOTAutograd's cache (the joint graph, before Inductor)
    cache_autotune_benchmarked               GEMM selections max-autotune benchmarked (its local autotune cache
                                             missed); 0 for an autotuning mode means every choice came from a cache
    cache_<build>_hit                        1 or 0 per native build: modelab_ops, aoti_runner, aoti_package …
    cache_<build>_build_s                    seconds that build took when it was not a hit (unit "s")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine.store.db import Metric

_COUNTERS = {("inductor", "fxgraph_cache_hit"): "cache_fxgraph_hit",
             ("inductor", "fxgraph_cache_miss"): "cache_fxgraph_miss",
             ("inductor", "fxgraph_cache_bypass"): "cache_fxgraph_bypass",
             ("aot_autograd", "autograd_cache_hit"): "cache_aotautograd_hit",
             ("aot_autograd", "autograd_cache_miss"): "cache_aotautograd_miss",
             ("aot_autograd", "autograd_cache_bypass"): "cache_aotautograd_bypass",
             ("inductor", "select_algorithm_autotune"): "cache_autotune_benchmarked"}
LABELS = {"fxgraph": "Inductor FX graph cache", "aotautograd": "AOTAutograd cache", "modelab_ops": "custom-op build",
          "modelab_ops_cuda": "custom-op build (CUDA)",
          "aoti_runner": "AOTInductor runner build", "aoti_package": "AOTInductor .pt2 package"}


def counter_snapshot() -> dict[str, int]:
    """The current values of the cache counters this module reports (dynamo's process-wide counters)."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][key]) for (group, key), name in _COUNTERS.items()}


def cache_metrics(before: Mapping[str, int], after: Mapping[str, int], builds: Iterable[dict] = (),
                  autotunes: bool = False) -> list[Metric]:
    """Metrics for what happened between two snapshots, plus native build events (engine.native.build's). An
    autotuning mode's count of benchmarked selections is kept even at 0 (then its choices came from a cache)."""
    out = []
    for name, value in after.items():
        delta = value - before.get(name, 0)
        if delta or (autotunes and name == "cache_autotune_benchmarked"):
            out.append(Metric(name, float(delta), ""))
    seen: dict[str, dict] = {}
    for event in builds:  # one row per artifact: a miss anywhere in the phase is a miss
        prev = seen.get(event["name"])
        if prev is None or (prev["cache_hit"] and not event["cache_hit"]):
            seen[event["name"]] = event
    for name, event in seen.items():
        out.append(Metric(f"cache_{name}_hit", 1.0 if event["cache_hit"] else 0.0, ""))
        if not event["cache_hit"]:
            out.append(Metric(f"cache_{name}_build_s", float(event["seconds"]), "s"))
    return out


def _autotune_text(metrics: Mapping[str, float]) -> str:
    n = int(metrics["cache_autotune_benchmarked"])
    if n:
        return f"max-autotune: {n} GEMM selection{'s' if n != 1 else ''} benchmarked (not in the autotune cache)"
    if metrics.get("cache_fxgraph_hit", 0) and not metrics.get("cache_fxgraph_miss", 0):
        return "max-autotune: the tuned graph came from the FX graph cache (nothing benchmarked)"
    return "max-autotune: nothing benchmarked (no GEMM to tune here, or every choice from the autotune cache)"


def describe(metrics: Mapping[str, float]) -> str:
    """One line for a page: 'Inductor FX graph cache: 2 hits, 0 misses · AOTInductor .pt2 package: cached'.

    `metrics` maps metric name → value for one (run, phase, batch size); empty text when nothing was looked up.
    """
    parts = []
    for cache in ("fxgraph", "aotautograd"):
        hit, miss = metrics.get(f"cache_{cache}_hit", 0), metrics.get(f"cache_{cache}_miss", 0)
        bypass = metrics.get(f"cache_{cache}_bypass", 0)
        if hit or miss or bypass:
            text = (f"{LABELS[cache]}: {int(hit)} hit{'s' if hit != 1 else ''}, "
                    f"{int(miss)} miss{'es' if miss != 1 else ''}")
            parts.append(text + (f", {int(bypass)} bypassed" if bypass else ""))
    if "cache_autotune_benchmarked" in metrics:
        parts.append(_autotune_text(metrics))
    for name, value in sorted(metrics.items()):
        if name.startswith("cache_") and name.endswith("_hit") and name[6:-4] not in ("fxgraph", "aotautograd"):
            build = name[6:-4]
            label = LABELS.get(build, build.replace("_", " "))
            if value:
                parts.append(f"{label}: cached")
            else:
                seconds = metrics.get(f"cache_{build}_build_s")
                parts.append(f"{label}: built" + (f" ({seconds:.1f} s)" if seconds is not None else ""))
    return " · ".join(parts)
