"""Measured time on the IR graph: tie rules on a hand-made trace, a real CPU profile of house_price attributed to its
IR through the store, the two-mode comparison, and the mermaid colouring."""

from __future__ import annotations

import pytest

from engine.ir.graph import IR, OpNode, TensorMeta
from engine.ir.mermaid import to_mermaid
from engine.ir.overlay import (
    attribute,
    compare,
    fractions,
    module_table,
    overlay_for_run,
    profile_runs,
    profile_workloads,
    reproduce_command,
)
from engine.ir.runs import extract_run
from engine.runner import jobs

H = {"pid": 1, "tid": 1}


def op(name: str, ts: float, dur: float, dims: list) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "args": {"Input Dims": dims}, **H}


def relu_chain() -> IR:
    """x[4, 8] -> relu -> relu -> (module b) relu -> sum[]: three identical relus, the last in another module."""
    x = TensorMeta("x", [4, 8], "float32")
    nodes = []
    prev = "x"
    for i, module in enumerate(["a", "a", "b"]):
        nodes.append(OpNode(f"relu_{i}", "aten.relu.default", [prev], [TensorMeta(f"relu_{i}", [4, 8], "float32")],
                            module_path=module))
        prev = f"relu_{i}"
    nodes.append(OpNode("sum_1", "aten.sum.default", [prev], [TensorMeta("sum_1", [], "float32")], module_path="b"))
    return IR(nodes=nodes, graph_inputs=[x], graph_outputs=["sum_1"], weights={}, weight_name_mapping={},
              module_types={"a": "A", "b": "B"})


def test_ties_match_the_kth_call_to_the_kth_node() -> None:
    ir = relu_chain()
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **H},
          op("aten::relu", 1, 10, [[4, 8]]),  # 1st relu with these shapes -> relu_0
          op("aten::relu", 12, 20, [[4, 8]]),  # 2nd -> relu_1
          op("aten::relu", 33, 30, [[2, 8]]),  # other shapes: a leftover, matched by name -> relu_2
          op("aten::sum", 64, 5, [[4, 8], []]),  # shapes match sum_1's input
          op("aten::clone", 70, 7, [[4, 8], []]),  # no IR op of this name: unmatched
          {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 100, "dur": 100, **H},
          op("aten::relu", 101, 12, [[4, 8]]), op("aten::relu", 114, 22, [[4, 8]]), op("aten::relu", 137, 32, [[2, 8]]),
          op("aten::sum", 170, 7, [[4, 8], []]), op("aten::clone", 178, 9, [[4, 8], []])]
    ov = attribute(ir, {"traceEvents": ev})
    assert ov.basis == "cpu" and ov.steps == 2
    assert ov.node_us == pytest.approx({"relu_0": 11, "relu_1": 21, "relu_2": 31, "sum_1": 6})
    assert ov.node_how == {"relu_0": "shape", "relu_1": "shape", "relu_2": "name", "sum_1": "shape"}
    assert [(m.name, m.calls, m.us) for m in ov.unmatched] == [("aten::clone", 2, pytest.approx(8))]
    assert ov.total_us == pytest.approx(77) and ov.share == pytest.approx(69 / 77)
    assert ov.module_us == pytest.approx({"": 69, "a": 32, "b": 37})
    table = module_table(ir, ov).set_index("module")
    assert table.loc["b", "us_per_step"] == pytest.approx(37) and table.loc["a", "ops"] == 2


def test_kernels_that_overlap_count_once_on_the_graph() -> None:
    """A GPU profile under programmatic dependent launch: each kernel starts while the one before drains, so its
    duration also counts that wait; a node gets its kernel's share of the critical path, and the nodes add up to the
    device's busy time (here 55 µs), not to the durations (70)."""
    ir = relu_chain()
    D = {"pid": 0, "tid": 7}

    def launch(name: str, ts: float, ext: int, dims: list) -> dict:
        return {**op(name, ts, 3, dims), "args": {"Input Dims": dims, "External id": ext}}

    def kernel(ts: float, dur: float, ext: int) -> dict:
        return {"ph": "X", "cat": "kernel", "name": f"k{ext}", "ts": ts, "dur": dur, "args": {"External id": ext}, **D}

    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **H},
          launch("aten::relu", 1, 1, [[4, 8]]), launch("aten::relu", 5, 2, [[4, 8]]),
          launch("aten::relu", 9, 3, [[4, 8]]), launch("aten::sum", 13, 4, [[4, 8], []]),
          kernel(20, 10, 1), kernel(25, 20, 2), kernel(40, 25, 3), kernel(60, 15, 4)]  # ends 30, 45, 65, 75
    ov = attribute(ir, {"traceEvents": ev})
    assert ov.basis == "device"
    assert ov.node_us == pytest.approx({"relu_0": 10, "relu_1": 15, "relu_2": 20, "sum_1": 10})
    assert ov.total_us == pytest.approx(55) and ov.share == pytest.approx(1.0)


def test_a_compiled_profile_reports_fused_kernels_and_what_is_new() -> None:
    ir = relu_chain()
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **H}
    eager = [step, op("aten::relu", 1, 10, [[4, 8]]), op("aten::relu", 12, 10, [[4, 8]]),
             op("aten::relu", 23, 10, [[4, 8]]), op("aten::sum", 34, 10, [[4, 8], []])]
    call = {"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph abc ##", "ts": 5, "dur": 40, **H}
    compiled = [step, {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "ts": 1, "dur": 50, **H}, call,
                op("aten::sum", 30, 10, [[4, 8], []])]
    a, b = attribute(ir, {"traceEvents": eager}), attribute(ir, {"traceEvents": compiled})
    assert b.node_us == pytest.approx({"sum_1": 10})  # found inside the opened compiled region
    c = compare(ir, a, b)
    status = dict(zip(c.nodes["node"], c.nodes["status"]))
    assert status == {"relu_0": "fused away", "relu_1": "fused away", "relu_2": "fused away", "sum_1": "kept"}
    fused = dict(zip(c.fused["name"], c.fused["us_per_step"]))
    assert fused == pytest.approx({"## Call CompiledFxGraph abc ##": 30, "Torch-Compiled Region: 0/0": 10})
    assert set(c.new["name"]) == {"## Call CompiledFxGraph abc ##", "Torch-Compiled Region: 0/0"}


def test_mermaid_is_unchanged_without_colour_and_styled_with_it() -> None:
    ir = relu_chain()
    plain = to_mermaid(ir)
    assert to_mermaid(ir, colour=None).text == plain.text
    assert "heat" not in plain.text
    shaded = to_mermaid(ir, colour={("node", "relu_0"): 1.0, ("node", "relu_1"): 0.1, ("node", "nope"): 0.5})
    assert shaded.text.startswith(plain.text.rstrip("\n"))  # the same chart, style lines added at the end
    assert shaded.text.count("classDef heat") == 5
    ids = {name: mid for mid, (kind, name) in shaded.items.items() if kind == "node"}
    assert f"class {ids['relu_0']} heat4" in shaded.text and f"class {ids['relu_1']} heat0" in shaded.text
    boxes = to_mermaid(ir, depth=1, colour={("module", "a"): 1.0, ("module", "b"): 0.5})
    mods = {name: mid for mid, (kind, name) in boxes.items.items() if kind == "module"}
    assert f"class {mods['a']} heat4" in boxes.text and f"class {mods['b']} heat2" in boxes.text


# -- a real profile of house_price through the job runner ---------------------------------------------------------
@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory, module_lab):
    """house_price's IR extracted into a store, and an eager CPU profile of its forward (infer, B=64) by a worker."""
    with module_lab(tmp_path_factory.mktemp("overlay")) as (store, _env):
        ex = extract_run(store, "house_price", "batch64")
        prof = {"workload": "house_price", "mode": "eager", "device": "cpu", "phases": ["infer"], "batch_size": 64,
                "wait": 0, "warmup": 1, "active": 2, "settle": 1, "unprofiled_iters": 2}
        ids = jobs.create_runs(store, [jobs.JobSpec("profile", "house_price", "eager", "cpu", prof)])
        statuses = jobs.run_jobs(store, ids)
        assert statuses[ids[0]] == "ok", store.run(ids[0])["error"]
        yield {"store": store, "ir": ex.ir, "profile": ids[0]}


def test_attribution_covers_the_profiled_step_of_house_price(profiled) -> None:
    store, ir = profiled["store"], profiled["ir"]
    runs = profile_runs(store, profile_workloads("house_price", "batch64", "batch64"))
    assert list(runs["id"]) == [profiled["profile"]]
    ov = overlay_for_run(store, ir, profiled["profile"])
    assert ov is not None and ov.basis == "cpu" and ov.phase == "infer" and ov.steps == 2
    print(f"\nhouse_price eager cpu infer B=64: {ov.share_text()} "
          f"({ov.attributed_us:.0f} of {ov.total_us:.0f} us per step)")
    assert ov.share >= 0.90
    assert not ov.unobserved and set(ov.node_how.values()) == {"shape"}  # every op found with its shapes
    assert sum(ov.module_us[m] for m in ("fc1", "fc2", "fc3", "relu1", "relu2")) == pytest.approx(ov.attributed_us)
    graph = to_mermaid(ir)
    colour = fractions(graph.items.values(), ov)
    assert max(colour.values()) == pytest.approx(1.0) and len(colour) == len(ir.nodes)
    assert "classDef heat4" in to_mermaid(ir, colour=colour).text
    cmd = reproduce_command(store.run(profiled["profile"]), ov.phase)
    assert cmd == "python -m engine profile --workload house_price --mode eager --device cpu --phases infer " \
                  "--batch-size 64"
