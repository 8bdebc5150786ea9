"""A job target that injects a wrong level (its output is scaled by 1.01) and runs it like any level: the run must
fail with the correctness error, never be timed."""

from __future__ import annotations

from engine.levels import LEVELS
from engine.levels.base import Built, Level
from engine.levels.run import levels_job


def _wrong(component, shape, naive, device):
    return Built(fn=lambda *inputs: naive(*inputs) * 1.01)


def wrong_level_job(params: dict, progress):
    LEVELS["L9-wrong"] = Level("L9-wrong", 9, "wrong on purpose", "scales the right answer by 1.01", _wrong)
    return levels_job({**params, "level": "L9-wrong"}, progress)
