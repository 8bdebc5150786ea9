"""Every execution mode benchmarked in-process on CPU, checked against eager, and a wrong mode caught."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from engine.bench.run import BenchConfig, bench_mode
from engine.measure.checks import ToleranceError
from engine.measure.timing import summarize
from engine.modes import MODES, Mode, Prepared, get_mode, register, resolve_modes
from engine.store.db import RunResult

ITERS = 3
INFER_B, TRAIN_B = 4, 8
STAT_NAMES = {"median", "p10", "p90", "p25", "p75", "iqr", "mean", "std", "min", "max"}
CPU_MODES = ["eager", "fx", "torchscript", "compile", "compile-max-autotune"]


def bench(mode: str, **kw) -> tuple[RunResult, list[tuple[float, str]]]:
    events: list[tuple[float, str]] = []
    cfg = BenchConfig(mode=mode, batch_sizes=(INFER_B,), train_batch_sizes=(TRAIN_B,), warmup=1, iters=ITERS, **kw)
    return bench_mode(cfg, lambda frac, msg: events.append((frac, msg))), events


def metric(result: RunResult, name: str, phase: str) -> float:
    found = [m.value for m in result.metrics if m.name == name and m.phase == phase]
    assert len(found) == 1, f"{name}/{phase}: {found}"
    return found[0]


def check_matches_eager(result: RunResult, events: list[tuple[float, str]]) -> None:
    points = {("infer", INFER_B), ("train", TRAIN_B)}
    assert {(s.phase, s.batch_size) for s in result.samples} == points
    for s in result.samples:
        assert len(s.values) == ITERS and s.unit == "us" and all(v > 0 for v in s.values)
        stats = summarize(s.values)
        assert metric(result, "median", s.phase) == pytest.approx(stats.median)
        assert metric(result, "p90", s.phase) == pytest.approx(stats.p90)
        assert metric(result, "throughput", s.phase) == pytest.approx(s.batch_size / (stats.median * 1e-6))
    for phase, batch in points:
        names = {m.name for m in result.metrics if m.phase == phase}
        assert STAT_NAMES | {"first_call", "max_abs_err", "max_rel_err", "throughput"} <= names
        assert {m.batch_size for m in result.metrics if m.phase == phase} == {batch}
        assert 0 <= metric(result, "max_abs_err", phase) <= 1e-4
        assert metric(result, "first_call", phase) > 0
    fracs = [f for f, _ in events]
    assert fracs == sorted(fracs) and events[-1] == (1.0, "done")
    assert result.env["torch"] == torch.__version__ and result.env["device_name"].startswith("CPU")


@pytest.mark.parametrize("mode", ["eager", "fx", "torchscript"])
def test_mode_matches_eager(mode):
    result, events = bench(mode)
    check_matches_eager(result, events)
    assert not any(m.name in ("recompiles", "graph_breaks") for m in result.metrics)  # not a compiling mode
    assert result.artifacts == []  # nothing is written without an artifacts_dir


def test_fx_writes_its_graph(tmp_path):
    result, events = bench("fx", artifacts_dir=str(tmp_path / "run"))
    check_matches_eager(result, events)
    artifacts = {a.name: Path(a.path) for a in result.artifacts}
    assert set(artifacts) == {"fx_graph.py", "fx_graph_table.txt"}  # once, though both phases traced it
    code = artifacts["fx_graph.py"].read_text()
    assert "def forward" in code and "fc1" in code and "fc3" in code
    table = artifacts["fx_graph_table.txt"].read_text().splitlines()
    assert table[0].split() == ["opcode", "name", "target", "args", "kwargs"]
    assert sum("call_module" in line for line in table) == 5  # fc1 relu1 fc2 relu2 fc3
    assert table[2].startswith("placeholder") and table[-1].startswith("output")


def test_torchscript_notes_its_deprecation_once(tmp_path):
    result, _ = bench("torchscript", artifacts_dir=str(tmp_path))
    assert len(result.notes) == len(set(result.notes))
    assert sum("deprecated" in n.lower() for n in result.notes) <= 1
    assert {a.name for a in result.artifacts} == {"torchscript_graph.txt", "torchscript_code.py"}
    graph = (tmp_path / "torchscript_graph.txt").read_text()
    assert graph.startswith("graph(") and "fc1" in graph


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compile", "compile-max-autotune"])
def test_compile_mode_matches_eager_without_recompiles(mode):
    result, events = bench(mode)
    check_matches_eager(result, events)
    for phase in ("infer", "train"):
        assert metric(result, "recompiles", phase) == 0
        assert metric(result, "graph_breaks", phase) == 0
        assert metric(result, "graphs_compiled", phase) >= 1


def test_reduce_overhead_is_unavailable_on_cpu_with_a_reason():
    ok, reason = get_mode("compile-reduce-overhead").available("cpu")
    assert not ok and "CUDA" in reason
    with pytest.raises(RuntimeError, match="compile-reduce-overhead is not available on cpu: .*CUDA"):
        bench("compile-reduce-overhead")
    chosen, skipped = resolve_modes("all", "cpu")
    assert [m.name for m in chosen if m.name in CPU_MODES] == CPU_MODES  # later modes may join the list
    assert "compile-reduce-overhead" in skipped and not set(CPU_MODES) & set(skipped)


def test_mode_registry():
    assert list(MODES)[:6] == ["eager", "fx", "torchscript", "compile", "compile-reduce-overhead",
                               "compile-max-autotune"]
    with pytest.raises(ValueError, match="unknown mode 'nope'; known modes: eager, fx"):
        get_mode("nope")
    with pytest.raises(ValueError, match="already registered"):
        register(MODES["eager"])
    with pytest.raises(ValueError, match="no mode given"):
        resolve_modes(" , ", "cpu")
    assert [m.name for m in resolve_modes("fx, eager", "cpu")[0]] == ["fx", "eager"]


def test_unknown_workload_and_empty_plan():
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        bench_mode(BenchConfig(workload="nope"))
    with pytest.raises(ValueError, match="nothing to benchmark"):
        bench_mode(BenchConfig(phases=()))


@contextmanager
def temporary_mode(name: str, wrap) -> Iterator[str]:
    """Register a mode whose function is wrap(model), and always take it out of the registry again."""
    register(Mode(name=name, description="a deliberately wrong mode (test)",
                  prepare=lambda model, inputs, train: Prepared(fn=wrap(model))))
    try:
        yield name
    finally:
        MODES.pop(name, None)


def test_wrong_mode_fails_inference_check():
    with temporary_mode("test-offset", lambda model: (lambda x: model(x) + 1e-2)) as name:
        with pytest.raises(ToleranceError, match=r"test-offset inference at batch 4: differs from eager "
                                                 r"\(max abs err 0\.01"):
            bench(name)
    assert "test-offset" not in MODES


def test_wrong_mode_fails_training_check():
    with temporary_mode("test-offset-train", lambda model: (lambda x: model(x) + 1e-2)) as name:
        with pytest.raises(ToleranceError, match="test-offset-train training step at batch 8"):
            bench(name, phases=("train",))
    assert "test-offset-train" not in MODES


def test_mode_with_nan_or_wrong_shape_fails():
    with temporary_mode("test-nan", lambda model: (lambda x: model(x) * float("nan"))) as name:
        with pytest.raises(ToleranceError, match="output has NaN or inf"):
            bench(name, phases=("infer",))
    with temporary_mode("test-shape", lambda model: (lambda x: model(x)[:1])) as name:
        with pytest.raises(ToleranceError, match=r"shape \(1, 1\) differs from eager's \(4, 1\)"):
            bench(name, phases=("infer",))
    assert not {"test-nan", "test-shape"} & set(MODES)
