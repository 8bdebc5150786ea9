"""What the native route buys (engine.llm.report.native_vs_transformers), on hand-made rows: the fastest native mode
among the runs that passed, against transformers' compile-cudagraph where there is one (its fastest mode else), one
per configuration, nothing where a side is missing; and the newest group of a checkpoint that has both."""

from __future__ import annotations

import pandas as pd

from engine.llm.report import latest_native_vs_transformers, native_vs_transformers

CKPT = "llama (LlamaForCausalLM, 0123456789abcdef)"


def row(run_id: int, mode: str, tpot_us: float | None, status: str = "ok", route: str | None = None,
        **config: object) -> dict[str, object]:
    route = route or ("transformers" if mode.startswith("transformers-") else "native")
    return {"id": run_id, "mode": mode, "status": status, "route": route, "tpot_median_us": tpot_us,
            "checkpoint": CKPT, "device": "cuda", "dtype": None, "batch": 1, "prompt_len": 512, "new_tokens": 128,
            **config}


def test_the_best_passing_native_mode_against_transformers_compile_cudagraph() -> None:
    rows = [row(1, "eager", 9000.0), row(2, "triton-fused", 2000.0), row(3, "compile-cudagraph", 1500.0, "failed"),
            row(4, "sdpa-flash", None),  # prefill only: no TPOT
            row(5, "transformers-compile", 4000.0), row(6, "transformers-compile-cudagraph", 5000.0)]
    (found,) = native_vs_transformers(rows)
    assert (found.native_mode, found.native_run, found.native_tpot_us) == ("triton-fused", 2, 2000.0)
    # compile-cudagraph is preferred even where transformers' plain compile was faster
    assert (found.transformers_mode, found.transformers_run, found.graphed) == ("transformers-compile-cudagraph", 6,
                                                                                True)
    assert found.ratio == 2.5
    assert found.line() == ("what the native route buys: triton-fused TPOT 2.00 ms vs transformers' "
                            "compile-cudagraph 5.00 ms: 2.50×")
    assert native_vs_transformers(pd.DataFrame(rows)) == [found]  # llm_runs' frame, NaN for the missing TPOT


def test_without_compile_cudagraph_the_fastest_transformers_mode_and_it_says_so() -> None:
    (found,) = native_vs_transformers([row(1, "eager", 3000.0), row(2, "transformers-eager", 6000.0),
                                       row(3, "transformers-compile", 4500.0)])
    assert found.transformers_mode == "transformers-compile" and not found.graphed
    assert found.line() == ("what the native route buys: eager TPOT 3.00 ms vs transformers' compile 4.50 ms: 1.50× "
                            "(no transformers-compile-cudagraph run beside it: transformers' fastest mode in the "
                            "group)")


def test_absent_when_a_side_is_missing_or_only_failed() -> None:
    assert native_vs_transformers([row(1, "eager", 3000.0), row(2, "triton-fused", 2000.0)]) == []
    assert native_vs_transformers([row(1, "transformers-eager", 3000.0)]) == []
    assert native_vs_transformers([row(1, "eager", 3000.0, "failed"), row(2, "transformers-eager", 3000.0)]) == []
    # a transformers-route folder (GPT-2): every run is transformers' module, nothing native to compare
    assert native_vs_transformers([row(1, "eager", 3000.0, route="transformers"),
                                   row(2, "compile", 2000.0, route="transformers")]) == []


def test_one_headline_per_configuration() -> None:
    rows = [row(1, "eager", 3000.0, batch=1), row(2, "transformers-eager", 6000.0, batch=1),
            row(3, "eager", 5000.0, batch=8), row(4, "transformers-eager", 7000.0, batch=8),
            row(5, "eager", 1000.0, batch=16)]  # no transformers run at B=16
    assert [(f.native_run, f.transformers_run) for f in native_vs_transformers(rows)] == [(1, 2), (3, 4)]


def test_the_newest_group_of_the_checkpoint_with_both() -> None:
    runs = pd.DataFrame([row(1, "eager", 3000.0, group_id="old"), row(2, "transformers-eager", 6000.0, group_id="old"),
                         row(3, "eager", 2000.0, group_id="new"), row(4, "transformers-eager", 3000.0, group_id="new"),
                         row(5, "eager", 1000.0, group_id="newest"),  # one side only
                         row(6, "eager", 1.0, checkpoint="other", group_id="x"),
                         row(7, "transformers-eager", 2.0, checkpoint="other", group_id="x")])
    (found,) = latest_native_vs_transformers(runs, CKPT)
    assert (found.native_run, found.transformers_run, found.ratio) == (3, 4, 1.5)
    assert latest_native_vs_transformers(runs, "nothing") == []
