"""`levels --component all --level all --device cpu`: every level of every component runs as one group (runs prepare
side by side, forked by a fork server) and each run passes. The L4-triton runs need Triton's interpreter, which is
switched on when Triton is first imported; beside a group the worker imports Triton (through dynamo) before it builds
the level, so the switch must come first (engine.levels.run.run_level)."""

from __future__ import annotations

import subprocess
import sys

from engine.levels import COMPONENTS, resolve_levels
from engine.store.db import Store


def test_every_level_of_every_component_runs_in_one_cpu_group(child_env: dict[str, str], store: Store) -> None:
    ran = subprocess.run([sys.executable, "-m", "engine", "levels", "--component", "all", "--level", "all",
                          "--device", "cpu", "--iters", "1", "--warmup", "0", "--prepare-parallel", "2"],
                         capture_output=True, text=True, env=child_env, timeout=900)
    levels = store.runs(kind="levels")
    failed = {f"{r['workload']} {r['mode']}": str(r["error"])[:400] for r in levels.to_dict("records")
              if r["status"] != "ok"}
    assert ran.returncode == 0 and not failed, (failed, ran.stderr[-2000:])
    shapes = sum(1 for c in COMPONENTS.values() for s in c.shapes.values() if s.runs_on("cpu"))
    assert len(levels) == shapes * len(resolve_levels("all", "cpu")[0])
    assert set(levels["mode"]) >= {"L1-naive", "L3-compile", "L4-triton"}
