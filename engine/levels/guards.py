"""Guards around a user's kernel ("yours:" levels): checks a fast-looking wrong kernel cannot pass.

Each guard ends in a Verdict (pass / fail / flag / skipped) whose line goes into the run's notes and whose status
into a metric guard_<name> (1 pass, 0 flagged); the first failing guard fails the run with its line first.

    threads       the call started host threads (threading.Thread.start watched, active_count before/after)   fail
    inputs        the call changed an input (compared with a saved copy)                                     fail
    aliasing      the output shares storage with an input or an earlier output (memoised results)           fail
    input_sets    fresh seeds checked against the fp32 reference (a constant / stale output fails)           fail
    precision     tiny (x1e-6) and sharp (x10) value ranges against the float64 reference with the shape's
                  tolerance: fp16 underflows on the first, fp16/bf16 rounding breaks the second             fail
    background_cpu  CPU time other threads spend while the caller sleeps after the calls, beyond what they spend
                  after the lab's own L1 module on the same inputs (thread pools spin-wait after a parallel
                  region: 16 OpenMP threads use ~2.5 cores for a while after any CPU op)                      flag
    timed_outputs sampled outputs of the timed calls checked, their storage distinct, inputs unchanged       fail
    roofline      a median faster than the floor of the measured ceilings is impossible                      flag
    other_stream  (CUDA) device work outlasting the end event on the current stream (profiler span), the calls
                  queued behind a lead so the device sets the pace                                           flag
    l2_flush      (CUDA) timed with a 2x-L2 buffer zeroed between calls (size from get_device_properties)    note
The CUDA paths are tested on a GPU by tests/engine/levels/test_yours.py's CUDA tests (docs/your-own-kernel.md).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import torch

from engine.measure.checks import nonfinite
from engine.measure.timing import Measurement, time_events_each, time_fn
from engine.store.db import Metric
from engine.workloads.component import Component, Shape, rel_l2_error


class GuardFailure(AssertionError):
    """A guard caught the kernel: the message's first line is the failing verdict."""


@dataclass(frozen=True)
class GuardSet:
    label: str
    seed: int
    scale: float
    precision: bool = False  # checked against the float64 reference (the precision guard)


GUARD_SETS = (GuardSet("seed 101", 101, 1.0), GuardSet("seed 202", 202, 1.0),
              GuardSet("tiny x1e-6", 303, 1e-6, precision=True), GuardSet("sharp x10", 404, 10.0, precision=True))
BACKGROUND_WINDOW_S = 0.05
BACKGROUND_CPU_FRACTION = 0.5  # other threads busier than half a core while the caller sleeps: flagged
# ... beyond the baseline and a quarter of it: the runtime's own pools are noisy where they are busy. On a loaded
# many-core GPU host the lab's own L1 can leave ~200 ms of other threads' CPU in the 50 ms pause and an honest kernel
# a little more, which the half-core margin alone would flag.
BACKGROUND_BASELINE_SLACK = 0.25
BACKGROUND_TRIES = 3  # the smallest of these pauses counts: spikes pass, work left running does not
# Beside that: threads the calls started (not alive before them) that are still busier than half a core in the pause
# are flagged whatever the baseline — on a 64-core GPU host under load the pools' own noise can hide threads left
# computing by a cheat. Linux only (per-thread CPU from /proc, 10 ms ticks).
TIMED_SAMPLES = 8
# device work past the caller's stream: flagged beyond 4 us + 1 % of the work inside its events (an honest call's excess
# is the lag of one event record and the timers' granularity, ~1 us; see StreamSpan)
OTHER_STREAM_SLACK_US, OTHER_STREAM_SLACK = 4.0, 0.01
EARLY_SLACK_US = 1.0  # device work starting this long before the lead ended did not wait for the caller's stream
HOST_LATE_US = 50.0  # ... starting this long after it: the host fell behind the lead (the figures are taken again)
ROOFLINE_SLACK = 0.8  # flagged below 80 % of the floor (ceilings are measured, not exact)
FLUSH_L2_FACTOR = 2


@dataclass(frozen=True)
class Verdict:
    guard: str
    status: str  # "pass", "fail", "flag" or "skipped"
    detail: str

    def line(self) -> str:
        return f"guard {self.guard}: {self.status.upper()} — {self.detail}"


@dataclass
class Guard:
    component: Component
    shape: Shape
    naive: torch.nn.Module
    tol: float
    device: str
    verdicts: list[Verdict] = field(default_factory=list)
    kept: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def add(self, guard: str, status: str, detail: str) -> None:
        self.verdicts.append(Verdict(guard, status, detail))

    def raise_on_fail(self) -> None:
        failed = [v for v in self.verdicts if v.status == "fail"]
        if failed:
            others = [v.line() for v in self.verdicts if v is not failed[0]]
            raise GuardFailure("\n".join([failed[0].line(), *others]))

    def lines(self) -> list[str]:
        return [v.line() for v in self.verdicts]

    def metrics(self) -> list[Metric]:
        scores = {"pass": 1.0, "flag": 0.0}
        return [Metric(f"guard_{v.guard}", scores[v.status], "", phase="forward") for v in self.verdicts
                if v.status in scores]

    # -- before timing --------------------------------------------------------------------------------------------
    def probe(self, fn: Callable[..., torch.Tensor]) -> None:
        """Call fn twice on each guard set; record threads, inputs, aliasing, input_sets, precision, background."""
        names = input_names(self.naive)
        found: dict[str, str] = {}
        started = 0
        # before fn's first call: work fn leaves running would otherwise be counted in the baseline
        baseline = self._background_baseline(scaled_inputs(self.component, self.shape, self.device, GUARD_SETS[0]))
        for gs in GUARD_SETS:
            inputs = scaled_inputs(self.component, self.shape, self.device, gs)
            saved = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            with watch_threads() as seen:
                first = self._call(fn, inputs, gs)
                second = self._call(fn, inputs, gs)
            started += seen()
            found.setdefault("inputs", changed_input(inputs, saved, names, gs.label) or "")
            found.setdefault("aliasing", aliased(first, second, inputs, names, gs.label) or "")
            key = "precision" if gs.precision else "input_sets"
            found.setdefault(key, self._wrong(first, saved, gs) or "")
            for k, v in list(found.items()):  # keep the first non-empty reason per guard
                if not v:
                    del found[k]
        self._probe_verdicts(found, started)
        self._background(fn, inputs, baseline)
        self.raise_on_fail()

    def _call(self, fn: Callable[..., torch.Tensor], inputs: tuple, gs: GuardSet) -> torch.Tensor:
        out = fn(*inputs)
        sync(self.device)
        if not isinstance(out, torch.Tensor):
            raise GuardFailure(Verdict("output", "fail", f"returned a {type(out).__name__}, not a tensor, on "
                                                          f"input set '{gs.label}'").line())
        return out

    def _wrong(self, out: torch.Tensor, inputs: list, gs: GuardSet) -> str | None:
        dtype = torch.float64 if gs.precision else torch.float32
        ref = reference(self.naive, inputs, dtype)
        if tuple(out.shape) != tuple(ref.shape):
            return f"output shape {tuple(out.shape)} differs from the reference {tuple(ref.shape)}"
        bad = nonfinite(out)
        if bad:
            return f"output has NaN or inf ({bad}) on input set '{gs.label}'"
        err = rel_l2_error(out, ref)
        if err <= self.tol:
            return None
        if gs.precision:
            return (f"relative L2 error against the float64 reference exceeds the {self.shape.dtype} tolerance "
                    f"{self.tol:g} on input set '{gs.label}' (arithmetic below {self.shape.dtype}?)")
        return f"relative L2 error against the fp32 reference exceeds {self.tol:g} on input set '{gs.label}'"

    def _probe_verdicts(self, found: dict[str, str], started: int) -> None:
        if started:
            self.add("threads", "fail", f"the call started {started} host thread(s)")
        else:
            self.add("threads", "pass", "no host thread started by a call")
        passes = {"inputs": "inputs unchanged after every call (compared with saved copies)",
                  "aliasing": "every output in fresh storage (no input, no earlier output)",
                  "input_sets": f"{sum(not g.precision for g in GUARD_SETS)} fresh seeds within {self.tol:g} of the "
                                "fp32 reference",
                  "precision": f"{', '.join(g.label for g in GUARD_SETS if g.precision)} within {self.tol:g} of "
                               "the float64 reference"}
        for name, ok in passes.items():
            self.add(name, "fail" if name in found else "pass", found.get(name, ok))

    def _after(self, f: Callable[..., object], inputs: tuple) -> tuple[float, float]:
        """Other threads' CPU seconds in a pause right after two calls of f, and those of the threads the calls
        started (each the smallest of BACKGROUND_TRIES)."""
        busy, started = [], []
        for _ in range(BACKGROUND_TRIES):
            before = thread_ids()
            f(*inputs)
            f(*inputs)
            sync(self.device)
            all_s, new_s = background_cpu_s(BACKGROUND_WINDOW_S, before)
            busy.append(all_s)
            started.append(new_s)
        return min(busy), min(started)

    def _background_baseline(self, inputs: tuple) -> float:
        """The same pause after the lab's naive module: what the runtime's own pools spend spinning down."""
        with torch.no_grad():
            return self._after(self.naive, inputs)[0]

    def _background(self, fn: Callable[..., torch.Tensor], inputs: tuple, baseline: float) -> None:
        busy, started = self._after(fn, inputs)
        window_ms = BACKGROUND_WINDOW_S * 1e3
        of_new = f", {started * 1e3:.0f} ms of it threads the calls started"
        if background_flagged(busy, baseline) or started_flagged(started):
            self.add("background_cpu", "flag", f"other threads used {busy * 1e3:.0f} ms of CPU during a "
                                               f"{window_ms:.0f} ms pause after the calls{of_new} "
                                               f"({baseline * 1e3:.0f} ms after the lab's L1)")
        else:
            self.add("background_cpu", "pass", f"other threads used {busy * 1e3:.0f} ms of CPU in a {window_ms:.0f} ms "
                                               f"pause after the calls{of_new}, {baseline * 1e3:.0f} ms after the "
                                               "lab's L1")

    # -- timing ---------------------------------------------------------------------------------------------------
    def time(self, fn: Callable[..., torch.Tensor], sets: list[tuple], warmup: int, iters: int) -> Measurement:
        """Rotating over sets like any level, keeping a sample of the timed calls' outputs; on CUDA with the L2
        flushed between calls."""
        every = max(1, iters // TIMED_SAMPLES)
        counter = [0]

        def call() -> torch.Tensor:
            i = counter[0]
            counter[0] += 1
            out = fn(*sets[i % len(sets)])
            timed_index = i - warmup
            if timed_index >= 0 and (timed_index % every == 0 or timed_index == iters - 1):
                self.kept.append((i % len(sets), out))
            return out

        if self.device.startswith("cuda"):
            return self._time_flushed(call, warmup, iters)
        self.add("l2_flush", "skipped", "CPU run: no L2 flush between timed calls (CUDA only)")
        return time_fn(call, self.device, warmup=warmup, iters=iters, first_call=False)

    def _time_flushed(self, call: Callable[[], torch.Tensor], warmup: int, iters: int) -> Measurement:
        props = torch.cuda.get_device_properties(torch.device(self.device))
        l2 = int(props.L2_cache_size)
        flush = torch.empty(max(FLUSH_L2_FACTOR * l2, 1 << 20) // 4, dtype=torch.float32, device=self.device)
        samples = time_events_each(call, warmup, iters, flush.zero_)
        self.add("l2_flush", "pass", f"a {flush.numel() * 4 / 1e6:.0f} MB buffer ({FLUSH_L2_FACTOR}x this device's "
                                     f"{l2 / 1e6:.0f} MB L2, torch.cuda.get_device_properties) zeroed before each "
                                     "timed call")
        return Measurement(samples, float("nan"), self.device)

    # -- after timing ---------------------------------------------------------------------------------------------
    def after_timing(self, sets: list[tuple], saved: list[list], median_us: float, floor_us: float | None,
                     fn: Callable[..., torch.Tensor]) -> None:
        names = input_names(self.naive)
        problem = self._timed_problem(sets, saved, names)
        n = len(self.kept)
        self.add("timed_outputs", "fail" if problem else "pass",
                 problem or f"{n} sampled timed outputs within {self.tol:g} of the fp32 reference, each in its own "
                            "storage; inputs unchanged")
        self.kept.clear()
        self._roofline(median_us, floor_us)
        self._other_stream(fn, sets[0])
        self.raise_on_fail()

    def _timed_problem(self, sets: list[tuple], saved: list[list], names: list[str]) -> str | None:
        for i, (inputs, copy_) in enumerate(zip(sets, saved)):
            changed = changed_input(inputs, copy_, names, f"timed set {i}")
            if changed:
                return changed
        refs = {i: reference(self.naive, list(sets[i]), torch.float32) for i in {s for s, _ in self.kept}}
        storages: set[int] = set()
        for k, (set_index, out) in enumerate(self.kept):
            ptr = storage_ptr(out)
            if ptr in storages:
                return f"timed call sample {k} returned storage an earlier timed call returned (memoised)"
            storages.add(ptr)
            if tuple(out.shape) != tuple(refs[set_index].shape) or rel_l2_error(out, refs[set_index]) > self.tol:
                return f"timed call sample {k} (input set {set_index}) is off the fp32 reference by more than " \
                       f"{self.tol:g}"
        return None

    def _roofline(self, median_us: float, floor_us: float | None) -> None:
        if floor_us is None:
            self.add("roofline", "skipped", "no measured ceilings for this device: no floor to compare with")
        elif median_us < ROOFLINE_SLACK * floor_us:
            self.add("roofline", "flag", f"impossible: median {median_us:.3g} us beats the floor {floor_us:.3g} us "
                                         "from the measured ceilings")
        else:
            self.add("roofline", "pass", f"median {median_us:.3g} us above the floor {floor_us:.3g} us from the "
                                         "measured ceilings")

    def _other_stream(self, fn: Callable[..., torch.Tensor], inputs: tuple) -> None:
        if not self.device.startswith("cuda"):
            self.add("other_stream", "skipped", "CPU run: side-stream work is a CUDA-only concern")
            return
        span = profiled_span_us(lambda: fn(*inputs), calls=5)
        bound = OTHER_STREAM_SLACK_US + OTHER_STREAM_SLACK * span.event_us
        if not span.host_kept_up:
            self.add("other_stream", "flag", f"the device sat idle {-span.early_us:.0f} us after a lead before the "
                                             "calls' first work, even with the lead 16x longer: the calls could not "
                                             "be queued ahead of the device, so their stream order was not checked")
        elif span.early_us > EARLY_SLACK_US:
            self.add("other_stream", "flag", f"device work started {span.early_us:.0f} us before the caller's stream "
                                             "reached the calls: work on another stream that does not wait for the "
                                             "caller's (its inputs may not be ready; its time is outside the events)")
        elif span.excess_us > bound:
            self.add("other_stream", "flag", f"device work ran {span.excess_us:.0f} us past the end event on the "
                                             f"current stream ({span.event_us:.0f} us of work inside the events, "
                                             f"bound {bound:.0f} us): work on another stream the caller never waits "
                                             "for")
        else:
            self.add("other_stream", "pass", f"device work ended within {max(span.excess_us, 0):.0f} us of the end "
                                             f"event on the current stream (bound {bound:.0f} us, "
                                             f"{span.kernels} device activities)")


def roofline_floor_us(flops: float, nbytes: float, matmul: float | None, copy_bw: float | None) -> float | None:
    """The least time the measured ceilings allow: max(FLOPs / matmul rate, bytes / copy bandwidth)."""
    parts = [flops / matmul if matmul else 0.0, nbytes / copy_bw if copy_bw else 0.0]
    return max(parts) * 1e6 if any(parts) else None


def input_names(naive: torch.nn.Module) -> list[str]:
    return list(inspect.signature(naive.forward).parameters)


def scaled_inputs(component: Component, shape: Shape, device: str, gs: GuardSet) -> tuple:
    inputs = component.make_inputs(shape, device, gs.seed)
    if gs.scale == 1.0:
        return inputs
    return tuple((x * gs.scale).to(x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                 for x in inputs)


def reference(naive: torch.nn.Module, inputs: list, dtype: torch.dtype) -> torch.Tensor:
    module = copy.deepcopy(naive).to(dtype)
    with torch.no_grad():
        args = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        return module(*args).to(dtype)


def changed_input(inputs: tuple, saved: list, names: list[str], where: str) -> str | None:
    for i, (x, s) in enumerate(zip(inputs, saved)):
        if isinstance(x, torch.Tensor) and not torch.equal(x, s):
            name = names[i] if i < len(names) else f"#{i}"
            return f"the call wrote into input {name} (on {where})"
    return None


def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def aliased(first: torch.Tensor, second: torch.Tensor, inputs: tuple, names: list[str], where: str) -> str | None:
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.numel() and storage_ptr(first) == storage_ptr(x):
            return f"the output shares storage with input {names[i] if i < len(names) else i} (on {where})"
    if first.numel() and storage_ptr(first) == storage_ptr(second):
        return f"a repeated call returned the storage of the earlier output: a memoised result (on {where})"
    return None


@contextlib.contextmanager
def watch_threads() -> Iterator[Callable[[], int]]:
    """Count host threads started inside the block: Thread.start calls, or more threads alive at the end."""
    starts = [0]
    original = threading.Thread.start

    def start(self: threading.Thread, *args, **kwargs) -> None:
        starts[0] += 1
        original(self, *args, **kwargs)

    before = threading.active_count()
    threading.Thread.start = start  # type: ignore[method-assign]
    after = [before]
    try:
        yield lambda: max(starts[0], after[0] - before)
    finally:
        after[0] = threading.active_count()
        threading.Thread.start = original  # type: ignore[method-assign]


def background_flagged(busy_s: float, baseline_s: float) -> bool:
    """Other threads' CPU seconds in the pause after a kernel's calls (busy_s) past what they use after the lab's L1
    (baseline_s) by more than half a core of the window plus a quarter of the baseline."""
    allowed = BACKGROUND_CPU_FRACTION * BACKGROUND_WINDOW_S + BACKGROUND_BASELINE_SLACK * baseline_s
    return busy_s - baseline_s > allowed


def started_flagged(started_s: float) -> bool:
    """Threads the calls started used more than half a core of the pause: work left running, whatever the noise."""
    return started_s > BACKGROUND_CPU_FRACTION * BACKGROUND_WINDOW_S


def thread_cpu_s(skip: AbstractSet[int] = frozenset()) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process but those in `skip`, by thread id; empty where /proc
    has no per-thread stat (not Linux). Resolution: one clock tick (10 ms)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        if int(tid) in skip:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return out


def thread_ids() -> set[int]:
    """This process's thread ids (empty where /proc has no per-thread entries)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def background_cpu_s(window_s: float, before: set[int] | None = None) -> tuple[float, float]:
    """CPU seconds other threads of this process used while this one slept for window_s, and of those the threads
    not in `before` (started since; 0.0 without `before` or without per-thread figures). Both figures cover the same
    span — the per-thread snapshots lie inside it, and reading /proc can take a while when busy threads hold the GIL
    — and are scaled to window_s, so the threads started since never count more than all of them (up to one 10 ms
    tick a thread: /proc's resolution)."""
    wall, proc, mine = time.perf_counter(), time.process_time(), time.thread_time()
    # only the threads started since are read (each read may wait for the GIL while other threads spin)
    start = thread_cpu_s(skip=before) if before is not None else {}
    time.sleep(window_s)
    end = thread_cpu_s(skip=before) if before is not None else {}
    busy = max(0.0, (time.process_time() - proc) - (time.thread_time() - mine))
    scale = window_s / max(window_s, time.perf_counter() - wall)
    started = sum(cpu - start.get(tid, 0.0) for tid, cpu in end.items())
    return busy * scale, max(0.0, started) * scale


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass(frozen=True)
class StreamSpan:
    """Where the calls' device work lay against the caller's stream, every figure measured from the moment the lead
    (a sleep on the caller's stream) ended: event_us on the stream's own events (one recorded right after the lead,
    one after the calls), device_us on the profiler's timestamps of the device activity (kernels, copies, sets)."""
    event_us: float  # the caller's stream: from the lead's end to the end event
    device_us: float  # the device: from the lead's end to the end of the last activity of the calls
    early_us: float  # how long before the lead's end the first activity of the calls started (> 0: it did not wait)
    kernels: int  # activities of the calls the profiler saw

    @property
    def host_kept_up(self) -> bool:
        """The calls' first work started within HOST_LATE_US of the lead's end: the host queued them in time."""
        return self.early_us > -HOST_LATE_US

    @property
    def excess_us(self) -> float:
        """Device work past the end event: ≤ ~1 us for work on the caller's stream or joined back into it."""
        return self.device_us - self.event_us


def profiled_span_us(call: Callable[[], object], calls: int, attempts: int = 3) -> StreamSpan:
    """`calls` calls queued behind a lead (torch.cuda._sleep on the current stream, longer than the host needs to
    launch them all), so the device, not the host, sets the pace. An event recorded right after the lead and the end
    event after the calls bracket the caller's stream; the profiler gives every activity's start and end on the
    device. Both start where the lead ends — no separately timed lead is subtracted and no event waits on a host
    launch — so an honest call's device work ends where its end event does, and work on a stream the current one
    never waits for runs on past it (or, when it does not wait for the caller's stream either, starts during the
    lead). If the device still sat idle after the lead (the host fell behind it: the first profiled launch in a
    process is slow), the figures do not hold — the event after the lead may itself have been late — so it is taken
    again behind a lead four times longer, up to `attempts` times. CUDA only."""
    cycles = _lead_cycles(call, calls)
    span = _behind_lead(call, calls, cycles)
    for _ in range(attempts - 1):
        if span.host_kept_up:
            break
        cycles *= 4
        span = _behind_lead(call, calls, cycles)
    return span


def _behind_lead(call: Callable[[], object], calls: int, cycles: int) -> StreamSpan:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    after_lead, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(1000)  # the profiler's first launch pays its set-up: a short one, not the lead's
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        after_lead.record()
        for _ in range(calls):
            call()
        end.record()
        torch.cuda.synchronize()
    ranges = sorted((float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
                    if e.device_type == DeviceType.CUDA)
    if len(ranges) < 2:
        raise RuntimeError("the profiler saw no lead on the device")
    # the device was idle when each sleep was queued, and every other launch came after the second: the warm-up
    # starts first, the lead second
    (_, lead_end), work = ranges[1], ranges[2:]
    event_us = after_lead.elapsed_time(end) * 1e3
    if not work:
        return StreamSpan(event_us, 0.0, 0.0, 0)
    return StreamSpan(event_us=event_us, device_us=max(r[1] for r in work) - lead_end,
                      early_us=lead_end - min(r[0] for r in work), kernels=len(work))


def _lead_cycles(call: Callable[[], object], calls: int) -> int:
    """Cycles of a torch.cuda._sleep lasting four times the host time of `calls` calls (at least 1 ms)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    probe = 1_000_000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(probe)
    b.record()
    torch.cuda.synchronize()
    per_us = probe / max(a.elapsed_time(b) * 1e3, 1.0)
    # the profiler slows every launch down: a generous lead so that the device never waits on the host
    return int(per_us * max(1000.0, 4 * host_us))
