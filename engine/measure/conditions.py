"""What else the machine did while a timing ran: read from /proc (and NVML on a GPU) around the timed window.

    with conditions.window(device, phase="infer", batch_size=64):
        samples = time_fn(...)
    result.conditions = noise.record(result, conditions.take_windows())   # judged beside the samples

A timing on a shared machine measures the machine as much as the code: on 2 cores, another process spinning on both
made one eager run's median 16 ms where a quiet rerun took 89 µs. A window records, for the cores this process may
run on (its affinity mask: every core for a CPU timing, the two timing cores of a GPU worker):

- cores busy elsewhere: the busy jiffies of those cores in /proc/stat (user, nice, system, irq, softirq, steal) minus
  this process tree's own (utime + stime of this process and its live descendants, plus their reaped children), in
  cores — "other processes took 1.6 of 2 cores". /proc/stat counts in ticks (CLK_TCK, 100 a second), so a window is
  measured over at least MIN_SPAN_S: a shorter timing is followed by an idle wait (still holding the device) until
  the span is long enough to count;
- the timing cores' hyperthread siblings (a GPU worker's two cores; engine.runner.device_lock.siblings): how busy
  they were, in cores — the lab keeps its own work off them, so whatever ran there shared the timing's physical cores
  (recorded, not a flag);
- CPU wait: how long this process's threads waited on a run queue while they wanted a CPU, from
  /proc/self/task/*/schedstat (nanoseconds, no tick granularity) — the direct sign that the timing shared its cores;
- the load average (1 min) at its start and end, and the CPU frequency where cpufreq exposes it;
- the wait for the device lock before the window (engine.runner.device_lock.waited_s);
- on a GPU, through engine.measure.nvml: the SM clock's min and median over the window, the clock-event reasons seen,
  the temperature, and other processes on the device (those of its own group, which wait on the device lock while it
  times, listed apart).

Whatever cannot be read is left None (with the reason where there is one); nothing here fails a run.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MIN_SPAN_S = 0.2  # /proc/stat's ticks are 10 ms: a shorter span cannot tell 0.5 of a core from none
GPU_SAMPLE_S = 0.02


@dataclass
class Conditions:
    """One timed window's surroundings (None: not readable here)."""
    phase: str | None = None
    batch_size: int | None = None
    device: str = "cpu"
    window_s: float = 0.0  # the timed window itself
    span_s: float = 0.0  # what /proc/stat was read over (at least MIN_SPAN_S)
    cores: int = 0  # the cores this process could run on
    other_cores: float | None = None  # cores' worth of CPU time other processes took on them meanwhile
    own_cores: float | None = None  # this process tree's
    sibling_cores: float | None = None  # cores' worth busy on the hyperthread siblings of those cores (None: none)
    cpu_wait_frac: float | None = None  # of the time its threads wanted a CPU, the share spent waiting for one
    load_start: float | None = None
    load_end: float | None = None
    cpu_mhz_min: float | None = None
    cpu_mhz_median: float | None = None
    device_wait_s: float | None = None  # waited for the device lock before this window
    gpu_sm_clock_min_mhz: float | None = None
    gpu_sm_clock_median_mhz: float | None = None
    gpu_reasons: list[str] = field(default_factory=list)
    gpu_temperature_c: float | None = None
    gpu_other_processes: list[int] = field(default_factory=list)
    # On the GPU but of this run's own group (started by the same supervisor lane or by this process): they hold the
    # device lock shared and wait while this one times, so they are listed apart and blamed for nothing.
    gpu_group_processes: list[int] = field(default_factory=list)
    gpu_note: str | None = None  # why there are no GPU figures, on a GPU

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Conditions:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


# -- /proc readers -----------------------------------------------------------------------------------------------------
def cpu_jiffies(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """{cpu index: (busy, total)} jiffies. Busy counts user, nice, system, irq, softirq and steal (another guest's
    time on a shared host is time this one did not get); guest time is already inside user."""
    out: dict[int, tuple[int, int]] = {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return out
    for line in lines:
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        v = [int(x) for x in values[:8]] + [0] * max(0, 8 - len(values))
        user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
        busy = user + nice + system + irq + softirq + steal
        out[int(name[3:])] = (busy, busy + idle + iowait)
    return out


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 0


def tree_jiffies(root: int | None = None) -> int:
    """CPU jiffies of a process tree: utime + stime + cutime + cstime of the root and of every live descendant (a
    child reaped during a window moves from its own figures into its parent's cutime/cstime, so a difference of two
    readings stays right)."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None or len(fields) < 15:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(times.get(pid, 0) for pid in tree)


def thread_schedstat() -> dict[str, tuple[int, int]]:
    """{thread id: (ns on a CPU, ns waiting on a run queue)} of this process's threads (empty where the kernel keeps
    no schedstat)."""
    out: dict[str, tuple[int, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns, *_ = f.read().split()
            out[tid] = (int(run_ns), int(wait_ns))
        except (OSError, ValueError):
            continue
    return out


def load_average() -> float | None:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_mhz(cpus: set[int]) -> list[float]:
    """scaling_cur_freq of these CPUs in MHz; [] where cpufreq is not exposed (most VMs)."""
    out = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            cpu = int(path.split("/cpu")[2].split("/")[0])
            if cpu in cpus:
                with open(path) as f:
                    out.append(int(f.read().strip()) / 1000.0)
        except (OSError, ValueError, IndexError):
            continue
    return out


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _device_waited_s() -> float:
    from engine.runner import device_lock

    return device_lock.waited_s()


# -- a window ----------------------------------------------------------------------------------------------------------
@dataclass
class _Snapshot:
    t: float
    cpus: dict[int, tuple[int, int]]
    own: int
    sched: dict[str, tuple[int, int]]
    load: float | None
    mhz: list[float]

    @classmethod
    def take(cls, cpus: set[int]) -> _Snapshot:
        return cls(time.perf_counter(), cpu_jiffies(), tree_jiffies(), thread_schedstat(), load_average(),
                   cpu_mhz(cpus))


def _cpu_figures(start: _Snapshot, end: _Snapshot, cpus: set[int]) -> tuple[float | None, float | None]:
    """(cores busy elsewhere, cores this tree used) between two snapshots, over these CPUs."""
    span = _span(start, end, cpus)
    if span is None:
        return None, None
    busy, per_core = span
    own = max(0, end.own - start.own)
    return max(0.0, (busy - own) / per_core), own / per_core


def _span(start: _Snapshot, end: _Snapshot, cpus: set[int]) -> tuple[int, float] | None:
    """(busy jiffies on these CPUs, jiffies one core had) between two snapshots; None where none were readable."""
    common = [c for c in cpus if c in start.cpus and c in end.cpus]
    total = sum(end.cpus[c][1] - start.cpus[c][1] for c in common)
    if not common or total <= 0:
        return None
    return sum(end.cpus[c][0] - start.cpus[c][0] for c in common), total / len(common)


def _busy_cores(start: _Snapshot, end: _Snapshot, cpus: set[int]) -> float | None:
    """Cores' worth of busy time on these CPUs between two snapshots, whoever's it was (None: none readable)."""
    span = _span(start, end, cpus)
    return None if span is None else span[0] / span[1]


def _siblings(cpus: set[int], known: set[int]) -> set[int]:
    """The hyperthread siblings of a proper subset of the machine's cores (a GPU worker's timing cores)."""
    if not cpus or cpus >= known:
        return set()
    from engine.runner.device_lock import siblings

    return siblings(cpus, sorted(known))


def _wait_fraction(start: _Snapshot, end: _Snapshot) -> float | None:
    ran = waited = 0
    for tid, (run_ns, wait_ns) in end.sched.items():
        r0, w0 = start.sched.get(tid, (0, 0))
        ran, waited = ran + max(0, run_ns - r0), waited + max(0, wait_ns - w0)
    return waited / (ran + waited) if ran + waited > 0 else None


class _GpuWatch:
    """NVML over the window: a sampler thread (engine.measure.nvml.Sampler) and the device's other processes."""

    def __init__(self, device: str) -> None:
        self.reader, self.note, self.sampler = None, None, None
        try:
            from engine.measure import nvml
        except ImportError as exc:
            self.note = f"no NVML reader ({exc})"
            return
        try:
            self.reader, why = nvml.open_device(nvml.nvml_index(device))
        except Exception as exc:  # noqa: BLE001 - conditions never fail a run
            self.reader, why = None, f"{type(exc).__name__}: {exc}"
        if self.reader is None:
            self.note = why or "NVML unavailable"
            return
        self.sampler = nvml.Sampler(self.reader, GPU_SAMPLE_S)

    def __enter__(self) -> _GpuWatch:
        if self.sampler is not None:
            try:
                self.sampler.__enter__()
            except Exception as exc:  # noqa: BLE001
                self.sampler, self.note = None, f"NVML sampler failed: {exc}"
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the sampler stops in finish(), after the window's idle wait

    def finish(self, into: Conditions) -> None:
        if self.sampler is not None:
            try:
                self.sampler.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                self.note = f"NVML sampler failed: {exc}"
        into.gpu_note = self.note
        if self.reader is None:
            return
        samples = list(getattr(self.sampler, "samples", []) or [])
        clocks = [float(s.sm_clock_mhz) for s in samples if s.sm_clock_mhz is not None]
        temps = [float(s.temperature_c) for s in samples if s.temperature_c is not None]
        reasons = [r for s in samples for r in (s.reasons or [])]
        try:  # one direct reading too, so a window shorter than a sampling interval still has figures
            clock = self.reader.sm_clock_mhz()
            clocks += [float(clock)] if clock is not None else []
            reasons += list(self.reader.clock_event_reasons() or [])
            temp = self.reader.temperature_c()
            temps += [float(temp)] if temp is not None else []
            others = sorted(int(p) for p in self.reader.other_processes(os.getpid()) or [])
            into.gpu_group_processes = [p for p in others if _in_group(p)]
            into.gpu_other_processes = [p for p in others if p not in into.gpu_group_processes]
        except Exception as exc:  # noqa: BLE001
            into.gpu_note = f"NVML read failed: {exc}"
        if clocks:
            into.gpu_sm_clock_min_mhz, into.gpu_sm_clock_median_mhz = min(clocks), statistics.median(clocks)
        into.gpu_temperature_c = max(temps) if temps else None
        into.gpu_reasons = sorted(set(reasons))


def _in_group(pid: int) -> bool:
    """True when `pid` is this run's supervisor or descends from it, from this process or from its parent: a worker
    of the same group in any lane (its fork server's or its supervisor's child), the supervisor itself (which may
    hold a CUDA context of its own), or something one of them started; False where /proc does not show it (another
    container). A group's other runs hold their memory but never launch work while this one times (the device
    lock's exclusive phase), so they are listed apart from interference."""
    from engine.runner import device_lock

    mine = {os.getpid(), os.getppid(), device_lock.supervisor_pid()} - {0}
    if pid in mine:
        return True
    seen = 0
    while pid > 1 and seen < 64:
        fields = _stat_fields(pid)
        if fields is None:
            return False
        parent = int(fields[1])
        if parent in mine:
            return True
        pid, seen = parent, seen + 1
    return False


_WINDOWS: list[Conditions] = []
_LAST_WAIT = [0.0]  # device_lock.waited_s() at the previous window's end: each window reports the wait before it


@contextmanager
def window(device: str, phase: str | None = None, batch_size: int | None = None,
           min_span_s: float = MIN_SPAN_S) -> Iterator[Conditions]:
    """Record the conditions around the block (a timed window) into the module's list (take_windows) and the
    yielded Conditions, filled in when the block ends. phase/batch_size name the series the block timed; None
    matches every series no other window names (engine.measure.noise.record)."""
    cpus = _affinity()
    found = Conditions(phase=phase, batch_size=batch_size, device=device, cores=len(cpus))
    gpu = _GpuWatch(device) if device.startswith("cuda") else None
    start = _Snapshot.take(cpus)
    try:
        with gpu if gpu is not None else _nothing():
            yield found
    finally:
        found.window_s = time.perf_counter() - start.t
        short = min_span_s - found.window_s
        if short > 0:  # too short for /proc/stat's ticks: stay idle (holding the device) until the span counts
            time.sleep(short)
        end = _Snapshot.take(cpus)
        if gpu is not None:
            gpu.finish(found)
        found.span_s = end.t - start.t
        found.other_cores, found.own_cores = _cpu_figures(start, end, cpus)
        sibs = _siblings(cpus, set(start.cpus))
        found.sibling_cores = _busy_cores(start, end, sibs) if sibs else None
        found.cpu_wait_frac = _wait_fraction(start, end)
        found.load_start, found.load_end = start.load, end.load
        mhz = start.mhz + end.mhz
        if mhz:
            found.cpu_mhz_min, found.cpu_mhz_median = min(mhz), statistics.median(mhz)
        try:
            waited = _device_waited_s()
            found.device_wait_s, _LAST_WAIT[0] = max(0.0, waited - _LAST_WAIT[0]), waited
        except Exception:  # noqa: BLE001 - no runner state (a bare call outside a worker)
            found.device_wait_s = None
        _WINDOWS.append(found)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def take_windows() -> list[Conditions]:
    """The windows recorded since the last call, oldest first (and forget them)."""
    out = list(_WINDOWS)
    _WINDOWS.clear()
    return out


def reset() -> None:
    """A run's start: forget recorded windows; its first window reports every wait for the device so far (the
    supervisor's before it started the worker included)."""
    _WINDOWS.clear()
    _LAST_WAIT[0] = 0.0
