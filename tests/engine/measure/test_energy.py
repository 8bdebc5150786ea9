"""Energy around timed regions: the NVML counter (a scripted fake) into joules, the idle draw stored and taken out,
power samples integrated where the counter is missing, RAPL under a fake powercap folder (wrap-around included),
the not-available path, and the metrics a run stores with their units."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.measure import energy
from engine.measure.energy import EnergyWindow, Meter, energy_metrics, measure, open_meter
from engine.measure.nvml import FakeNvml, open_device, set_backend
from engine.store.db import RunResult, Store


@pytest.fixture
def fake_gpu():
    """A fake NVML behind the reader; the test scripts its answers."""
    fake = FakeNvml()
    previous = set_backend(fake)
    yield fake
    set_backend(previous)


def gpu_meter(fake: FakeNvml, min_window_s: float = 0.0) -> Meter:
    reader, why = open_device(0)
    assert reader is not None, why
    return Meter("cuda", "nvml", reader=reader, min_window_s=min_window_s, sample_interval_s=0.005)


def test_the_counter_read_around_a_region_gives_its_joules(fake_gpu: FakeNvml):
    fake_gpu.energy_mj = [10_000, 17_500]  # before, after: 7.5 J
    fake_gpu.power_mw, fake_gpu.sm_clock_mhz = [300_000], [1980, 1500, 1755]
    fake_gpu.reason_bits = [0x0, 0x4, 0x4]
    meter = gpu_meter(fake_gpu)
    meter.idle_w = 50.0
    out, window = measure(meter, lambda: time.sleep(0.03) or "timed", units=100)
    assert out == "timed" and window is not None
    assert window.joules == pytest.approx(7.5) and window.source == "NVML energy counter"
    assert window.units == 100 and window.runs == 1
    assert window.above_idle_j == pytest.approx(7.5 - 50.0 * window.seconds)
    assert window.avg_power_w == pytest.approx(7.5 / window.seconds)
    assert min(window.sm_clocks) == 1500 and "sw_power_cap" in window.reason_shares()
    assert "clock-event reasons in the window: sw_power_cap" in energy.window_note(window, "infer B=8")
    plain = EnergyWindow(seconds=1.0, joules=5.0, source="NVML energy counter")
    assert energy.window_note(plain, "infer B=8") is None  # nothing to say beyond the metrics


def test_a_short_region_runs_again_until_the_window_is_long_enough(fake_gpu: FakeNvml):
    fake_gpu.energy_mj = [0, 2_000]
    meter = gpu_meter(fake_gpu, min_window_s=0.05)
    calls = []

    def again() -> float:
        calls.append(1)
        time.sleep(0.01)
        return 10

    _, window = measure(meter, lambda: time.sleep(0.01), units=10, again=again)
    assert window is not None and window.seconds >= 0.05
    assert window.runs == 1 + len(calls) and len(calls) >= 3
    assert window.units == 10 * window.runs
    metrics = {m.name: m for m in energy_metrics(window, "step", phase="infer", batch_size=8)}
    assert metrics["energy_per_step"].value == pytest.approx(2.0 / window.units)
    assert metrics["energy_window_runs"].value == window.runs


class SteppingCounter(FakeNvml):
    """A board drawing a steady `watts` whose energy counter, like NVML's, moves only every `step_s`."""
    watts = 100.0
    step_s = 0.02

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return int(time.perf_counter() // self.step_s * self.step_s * self.watts * 1000)


def test_a_stepping_counter_is_read_at_its_steps_and_the_idle_tail_taken_out():
    previous = set_backend(SteppingCounter())
    try:
        reader, _ = open_device(0)
        meter = Meter("cuda", "nvml", reader=reader, min_window_s=0.0, sample_interval_s=0.01, align_s=0.1)
        meter.idle_w = SteppingCounter.watts  # the board idles at the same draw, so the tail is all idle
        errors = []
        for _ in range(7):
            _, window = measure(meter, lambda: time.sleep(0.05))
            assert window is not None and window.seconds >= 0.05
            errors.append(abs(window.joules - SteppingCounter.watts * window.seconds))
        # read as they come, a 20 ms step is off by up to 2 J on a 5 J window (about 1 J in practice); read at the
        # steps, what is left is how late the polling saw a step (a few ms: 0.1 J each on a loaded machine)
        assert sorted(errors)[len(errors) // 2] < 0.3
        meter.idle_w = None  # no idle draw to take the tail out with: the window runs to the counter's step
        _, window = measure(meter, lambda: time.sleep(0.05))
        assert window.seconds >= 0.05 + SteppingCounter.step_s and window.above_idle_j is None
        assert window.joules == pytest.approx(SteppingCounter.watts * window.seconds, abs=0.5)
    finally:
        set_backend(previous)


def test_without_the_counter_power_samples_are_integrated(fake_gpu: FakeNvml):
    fake_gpu.unsupported = ("energy",)
    fake_gpu.power_mw = [200_000]  # a steady 200 W
    meter = gpu_meter(fake_gpu)
    _, window = measure(meter, lambda: time.sleep(0.1), units=1)
    assert window is not None and window.source == "NVML power samples, integrated"
    span = window.samples[-1].t - window.samples[0].t
    assert window.joules == pytest.approx(200.0 * span)
    assert "power samples (this GPU has no energy counter)" in energy.window_note(window, "decode")


def test_nothing_readable_is_a_reason_not_a_figure(fake_gpu: FakeNvml):
    fake_gpu.unsupported = ("energy", "power")
    reader, _ = open_device(0)
    meter = Meter("cuda", "nvml", reader=reader, min_window_s=0.0)
    _, window = measure(meter, lambda: None)
    assert window is not None and window.joules is None and window.reason
    assert energy_metrics(window, "step") == []
    assert energy.window_note(window, "the timed calls").startswith("energy: not available here (")
    meter, why = open_meter("cuda")
    assert meter is None and "neither the energy counter nor the power" in why


def test_no_nvml_means_no_energy_and_the_run_says_why(fake_gpu: FakeNvml):
    set_backend(FakeNvml(init_error="Driver Not Loaded"))
    result = RunResult()
    assert energy.open_for_run("cuda", None, result) is None
    assert result.notes == ["energy: not available here (NVML did not start (Driver Not Loaded))"]
    out, window = measure(None, lambda: 42)
    assert (out, window) == (42, None) and energy_metrics(None, "token") == []


def test_an_unknown_device_and_the_switch_off(monkeypatch: pytest.MonkeyPatch):
    meter, why = open_meter("mps")
    assert meter is None and "'mps'" in why
    monkeypatch.setenv("MODELAB_ENERGY", "0")
    assert open_meter("cpu") == (None, "turned off by MODELAB_ENERGY=0")


def test_stored_metrics_carry_their_units(tmp_path: Path):
    window = EnergyWindow(seconds=2.0, joules=600.0, source="NVML energy counter", units=1000.0, runs=2, idle_w=100.0,
                          samples=[])
    metrics = energy_metrics(window, "token", tokens_per_unit=1, phase="decode", batch_size=4)
    store = Store(tmp_path / "r.duckdb")
    store.init()
    run_id = store.create_run("llm", "tiny", "eager", "cuda", {})
    store.record_result(run_id, RunResult(metrics=metrics))
    stored = store.metrics([run_id]).set_index("name")
    assert stored.loc["energy_per_token", "unit"] == "J/token"
    assert stored.loc["energy_per_token", "value"] == pytest.approx(0.6)
    assert stored.loc["energy_above_idle_per_token", "value"] == pytest.approx((600 - 200) / 1000)
    assert stored.loc["tokens_per_j", "unit"] == "tokens/J"
    assert stored.loc["tokens_per_j", "value"] == pytest.approx(1000 / 600)
    assert stored.loc["avg_power_w", "unit"] == "W" and stored.loc["avg_power_w", "value"] == pytest.approx(300)
    assert stored.loc["idle_power_w", "value"] == 100.0
    assert set(stored["phase"]) == {"decode"} and set(stored["batch_size"]) == {4}


def test_the_prefills_between_decode_passes_are_taken_out():
    prefill = EnergyWindow(seconds=1.0, joules=40.0, source="x", units=10)  # 4 J and 0.1 s per prefill
    decode = EnergyWindow(seconds=3.0, joules=300.0, source="x", units=100, idle_w=20.0)
    only = decode.less(prefill, count=5, units=100)
    assert only.joules == pytest.approx(280.0) and only.seconds == pytest.approx(2.5)
    assert only.above_idle_j == pytest.approx(280.0 - 20.0 * 2.5)
    assert decode.less(prefill, count=40, units=100) is None  # 160 J of 300: the rest would be mostly error


# -- RAPL ------------------------------------------------------------------------------------------------------------

def powercap(root: Path, zones: dict[str, tuple[int, int]]) -> Path:
    """A fake /sys/class/powercap: {zone: (energy_uj, max_energy_range_uj)}."""
    for name, (uj, max_uj) in zones.items():
        zone = root / name
        zone.mkdir(parents=True)
        (zone / "energy_uj").write_text(f"{uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
        (zone / "name").write_text(f"package-{name[-1]}\n")
    return root


def test_rapl_sums_the_packages_and_survives_wrap_around(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = powercap(tmp_path, {"intel-rapl:0": (999_000_000, 1_000_000_000), "intel-rapl:1": (5_000_000, 10**9),
                               "intel-rapl:0:0": (1, 10**9)})  # a sub-zone: part of package 0, not added again
    monkeypatch.setattr(energy, "POWERCAP_ROOT", root)
    meter, why = open_meter("cpu")
    assert meter is not None and why == "" and [z.name for z in meter.zones] == ["package-0", "package-1"]
    meter.min_window_s = 0.0

    def region() -> None:  # package 0 wraps past its range (2.5 J), package 1 adds 1.5 J
        (root / "intel-rapl:0" / "energy_uj").write_text("1500000\n")
        (root / "intel-rapl:1" / "energy_uj").write_text("6500000\n")

    _, window = measure(meter, region)
    assert window is not None and window.source == "RAPL package counters"
    assert window.joules == pytest.approx(2.5 + 1.5)
    assert energy.rapl_delta_uj(10, 30, 100) == 20 and energy.rapl_delta_uj(90, 5, 100) == 15


def test_rapl_unreadable_or_absent_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(energy, "POWERCAP_ROOT", tmp_path / "nothing")
    meter, why = open_meter("cpu")
    assert meter is None and why.startswith("no RAPL zones under")
    root = powercap(tmp_path / "pc", {"intel-rapl:0": (1, 10**9)})
    monkeypatch.setattr(energy, "POWERCAP_ROOT", root)
    real_read = Path.read_text

    def refuse(path: Path, *args, **kwargs) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)
    meter, why = open_meter("cpu")
    assert meter is None and why.endswith("energy_uj is not readable by this user")


# -- the idle draw ---------------------------------------------------------------------------------------------------

@pytest.fixture
def ticking_rapl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    """A CPU package drawing a steady 30 W: its counter follows the clock (and wraps every ~33 s)."""
    watts = 30.0
    monkeypatch.setattr(energy, "POWERCAP_ROOT", powercap(tmp_path / "pc", {"intel-rapl:0": (0, 10**9)}))
    monkeypatch.setattr(energy.RaplZone, "read_uj", lambda self: int(time.perf_counter() * watts * 1e6) % self.max_uj)
    monkeypatch.setattr(energy, "IDLE_WINDOW_S", 0.2)
    monkeypatch.setattr(energy, "RAPL_MIN_WINDOW_S", 0.05)
    monkeypatch.setattr(energy, "_IDLE_HERE", {})
    return watts


def test_the_idle_draw_is_measured_once_and_stored(ticking_rapl: float, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    db = str(tmp_path / "r.duckdb")
    result = RunResult()
    meter = energy.open_for_run("cpu", db, result)
    assert meter is not None and meter.idle_w == pytest.approx(ticking_rapl, rel=0.05)
    runs = Store(db).runs(kind=energy.IDLE_KIND)
    assert runs["status"].tolist() == ["ok"]
    assert [m.name for m in result.metrics] == ["idle_run_id"] and result.metrics[0].value == runs["id"].iloc[0]

    monkeypatch.setattr(energy, "measure_idle", lambda *a, **k: pytest.fail("the stored idle draw is reused"))
    again = energy.open_for_run("cpu", db, RunResult())
    assert again is not None and again.idle_w == meter.idle_w
    assert len(Store(db).runs(kind=energy.IDLE_KIND)) == 1
    _, window = measure(again, lambda: time.sleep(0.1), units=4)
    assert window is not None and window.above_idle_j == pytest.approx(0.0, abs=0.2)  # the package only idled


def test_levels_run_stores_joules_per_call(ticking_rapl: float, tmp_path: Path):
    from engine.levels.run import LevelsConfig, run_level

    cfg = LevelsConfig(component="causal_attention", shape="small", level="L1-naive", warmup=1, iters=3,
                       db=str(tmp_path / "r.duckdb"), artifacts_dir=str(tmp_path))
    result = run_level(cfg)
    found = {m.name: m for m in result.metrics if m.phase == "forward"}
    step = found["energy_per_step"]
    assert step.unit == "J/step"
    window_s, calls = found["energy_window_s"].value, found["energy_window_runs"].value * 4
    assert window_s >= 0.05 and step.value == pytest.approx(ticking_rapl * window_s / calls, rel=0.05)
    assert found["avg_power_w"].value == pytest.approx(ticking_rapl, rel=0.05)
    assert any(n.startswith("energy: the RAPL package counters") and "idle draw 30" in n for n in result.notes)


def test_llm_run_stores_joules_per_token_and_per_prefill(ticking_rapl: float, tmp_path: Path):
    from engine.llm.run import LLMConfig, llm_run

    cfg = LLMConfig(preset="tiny", prompt_len=4, new_tokens=16, batch=2, mode="eager", prefill_iters=2,
                    decode_passes=1, check_tokens=2, profile=False, ceilings="none", db=str(tmp_path / "r.duckdb"),
                    artifacts_dir=str(tmp_path / "a"))
    result = llm_run(cfg)
    decode = {m.name: m for m in result.metrics if m.phase == "decode"}
    prefill = {m.name: m for m in result.metrics if m.phase == "prefill"}
    assert decode["energy_per_token"].unit == "J/token" and decode["energy_per_token"].value > 0
    assert decode["tokens_per_j"].value == pytest.approx(1 / decode["energy_per_token"].value)
    assert prefill["energy_per_prefill"].unit == "J/prefill"
    assert prefill["tokens_per_j"].value == pytest.approx(2 * 4 / prefill["energy_per_prefill"].value)
    # a steady 30 W: what the decode window drew, less its prefills, is 30 W over what is left of it
    assert decode["avg_power_w"].value == pytest.approx(ticking_rapl, rel=0.1)
    per_token = decode["energy_per_token"].value
    assert decode["energy_above_idle_per_token"].value == pytest.approx(0.0, abs=0.05 * per_token)


def test_bench_stores_joules_per_step_for_each_phase(ticking_rapl: float, tmp_path: Path):
    from engine.bench.run import BenchConfig, bench_mode

    cfg = BenchConfig(mode="eager", batch_sizes=(4,), train_batch_sizes=(8,), warmup=1, iters=3, adaptive=False,
                      loop=False, db=str(tmp_path / "r.duckdb"))
    result = bench_mode(cfg)
    for phase, batch in (("infer", 4), ("train", 8)):
        found = {m.name: m for m in result.metrics if (m.phase, m.batch_size) == (phase, batch)}
        step = found["energy_per_step"]
        assert step.unit == "J/step" and found["energy_above_idle_per_step"].unit == "J/step"
        calls = found["energy_window_runs"].value * 4  # each run of the region: 1 warm-up call and 3 timed
        assert step.value == pytest.approx(ticking_rapl * found["energy_window_s"].value / calls, rel=0.05)
    assert sum(n.startswith("energy: the RAPL package counters") for n in result.notes) == 1
