"""engine.measure.conditions on this machine: /proc read right, a process tree's own CPU time kept apart from other
processes', the device-lock wait, NVML through the fake backend, and a bounded CPU hog beside a short bench run —
flagged interfered, naming the hog's share — against the same run without it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.measure import conditions, noise, nvml
from engine.runner import device_lock

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"


@contextmanager
def hog(seconds: float, processes: int) -> Iterator[list[subprocess.Popen]]:
    """`processes` Python processes spinning for at most `seconds`, stopped (by pid) when the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)]) for _ in range(processes)]
    try:
        time.sleep(0.3)  # all of them spinning before the block starts
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@dataclass
class Orphan:
    pid: int


@contextmanager
def foreign_hog(seconds: float, processes: int) -> Iterator[list[Orphan]]:
    """Like hog, but the spinners are not this process's descendants: a shell starts them in the background and
    exits, so they belong to nobody here, as another program's processes would."""
    script = " ".join(f'"{sys.executable}" -c "$SPIN" >/dev/null 2>&1 & echo $!;' for _ in range(processes))
    out = subprocess.run(["sh", "-c", script], env={**os.environ, "SPIN": SPIN.format(s=seconds)},
                         capture_output=True, text=True, timeout=30)
    procs = [Orphan(int(pid)) for pid in out.stdout.split()]
    try:
        time.sleep(0.3)  # all of them spinning before the block starts
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


def test_proc_stat_is_read_per_cpu(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  30 0 10 100 5 0 1 2 0 0\ncpu0 10 0 5 50 2 0 1 1 0 0\ncpu1 20 0 5 50 3 0 0 1 9 0\n"
                    "intr 1 2 3\n")
    assert conditions.cpu_jiffies(str(stat)) == {0: (17, 69), 1: (26, 79)}  # busy incl. steal; + idle, iowait
    assert conditions.cpu_jiffies(str(tmp_path / "missing")) == {}


def test_a_busy_child_counts_as_this_tree_not_as_others() -> None:
    before = conditions.tree_jiffies()
    with hog(1.0, 1):
        time.sleep(0.8)
        during = conditions.tree_jiffies()
    assert during - before >= 0.3 * conditions.HZ  # the child's spinning is ours


def test_a_window_records_its_span_and_the_wait_before_it() -> None:
    device_lock.note_run_wait(1.5)  # as the worker does with the supervisor's wait (job.json)
    try:
        conditions.reset()
        with conditions.window("cpu", "infer", 64) as first:
            pass
        with conditions.window("cpu", "infer", 1024):
            pass
    finally:
        device_lock.note_run_wait(0.0)
    second = conditions.take_windows()[1]
    assert first.device_wait_s == pytest.approx(1.5) and second.device_wait_s == 0.0
    assert first.window_s < 0.05 and first.span_s >= conditions.MIN_SPAN_S  # ticks need a longer span
    assert first.cores == len(os.sched_getaffinity(0)) and first.other_cores is not None
    if set(os.sched_getaffinity(0)) >= set(conditions.cpu_jiffies()):  # every core: no sibling outside them
        assert first.sibling_cores is None
    assert first.load_start is not None and (first.phase, first.batch_size) == ("infer", 64)
    assert conditions.take_windows() == []
    assert conditions.Conditions.from_dict(first.to_dict()) == conditions.Conditions.from_dict(first.to_dict())


def test_gpu_figures_come_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = nvml.FakeNvml(sm_clock_mhz=[1980, 1200, 1980], temperature_c=[70, 83], reason_bits=[0x40],
                         pids=[os.getpid(), 4242])
    previous = nvml.set_backend(fake)
    try:
        with conditions.window("cuda:0", min_span_s=0.0) as found:
            time.sleep(0.05)
    finally:
        nvml.set_backend(previous)
    assert found.gpu_sm_clock_min_mhz == 1200 and found.gpu_sm_clock_median_mhz == 1980
    assert found.gpu_temperature_c == 83 and found.gpu_reasons == ["hw_thermal"]
    assert found.gpu_other_processes == [4242] and found.gpu_note is None
    gpu_only = dataclasses.replace(found, other_cores=0.0, cpu_wait_frac=0.0)  # whatever the shared CPU did
    assert noise.judge([100.0] * 50, gpu_only).reason == ("1 other process on the GPU (pid 4242); GPU clock slowed: "
                                                          "hw_thermal; SM clock dipped to 1200 MHz (median 1980)")
    with hog(5.0, 1) as (child,):  # a process this one started (a group's worker, a compile helper) is its own
        previous = nvml.set_backend(nvml.FakeNvml(pids=[child.pid, 4242]))
        try:
            with conditions.window("cuda:0", min_span_s=0.0) as grouped:
                pass
        finally:
            nvml.set_backend(previous)
    assert grouped.gpu_group_processes == [child.pid] and grouped.gpu_other_processes == [4242]
    with foreign_hog(5.0, 1) as (sibling,):  # another lane's worker: not under this process, under its supervisor
        previous = nvml.set_backend(nvml.FakeNvml(pids=[sibling.pid, 4242]))
        try:
            with conditions.window("cuda:0", min_span_s=0.0) as outside:
                pass
            device_lock.note_supervisor(sibling.pid)
            with conditions.window("cuda:0", min_span_s=0.0) as supervised:
                pass
        finally:
            device_lock.note_supervisor(0)
            nvml.set_backend(previous)
    assert outside.gpu_other_processes == sorted([4242, sibling.pid])
    assert supervised.gpu_group_processes == [sibling.pid] and supervised.gpu_other_processes == [4242]
    previous = nvml.set_backend(nvml.FakeNvml(init_error="driver gone"))
    try:
        with conditions.window("cuda:0", min_span_s=0.0) as missing:
            pass
    finally:
        nvml.set_backend(previous)
    assert "driver gone" in missing.gpu_note and missing.gpu_sm_clock_min_mhz is None


def short_bench() -> dict:
    from engine.bench.run import BenchConfig, bench_mode

    result = bench_mode(BenchConfig(mode="eager", phases=("infer",), batch_sizes=(64,), warmup=10, iters=300))
    return result.conditions


def test_a_cpu_hog_beside_a_short_run_is_flagged_interfered_with_its_share() -> None:
    """A hog spinning on every core beside a short bench run: the run is flagged interfered, and the cores it says
    other processes took include the hog's own CPU time (read from the hog's /proc entries). The machine is shared,
    so the quiet run before it is not asserted clean: only that its own work is never counted as someone else's."""
    cores = len(os.sched_getaffinity(0))
    quiet = short_bench()
    with foreign_hog(30.0, cores) as procs:
        start, t0 = sum(conditions.tree_jiffies(p.pid) for p in procs), time.perf_counter()
        hogged = short_bench()
        used = sum(conditions.tree_jiffies(p.pid) for p in procs) - start
        hog_cores = used / conditions.HZ / (time.perf_counter() - t0)
    entry = hogged["series"][0]
    other = entry["conditions"]["other_cores"]
    assert hog_cores > 0.1 and other >= 0.7 * hog_cores  # the window counts the hog as other processes'
    assert entry["state"] == hogged["state"] == "interfered"
    assert f"other processes took {other:.1f} of {cores} cores" in entry["flags"]
    quiet_entry = quiet["series"][0]["conditions"]
    assert quiet_entry["own_cores"] > 0  # the run's own work, kept apart
    if quiet_entry["other_cores"] < noise.MAX_OTHER_SHARE * cores:
        assert not any("other processes" in f for f in quiet["flags"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores: one to time on, its 'sibling' busy")
def test_a_busy_hyperthread_sibling_of_the_timing_core_is_recorded_and_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU worker times on two cores; work on their hyperthread siblings shares their physical cores. Here core a
    times and core b plays its sibling (a faked topology), with a spinner pinned to b."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    monkeypatch.setattr(device_lock, "_physical_core", lambda cpu: ("0", "0") if cpu in (a, b) else ("0", str(cpu)))
    everything = os.sched_getaffinity(0)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN.format(s=3)],
                               preexec_fn=lambda: os.sched_setaffinity(0, {b}))
    try:
        time.sleep(0.3)
        os.sched_setaffinity(0, {a})
        with conditions.window("cuda:0") as busy:
            time.sleep(0.4)
    finally:
        os.sched_setaffinity(0, everything)
        spinner.kill()
        spinner.wait()
    conditions.take_windows()
    assert busy.sibling_cores is not None and busy.sibling_cores >= 0.7
    assert any("hyperthread siblings were busy" in n for n in noise.condition_notes(busy))
    assert not any("sibling" in f for f in noise.condition_flags(busy))  # recorded, not (yet) judged interference
    quiet = dataclasses.replace(busy, sibling_cores=0.1)
    assert not any("sibling" in n for n in noise.condition_notes(quiet))
    every_core = dataclasses.replace(busy, sibling_cores=None)  # a CPU timing's window: all cores, no siblings
    assert noise.condition_notes(every_core) == noise.condition_notes(dataclasses.replace(busy, sibling_cores=0.0))
