"""engine.runner.device_lock: shared holds coexist, an exclusive one excludes everything else, `exclusive()` switches a
phased worker for its block and passes straight through elsewhere; phased supervision (engine.runner.jobs.run_jobs with
prepare_parallel) overlaps preparations and never timings."""

from __future__ import annotations

import threading
import time

import pytest

from engine.runner import device_lock as dl
from engine.runner.jobs import JobSpec, create_runs, run_jobs
from engine.store.db import Store


@pytest.fixture(autouse=True)
def own_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELAB_LOCK_DIR", str(tmp_path / "locks"))
    yield
    dl.end_phases()


def test_shared_holds_coexist_and_exclusive_waits_for_all_of_them():
    a, b, c = dl.PhaseHold("cpu", poll_s=0.01), dl.PhaseHold("cpu", poll_s=0.01), dl.PhaseHold("cpu", poll_s=0.01)
    a.shared()
    b.shared()
    assert a.waited_s < 0.05 and b.waited_s < 0.05  # the second shared hold did not wait for the first
    got = threading.Event()

    def take() -> None:
        c.exclusive()
        got.set()

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.2)
    assert not got.is_set(), "exclusive granted while two shared holds were out"
    a.release()
    time.sleep(0.2)
    assert not got.is_set(), "exclusive granted while one shared hold was out"
    b.release()
    thread.join(5)
    assert got.is_set() and c.state == "exclusive" and c.waited_s >= 0.35
    # ...and while it is exclusive, a shared hold waits for it
    waiting = threading.Thread(target=a.shared)
    waiting.start()
    time.sleep(0.15)
    assert a.state is None
    c.release()
    waiting.join(5)
    assert a.state == "shared"
    for hold in (a, b, c):
        hold.close()


def test_device_lock_waits_for_a_shared_hold_and_names_no_stale_holder():
    hold = dl.PhaseHold("cpu", poll_s=0.01)
    hold.exclusive()  # labels the lock file "pid … (timing)"...
    hold.shared()  # ...and clears the label when it goes back to preparing
    messages: list[str] = []
    done = threading.Event()

    def take() -> None:
        with dl.device_lock("cpu", on_wait=messages.append, poll_s=0.01):
            done.set()

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.2)
    assert not done.is_set()
    hold.close()
    thread.join(5)
    assert done.is_set() and messages == ["waiting for cpu: held by other runs (preparing)"]


def test_exclusive_block_is_a_no_op_in_an_ordinary_worker():
    assert dl.current() is None
    with dl.exclusive():
        other = dl.PhaseHold("cpu", poll_s=0.01)
        other.exclusive()  # nothing was taken by the block: the device is free
        assert other.state == "exclusive"
        other.close()


def test_exclusive_block_switches_a_phased_worker_and_back():
    hold = dl.begin_phases("cpu", group_size=3)
    assert dl.current() is hold and hold.state == "shared" and hold.group_size == 3
    with dl.exclusive():
        assert hold.state == "exclusive"
        with dl.exclusive():  # nested: stays exclusive, no second switch
            assert hold.state == "exclusive"
        assert hold.state == "exclusive"
        time.sleep(0.05)
    assert hold.state == "shared" and hold.exclusive_s >= 0.05
    with dl.exclusive(final=True):  # the run's last timing: afterwards it holds nothing, waits for nothing
        assert hold.state == "exclusive"
    assert hold.state is None
    dl.end_phases()
    assert dl.current() is None


def _interval(metrics, prefix):
    return metrics[f"{prefix}_start"], metrics[f"{prefix}_end"]


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_phased_runs_prepare_together_and_time_one_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    store = Store(tmp_path / "results.duckdb")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    specs = [JobSpec("llm", "phased", f"m{i}", "cpu", {"prepare_s": 0.3, "timed_s": 0.4, "group": 3,
                                                       "barrier_dir": str(barrier)},
                     target="tests.engine.runner.phased_target:run", timeout_s=120) for i in range(3)]
    ids = create_runs(store, specs)
    statuses = run_jobs(store, ids, prepare_parallel=3)
    assert statuses == {i: "ok" for i in ids}, [store.run(i)["error"] for i in ids]
    metrics = store.metrics(ids)
    runs = [metrics[metrics.run_id == i].set_index("name")["value"].to_dict() for i in ids]
    assert all(r["group_size"] == 3 and r["shared_after"] == 1 for r in runs)
    prepares = [_interval(r, "prepare") for r in runs]
    timings = [_interval(r, "timed") for r in runs]
    # the preparations ran side by side (each waited for all three to have started)...
    assert max(p[0] for p in prepares) < min(p[1] for p in prepares)
    # ...and no timing overlapped another timing or any preparation
    for i, t in enumerate(timings):
        assert not any(_overlap(t, other) for j, other in enumerate(timings) if j != i), timings
        assert not any(_overlap(t, p) for p in prepares), (t, prepares)


def test_phased_supervision_refuses_kinds_that_do_not_mark_their_timings(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    store = Store(tmp_path / "results.duckdb")
    ids = create_runs(store, [JobSpec("train", "house_price", "eager", "cpu", {}) for _ in range(2)])
    with pytest.raises(ValueError, match="prepare side by side"):
        run_jobs(store, ids, prepare_parallel=2)
    assert {store.run(i)["status"] for i in ids} == {"queued"}


def test_a_waiting_timing_goes_before_later_preparations():
    a, timing, late = (dl.PhaseHold("cpu", poll_s=0.005) for _ in range(3))
    a.shared()
    waiter = threading.Thread(target=timing.exclusive, daemon=True)
    waiter.start()
    time.sleep(0.1)
    joining = threading.Thread(target=late.shared, daemon=True)
    joining.start()
    time.sleep(0.1)
    assert late.state is None and timing.state is None  # the later preparation queues behind the waiting timing
    a.release()
    waiter.join(5)
    assert timing.state == "exclusive" and late.state is None
    timing.release()
    joining.join(5)
    assert late.state == "shared"
    for hold in (a, timing, late):
        hold.close()


def test_overlapping_preparations_cannot_starve_a_timing():
    """Two runs that keep preparing with their shared holds overlapping (the device never free) let a waiting
    timing in as soon as each has stepped out once."""
    preparers = [dl.PhaseHold("cpu", poll_s=0.002) for _ in range(2)]
    timing = dl.PhaseHold("cpu", poll_s=0.002)
    stop = threading.Event()

    def prepare(hold: dl.PhaseHold, offset: float) -> None:
        time.sleep(offset)
        while not stop.is_set():
            hold.shared()
            time.sleep(0.05)  # a stretch of device work...
            hold.release()  # ...and straight back to the next one

    threads = [threading.Thread(target=prepare, args=(hold, 0.025 * i), daemon=True)
               for i, hold in enumerate(preparers)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    got = threading.Thread(target=timing.exclusive, daemon=True)
    got.start()
    got.join(2)
    timed = timing.state == "exclusive"
    timing.release()
    stop.set()
    for thread in threads:
        thread.join(5)
    for hold in (*preparers, timing):
        hold.close()
    assert timed and timing.waited_s < 0.5, timing.waited_s


@pytest.fixture
def two_cores(monkeypatch):
    """A GPU machine's split, on whatever cores this machine has: timing on the first, the rest for everything else."""
    import os

    cores = sorted(os.sched_getaffinity(0))
    split = ({cores[0]}, set(cores[1:]) or {cores[0]})
    monkeypatch.setattr(dl, "split_cores", lambda device: split if device.startswith("cuda") else None)
    return split, set(cores)


def test_released_gives_the_device_up_for_host_work_and_takes_it_back(two_cores):
    import os

    (timing_cores, other_cores), all_cores = two_cores
    hold = dl.begin_phases("cuda:0", group_size=2)
    assert hold.state == "shared" and os.sched_getaffinity(0) == other_cores
    other = dl.PhaseHold("cuda:0", poll_s=0.005)
    with dl.released():
        assert hold.state is None
        other.exclusive()  # another run times while this one compiles: it does not wait
        assert other.waited_s < 0.05
        other.release()
        with dl.exclusive():  # a compile's own timing inside the block takes the device alone, on the timing cores
            assert hold.state == "exclusive" and os.sched_getaffinity(0) == timing_cores
        assert hold.state is None and os.sched_getaffinity(0) == other_cores
    assert hold.state == "shared" and hold.released_s > 0
    with dl.exclusive():
        with dl.released():  # host work inside a timing's block: the device goes, and comes back exclusive
            assert hold.state is None
        assert hold.state == "exclusive"
    other.close()
    dl.end_phases()
    assert os.sched_getaffinity(0) == all_cores


def test_released_holds_on_where_host_work_would_share_a_timings_cores(two_cores):
    hold = dl.begin_phases("cpu", group_size=2)  # a CPU device: its timings use every core
    with dl.released():
        assert hold.state == "shared"
    assert hold.released_s == 0


def test_compile_off_device_wraps_host_only_functions_once(two_cores, monkeypatch):
    import sys
    import types

    from engine.measure import inductor_timing

    seen: list[str | None] = []
    module = types.ModuleType("fake_compiler")

    def compile(src: str) -> str:  # noqa: A001 - the name Triton's compiler has
        seen.append(dl.current().state if dl.current() else None)
        return src.upper()

    module.compile = compile
    monkeypatch.setitem(sys.modules, "fake_compiler", module)
    monkeypatch.setattr(inductor_timing, "HOST_ONLY", (("fake_compiler", None, "compile"),
                                                        ("absent_module", None, "x")))
    assert inductor_timing.compile_off_device() == ["fake_compiler.compile"]
    wrapped = module.compile
    inductor_timing.compile_off_device()
    assert module.compile is wrapped
    assert module.compile("k") == "K"  # no phased hold: straight through
    dl.begin_phases("cuda:0", group_size=2)
    assert module.compile("k") == "K" and dl.current().state == "shared"
    assert seen == [None, None]  # the second call ran with the device given up


def test_a_timing_holds_two_cores_of_two_physical_cores_away_from_core_0(monkeypatch):
    """Hyperthread siblings share one core's pipeline: the timing cores are the last ones on distinct physical cores
    (here 8 logical cores on 4 physical ones, siblings n and n+4, as Linux numbers them on x86)."""
    monkeypatch.delenv("MODELAB_TIMING_CORES", raising=False)
    monkeypatch.setattr(dl, "_physical_core", lambda cpu: ("0", str(cpu % 4)))
    assert dl.timing_cores(list(range(8))) == {7, 6}
    monkeypatch.setattr(dl, "_physical_core", lambda cpu: ("0", str(cpu // 2)))  # siblings 2k and 2k+1
    assert dl.timing_cores(list(range(8))) == {7, 5}
    monkeypatch.setattr(dl, "_physical_core", lambda cpu: None)  # no topology: the last two
    assert dl.timing_cores(list(range(8))) == {6, 7}


def test_host_work_stays_off_the_timing_cores_hyperthread_siblings(monkeypatch):
    monkeypatch.delenv("MODELAB_TIMING_CORES", raising=False)
    monkeypatch.setattr(dl.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(dl, "_physical_core", lambda cpu: ("0", str(cpu % 8)))  # siblings n and n+8
    timing, others = dl.split_cores("cuda:0")
    assert timing == {15, 14} and others == set(range(16)) - {6, 7, 14, 15}
    monkeypatch.setattr(dl, "_physical_core", lambda cpu: None)  # no topology: only the timing cores themselves
    timing, others = dl.split_cores("cuda:0")
    assert timing == {14, 15} and others == set(range(14))


def test_the_timing_cores_can_be_chosen_and_a_bad_choice_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("MODELAB_TIMING_CORES", "2,3")
    assert dl.timing_cores(list(range(8))) == {2, 3}
    for bad, says in (("a,b", "give core numbers"), ("7,99", "not a proper subset"), ("0,1,2,3", "not a proper")):
        monkeypatch.setenv("MODELAB_TIMING_CORES", bad)
        with pytest.raises(ValueError, match=says):
            dl.timing_cores(list(range(4)) if bad == "0,1,2,3" else list(range(8)))
