"""Device-memory admission for LLM groups, on fake devices: runs prepare side by side only while their needs fit,
every run still runs, measured peaks replace estimates, and a run too big alone is refused with its bytes."""

from __future__ import annotations

import pytest

from engine.llm import group
from engine.llm.group import MemoryNeed, estimate, plan_group, prepare_slots
from engine.llm.run import LLMConfig, params_of
from engine.runner.jobs import JobSpec, create_runs
from engine.store.db import Metric, RunResult, Store

GiB = 2**30
MODES = ("eager", "compile", "triton-fused", "int8-wo", "triton-int8-wo", "triton-int4-wo")


def fake_device(monkeypatch, free_gib: float, total_gib: float = 141.0) -> None:
    def budget(cfg):
        free, total = int(free_gib * GiB), int(total_gib * GiB)
        if cfg.device_memory:
            used = total - free
            return max(0, min(free, cfg.device_memory - used)), min(total, cfg.device_memory), " (capped)"
        return free, total, ""

    monkeypatch.setattr(group, "device_budget", budget)


def cfgs(preset: str, **kw) -> list[LLMConfig]:
    return [LLMConfig(preset=preset, mode=m, device="cuda", prompt_len=512, new_tokens=128, **kw) for m in MODES]


def test_the_estimate_counts_the_twin_and_the_workspaces() -> None:
    bf16, int8 = (estimate(c) for c in cfgs("7B")[2:4])
    weights = 2 * 6.7e9
    assert 60 * GiB < bf16.prepare < 70 * GiB  # model + float32 twin (and its fused copies) + caches + process
    assert bf16.timed < bf16.prepare and int8.prepare >= bf16.prepare - weights / 4
    assert estimate(cfgs("7B")[0]).timed < bf16.timed  # eager has no compile workspace


@pytest.mark.parametrize("free_gib, cap", [(139, None), (139, 80 * 10**9), (60, None), (20, None)])
def test_side_by_side_never_over_the_memory_the_lab_may_use(monkeypatch, free_gib, cap) -> None:
    fake_device(monkeypatch, free_gib)
    runs = cfgs("7B", device_memory=cap)
    needs = [estimate(c) for c in runs]
    slots, why = prepare_slots("auto", runs, serial=False, needs=needs)
    free = group.device_budget(runs[0])[0]
    assert slots >= 1
    assert slots == 1 or slots * max(n.most for n in needs) <= group.MEMORY_MARGIN * free, why
    # a requested count is held to the memory too
    assert prepare_slots(6, runs, serial=False, needs=needs)[0] == slots or slots == 6


def test_a_three_run_7b_group_on_141gb_never_prepares_three_at_once(monkeypatch) -> None:
    """Three 7B preparations at once ran out of memory on an H200 (62 + 50 + 27 GiB held)."""
    fake_device(monkeypatch, 139)
    runs = [c for c in cfgs("7B") if c.mode in ("triton-fused", "triton-int8-wo", "triton-int4-wo")]
    slots, why = prepare_slots("auto", runs, serial=False)
    assert slots < 3 and "GiB" in why
    small = [c for c in cfgs("1B") if c.mode in ("triton-fused", "triton-int8-wo", "triton-int4-wo")]
    assert prepare_slots("auto", small, serial=False)[0] == 3  # a 1B group still prepares side by side


def test_measured_peaks_replace_the_estimate(store: Store, monkeypatch) -> None:
    fake_device(monkeypatch, 139)
    cfg = cfgs("7B")[2]
    (done,) = create_runs(store, [JobSpec("llm", "llama-7B", cfg.mode, "cuda", params_of(cfg))])
    store.start_run(done)
    store.record_result(done, RunResult(metrics=[Metric("prepare_peak_bytes", 20.0 * GiB, "B"),
                                                 Metric("peak_memory_bytes", 15.0 * GiB, "B")]))
    (queued,) = create_runs(store, [JobSpec("llm", "llama-7B", cfg.mode, "cuda", params_of(cfg))])
    need = group.need_of(store, store.run(queued))
    assert need.source == f"measured in run {done}"
    assert need.prepare == int(1.1 * 20 * GiB) + GiB
    other = LLMConfig(**{**params_of(cfg), "batch": 8})  # another shape: the estimate
    (shape,) = create_runs(store, [JobSpec("llm", "llama-7B", cfg.mode, "cuda", params_of(other))])
    assert group.need_of(store, store.run(shape)).source == "estimate"


def test_a_run_too_big_alone_is_refused_with_its_bytes_and_the_rest_run(store: Store, monkeypatch) -> None:
    fake_device(monkeypatch, 30)
    small = LLMConfig(preset="1B", mode="triton-fused", device="cuda", prompt_len=512, new_tokens=128)
    big = LLMConfig(preset="7B", mode="triton-fused", device="cuda", prompt_len=512, new_tokens=128)
    ids = create_runs(store, [JobSpec("llm", "llama-1B", "triton-fused", "cuda", params_of(small)),
                              JobSpec("llm", "llama-7B", "triton-fused", "cuda", params_of(big))])
    slots, order, why = plan_group(store, ids)
    assert order == [ids[0]]
    refused = store.run(ids[1])
    assert refused["status"] == "failed"
    assert "needs" in refused["error"] and "GiB of device memory alone" in refused["error"]
    assert "30.0 GiB free" in refused["error"]


def test_memory_need_most() -> None:
    assert MemoryNeed(5, 7, "estimate").most == 7
