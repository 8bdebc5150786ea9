"""The LLM page: queuing runs and sweeps, the cards (each % naming its ceiling), the decode-latency, operator and
roofline charts from real stored runs, two runs side by side, the report downloads, and failures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.llm.modes import MODES, availability
from engine.llm.run import LLMConfig, llm_run, params_of
from engine.measure.ceilings import CEILINGS
from engine.runner import jobs
from engine.store.db import Metric, RunResult, Store
from engine.store.envinfo import capture_env

PAGE = Path(__file__).resolve().parents[2] / "app" / "pages" / "6_LLM.py"


def open_llm() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=90)


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.fixture(scope="module")
def sweep_results(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, RunResult]]:
    """Two real eager runs of the tiny preset on the CPU (B=1 and B=2, a batch sweep), against stored ceilings."""
    folder = tmp_path_factory.mktemp("llm-page")
    store = Store(folder / "ceilings.duckdb")
    store.init()
    cid = store.create_run("ceilings", "ceilings", "measure", "cpu", {"device": "cpu"})
    store.start_run(cid)
    store.record_result(cid, RunResult(env=capture_env("cpu"), metrics=[
        Metric("copy_bw", 2e10, CEILINGS["copy_bw"][0]), Metric("matmul_fp32", 5e10, "FLOP/s")]))
    out = []
    for batch in (1, 2):
        cfg = LLMConfig(preset="tiny", prompt_len=8, new_tokens=4, batch=batch, mode="eager", prefill_iters=2,
                        decode_passes=2, check_tokens=2, profile_decode_steps=2, sweep="batch", ceilings="stored",
                        db=str(store.path), artifacts_dir=str(folder / f"b{batch}"))
        out.append((params_of(cfg), llm_run(cfg)))
    return out


def add_runs(store: Store, results: list[tuple[dict, RunResult]], group: str | None = "g1") -> list[int]:
    ids = []
    for params, result in results:
        run_id = store.create_run("llm", "llama-tiny", params["mode"], "cpu", params, group_id=group)
        store.start_run(run_id)
        store.record_result(run_id, result)
        ids.append(run_id)
    return ids


def test_empty_store_offers_a_first_run(lab: Store) -> None:
    at = open_llm().run()
    assert not at.exception
    assert "No LLM runs yet" in texts(at.info)
    runnable = [n for n, m in MODES.items() if availability(m, "cpu", __import__("torch").float32) is None
                and m.route == "native"]  # the transformers-* modes need an --hf folder (the CLI's)
    assert at.button(key="llm-run").label == f"Run ({len(runnable)} runs)"  # mode "all": every available mode
    assert not at.get("plotly_chart")


def test_run_button_queues_a_batch_sweep(lab: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = []

    def fake_submit(store, specs, group_id=None):
        submitted.append((specs, group_id))
        return list(range(1, len(specs) + 1))

    monkeypatch.setattr(jobs, "submit", fake_submit)
    at = open_llm().run()
    at.selectbox(key="new-mode").set_value("eager").run()
    at.selectbox(key="new-sweep").set_value("batch B").run()
    at.text_input(key="new-sweep-batch").set_value("1, 4").run()
    assert at.button(key="llm-run").label == "Run (2 runs)"
    at.button(key="llm-run").click().run()
    assert not at.exception
    (specs, group), = submitted
    assert [s.params["batch"] for s in specs] == [1, 4] and group
    assert all(s.kind == "llm" and s.mode == "eager" and s.params["sweep"] == "batch" for s in specs)
    assert "Queued 2 LLM run(s)" in texts(at.success)


def test_unavailable_mode_and_bad_sweep_disable_the_run(lab: Store) -> None:
    at = open_llm().run()
    at.selectbox(key="new-mode").set_value("compile-cudagraph").run()
    assert "compile-cudagraph is not available on cpu" in texts(at.error)
    assert at.button(key="llm-run").disabled
    at.selectbox(key="new-mode").set_value("eager").run()
    at.selectbox(key="new-sweep").set_value("prompt length P").run()
    at.text_input(key="new-sweep-prompt_len").set_value("128, lots").run()
    assert "Sweep values must be whole numbers" in texts(at.error)
    assert at.button(key="llm-run").disabled


def test_cards_charts_roofline_comparison_and_report(lab: Store, sweep_results) -> None:
    ids = add_runs(lab, sweep_results)
    at = open_llm().run()
    assert not at.exception
    labels = {m.label: m for m in at.metric}
    for label in ("TTFT (prefill)", "TPOT (decode)", "Tokens/s (decode)", "MFU (prefill)", "MBU (decode)"):
        assert label in labels and labels[label].value not in ("—", "")
    captions = texts(at.caption)
    assert "% of the measured fp32 matmul rate" in captions
    assert "% of the measured device-to-device copy bandwidth" in captions
    assert "memory-bound" in captions or "compute-bound" in captions
    # decode latency, prefill box, prefill and decode operators, roofline, A-vs-B operator bars (2)
    charts = at.get("plotly_chart")
    assert len(charts) >= 7
    roof = [c for c in charts if "Roofline" in c.proto.spec]
    assert len(roof) == 1 and "measured roof" in roof[0].proto.spec
    assert sorted(at.multiselect(key=f"roof-{ids[-1]}").value) == sorted(ids)  # the sweep's runs by default
    table = next(d.value for d in at.dataframe if "B / A" in d.value.columns)  # (no lookup by key in AppTest)
    assert list(table["figure"])[:3] == ["TTFT", "TPOT median", "TPOT p90"]
    ttft = table.set_index("figure").loc["TTFT"]
    assert ttft["B / A"].endswith("×") and "ms" in ttft.iloc[0] or "µs" in ttft.iloc[0]
    assert len(at.download_button) == 6  # report.md … assumptions.md
    assert f"python -m engine llm-report {ids[-1]}" in captions
    # the selected run's timing state beside its cards, and what its windows recorded
    assert any(line.split(":material/warning: ")[-1].startswith("Timing: ") for line in captions.splitlines())
    [expander] = [e for e in at.expander if e.label == f"Conditions of run #{ids[-1]}"]
    assert set(expander.dataframe[0].value["series"]) == {"prefill B=2", "decode B=2"}


def test_failed_run_shows_its_error(lab: Store) -> None:
    run_id = lab.create_run("llm", "llama-7B", "compile-cudagraph", "cuda", {"preset": "7B"})
    lab.start_run(run_id)
    lab.fail_run(run_id, "ToleranceError: compile-cudagraph: decode step 3 logits differ from eager's\n--- tb ---")
    at = open_llm().run()
    assert not at.exception
    assert "decode step 3 logits differ" in texts(at.error)
    assert "--- tb ---" in texts(at.code)


def test_what_the_native_route_buys_for_a_checkpoint(lab: Store, sweep_results) -> None:
    """A native checkpoint's newest group with a native mode and transformers' own: the headline over the cards,
    computed by engine.llm.report.native_vs_transformers (the CLI prints the same line)."""
    params, result = sweep_results[0]
    ckpt = {"folder": "/models/llama", "architecture": "LlamaForCausalLM", "parameters": 1000, "dtype": "F32",
            "weights": "safetensors", "hash": "0123456789abcdef", "route": "native"}
    slower = dataclasses.replace(result, metrics=[dataclasses.replace(m, value=2 * m.value)
                                                  if m.name == "tpot_median_us" else m for m in result.metrics])
    native_id, theirs_id = add_runs(lab, [({**params, "checkpoint": ckpt}, result),
                                          ({**params, "mode": "transformers-eager",
                                            "checkpoint": {**ckpt, "route": "transformers"}}, slower)], group="g2")
    at = open_llm().run()
    assert not at.exception
    line = next(t for t in (str(e.value) for e in at.info) if t.startswith("What the native route buys: eager TPOT"))
    assert "vs transformers' eager" in line and ": 2.00×" in line
    assert f"runs #{native_id} and #{theirs_id}" in line
    assert "transformers-eager" not in [o for o in at.selectbox(key="new-mode").options]  # presets only here


def test_a_group_with_a_quantized_mode_shows_bytes_and_its_gate(lab: Store, sweep_results) -> None:
    """eager and int8-wo of the tiny preset (real CPU runs) in one group: the modes table puts bytes per token, the
    gain over the unquantized step and each run's check beside TPOT; the quantized run's card states its gate."""
    from engine.llm.quant import GATE_STEPS, GATES

    params, result = sweep_results[0]
    cfg = LLMConfig(preset="tiny", prompt_len=8, new_tokens=GATE_STEPS + 1, mode="int8-wo", prefill_iters=1,
                    decode_passes=1, profile=False, ceilings="none")
    eager_id, quant_id = add_runs(lab, [(params, result), (params_of(cfg), llm_run(cfg))], group="g3")
    at = open_llm().run()
    assert not at.exception
    assert at.selectbox(key="run-a").value == quant_id  # the newest run is selected
    table = next(d.value for d in at.dataframe if "bytes / token" in d.value.columns).set_index("mode")
    assert list(table["run"]) == [f"#{quant_id}", f"#{eager_id}"]
    assert table.loc["int8-wo", "vs unquantized"].endswith("× fewer") and table.loc["eager", "vs unquantized"] == "1×"
    assert table.loc["int8-wo", "accuracy"].startswith("top-1 ") and table.loc["eager", "accuracy"] == "the reference"
    assert table.loc["eager", "timing"].split(":")[0] in ("clean", "noisy", "interfered")  # each run's noise state
    captions = texts(at.caption)
    assert "accuracy gate: greedy top-1 agreement with the unquantized model" in captions
    assert f"(≥ {GATES['int8-wo'].min_top1:g})" in captions and "logits vs eager" not in captions
