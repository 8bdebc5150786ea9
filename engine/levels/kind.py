"""The `levels` run kind, registered with the runner (engine.runner.kinds): its worker runs
engine.levels.run:levels_job and marks its timed sections, so a group of levels prepares side by side and times one at
a time. Light (no torch; engine/levels/__init__.py loads its catalogue on first use): the CLI and the dashboard import
it at start."""

from __future__ import annotations

from engine.runner.kinds import RunKind, register

# How long each level takes to prepare, roughly: the CUDA build (3), compiles (2); the rest 1. A group starts the slow
# first.
PREPARE_COST = {"L5-cuda": 3, "L3-compile": 2, "L4-triton": 2}


def prepare_cost(level: str) -> int:
    return PREPARE_COST.get(level, 1)


def preload(device: str) -> tuple[str, ...] | None:
    """What a lane's fork server may import for levels on `device`. Off CUDA Triton runs in its interpreter, a switch
    read when Triton is first imported (dynamo and Inductor import it): the server imports engine.levels.interpreter,
    which sets it, right after torch and before the default's dynamo, Inductor and Triton, so a worker starts with
    them imported (each would otherwise spend seconds importing them). On CUDA the default."""
    if device.startswith("cuda"):
        return None
    from engine.runner.jobs import default_preload

    first, *rest = default_preload()
    return (first, "engine.levels.interpreter", *rest)


KIND = register(RunKind(
    "levels", "engine.levels.run:levels_job", phased=True,
    group_start=("engine.measure.ceilings:ensure_for_group", "engine.native.prebuild:start_for_group"),
    preload=preload, prepare_cost=prepare_cost))
