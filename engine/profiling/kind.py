"""The `profile` run kind, registered with the runner (engine.runner.kinds): its worker runs
engine.profiling.profile:profile_job, holding the device from start to end. Light (no torch): the CLI and the
dashboard import it at start."""

from __future__ import annotations

from engine.runner.kinds import RunKind, register

KIND = register(RunKind("profile", "engine.profiling.profile:profile_job"))
