"""Who may use a device, machine-wide: an flock on one file per device (the kernel drops it when its holder dies, so
it never goes stale).

    device_lock(device)        exclusive for a whole run: the supervisor holds it around one worker (engine.runner.jobs)
    PhaseHold / exclusive()    a worker that prepares beside other runs of its group (`llm --mode all` on a GPU):
                               shared while it builds, checks and compiles — untimed work, any number at once —
                               and exclusive while it times or profiles; a shared holder never overlaps an exclusive
                               one, so two timings (or a timing and another run's compile) never share the device

An exclusive taker queues on a second flock first (the device's gate, `gate_path`) and holds it while it waits; a
shared taker passes the gate only while nobody queues there. So a waiting timing holds new preparations back and gets
the device once the preparations already under way step out of it: a group whose runs keep preparing side by side,
their shared holds overlapping, cannot starve a ready run of its timing.

Code that times (engine.measure.timing users, the GEMV's choice, Triton's autotuner) wraps the timed part in
`exclusive()`: a
no-op in an ordinary worker, whose supervisor already holds the device alone. Host-only work (native builds, C++ and
Triton compiles) runs in `released()`: on a GPU machine with cores to spare it gives the device up, so other runs may
time meanwhile, and moves to the cores a timing never uses — a timing holds two cores (`timing_cores`), a released
block the rest — so a compile beside a timing neither launches work on its device nor takes its cores.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.store import settings


def lock_dir() -> Path:
    return settings.get("MODELAB_LOCK_DIR") or Path(tempfile.gettempdir())


def lock_path(device: str) -> Path:
    name = device if ":" in device else (device + ":0" if device == "cuda" else device)
    return lock_dir() / f"modelab-device-{name.replace(':', '')}.lock"


def gate_path(device: str) -> Path:
    """The device's gate: held by whoever waits to take the device exclusively, so shared takers queue behind it."""
    return lock_path(device).with_suffix(".gate")


def _open(device: str, path: Path | None = None) -> int:
    path = path or lock_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_CREAT | os.O_RDWR, 0o666)


def _try(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _take(fd: int, kind: int, poll_s: float, on_wait: Callable[[], None] | None = None, gate: int | None = None
          ) -> float:
    """Poll for the lock (non-blocking tries, so a signal or timeout always gets through); returns seconds waited.
    With the device's `gate` (an fd of gate_path): an exclusive taker holds the gate while it waits, a shared one
    tries the lock only while the gate is free — a waiting exclusive taker goes before later shared ones."""
    t0 = time.perf_counter()
    waited = False
    queued = False  # this exclusive taker holds the gate
    try:
        while True:
            if gate is None:
                if _try(fd, kind):
                    return time.perf_counter() - t0
            elif kind == fcntl.LOCK_EX:
                queued = queued or _try(gate, fcntl.LOCK_EX)
                if queued and _try(fd, kind):
                    return time.perf_counter() - t0
            elif _try(gate, fcntl.LOCK_SH):  # nobody queues for the device exclusively
                try:
                    if _try(fd, kind):
                        return time.perf_counter() - t0
                finally:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            if on_wait and not waited:
                on_wait()
            waited = True
            time.sleep(poll_s)
    finally:
        if queued:
            fcntl.flock(gate, fcntl.LOCK_UN)


@dataclass
class Holder:
    """Who holds a device's lock, as its lock file says: the process, its command line (from /proc) and since when."""
    pid: int | None
    label: str  # what the holder wrote: "pid 123" or "pid 123 (timing)"
    command: str  # the holder's command line, "" where /proc cannot tell (gone, another namespace)
    since: float  # when it took the lock (the lock file's mtime, epoch seconds)

    def describe(self, now: float | None = None) -> str:
        """'pid 123 (python -m engine bench --mode all) for 42 s'."""
        held = max(0.0, (time.time() if now is None else now) - self.since)
        command = f" ({self.command})" if self.command else ""
        return f"{self.label}{command} for {held_text(held)}"


def held_text(seconds: float) -> str:
    """42 s, 3 min 5 s, 1 h 2 min."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def command_of(pid: int, limit: int = 120) -> str:
    """A process's command line from /proc, shortened: the interpreter's path left out, cut at `limit` characters."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    parts = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if parts and Path(parts[0]).name.startswith("python"):
        parts[0] = "python"
    text = " ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def holder(device: str) -> Holder | None:
    """Who holds `device`'s lock now, or None when nobody does (or the lock file says nothing: a group preparing
    side by side holds it shared and writes no name)."""
    path = lock_path(device)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:  # free if a shared try succeeds at once: then nobody holds it exclusively
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            pass
        label = os.pread(fd, 200, 0).decode(errors="replace").strip()
        since = os.fstat(fd).st_mtime
    finally:
        os.close(fd)
    return _named(label, since)


def _named(label: str, since: float) -> Holder | None:
    """The holder a lock file's label names ("pid 123 …"), None for an empty one."""
    if not label:
        return None
    match = re.match(r"pid (\d+)", label)
    pid = int(match.group(1)) if match else None
    return Holder(pid, label, command_of(pid) if pid else "", since)


@contextmanager
def device_lock(device: str, on_wait: Callable[[str], None] | None = None, poll_s: float = 0.2) -> Iterator[float]:
    """Exclusive, machine-wide lock on a device for as long as the block runs; yields the seconds it waited."""
    path = lock_path(device)
    fd = _open(device)
    gate = _open(device, gate_path(device))
    try:
        def waiting() -> None:
            if on_wait:
                # A holder that has just taken the lock has not written its label yet: read the file once more, and
                # name a process found there with its command line too.
                found = holder(device) or _named(Path(path).read_text().strip(), os.stat(path).st_mtime)
                on_wait(f"waiting for {device}: held by {found.describe() if found else 'other runs (preparing)'}")

        waited = _take(fd, fcntl.LOCK_EX, poll_s, waiting, gate)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield waited
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        os.close(gate)


def _drain_device(device: str) -> None:
    """Let this process's queued work on `device` finish before it gives up the device (kernels run behind the
    host)."""
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(torch.device(device))


# Below this many cores a compile beside a timing would share its cores: released() holds on to the device there.
MIN_CORES_TO_SPLIT = 8
TIMING_CORES = 2


def split_cores(device: str) -> tuple[set[int], set[int]] | None:
    """(cores a timing holds, cores a released block runs on) for a phased worker on `device`; None where host-only
    work cannot be kept off a timing's cores (a CPU device, whose timings use every core; too few cores; no
    affinity calls on this system). The timing cores' hyperthread siblings belong to neither: a compile on a
    sibling shares the timing's physical core, its pipeline and caches, and slows a host-bound step."""
    if not device.startswith("cuda") or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < MIN_CORES_TO_SPLIT:
        return None
    timing = timing_cores(cores)
    others = set(cores) - timing - siblings(timing, cores)
    return timing, others or set(cores) - timing


def siblings(chosen: set[int], cores: list[int]) -> set[int]:
    """The cores among `cores`, outside `chosen`, that share a physical core with one of `chosen` (none where the
    topology cannot be read)."""
    physical = {_physical_core(cpu) for cpu in chosen} - {None}
    return {cpu for cpu in cores if cpu not in chosen and _physical_core(cpu) in physical}


def _physical_core(cpu: int) -> tuple[str, str] | None:
    base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return (base / "physical_package_id").read_text().strip(), (base / "core_id").read_text().strip()
    except OSError:
        return None


def timing_cores(cores: list[int]) -> set[int]:
    """The TIMING_CORES cores a timing holds: MODELAB_TIMING_CORES (e.g. "6,7") if set; else the last ones, each on
    its own physical core — hyperthread siblings would share one core's pipeline, and core 0 often takes more of a
    machine's interrupts (on a GPU machine either choice times the same: docs/architecture.md)."""
    wanted = settings.get("MODELAB_TIMING_CORES")  # ValueError for anything but core numbers
    if wanted:
        chosen = set(wanted)
        if not chosen < set(cores):
            raise ValueError(f"MODELAB_TIMING_CORES={','.join(map(str, wanted))!r}: not a proper subset of this "
                             f"process's cores {cores}")
        return chosen
    chosen, physical = set(), set()
    for cpu in reversed(cores):
        where = _physical_core(cpu)
        if where is not None and where in physical:
            continue
        chosen.add(cpu)
        physical.add(where or ("cpu", str(cpu)))
        if len(chosen) == TIMING_CORES:
            return chosen
    return set(cores[-TIMING_CORES:])  # fewer physical cores than that: the last ones


# The progress message of a worker whose wait for its device is over (after "waiting for the device: …").
HAS_DEVICE = "has the device"
WAITING_PREFIX = "waiting for the device"


class PhaseHold:
    """One worker's hold on its device, shared or exclusive, switched as its run moves from preparing to timing.
    `waited_s` adds up the time spent waiting for the lock, so a caller can take it out of a wall-clock figure."""

    def __init__(self, device: str, on_wait: Callable[[str], None] | None = None, poll_s: float = 0.005,
                 group_size: int = 1, on_switch: Callable[[str | None], None] | None = None) -> None:
        self.device = device
        self.on_switch = on_switch  # told each new state once it holds it (a worker's timeline records them)
        self.group_size = group_size  # runs of the group that may prepare at once (this one included)
        self.on_wait = on_wait
        self.poll_s = poll_s
        self.state: str | None = None  # None | "shared" | "exclusive"
        self.waited_s = 0.0
        self.exclusive_s = 0.0  # time held exclusively (timing and profiling)
        self._since = 0.0
        self._fd = _open(device)
        self._gate = _open(device, gate_path(device))
        self.cores = split_cores(device)  # None: released() passes straight through, affinity is left alone
        self._all_cores = set(os.sched_getaffinity(0)) if self.cores else set()
        self.released_s = 0.0  # time given up for host-only work (released())

    def _pin(self, state: str | None) -> None:
        """This thread's cores: a timing's two while it times, the rest otherwise — a thread's mask, inherited by the
        threads and processes it starts (compile pools, ninja, nvcc), so only a timing ever runs on its two."""
        if self.cores:
            timing, others = self.cores
            os.sched_setaffinity(0, timing if state == "exclusive" else others)

    def _switch(self, state: str | None) -> None:
        if state == self.state:
            return
        if self.state is not None:
            _drain_device(self.device)
            if self.state == "exclusive":
                self.exclusive_s += time.perf_counter() - self._since
                os.ftruncate(self._fd, 0)  # no stale "(timing)" label for whoever waits next
            if self.on_switch:  # told before the lock goes (and after it is taken, below): a recorded hold lies
                self.on_switch(None)  # inside the real one, so recorded timelines can be checked for overlaps
            fcntl.flock(self._fd, fcntl.LOCK_UN)  # explicit: flock's own conversion is not atomic either
            self.state = None
        if state is None:
            self._pin(None)
            return
        kind = fcntl.LOCK_EX if state == "exclusive" else fcntl.LOCK_SH
        what = ("waiting for the device: other runs are preparing or timing" if state == "exclusive"
                else "waiting for the device: another run is timing or waits to time")
        waited = _take(self._fd, kind, self.poll_s, (lambda: self.on_wait(what)) if self.on_wait else None,
                       self._gate)
        self.waited_s += waited
        if waited and self.on_wait:  # the wait is over: the supervisor counts time against the run again from here
            self.on_wait(HAS_DEVICE)
        self.state = state
        self._pin(state)
        self._since = time.perf_counter()
        if state == "exclusive":  # named to whoever waits (device_lock's message)
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"pid {os.getpid()} (timing)".encode(), 0)
        if self.on_switch:
            self.on_switch(state)

    def shared(self) -> None:
        self._switch("shared")

    def exclusive(self) -> None:
        self._switch("exclusive")

    def release(self) -> None:
        self._switch(None)

    def close(self) -> None:
        self.release()
        if self.cores:
            os.sched_setaffinity(0, self._all_cores)
        os.close(self._fd)
        os.close(self._gate)


_HOLD: PhaseHold | None = None


def begin_phases(device: str, on_wait: Callable[[str], None] | None = None, group_size: int = 2,
                 on_switch: Callable[[str | None], None] | None = None) -> PhaseHold:
    """Make this process a phased worker: it holds `device` shared from now on (engine.runner.worker calls this)."""
    global _HOLD
    end_phases()
    _HOLD = PhaseHold(device, on_wait, group_size=group_size, on_switch=on_switch)
    _HOLD.shared()
    return _HOLD


def end_phases() -> None:
    global _HOLD
    if _HOLD is not None:
        _HOLD.close()
        _HOLD = None


_RUN_WAIT_S = [0.0]  # what the supervisor waited for this run's whole-run lock (job.json), set by the worker


def note_run_wait(seconds: float) -> None:
    """The worker's record of how long its supervisor waited for the device before starting it."""
    _RUN_WAIT_S[0] = max(0.0, float(seconds))


_SUPERVISOR_PID = [0]  # the process that launched this worker's group (job.json), set by the worker


def note_supervisor(pid: int) -> None:
    """The worker's record of its supervisor: it and every process under it (the other runs of the group, in any
    lane) are the lab's own, not other users of the device (engine.measure.conditions)."""
    _SUPERVISOR_PID[0] = int(pid)


def supervisor_pid() -> int:
    """This worker's supervisor's pid (0 outside a worker)."""
    return _SUPERVISOR_PID[0]


def waited_s() -> float:
    """Seconds this worker's run has waited for its device so far: its supervisor's wait for the whole-run lock and,
    beside a group, every wait of its phased hold (engine.measure.conditions reports each timing's share)."""
    return _RUN_WAIT_S[0] + (_HOLD.waited_s if _HOLD is not None else 0.0)


def current() -> PhaseHold | None:
    """This process's phased hold, or None in an ordinary worker (whose supervisor holds the device alone)."""
    return _HOLD


@contextmanager
def exclusive(final: bool = False) -> Iterator[None]:
    """Own the device for the block: waits until no other run of the group prepares or times; then back to shared,
    or, `final` (the run's last use of the device: what follows is arithmetic and files), let go altogether — taking
    it back shared would queue behind every run of the group waiting to time, holding the run's slot meanwhile.
    Nested blocks and ordinary workers pass straight through."""
    hold = _HOLD
    if hold is None or hold.state == "exclusive":
        yield
        return
    before = hold.state
    hold.exclusive()
    try:
        yield
    finally:
        hold._switch(None if final else before)


@contextmanager
def released() -> Iterator[None]:
    """Give the device up for a block of host-only work (a native build, a C++ or Triton compile, waiting for a
    compile pool): other runs of the group may time meanwhile. The hold comes back as it was before the block (waiting
    while another run times). Nested blocks and ordinary workers pass straight through."""
    hold = _HOLD
    if hold is None or hold.state is None or hold.cores is None:
        yield
        return
    before = hold.state
    hold.release()
    start = time.perf_counter()
    try:
        yield
    finally:
        hold.released_s += time.perf_counter() - start
        hold._switch(before)
