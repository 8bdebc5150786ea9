"""The NVML reader over a scripted fake: each query's units, the refusals NVML gives, and the background sampler."""

from __future__ import annotations

import os
import time

import pytest

from engine.measure import nvml
from engine.measure.nvml import FakeNvml, Sampler, open_device, reason_names, set_backend


@pytest.fixture
def fake():
    fake = FakeNvml(energy_mj=[1_000, 4_500], power_mw=[250_000, 300_500], sm_clock_mhz=[1980, 1755],
                    temperature_c=[41, 44], reason_bits=[0x1, 0x4 | 0x20], pids=[os.getpid(), 4242, 77])
    previous = set_backend(fake)
    yield fake
    set_backend(previous)


def test_queries_answer_in_their_units(fake: FakeNvml):
    reader, why = open_device(0)
    assert reader is not None and why == ""
    assert reader.energy_mj() == 1_000 and reader.energy_mj() == 4_500 and reader.energy_mj() == 4_500
    assert reader.power_w() == 250.0 and reader.power_w() == 300.5
    assert reader.sm_clock_mhz() == 1980 and reader.temperature_c() == 41
    assert reader.clock_event_reasons() == ["idle"]
    assert reader.clock_event_reasons() == ["sw_power_cap", "sw_thermal"]
    assert reader.other_processes(os.getpid()) == [77, 4242]
    assert reader.name() == "Fake GPU"


def test_reason_names_cover_every_bit():
    assert reason_names(0) == []
    assert reason_names(0x8 | 0x40 | 0x80) == ["hw_slowdown", "hw_thermal", "power_brake"]
    assert reason_names(0x1000) == ["bit_0x1000"]


def test_unsupported_queries_answer_none(fake: FakeNvml):
    fake.unsupported = ("energy", "power", "clock", "temperature", "reasons", "processes")
    reader, _ = open_device(0)
    assert reader is not None
    assert (reader.energy_mj(), reader.power_w(), reader.sm_clock_mhz(), reader.temperature_c()) == (None,) * 4
    assert reader.clock_event_reasons() == [] and reader.other_processes(1) == []


def test_older_drivers_answer_the_throttle_reasons_name():
    class OldDriver(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # not in this binding

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
            return 0x8

    previous = set_backend(OldDriver())
    try:
        reader, _ = open_device(0)
        assert reader is not None and reader.clock_event_reasons() == ["hw_slowdown"]
    finally:
        set_backend(previous)


def test_not_available_paths_name_the_reason():
    previous = set_backend(FakeNvml(init_error="Driver Not Loaded"))
    try:
        reader, why = open_device(0)
        assert reader is None and "Driver Not Loaded" in why
        set_backend(FakeNvml(devices=1))
        reader, why = open_device(3)
        assert reader is None and "no GPU 3" in why
    finally:
        set_backend(previous)


def test_missing_package_is_a_reason(monkeypatch: pytest.MonkeyPatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    previous = set_backend(None)
    try:
        reader, why = open_device(0)
        assert reader is None and "nvidia-ml-py" in why
    finally:
        set_backend(previous)


def test_sampler_records_from_enter_to_exit(fake: FakeNvml):
    reader, _ = open_device(0)
    assert reader is not None
    with Sampler(reader, interval_s=0.01) as sampler:
        time.sleep(0.08)
    samples = sampler.samples
    assert len(samples) >= 3  # one at each end, more between
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert samples[0].power_w == 250.0 and samples[-1].power_w == 300.5
    assert samples[0].reasons == ("idle",) and samples[-1].reasons == ("sw_power_cap", "sw_thermal")
    assert samples[-1].sm_clock_mhz == 1755 and samples[-1].temperature_c == 44
    assert not any(t.name == "gpu-sampler" and t.is_alive() for t in __import__("threading").enumerate())


def test_the_real_binding_is_the_default():
    previous = set_backend(None)
    try:
        backend, why = nvml._get_backend()
        assert why == "" and backend.__name__ == "pynvml"
        assert hasattr(backend, "nvmlDeviceGetTotalEnergyConsumption")
    finally:
        set_backend(previous)
