"""A mode, level, component, shape, phase or batch size named twice in a command's list runs once, at its first place:
`bench --mode eager,eager` made two eager runs and showed eager 1.70x itself."""

from __future__ import annotations

import pytest

from engine.cli.args import CliError, phases_arg, positive_ints
from engine.levels import resolve_levels
from engine.modes import resolve_modes


def test_resolvers_keep_the_first_of_each() -> None:
    modes, _ = resolve_modes("fx,eager,fx,eager", "cpu")
    assert [m.name for m in modes] == ["fx", "eager"]
    levels, _ = resolve_levels("L4-triton,1,L1-naive,4", "cpu")
    assert [lv.key for lv in levels] == ["L4-triton", "L1-naive", "L1-native"]
    assert phases_arg("train,infer,train") == ("train", "infer")
    assert positive_ints("8,1,8") == (8, 1)


@pytest.mark.parametrize("argv, runs", [
    (["bench", "--mode", "eager,fx,eager", "--phases", "infer,infer"], [("eager",), ("fx",)]),
    (["profile", "--mode", "eager,eager,fx"], [("eager",), ("fx",)]),
    (["levels", "--component", "causal_attention,causal_attention", "--shape", "small,small",
      "--level", "L1-naive,1,L1-naive"], [("causal_attention", "small", "L1-naive"),
                                          ("causal_attention", "small", "L1-native")]),
    (["llm", "--preset", "tiny", "--mode", "eager,eager"], [("eager",)]),
])
def test_a_command_queues_each_named_item_once(argv, runs, monkeypatch, tmp_path) -> None:
    """The runs each command would queue, caught at create_runs (nothing runs)."""
    import engine.runner.jobs as jobs
    from engine.cli.main import main

    queued: list = []

    def catch(store, specs, *args, **kwargs):
        queued.extend(specs)
        raise CliError("caught")

    monkeypatch.setattr(jobs.Launcher, "prestart", lambda self: None)
    monkeypatch.setattr(jobs, "create_runs", catch)
    assert main([*argv, "--device", "cpu", "--db", str(tmp_path / "r.duckdb")]) == 2
    if argv[0] == "levels":
        assert [(s.params["component"], s.params["shape"], s.params["level"]) for s in queued] == runs
    else:
        assert [(s.mode,) for s in queued] == runs
    if argv[0] == "bench":
        assert {tuple(s.params["phases"]) for s in queued} == {("infer",)}
