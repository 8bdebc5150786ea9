"""The `llm` run kind, registered with the runner (engine.runner.kinds): its worker runs engine.llm.run:llm_job and
marks its timed sections, so a group prepares side by side as engine.llm.group plans it (device memory decides how
many at once) and times one at a time. Light (no torch): the CLI and the dashboard import it at start."""

from __future__ import annotations

from engine.runner.kinds import RunKind, register

KIND = register(RunKind(
    "llm", "engine.llm.run:llm_job", phased=True, planner="engine.llm.group:plan_group",
    group_start=("engine.measure.ceilings:ensure_for_group", "engine.native.prebuild:start_for_group"),
    plural="LLM runs"))
