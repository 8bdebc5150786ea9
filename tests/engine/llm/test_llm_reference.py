"""A run's reference computed once per key and loaded by the other runs of its group (engine.llm.reference), on the
CPU with the tiny preset in bfloat16 (so the float32 twin calibrates the tolerance): the loading run builds no twin
and still checks its mode, a wrong mode still fails, a damaged or stale entry is recomputed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.llm import reference
from engine.llm import run as llm_run_module
from engine.llm.run import LLMConfig, llm_run
from engine.measure.checks import ToleranceError
from engine.store.db import RunResult
from tests.engine.llm.drift import drift_prefill


@pytest.fixture
def twins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The reference cache in this test's folder; the modes of the runs that calibrated (built a float32 twin)."""
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    built: list[str] = []
    real = llm_run_module.calibrate

    def calibrate(cfg, model, prompt, ref):
        built.append(cfg.mode)
        return real(cfg, model, prompt, ref)

    monkeypatch.setattr(llm_run_module, "calibrate", calibrate)
    return built


def cfg_for(mode: str, folder: Path, run_id: int, **kw) -> LLMConfig:
    return LLMConfig(**{**dict(preset="tiny", prompt_len=8, new_tokens=3, mode=mode, dtype="bfloat16",
                               prefill_iters=2, decode_passes=1, check_tokens=2, profile=False, ceilings="none",
                               artifacts_dir=str(folder / f"run_{run_id}")), **kw})


def metric(result: RunResult, name: str, phase: str | None = None) -> float:
    found = [m.value for m in result.metrics if m.name == name and m.phase == phase]
    assert found, f"no metric {name} ({phase})"
    return found[-1]


def reference_notes(result: RunResult) -> list[str]:
    return [n for n in result.notes if n.startswith("reference:")]


def test_the_second_run_of_a_key_loads_the_reference_and_still_checks_its_mode(twins, tmp_path: Path) -> None:
    first = llm_run(cfg_for("eager", tmp_path, 7))
    key = reference.key(cfg_for("eager", tmp_path, 7))
    assert twins == ["eager"]
    (note,) = reference_notes(first)
    assert note.startswith("reference: computed") and key in note
    assert metric(first, "reference_computed") == 1.0
    assert reference.path_of(cfg_for("eager", tmp_path, 7)).exists()

    second = llm_run(cfg_for("sdpa-math", tmp_path, 8))
    assert twins == ["eager"]  # no second twin
    assert reference_notes(second) == [f"reference: loaded from {key} (computed by run 7)"]
    assert metric(second, "reference_computed") == 0.0
    assert metric(second, "tokens_matched") == 3  # the prefill's and two decode steps' tokens, checked
    assert 0 < metric(second, "max_rel_err", "prefill") <= metric(second, "tolerance")
    for name in ("tolerance", "eager_fp32_rel_err", "cache_vs_recompute_rel_err"):
        assert metric(second, name) == metric(first, name)

    # eager that loads the reference is compared with it like any mode
    again = llm_run(cfg_for("eager", tmp_path, 9))
    assert twins == ["eager"] and metric(again, "tokens_matched") == 3
    assert metric(again, "max_rel_err", "prefill") == 0.0  # the same eager on the same device


def test_another_seed_shape_or_depth_is_another_key(twins, tmp_path: Path) -> None:
    base = cfg_for("eager", tmp_path, 1)
    assert reference.key(base) == reference.key(cfg_for("sdpa-math", tmp_path, 2))  # the mode is no part of it
    for change in ({"seed": 1}, {"prompt_len": 9}, {"batch": 2}, {"layers": 1}, {"dtype": "float32"},
                   {"new_tokens": 40}, {"check_tokens": 1}, {"fuse": False}):
        assert reference.key(cfg_for("eager", tmp_path, 1, **change)) != reference.key(base), change


def test_the_code_that_computes_it_is_part_of_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = reference.key(cfg_for("eager", tmp_path, 1))
    monkeypatch.setattr(reference, "SOURCES", (*reference.SOURCES, "engine.llm.quant"))
    reference.code_hash.cache_clear()
    try:
        assert reference.key(cfg_for("eager", tmp_path, 1)) != base
    finally:
        reference.code_hash.cache_clear()


def test_a_mode_off_tolerance_still_fails_against_a_loaded_reference(twins, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    llm_run(cfg_for("eager", tmp_path, 1))
    drift_prefill(monkeypatch, 1.1)
    with pytest.raises(ToleranceError, match="sdpa-math: prefill logits differ from eager's"):
        llm_run(cfg_for("sdpa-math", tmp_path, 2))
    assert twins == ["eager"]  # it failed against the loaded reference, not a fresh one


@pytest.mark.parametrize("damage", ["garbage", "short", "missing", "nan", "other key"])
def test_a_damaged_entry_is_recomputed(twins, tmp_path: Path, damage: str) -> None:
    cfg = cfg_for("eager", tmp_path, 1)
    llm_run(cfg)
    path = reference.path_of(cfg)
    if damage == "garbage":
        path.write_bytes(b"not a torch file")
    else:
        saved = torch.load(path, weights_only=True)
        if damage == "short":
            saved["logits"] = saved["logits"][:-1]
        elif damage == "missing":
            del saved["cache_err"]
        elif damage == "nan":
            saved["fp32_logits"][0, 0, 0] = float("nan")
        else:
            saved["fields"] = {**saved["fields"], "seed": 5}
        torch.save(saved, path)
    assert reference.load(cfg)[0] is None
    result = llm_run(cfg_for("sdpa-math", tmp_path, 2))
    assert twins == ["eager", "sdpa-math"]
    (note,) = reference_notes(result)
    assert note.startswith("reference: computed") and "the stored one was not used" in note
    assert metric(result, "reference_computed") == 1.0
    assert reference.load(cfg)[0] is not None  # stored again, whole


def test_an_entry_its_model_disagrees_with_is_recomputed(twins, tmp_path: Path) -> None:
    """A stored reference whose prefill logits are not this model's (the model or eager changed under the same
    key) is recomputed before any mode is checked against it."""
    cfg = cfg_for("eager", tmp_path, 1)
    llm_run(cfg)
    path = reference.path_of(cfg)
    saved = torch.load(path, weights_only=True)
    saved["logits"] = saved["logits"] * 1.5
    torch.save(saved, path)
    assert reference.load(cfg)[0] is not None  # well formed: only the model's own prefill shows it is stale
    result = llm_run(cfg_for("sdpa-math", tmp_path, 2))
    assert twins == ["eager", "sdpa-math"]
    assert "disagrees with this model's eager prefill" in reference_notes(result)[0]


def test_one_claim_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second claim of the key waits for the first (a thread here; another run's process in a group)."""
    import threading

    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    cfg = cfg_for("eager", tmp_path, 1)
    waited: list[str] = []
    order: list[str] = []
    with reference.Claim(cfg, "run 1") as first:
        first.acquire()
        second = reference.Claim(cfg, "run 2")
        thread = threading.Thread(target=lambda: (second.acquire(waited.append), order.append("second")))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and waited == ["run 1"]
        order.append("first done")
    thread.join(5)
    assert order == ["first done", "second"] and second.held
    second.release()


def test_a_group_preparing_side_by_side_computes_one_reference(store, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes of one group start together: one claims the key and computes, the other waits for the
    claim and loads what it stored; both pass their checks."""
    from engine.llm.run import params_of
    from engine.runner.jobs import JobSpec, create_runs, run_jobs

    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))  # the workers inherit it
    specs = [JobSpec("llm", "llama-tiny", m, "cpu", params_of(cfg_for(m, tmp_path, 0, artifacts_dir=None)))
             for m in ("eager", "sdpa-math")]
    ids = create_runs(store, specs)
    assert run_jobs(store, ids, prepare_parallel=2) == {i: "ok" for i in ids}
    notes = {i: [n for n in store.run(i)["notes"] if n.startswith("reference:")] for i in ids}
    computed = [i for i in ids if notes[i][0].startswith("reference: computed")]
    assert len(computed) == 1, notes
    (loaded,) = set(ids) - set(computed)
    key = reference.key(cfg_for("eager", tmp_path, 0))
    assert notes[loaded] == [f"reference: loaded from {key} (computed by run {computed[0]})"]
    flags = store.metrics(ids).query("name == 'reference_computed'").set_index("run_id")["value"]
    assert flags.to_dict() == {computed[0]: 1.0, loaded: 0.0}
