"""Energy beside latency: joules per step, per token, per prefill, read around the same regions that are timed.

A GPU's energy is NVML's total-energy counter (whole board, millijoules) read just before and just after a timed
region, outside its timing; only where a GPU lacks the counter are its power samples integrated instead. A CPU's is
the RAPL package counters under /sys/class/powercap (intel-rapl:N/energy_uj, wrapping at max_energy_range_uj) where
this user may read them. Anywhere else the run records "energy: not available here (<reason>)", never a figure.

The counters change in steps (NVML's every few tens of milliseconds: benchmarks/energy_check.py measures it), so a
region shorter than the meter's `min_window_s` is run again, untimed and identical, inside the same window until the
window is that long; the per-unit figures divide by every run. While the window is open a background thread samples
power, SM clock and clock-event reasons (GPU only) for the clock figures of the window.

The idle draw is measured once per device (a quiet window with nothing queued) and stored as its own run (kind
`idle_power`), like the device ceilings; runs show the total energy and the share above idle separately.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from engine.measure.nvml import GpuReader, GpuSample, Sampler, nvml_index, open_device
from engine.store import settings
from engine.store.db import Metric, RunResult, Store

T = TypeVar("T")

POWERCAP_ROOT = Path("/sys/class/powercap")
IDLE_KIND = "idle_power"
GPU_MIN_WINDOW_S = 1.0  # many counter updates per window (benchmarks/energy_check.py: the counter's update interval)
RAPL_MIN_WINDOW_S = 0.2  # RAPL updates about every millisecond
NVML_ALIGN_S = 0.25  # NVML's counter moves every ~100 ms (benchmarks/energy_check.py); a window waits for its steps
SAMPLE_INTERVAL_S = 0.1  # one sample is four short NVML calls: the timed loop loses well under 0.1 % to it
IDLE_WINDOW_S = 2.0


# -- RAPL (CPU packages) -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RaplZone:
    path: Path
    name: str
    max_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text())


def rapl_zones(root: Path | None = None) -> tuple[list[RaplZone], str]:
    """The top-level RAPL zones (one per CPU package; their sub-zones are parts of it) and "", or [] and why not."""
    root = POWERCAP_ROOT if root is None else root
    paths = sorted(p for p in root.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", p.name))
    if not paths:
        return [], f"no RAPL zones under {root}"
    zones = []
    for path in paths:
        try:
            int((path / "energy_uj").read_text())
            max_uj = int((path / "max_energy_range_uj").read_text())
            name = (path / "name").read_text().strip() if (path / "name").exists() else path.name
        except PermissionError:
            return [], f"{path / 'energy_uj'} is not readable by this user"
        except (OSError, ValueError) as e:
            return [], f"{path} could not be read ({e})"
        zones.append(RaplZone(path, name, max_uj))
    return zones, ""


def rapl_delta_uj(before: int, after: int, max_uj: int) -> int:
    """Energy between two readings of one zone; the counter wraps to 0 past max_energy_range_uj."""
    return after - before if after >= before else max_uj - before + after


# -- the meter ---------------------------------------------------------------------------------------------------------

@dataclass
class Meter:
    """Energy of regions on one device: a GPU through NVML or the CPU packages through RAPL."""
    device: str
    source: str  # "nvml" | "rapl"
    reader: GpuReader | None = None
    zones: list[RaplZone] = field(default_factory=list)
    idle_w: float | None = None
    min_window_s: float = GPU_MIN_WINDOW_S
    sample_interval_s: float = SAMPLE_INTERVAL_S
    align_s: float = 0.0  # the longest wait for a counter update at each end of a window (0: read it as it is)

    @property
    def label(self) -> str:
        return ("NVML's energy counter (the whole board)" if self.source == "nvml"
                else "the RAPL package counters (whole CPU packages)")

    def read(self) -> Any:
        """A raw snapshot of the counter(s): NVML millijoules, or one microjoule reading per RAPL zone."""
        if self.source == "rapl":
            return tuple(zone.read_uj() for zone in self.zones)
        return self.reader.energy_mj() if self.reader is not None else None

    def read_on_change(self, changes: int = 1) -> tuple[Any, float | None]:
        """The counter right after it has changed `changes` times from now, and when (perf_counter seconds); the
        value now and None where it does not change within align_s each time (no update rate to align to)."""
        value = self.read()
        for _ in range(changes):
            start, first = time.perf_counter(), value
            while value == first:
                if value is None or time.perf_counter() - start > self.align_s:
                    return value, None
                time.sleep(0.0005)
                value = self.read()
        return value, time.perf_counter()

    def joules_between(self, before: Any, after: Any) -> float | None:
        if before is None or after is None:
            return None
        if self.source == "rapl":
            return sum(rapl_delta_uj(b, a, z.max_uj) for b, a, z in zip(before, after, self.zones)) / 1e6
        return (after - before) / 1000.0


def open_meter(device: str) -> tuple[Meter | None, str]:
    """(meter, "") for `device`, or (None, why energy is not available there). MODELAB_ENERGY=0 turns it off."""
    if not settings.get("MODELAB_ENERGY"):
        return None, "turned off by MODELAB_ENERGY=0"
    if device.startswith("cuda"):
        reader, why = open_device(nvml_index(device))
        if reader is None:
            return None, why
        if reader.energy_mj() is None and reader.power_w() is None:
            return None, "NVML reads neither the energy counter nor the power of this GPU"
        return Meter(device, "nvml", reader=reader, align_s=NVML_ALIGN_S), ""
    if device == "cpu":
        zones, why = rapl_zones()
        if not zones:
            return None, why
        return Meter(device, "rapl", zones=zones, min_window_s=RAPL_MIN_WINDOW_S), ""
    return None, f"no energy reader for device {device!r}"


# -- a window around a region ------------------------------------------------------------------------------------------

@dataclass
class EnergyWindow:
    """The energy of one window around a region: `units` of work (steps, tokens, prefills) done in `runs` runs."""
    seconds: float
    joules: float | None
    source: str
    units: float = 1.0
    runs: int = 1
    idle_w: float | None = None
    samples: list[GpuSample] = field(default_factory=list)
    reason: str = ""  # why joules is None

    @property
    def above_idle_j(self) -> float | None:
        if self.joules is None or self.idle_w is None:
            return None
        return self.joules - self.idle_w * self.seconds

    @property
    def avg_power_w(self) -> float | None:
        return None if self.joules is None or self.seconds <= 0 else self.joules / self.seconds

    @property
    def sm_clocks(self) -> list[int]:
        return [s.sm_clock_mhz for s in self.samples if s.sm_clock_mhz is not None]

    def less(self, other: EnergyWindow, count: float, units: float) -> EnergyWindow | None:
        """This window without `count` of `other`'s units (the prefills between decode passes, say), whose joules and
        seconds per unit are taken out (so the share above idle stays consistent); `units`: what is left's count.
        None where they were over half the window: what is left would be mostly the error of that estimate."""
        if self.joules is None or other.joules is None:
            return self
        joules = self.joules - count * other.joules / other.units
        seconds = self.seconds - count * other.seconds / other.units
        if joules < self.joules / 2 or seconds < self.seconds / 2:
            return None
        return EnergyWindow(seconds, joules, self.source, units, self.runs, self.idle_w, self.samples, self.reason)

    def reason_shares(self) -> dict[str, float]:
        """Each clock-event reason seen in the window: the % of samples it was set in."""
        if not self.samples:
            return {}
        names = sorted({r for s in self.samples for r in s.reasons})
        return {r: 100.0 * sum(r in s.reasons for s in self.samples) / len(self.samples) for r in names}


def integrate_power(samples: list[GpuSample]) -> float | None:
    """Trapezoid integral of the power samples, joules; None with fewer than two readings."""
    points = [(s.t, s.power_w) for s in samples if s.power_w is not None]
    if len(points) < 2:
        return None
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(points, points[1:]))


def measure(meter: Meter | None, region: Callable[[], T], units: float | Callable[[T], float] = 1.0,
            again: Callable[[], float] | None = None) -> tuple[T, EnergyWindow | None]:
    """Run `region` (which times itself and leaves the device idle at its end) inside an energy window: the counter
    read before and after it, outside its timing. `units`: the work it does (or a function of what it returns).
    While the window is shorter than `meter.min_window_s`, `again` (the same work, untimed, leaving the device idle;
    it returns its units) runs inside it too. Without a meter, just the region.

    A counter that moves in steps (NVML's, every ~100 ms) is read at its steps: the region starts right after one,
    and the window closes at the second step after the region ends (the reading may lag the board by up to a step);
    the idle draw times that idle tail is taken out, so the figure is the region's. Without a stored idle draw the
    tail stays in, and the window's seconds with it."""
    if meter is None:
        return region(), None
    if meter.source == "nvml":
        _sync_cuda()  # queued work from before belongs to no window
    sampler = Sampler(meter.reader, meter.sample_interval_s) if meter.reader is not None else None
    if sampler is not None:
        sampler.__enter__()
    try:
        before, t0 = meter.read_on_change() if meter.align_s > 0 else (meter.read(), None)
        aligned = t0 is not None
        t0 = t0 if aligned else time.perf_counter()
        out = region()
        done, runs = float(units(out) if callable(units) else units), 1
        while again is not None and time.perf_counter() - t0 < meter.min_window_s:
            done += again()
            runs += 1
        t1 = time.perf_counter()
        after, t_end = meter.read_on_change(2) if aligned else (meter.read(), None)
        t_end = t1 if t_end is None else t_end
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
    samples = sampler.samples if sampler is not None else []
    joules = meter.joules_between(before, after)
    seconds = t_end - t0
    if joules is not None and meter.idle_w is not None and t_end > t1:  # the idle tail after the region
        joules -= meter.idle_w * (t_end - t1)
        seconds = t1 - t0
    source = "NVML energy counter" if meter.source == "nvml" else "RAPL package counters"
    reason = ""
    if joules is None:
        joules = integrate_power(samples)
        source = "NVML power samples, integrated"
        seconds = t1 - t0
        reason = "" if joules is not None else "neither the energy counter nor power samples answered"
    return out, EnergyWindow(seconds, joules, source, done, runs, meter.idle_w, samples, reason)


def _sync_cuda() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def open_for_run(device: str, db: str | None, result: RunResult) -> Meter | None:
    """A run's meter with the device's idle draw set (stored, else measured and stored), or None with the reason in
    the run's notes ("energy: not available here (...)")."""
    meter, why = open_meter(device)
    if meter is None:
        result.notes.append(not_available_note(why))
        return None
    _, run_id = idle_for(meter, db)
    if run_id is not None:
        result.metrics.append(Metric("idle_run_id", float(run_id), ""))
    idle = (f"idle draw {meter.idle_w:.1f} W" + (f" (run {run_id})" if run_id is not None else "")
            if meter.idle_w is not None else "the idle draw could not be measured, so only totals are shown")
    result.notes.append(f"energy: {meter.label}, read just outside each timed region (a region shorter than "
                        f"{meter.min_window_s:g} s runs again, untimed, inside the same window); {idle}")
    return meter


# -- the idle draw -----------------------------------------------------------------------------------------------------

def measure_idle(meter: Meter, seconds: float = IDLE_WINDOW_S) -> float | None:
    """Watts over a quiet window with nothing queued (after a short settle), or None if the meter reads nothing."""
    time.sleep(0.3)
    _, window = measure(meter, lambda: time.sleep(seconds))
    return None if window is None or window.joules is None else window.joules / window.seconds


def latest_idle(store: Store, device_name: str | None, device: str) -> tuple[float, int] | None:
    """(watts, run id) of the newest idle-power run of this device name (or device string), or None."""
    if not store.path.exists():
        return None
    where, args = [f"r.kind = '{IDLE_KIND}'", "r.status = 'ok'", "m.name = 'idle_power_w'"], []
    if device_name:
        where.append("e.device_name = ?")
        args.append(device_name)
    else:
        where.append("r.device = ?")
        args.append(device)
    rows = store.query("SELECT r.id, m.value FROM runs r LEFT JOIN environments e ON e.run_id = r.id "
                       f"JOIN metrics m ON m.run_id = r.id WHERE {' AND '.join(where)} ORDER BY r.id DESC LIMIT 1",
                       args)
    return None if rows.empty else (float(rows.iloc[0]["value"]), int(rows.iloc[0]["id"]))


_IDLE_HERE: dict[str, float] = {}  # device -> watts, for runs without a store (measured once per process)


def idle_for(meter: Meter, db: str | None) -> tuple[float | None, int | None]:
    """The device's stored idle draw, else measured now with the device alone (and stored as its own run so the
    next run reuses it; without a store, kept for this process). Sets meter.idle_w; returns (watts, run id)."""
    from engine.runner.device_lock import exclusive
    from engine.store.envinfo import capture_env

    if not db and meter.device in _IDLE_HERE:
        meter.idle_w = _IDLE_HERE[meter.device]
        return meter.idle_w, None
    env = capture_env(meter.device)
    name = env.get("device_name")
    store = Store(db) if db else None
    found = latest_idle(store, name, meter.device) if store is not None else None
    if found is None:
        with exclusive():
            found = latest_idle(store, name, meter.device) if store is not None else None
            if found is None:
                watts = measure_idle(meter)
                if watts is None:
                    return None, None
                found = (watts, _store_idle(store, meter, env, watts))
                if store is None:
                    _IDLE_HERE[meter.device] = watts
    meter.idle_w = found[0]
    return found


def _store_idle(store: Store | None, meter: Meter, env: dict, watts: float) -> int | None:
    if store is None:
        return None
    store.init()
    run_id = store.create_run(IDLE_KIND, IDLE_KIND, "measure", meter.device, {"device": meter.device, "auto": True})
    store.start_run(run_id, "measuring the idle draw (asked for by another run)")
    store.record_result(run_id, RunResult(env=env, metrics=[
        Metric("idle_power_w", watts, "W"), Metric("idle_window_s", IDLE_WINDOW_S, "s")],
        notes=[f"{meter.source}: {IDLE_WINDOW_S:.0f} s with nothing queued on {meter.device}"]))
    return run_id


# -- what a run stores -------------------------------------------------------------------------------------------------

def not_available_note(reason: str) -> str:
    return f"energy: not available here ({reason})"


def energy_metrics(window: EnergyWindow | None, per: str, *, tokens_per_unit: float = 0.0,
                   phase: str | None = None, batch_size: int | None = None) -> list[Metric]:
    """The window's figures as metrics: `energy_per_<per>` (J/<per>, whole board or package), the share above idle,
    `tokens_per_j` where a unit carries tokens, the average power, the idle draw, the window, the SM clock and the
    clock-event reasons."""
    if window is None or window.joules is None:
        return []
    units = window.units
    if units <= 0:
        return []
    tag = dict(phase=phase, batch_size=batch_size)
    unit = f"J/{per}"
    out = [Metric(f"energy_per_{per}", window.joules / units, unit, **tag),
           Metric("avg_power_w", window.avg_power_w or 0.0, "W", **tag),
           Metric("energy_window_s", window.seconds, "s", **tag),
           Metric("energy_window_runs", float(window.runs), "", **tag)]
    if window.above_idle_j is not None:
        out += [Metric(f"energy_above_idle_per_{per}", window.above_idle_j / units, unit, **tag),
                Metric("idle_power_w", float(window.idle_w), "W", **tag)]
    if tokens_per_unit and window.joules > 0:
        out.append(Metric("tokens_per_j", units * tokens_per_unit / window.joules, "tokens/J", **tag))
    clocks = window.sm_clocks
    if clocks:
        out += [Metric("sm_clock_min_mhz", float(min(clocks)), "MHz", **tag),
                Metric("sm_clock_median_mhz", float(statistics.median(clocks)), "MHz", **tag)]
    for reason, share in window.reason_shares().items():
        out.append(Metric(f"clock_event_{reason}_pct", share, "%", **tag))
    return out


def window_note(window: EnergyWindow | None, what: str) -> str | None:
    """A line for the run's notes where a window needs one: no energy figure (why), power samples instead of the
    counter, or clocks held back for a reason (the % of samples each reason was set in); else None."""
    if window is None:
        return None
    if window.joules is None:
        return not_available_note(f"{what}: {window.reason}")
    parts = []
    if window.source.startswith("NVML power samples"):
        parts.append(f"from {len(window.samples)} power samples (this GPU has no energy counter)")
    reasons = ", ".join(f"{r} {p:.0f}%" for r, p in window.reason_shares().items())
    if reasons:
        parts.append(f"clock-event reasons in the window: {reasons}")
    return f"energy of {what}: " + "; ".join(parts) if parts else None
