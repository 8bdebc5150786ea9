"""Triton's interpreter switched on where the module is imported: a CPU levels lane's fork server imports it first
(engine.levels.kind.preload), before its preload imports Triton through dynamo, so every worker it forks starts with
Triton, dynamo and Inductor imported and its L4-triton runs still interpret (engine.levels.base.use_triton_interpreter
sets the same switch in a worker started afresh). No torch here: importing it sets the variable and nothing else."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
