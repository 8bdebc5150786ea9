"""A small reader over NVML (the `nvidia-ml-py` package, import name `pynvml`): energy, power, SM clock, temperature,
clock-event reasons and the other processes on a GPU.

`open_device(index)` gives `(GpuReader, "")` or `(None, reason)`; every reader method returns None (or an empty list)
where the driver does not support a query, so a caller records "not available" instead of a made-up figure.
`Sampler` polls a reader from a background thread while a region runs.

The backend is the `pynvml` module unless `set_backend` substitutes another object with the same functions;
`FakeNvml` is a scripted one, so every path here runs on a machine without a GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# NVML's clock-event (formerly "clocks throttle") reason bits -> short names.
REASON_BITS: dict[int, str] = {
    0x1: "idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "power_brake",
    0x100: "display_clock",
    0x200: "board_limit",
    0x400: "reliability",
}

NVML_CLOCK_SM = 1  # pynvml.NVML_CLOCK_SM
NVML_TEMPERATURE_GPU = 0  # pynvml.NVML_TEMPERATURE_GPU

_backend: Any = None
_started: Any = None  # the backend whose nvmlInit succeeded
_lock = threading.Lock()


def set_backend(obj: Any) -> Any:
    """Use `obj` as NVML (the pynvml module, a FakeNvml, or None: import pynvml on demand); returns the previous."""
    global _backend, _started
    with _lock:
        previous, _backend, _started = _backend, obj, None
    return previous


def _get_backend() -> tuple[Any, str]:
    global _backend
    with _lock:
        if _backend is None:
            try:
                import pynvml
            except ImportError:
                return None, "the nvidia-ml-py package (pynvml) is not installed"
            _backend = pynvml
        return _backend, ""


def reason_names(bits: int) -> list[str]:
    """Short names of the set bits of an NVML clock-event reasons mask; an unknown bit is named by its hex value."""
    names = []
    bit = 1
    while bit <= bits:
        if bits & bit:
            names.append(REASON_BITS.get(bit, f"bit_{bit:#x}"))
        bit <<= 1
    return names


class GpuReader:
    """One GPU's NVML handle; each query answers None where the driver refuses it."""

    def __init__(self, backend: Any, handle: Any, index: int):
        self._nvml = backend
        self._handle = handle
        self.index = index

    def _query(self, name: str, *args: Any) -> Any:
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(self._handle, *args)
        except Exception:  # NVMLError (not supported, GPU lost, ...): the figure is unavailable, the run goes on
            return None

    def name(self) -> str | None:
        value = self._query("nvmlDeviceGetName")
        return value.decode() if isinstance(value, bytes) else value

    def energy_mj(self) -> int | None:
        """Total energy the board used since the driver loaded, in millijoules (Volta and later)."""
        value = self._query("nvmlDeviceGetTotalEnergyConsumption")
        return None if value is None else int(value)

    def power_w(self) -> float | None:
        """Board power draw now (NVML answers milliwatts; averaged by the driver over a short window)."""
        value = self._query("nvmlDeviceGetPowerUsage")
        return None if value is None else value / 1000.0

    def sm_clock_mhz(self) -> int | None:
        value = self._query("nvmlDeviceGetClockInfo", getattr(self._nvml, "NVML_CLOCK_SM", NVML_CLOCK_SM))
        return None if value is None else int(value)

    def temperature_c(self) -> int | None:
        sensor = getattr(self._nvml, "NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU)
        value = self._query("nvmlDeviceGetTemperature", sensor)
        return None if value is None else int(value)

    def clock_event_reasons(self) -> list[str]:
        """Why the clocks are below their maximum now ("idle", "sw_power_cap", ...); [] if none or unknown."""
        bits = self._query("nvmlDeviceGetCurrentClocksEventReasons")
        if bits is None:  # drivers before the rename answer only the older name
            bits = self._query("nvmlDeviceGetCurrentClocksThrottleReasons")
        return [] if bits is None else reason_names(int(bits))

    def other_processes(self, own_pid: int) -> list[int]:
        """Process ids of compute work on this GPU other than `own_pid`; [] if none or the driver does not say."""
        procs = self._query("nvmlDeviceGetComputeRunningProcesses") or []
        return sorted({int(p.pid) for p in procs if int(p.pid) != own_pid})


def nvml_index(device: str) -> int:
    """NVML's index of a torch CUDA device ("cuda", "cuda:1"): CUDA_VISIBLE_DEVICES renumbers torch's, not NVML's."""
    import torch

    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    to_nvml = getattr(torch.cuda, "_get_nvml_device_index", None)
    if to_nvml is not None and torch.cuda.is_available():
        try:
            return int(to_nvml(index))
        except Exception:  # an unusual CUDA_VISIBLE_DEVICES spelling: torch's own index
            return index
    return index


def open_device(index: int) -> tuple[GpuReader | None, str]:
    """(reader, "") for GPU `index`, or (None, the reason NVML is not available for it)."""
    global _started
    backend, why = _get_backend()
    if backend is None:
        return None, why
    if _started is not backend:
        try:
            backend.nvmlInit()
        except Exception as e:
            return None, f"NVML did not start ({e})"
        _started = backend
    try:
        handle = backend.nvmlDeviceGetHandleByIndex(index)
    except Exception as e:
        return None, f"NVML has no GPU {index} ({e})"
    return GpuReader(backend, handle, index), ""


@dataclass(frozen=True)
class GpuSample:
    t: float  # time.perf_counter() seconds
    power_w: float | None
    sm_clock_mhz: int | None
    temperature_c: int | None
    reasons: tuple[str, ...]


class Sampler:
    """Context manager: a background thread samples `reader` every `interval_s` from enter to exit (one sample at each
    end as well), into `.samples`."""

    def __init__(self, reader: GpuReader, interval_s: float = 0.05):
        self.reader = reader
        self.interval_s = interval_s
        self.samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        r = self.reader
        self.samples.append(GpuSample(time.perf_counter(), r.power_w(), r.sm_clock_mhz(), r.temperature_c(),
                                      tuple(r.clock_event_reasons())))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


# --- a scripted stand-in for pynvml --------------------------------------------------------------------------------

class FakeNvmlError(Exception):
    pass


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int = 0


def _next(script: list, default: Any) -> Any:
    """The next scripted value; the last one repeats once the script runs out."""
    if not script:
        return default
    return script.pop(0) if len(script) > 1 else script[0]


@dataclass
class FakeNvml:
    """Answers pynvml's calls from scripts: each list gives successive answers and its last value repeats. A query
    named in `unsupported` raises as NVML does for "Not Supported"; `init_error` makes nvmlInit fail; `devices` is
    how many GPUs exist."""
    energy_mj: list[int] = field(default_factory=list)
    power_mw: list[int] = field(default_factory=list)
    sm_clock_mhz: list[int] = field(default_factory=list)
    temperature_c: list[int] = field(default_factory=list)
    reason_bits: list[int] = field(default_factory=list)
    pids: Sequence[int] = ()
    unsupported: Sequence[str] = ()
    init_error: str = ""
    devices: int = 1
    device_name: str = "Fake GPU"

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = FakeNvmlError

    def _answer(self, query: str, script: list, default: Any) -> Any:
        if query in self.unsupported:
            raise FakeNvmlError("Not Supported")
        return _next(script, default)

    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNvmlError(self.init_error)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.devices:
            raise FakeNvmlError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.device_name

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._answer("energy", self.energy_mj, 0)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._answer("power", self.power_mw, 0)

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        return self._answer("clock", self.sm_clock_mhz, 0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._answer("temperature", self.temperature_c, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._answer("reasons", self.reason_bits, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[FakeProcess]:
        if "processes" in self.unsupported:
            raise FakeNvmlError("Not Supported")
        return [FakeProcess(pid) for pid in self.pids]
