"""Energy on the Benchmark and LLM pages: J/step or J/token beside latency and the energy-vs-latency chart with its
Pareto front, from a store with energy rows; without them, neither shows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.store.db import Store

ROOT = Path(__file__).resolve().parents[2]


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def add_energy(store: Store, run_id: int, phase: str, batch: int | None, rows: dict[str, tuple[float, str]]) -> None:
    with store.connect() as con:
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)",
                        [[run_id, phase, batch, name, value, unit] for name, (value, unit) in rows.items()])


def chart_spec(at: AppTest, key: str) -> dict:
    (chart,) = [c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or key in c.proto.id]
    return json.loads(chart.proto.spec)


def test_benchmark_page_shows_energy_and_the_front(lab: Store, bench_run, page) -> None:
    joules = {"eager": 0.005, "compile": 0.008, "fx": 0.009}  # compile: faster, dearer; fx: beaten by compile
    for mode, median in (("eager", 100.0), ("compile", 60.0), ("fx", 95.0)):
        run_id = bench_run(lab, mode, median, points=(("infer", 64),))
        add_energy(lab, run_id, "infer", 64, {"energy_per_step": (joules[mode], "J/step"),
                                              "energy_above_idle_per_step": (joules[mode] / 4, "J/step"),
                                              "avg_power_w": (320.0, "W")})
    at = page("benchmark").run()
    assert not at.exception
    captions = texts(at.caption)
    assert "Energy: 5 mJ per step (1.25 mJ above idle) · 320 W average" in captions
    spec = chart_spec(at, "chart-energy")
    stars = {t["name"]: t["marker"]["symbol"] for t in spec["data"] if t.get("mode") == "markers+text"}
    assert stars == {"eager": ["star"], "compile": ["star"], "fx": ["circle"]}
    front = [t for t in spec["data"] if t.get("name") == "Pareto front"]
    assert front and list(front[0]["x"]) == [60.0 * 1.125, 100.0 * 1.125]  # the fixture's medians at B=64


def test_benchmark_page_without_energy_has_no_energy_chart(lab: Store, bench_run, page) -> None:
    bench_run(lab, "eager", 100.0, points=(("infer", 64),))
    at = page("benchmark").run()
    assert not at.exception
    assert "Energy:" not in texts(at.caption)
    assert not [c for c in at.get("plotly_chart") if "chart-energy" in c.proto.id]


@pytest.fixture
def ticking_rapl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU package drawing a steady 30 W, so a real LLM run on this CPU measures energy."""
    from engine.measure import energy

    zone = tmp_path / "pc" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text("0\n")
    (zone / "max_energy_range_uj").write_text(f"{10**9}\n")
    monkeypatch.setattr(energy, "POWERCAP_ROOT", tmp_path / "pc")
    monkeypatch.setattr(energy.RaplZone, "read_uj", lambda self: int(time.perf_counter() * 30e6) % self.max_uj)
    monkeypatch.setattr(energy, "IDLE_WINDOW_S", 0.1)
    monkeypatch.setattr(energy, "RAPL_MIN_WINDOW_S", 0.05)


def test_llm_page_shows_joules_per_token_and_the_chart(lab: Store, ticking_rapl, tmp_path: Path) -> None:
    from engine.llm.run import LLMConfig, llm_run, params_of

    for mode in ("eager", "sdpa-math"):
        cfg = LLMConfig(preset="tiny", prompt_len=4, new_tokens=8, batch=1, mode=mode, prefill_iters=2,
                        decode_passes=1, check_tokens=2, profile=False, ceilings="none", db=str(lab.path),
                        artifacts_dir=str(tmp_path / mode))
        result = llm_run(cfg)
        run_id = lab.create_run("llm", "llama-tiny", mode, "cpu", params_of(cfg))
        lab.start_run(run_id)
        lab.record_result(run_id, result)
    at = AppTest.from_file(str(ROOT / "app" / "pages" / "6_LLM.py"), default_timeout=90).run()
    assert not at.exception
    assert "per token (" in texts(at.caption) and "tokens/J" in texts(at.caption)
    # Each phase's chart holds exactly the runs that stored that phase's energy. A decode window that the prefills
    # between its passes dominate stores none (engine.llm.run), which a loaded machine can do to both runs: then the
    # page says so in place of the decode chart.
    charted = 0
    for phase, name, unit in (("decode", "energy_per_token", "J/token"), ("prefill", "energy_per_prefill", "J/")):
        measured = set(lab.query("SELECT r.mode FROM runs r JOIN metrics m ON m.run_id = r.id "
                                 f"WHERE m.name = '{name}' AND m.phase = '{phase}'")["mode"])
        if not measured:
            assert f"No {phase} energy in these runs." in texts(at.info), phase
            assert not [c for c in at.get("plotly_chart") if f"chart-energy-{phase}" in c.proto.id], phase
            continue
        spec = chart_spec(at, f"chart-energy-{phase}")
        assert {t["name"] for t in spec["data"] if t.get("mode") == "markers+text"} == measured, phase
        assert unit in spec["layout"]["yaxis"]["title"]["text"], phase
        charted += 1
    assert charted, "neither phase stored energy from the ticking package"
