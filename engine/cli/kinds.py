"""Every run kind of the lab, registered with the runner (engine.runner.kinds) by importing the module where its
feature registers it. Light (no torch at import): the CLI imports it at start, and so does the dashboard
(app/common.py). The IR's kind registers with engine.ir.runs, which creates every IR run."""

from __future__ import annotations

from engine.bench.kind import KIND as BENCH
from engine.housing.kind import KIND as TRAIN
from engine.levels.kind import KIND as LEVELS
from engine.llm.kind import KIND as LLM
from engine.measure.ceilings import KIND as CEILINGS
from engine.profiling.kind import KIND as PROFILE

KINDS = (BENCH, TRAIN, PROFILE, CEILINGS, LEVELS, LLM)
