"""The `bench` run kind, registered with the runner (engine.runner.kinds): its worker runs engine.bench.run:bench_job
and marks its timed sections, so a group of modes prepares side by side and times one at a time. Light (no torch):
the CLI and the dashboard import it at start."""

from __future__ import annotations

from engine.runner.kinds import RunKind, register


def prepare_cost(mode: str) -> int:
    """A rough rank of how long a bench run of `mode` takes to prepare, so a group starts the slow first: native
    builds and autotuning (3), compiles (2), the rest (1)."""
    if mode in ("cuda", "aoti", "custom_op") or "max-autotune" in mode:
        return 3
    if mode.startswith("compile") or mode == "triton":
        return 2
    return 1


KIND = register(RunKind(
    "bench", "engine.bench.run:bench_job", phased=True,
    group_start=("engine.measure.ceilings:ensure_for_group", "engine.native.prebuild:start_for_group"),
    prepare_cost=prepare_cost))
