"""engine.llm.run beside its group: a phased LLM worker moves Inductor's and Triton's compiles off the device and
keeps only Inductor's candidate timings alone (engine.measure.inductor_timing), as bench and levels workers do."""

from __future__ import annotations

import pytest

from engine.llm import run as llm_run
from engine.llm.config import LLMConfig
from engine.measure import inductor_timing
from engine.runner import device_lock as dl


@pytest.fixture(autouse=True)
def own_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    yield
    dl.end_phases()


@pytest.mark.parametrize("phased", [True, False])
def test_a_phased_llm_run_compiles_off_the_device(tmp_path, monkeypatch, phased: bool) -> None:
    installed: list[bool] = []
    monkeypatch.setattr(inductor_timing, "install", lambda: installed.append(True) or True)
    if phased:
        dl.begin_phases("cpu", group_size=2)
    cfg = LLMConfig(preset="tiny", mode="compile", device="cpu", ceilings="none", artifacts_dir=str(tmp_path))
    run = llm_run._start(cfg, lambda f, m: None, 0.0)
    assert (run.hold is not None) == phased
    assert installed == ([True] if phased else [])


def test_a_timed_run_lets_the_device_go_without_queueing_behind_the_next_timing() -> None:
    """After its timing a run only computes figures and writes files: it gives the device up at once, so it does not
    wait (holding its slot and memory) behind the group's next timing."""
    import threading
    import time
    from types import SimpleNamespace

    from engine.store.db import RunResult

    hold = dl.begin_phases("cpu", group_size=2)
    hold.exclusive()  # timing
    other = dl.PhaseHold("cpu", poll_s=0.002)
    taken = threading.Event()

    def next_timing() -> None:
        other.exclusive()
        taken.set()
        time.sleep(0.5)
        other.close()

    thread = threading.Thread(target=next_timing, daemon=True)
    thread.start()
    time.sleep(0.05)  # the next run queues for the device
    t0 = time.perf_counter()
    llm_run._give_device_up(SimpleNamespace(hold=hold, result=RunResult()))
    assert time.perf_counter() - t0 < 0.3 and hold.state is None
    assert taken.wait(2)
    thread.join(2)
