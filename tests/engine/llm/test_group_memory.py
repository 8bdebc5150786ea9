"""Device-memory admission for LLM groups, on fake devices: runs prepare side by side only while their needs fit,
every run still runs, measured peaks replace estimates, and a run too big alone is refused with its bytes."""

from __future__ import annotations

import pytest
import torch

from engine.llm import group, reference
from engine.llm.generate import Generation
from engine.llm.group import MemoryNeed, estimate, held_at_most, plan_group, prepare_slots
from engine.llm.modes import MODES as ALL_MODES
from engine.llm.run import LLMConfig, params_of
from engine.llm.verify import Calibration
from engine.runner.jobs import JobSpec, create_runs
from engine.store.db import Metric, RunResult, Store

GiB = 2**30
MODES = ("eager", "compile", "triton-fused", "int8-wo", "triton-int8-wo", "triton-int4-wo")


@pytest.fixture(autouse=True)
def reference_cache(tmp_path, monkeypatch) -> None:
    """The reference cache in this test's folder; the fake GPU's name (the key names the device)."""
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setattr(reference, "device_name", lambda device: "fake GPU")


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
    slots, order, why, *admission = plan_group(store, ids)
    assert order == [ids[0]]
    refused = store.run(ids[1])
    assert refused["status"] == "failed"
    assert "needs" in refused["error"] and "GiB of device memory alone" in refused["error"]
    assert "30.0 GiB free" in refused["error"]


def test_memory_need_most() -> None:
    assert MemoryNeed(5, 7, "estimate").most == 7


def test_without_the_twin_a_run_needs_its_model_caches_and_workspaces() -> None:
    for cfg in cfgs("7B"):
        twin, own = estimate(cfg), estimate(cfg, twin=False)
        assert own.timed == twin.timed  # timing never holds the twin
        assert own.prepare < 0.55 * twin.prepare  # the float32 twin is twice the bf16 model, and its cache
        assert own.prepare > 2 * 6.7e9  # the model itself at least
    fp32 = LLMConfig(preset="7B", mode="eager", device="cuda", dtype="float32")
    assert estimate(fp32, twin=False) == estimate(fp32)  # a float32 run calibrates without a twin


def test_held_at_most_counts_each_computing_run_once() -> None:
    small = [MemoryNeed(20, 10, "estimate")] * 4
    assert held_at_most(1, small, [MemoryNeed(60, 10, "estimate")]) == 60
    assert held_at_most(3, small, [MemoryNeed(60, 10, "estimate")]) == 100
    assert held_at_most(3, small, [MemoryNeed(60, 10, "estimate"), MemoryNeed(50, 10, "estimate")]) == 130
    assert held_at_most(3, small, []) == held_at_most(3, small, None) == 60


def queue_all_modes(store: Store, preset: str = "7B") -> list[int]:
    runs = [LLMConfig(preset=preset, mode=m, device="cuda", prompt_len=512, new_tokens=128) for m in ALL_MODES
            if not m.startswith("transformers-")]
    return create_runs(store, [JobSpec("llm", f"llama-{preset}", c.mode, "cuda", params_of(c)) for c in runs])


def test_only_the_run_computing_the_reference_is_planned_with_the_twin(store: Store, monkeypatch) -> None:
    """`llm --preset 7B --mode all` on an H200: one twin for the group, the others admitted at their own needs."""
    fake_device(monkeypatch, 139)
    ids = queue_all_modes(store)
    slots, order, why, *admission = plan_group(store, ids)
    runs = [store.run(i) for i in order]
    with_twin = [group.need_of(store, r) for r in runs]
    without = [group.need_of(store, r, False) for r in runs]
    usable = group.MEMORY_MARGIN * 139 * GiB
    assert held_at_most(slots, without, [max(with_twin, key=lambda n: n.most)]) <= usable
    assert held_at_most(slots + 1, without, [max(with_twin, key=lambda n: n.most)]) > usable  # as many as fit
    assert slots > int(usable // max(n.most for n in with_twin)) == 2  # every run with a twin: two at a time
    assert "for the run computing the reference" in why and "float32 twin" in why


def test_a_stored_reference_leaves_the_twin_out_of_the_plan(store: Store, monkeypatch) -> None:
    fake_device(monkeypatch, 139)
    ids = queue_all_modes(store)
    cfg = LLMConfig(preset="7B", mode="eager", device="cuda", prompt_len=512, new_tokens=128)
    computing, *_ = plan_group(store, ids)
    s, k, vocab = reference.steps(cfg), reference.check_steps(cfg), cfg.model_config().vocab
    reference.save(cfg, reference.Reference(
        Generation(torch.zeros(1, s + 1, dtype=torch.long), [torch.zeros(1, vocab)] * (s + 1)),
        Calibration(0.01, 0.002, [torch.zeros(1, vocab)] * (k + 1)), 0.001, "", run_id=1))
    assert reference.cached(cfg)
    slots, order, why, *admission = plan_group(store, ids)
    assert slots > computing and "the reference is stored: no float32 twin" in why
    assert "up to 0." not in why  # the needs are GiB of a 7B model


def test_the_cheap_modes_start_first_eager_at_the_head(store: Store, monkeypatch) -> None:
    fake_device(monkeypatch, 139)
    ids = queue_all_modes(store)
    _, order, *_ = plan_group(store, ids)
    modes = [store.run(i)["mode"] for i in order]
    assert modes[0] == "eager"
    compiling = [ALL_MODES[m].compiles for m in modes]
    assert compiling == sorted(compiling)  # every mode that compiles nothing before every one that does
    assert sorted(order) == sorted(ids)


def test_measured_peaks_are_taken_from_runs_that_computed_or_loaded_alike(store: Store, monkeypatch) -> None:
    fake_device(monkeypatch, 139)
    cfg = cfgs("7B")[2]
    spec = JobSpec("llm", "llama-7B", cfg.mode, "cuda", params_of(cfg))
    done = {}
    for name, prepare, computed in (("old", 70.0, None), ("computed", 66.0, 1.0), ("loaded", 14.0, 0.0)):
        (done[name],) = create_runs(store, [spec])
        store.start_run(done[name])
        metrics = [Metric("prepare_peak_bytes", prepare * GiB, "B"), Metric("peak_memory_bytes", 13.0 * GiB, "B")]
        if computed is not None:
            metrics.append(Metric("reference_computed", computed, ""))
        store.record_result(done[name], RunResult(metrics=metrics))
    (queued,) = create_runs(store, [spec])
    assert group.need_of(store, store.run(queued), False) == MemoryNeed(
        int(1.1 * 14 * GiB) + GiB, int(1.1 * 13 * GiB) + GiB, f"measured in run {done['loaded']}")
    assert group.need_of(store, store.run(queued)).source == f"measured in run {done['computed']}"
    store.fail_run(done["computed"], "gone")  # the newest that computed is not ok: one stored without the metric
    assert group.need_of(store, store.run(queued)).source == f"measured in run {done['old']}"


def test_a_16_core_gpu_machine_admits_runs_by_their_own_needs(store: Store, monkeypatch) -> None:
    """`llm --preset 7B --mode all` on a 16-core H200: up to 6 lanes, each run weighed by its own need (one float32
    twin for the group, on the first run of its key), within 90 % of the free memory (engine.runner.jobs admits)."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    fake_device(monkeypatch, 139)
    ids = queue_all_modes(store)
    slots, order, why, (weights, budget) = plan_group(store, ids)
    assert slots == 6 and sorted(weights) == sorted(order) and budget == int(group.MEMORY_MARGIN * 139 * GiB)
    runs = {i: store.run(i) for i in order}
    twin = group.need_of(store, runs[order[0]]).most
    assert weights[order[0]] == twin  # eager, first: the one that computes the reference
    assert all(weights[i] == group.need_of(store, runs[i], False).most for i in order[1:])
    assert why.startswith("3–6 at a time as their memory fits (139 GiB free")
    serial_like = plan_group(store, ids, serial=True)
    assert serial_like[:1] == (1,) and len(serial_like) == 3  # one at a time: nothing to admit


@pytest.mark.parametrize("device, index", [("cuda", 3), ("cuda:1", 1)])
def test_the_device_memory_cap_passes_the_allocator_an_index(
        monkeypatch: pytest.MonkeyPatch, device: str, index: int) -> None:
    """torch's per-process fraction takes an index, not a bare "cuda": --device-memory on "cuda" means the current
    device, and the fraction is the cap over that device's total memory."""
    from engine.llm import config as llm_config

    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: calls.append(("info", i)) or (0, 160 * GiB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, i: calls.append(("fraction", round(fraction, 3), i)))
    llm_config.cap_device_memory(llm_config.LLMConfig(device=device, device_memory=80 * GiB))
    assert calls == [("info", index), ("fraction", 0.5, index)]
