"""Measured time on the IR graph: a profile run's operator events attributed to IR nodes and summed per module.

Input: an IR (engine.ir.graph) and the Chrome trace of a profile run (engine.profiling, kind 'profile', recorded with
input shapes). Output: an `Overlay` — time per IR node and per module, per profiled step — plus what matched nothing.

Basis. On a GPU profile the time is *device* time: every kernel, memcpy and memset in the trace (the trace holds only
the profiled steps), each given to the host operator that launched it (its "External id") and counted by its self
time (op_stats: the part no earlier-started device event covers, so kernels that overlap — programmatic dependent
launch, several streams — are not counted twice). On a CPU profile it is
*self CPU time*: the self time (duration minus nested host events) of every operator and record_function range other
than ProfilerStep#N — compiled code runs its fused C++ kernels inside the "## Call CompiledFxGraph ##" range, so that
range's self time is where they show. The share's denominator is that total over the ProfilerStep#N windows.

Units. Per step, the candidate events are the top-level host operators and record_function ranges (nothing but a
ProfilerStep above them). A candidate whose name is no IR op (aten::linear for aten.linear.default) and that has
nested operators — "Torch-Compiled Region", "## Call CompiledFxGraph ##", autograd wrappers — is opened: it keeps only
its own self time and its nested operators become candidates (recursively). A unit's time is its whole subtree's
(self CPU time of the operators and ranges in it, or the device time of the kernels they launched).

Ties, in this order, within each profiled step independently:
1. shape match: the k-th unit (in order of execution) with a given aten name and tensor input shapes (the profiler's
   "Input Dims" with non-tensor arguments left out) goes to the k-th IR node with that op and input shapes, in the
   IR's topological order;
2. name match: leftover units and leftover nodes with the same aten name, again k-th to k-th in order;
3. alias match: leftovers whose names are known decompositions of each other (aten::linear ↔ aten::addmm / aten::mm,
   see ALIASES: what torch.compile calls for a linear), k-th to k-th;
4. everything left is reported: units as `unmatched` (by name, with their time; on a GPU by kernel name), nodes as
   `unobserved`. Kernels no unit launched are unmatched too.
A node's time is the sum over steps divided by the number of steps (µs per step). `share` = attributed / total.
Only IR nodes of the top-level graph are matched (control-flow bodies run inside their cond/while op).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from engine.ir.graph import IR, OpNode
from engine.measure.op_stats import STEP_RE, Event, load_trace, timed_events

ALIASES = {"aten::linear": "linear", "aten::addmm": "linear", "aten::mm": "linear", "aten::matmul": "linear",
           "aten::bmm": "bmm", "aten::baddbmm": "bmm"}
FUSED_RE = re.compile(r"triton|fused|CompiledFxGraph|Compiled Region|inductor|cpp_|CompiledFunction", re.I)
BASIS_TEXT = {"device": "device time", "cpu": "self CPU time of operators"}


@dataclass
class Unmatched:
    name: str
    calls: int  # over all profiled steps
    us: float  # per step


@dataclass
class Overlay:
    basis: str  # "device" or "cpu"
    steps: int
    total_us: float  # per step: the profiled step's device (or operator self CPU) time
    node_us: dict[str, float]  # IR node -> µs per step
    node_how: dict[str, str]  # IR node -> "shape", "name" or "alias: aten::addmm"
    module_us: dict[str, float]  # module path ("" the root) -> µs per step, enclosing modules included
    unmatched: list[Unmatched] = field(default_factory=list)
    unobserved: list[str] = field(default_factory=list)  # IR nodes no event was attributed to
    phase: str | None = None
    run_id: int | None = None
    event_us: dict[str, float] = field(default_factory=dict)  # every event or kernel name -> µs per step

    @property
    def attributed_us(self) -> float:
        return sum(self.node_us.values())

    @property
    def share(self) -> float:
        return self.attributed_us / self.total_us if self.total_us > 0 else 0.0

    def share_text(self) -> str:
        what = "device time" if self.basis == "device" else "operator self CPU time"
        return f"attributed {self.share * 100:.0f} % of the profiled step's {what}"


@dataclass
class _Unit:
    event: Event
    own_only: bool  # an opened wrapper: its own time only
    us: float = 0.0
    kernels: Counter = field(default_factory=Counter)  # device basis: kernel name -> µs


# -- names and shapes ----------------------------------------------------------------------------------------------
def aten_name(op_type: str) -> str:
    """aten.linear.default -> aten::linear (the profiler's name); other ops keep their name."""
    parts = op_type.split(".")
    return f"aten::{parts[1]}" if len(parts) >= 2 and parts[0] == "aten" else op_type


def _flat_shapes(dims: Any) -> tuple[tuple[int, ...], ...]:
    """Input Dims without non-tensor arguments (empty lists), tensor lists flattened."""
    out: list[tuple[int, ...]] = []
    for d in dims or []:
        if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            out.extend(tuple(x) for x in d if x)
        elif isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append(tuple(d))
    return tuple(out)


def node_key(node: OpNode, shapes: dict[str, list[int]]) -> tuple[str, tuple]:
    return aten_name(node.op_type), tuple(tuple(shapes[t]) for t in node.inputs if shapes.get(t))


def event_key(event: Event) -> tuple[str, tuple]:
    return event.name, _flat_shapes(event.args.get("Input Dims"))


# -- units per step ------------------------------------------------------------------------------------------------
def _is_step(e: Event) -> bool:
    return e.kind == "annotation" and bool(STEP_RE.match(e.name))


def _counted(e: Event) -> bool:
    """Host events whose self time the CPU basis counts: operators and record_function ranges, not steps."""
    return e.device == "cpu" and not e.merged and e.kind in ("operator", "annotation") and not _is_step(e)


def _roots(host: Sequence[Event]) -> list[Event]:
    """Counted events with nothing but a ProfilerStep (or nothing) above them, in order of execution."""
    nested = {id(c) for e in host for c in e.children if not _is_step(e)}
    return sorted((e for e in host if _counted(e) and id(e) not in nested), key=lambda e: e.ts)


def _open(event: Event, ir_names: set[str]) -> list[_Unit]:
    """A unit, or for a wrapper that is no IR op: its own-time unit and the units of what it calls."""
    inner = [c for c in event.children if _counted(c)]
    if event.name in ir_names or event.name in ALIASES or not inner:
        return [_Unit(event, own_only=False)]
    units = [_Unit(event, own_only=True)]
    for child in sorted(inner, key=lambda c: c.ts):
        units += _open(child, ir_names)
    return units


def _subtree(event: Event, own_only: bool) -> list[Event]:
    if own_only:
        return [event] + [c for c in event.children if not _counted(c)]
    out, todo = [], [event]
    while todo:
        e = todo.pop()
        out.append(e)
        todo.extend(e.children)
    return out


def _ext_id(e: Event) -> Any:
    return e.args.get("External id", e.args.get("external id"))


def _time_units(units: list[_Unit], device: list[Event]) -> set[int]:
    """Fill each unit's time; returns the ids of the device events some unit launched."""
    by_ext: dict[Any, _Unit] = {}
    for u in units:
        events = _subtree(u.event, u.own_only)
        u.us = sum(e.self_us for e in events if _counted(e))
        for e in events:
            if _ext_id(e) is not None:
                by_ext.setdefault(_ext_id(e), u)
    if not device:
        return set()
    for u in units:
        u.us = 0.0
    used = set()
    for k in device:
        u = by_ext.get(_ext_id(k))
        if u is not None:  # a kernel's self time: its share of the critical path (op_stats.assign_overlaps)
            u.us += k.self_us
            u.kernels[k.name] += k.self_us
            used.add(id(k))
    return used


def step_units(events: list[Event], ir_names: set[str]) -> tuple[list[list[_Unit]], list[Event], float]:
    """(units of each ProfilerStep window, device events no unit launched, total time of the basis)."""
    host = [e for e in events if e.device == "cpu"]
    device = [e for e in events if e.device != "cpu"]
    spans = sorted((e.ts, e.end) for e in host if _is_step(e))
    if not spans and host:
        spans = [(min(e.ts for e in host), max(e.end for e in host))]
    roots = _roots(host)
    per_step = [[u for r in roots if s <= r.ts < t for u in _open(r, ir_names)] for s, t in spans]
    used = _time_units([u for units in per_step for u in units], device)
    if device:
        total = sum(k.self_us for k in device)
    else:
        total = sum(e.self_us for e in host if _counted(e) and any(s <= e.ts < t for s, t in spans))
    return per_step, [k for k in device if id(k) not in used], total


# -- matching ------------------------------------------------------------------------------------------------------
def _pair(units: list[_Unit], nodes: list[OpNode], key_u, key_n, out: dict[int, tuple[OpNode, str]], how) -> None:
    """k-th unit of each key to the k-th node of that key, both in order; fills `out` (unit index -> node, how)."""
    taken = {id(n) for n, _ in out.values()}
    queues: dict[Any, list[OpNode]] = defaultdict(list)
    for n in nodes:
        if id(n) not in taken and key_n(n) is not None:
            queues[key_n(n)].append(n)
    for i, u in enumerate(units):
        if i in out or u.own_only:
            continue
        q = queues.get(key_u(u))
        if q:
            out[i] = (q.pop(0), how(u))


def match_step(units: list[_Unit], nodes: list[OpNode], shapes: dict[str, list[int]]) -> dict[int, tuple[OpNode, str]]:
    """The tie rules of the module docstring: shapes, then name, then alias; unit index -> (node, how)."""
    out: dict[int, tuple[OpNode, str]] = {}
    _pair(units, nodes, lambda u: event_key(u.event), lambda n: node_key(n, shapes), out, lambda u: "shape")
    _pair(units, nodes, lambda u: u.event.name, lambda n: aten_name(n.op_type), out, lambda u: "name")
    _pair(units, nodes, lambda u: ALIASES.get(u.event.name), lambda n: ALIASES.get(aten_name(n.op_type)), out,
          lambda u: f"alias: {u.event.name}")
    return out


# -- the overlay ---------------------------------------------------------------------------------------------------
def attribute(ir: IR, trace: dict[str, Any] | list, phase: str | None = None) -> Overlay:
    """Per-node and per-module time (µs per step) of one profiled trace, by the rules of the module docstring."""
    events = timed_events(trace)
    shapes = {name: t.shape for name, t in ir.tensors().items()}
    ir_names = {aten_name(n.op_type) for n in ir.nodes}
    per_step, orphans, total = step_units(events, ir_names)
    steps = max(1, len(per_step))
    basis = "device" if any(e.device != "cpu" for e in events) else "cpu"
    node_us: dict[str, float] = defaultdict(float)
    node_how: dict[str, str] = {}
    missed: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for units in per_step:
        matched = match_step(units, ir.nodes, shapes)
        for i, u in enumerate(units):
            if i in matched:
                node, how = matched[i]
                node_us[node.name] += u.us / steps
                node_how.setdefault(node.name, how)
            else:
                _miss(missed, u, basis, steps)
    for k in orphans:
        _add(missed, k.name, k.self_us / steps)
    unmatched = sorted((Unmatched(n, int(c), us) for n, (c, us) in missed.items() if us > 0), key=lambda m: -m.us)
    return Overlay(basis=basis, steps=len(per_step), total_us=total / steps, node_us=dict(node_us), node_how=node_how,
                   module_us=module_totals(ir, node_us), unmatched=unmatched,
                   unobserved=[n.name for n in ir.nodes if n.name not in node_how], phase=phase,
                   event_us=_event_totals(events, basis, steps))


def _add(missed: dict[str, list[float]], name: str, us: float) -> None:
    missed[name][0] += 1
    missed[name][1] += us


def _miss(missed: dict[str, list[float]], u: _Unit, basis: str, steps: int) -> None:
    if basis == "device":
        for name, us in u.kernels.items():
            _add(missed, name, us / steps)
    else:
        _add(missed, u.event.name, u.us / steps)


def _event_totals(events: list[Event], basis: str, steps: int) -> dict[str, float]:
    """Every kernel (device basis) or counted host event (CPU basis) by name: µs per step."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if basis == "device" and e.device != "cpu":
            out[e.name] += e.self_us / steps
        elif basis == "cpu" and _counted(e):
            out[e.name] += e.self_us / steps
    return dict(out)


def module_totals(ir: IR, node_us: dict[str, float]) -> dict[str, float]:
    """Module path -> the time of every node it encloses (each enclosing module counts it); "" is the whole model."""
    out: dict[str, float] = defaultdict(float)
    for node in ir.nodes:
        us = node_us.get(node.name, 0.0)
        out[""] += us
        for module in ir.module_stack(node):
            out[module] += us
    return dict(out)


def overlay_from_file(ir: IR, path: str | Path, phase: str | None = None) -> Overlay:
    return attribute(ir, load_trace(path), phase)


# -- tables and colours --------------------------------------------------------------------------------------------
def module_table(ir: IR, ov: Overlay) -> pd.DataFrame:
    """One row per module (and the root's own ops): its type, ops, µs per step and share of the step."""
    counts: Counter = Counter()
    for node in ir.nodes:
        for module in ir.module_stack(node) or ["(root)"]:
            counts[module] += 1
    rows = [{"module": m, "type": ir.module_types.get(m, ""), "ops": n,
             "us_per_step": ov.module_us.get(m, 0.0) if m != "(root)" else _root_us(ir, ov),
             } for m, n in counts.items()]
    frame = pd.DataFrame(rows, columns=["module", "type", "ops", "us_per_step"])
    frame["share_of_step"] = frame["us_per_step"] / ov.total_us if ov.total_us > 0 else 0.0
    return frame.sort_values("us_per_step", ascending=False, ignore_index=True)


def _root_us(ir: IR, ov: Overlay) -> float:
    return sum(ov.node_us.get(n.name, 0.0) for n in ir.nodes if not ir.module_stack(n))


def node_table(ir: IR, ov: Overlay) -> pd.DataFrame:
    return pd.DataFrame([{"node": n.name, "op": n.op_type, "module": n.module_path or "(root)",
                          "us_per_step": ov.node_us.get(n.name, 0.0), "matched_by": ov.node_how.get(n.name, "—")}
                         for n in ir.nodes])


def fractions(items: Iterable[tuple[str, str]], ov: Overlay) -> dict[tuple[str, str], float]:
    """(kind, name) of drawn boxes -> time as a fraction of the largest drawn box (to_mermaid's `colour`)."""
    times = {}
    for kind, name in items:
        if kind == "node" and name in ov.node_us:
            times[(kind, name)] = ov.node_us[name]
        elif kind == "module" and name in ov.module_us:
            times[(kind, name)] = ov.module_us[name]
    top = max(times.values(), default=0.0)
    return {k: (v / top if top > 0 else 0.0) for k, v in times.items()}


# -- two modes -----------------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    nodes: pd.DataFrame  # node, op, module, us_a, us_b, status ("kept", "kept as …", "fused away", "not seen")
    fused: pd.DataFrame  # B's unmatched time in fused / compiled kernels: name, calls, us_per_step
    new: pd.DataFrame  # kernels (or host events on the CPU) B runs and A never does: name, us_per_step


def compare(ir: IR, a: Overlay, b: Overlay) -> Comparison:
    """Eager (a) against a compiled mode (b): which nodes were fused away, the fused kernels' time, what is new."""
    rows = []
    for n in ir.nodes:
        ua, ub = a.node_us.get(n.name), b.node_us.get(n.name)
        rows.append({"node": n.name, "op": n.op_type, "module": n.module_path or "(root)", "us_a": ua or 0.0,
                     "us_b": ub or 0.0, "status": _status(ua, ub, b.node_how.get(n.name, ""))})
    fused = [{"name": m.name, "calls": m.calls, "us_per_step": m.us} for m in b.unmatched if FUSED_RE.search(m.name)]
    new = [{"name": k, "us_per_step": v} for k, v in b.event_us.items() if k not in a.event_us and v > 0]
    return Comparison(nodes=pd.DataFrame(rows),
                      fused=pd.DataFrame(fused, columns=["name", "calls", "us_per_step"]),
                      new=pd.DataFrame(new, columns=["name", "us_per_step"]).sort_values("us_per_step",
                                                                                      ascending=False))


def _status(ua: float | None, ub: float | None, how_b: str) -> str:
    if ua is None and ub is None:
        return "not seen"
    if ub is None:
        return "fused away"
    if ua is None:
        return "only in B"
    return f"kept as {how_b.removeprefix('alias: ')}" if how_b.startswith("alias") else "kept"


# -- the store -----------------------------------------------------------------------------------------------------
def profile_workloads(workload: str, preset: str | None = None, default_preset: str | None = None) -> list[str]:
    """Store workload names whose profiles run this extraction's model: its own name (house_price, a user model's
    import path) and, for a zoo model, the `--model lab:NAME[-PRESET]` example the Profiler page runs."""
    names = [workload]
    if preset:
        names.append(f"lab:{workload}" if preset == default_preset else f"lab:{workload}-{preset}")
    return names


def profile_runs(store: Any, workloads: Sequence[str]) -> pd.DataFrame:
    """ok profile runs of these workload names, newest first (columns of the runs table)."""
    frames = [store.runs(kind="profile", workload=w, status=["ok"]) for w in workloads]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames).sort_values("id", ascending=False, ignore_index=True)


def trace_of(store: Any, run_id: int) -> tuple[Path, str] | None:
    """(trace path, phase) of a profile run: its infer trace where it has one (the IR is the forward graph), else
    its train trace; None when the trace file is gone."""
    arts = store.artifacts(run_id)
    if arts.empty:
        return None
    for phase in ("infer", "train"):
        rows = arts[(arts["kind"] == "chrome_trace") & (arts["name"] == f"trace-{phase}.json.gz")]
        if not rows.empty and Path(rows["path"].iloc[0]).is_file():
            return Path(rows["path"].iloc[0]), phase
    return None


def overlay_for_run(store: Any, ir: IR, run_id: int) -> Overlay | None:
    found = trace_of(store, run_id)
    if found is None:
        return None
    ov = overlay_from_file(ir, found[0], found[1])
    ov.run_id = int(run_id)
    return ov


def reproduce_command(run: dict[str, Any], phase: str | None = None) -> str:
    """The command that makes this profile again."""
    params = run.get("params") or {}
    what = f"--model {params['model']}" if params.get("model") else f"--workload {run['workload']}"
    if params.get("inputs"):
        what += f" --inputs '{params['inputs']}'"
    if params.get("model_path"):
        what += f" --model-path {params['model_path']}"
    cmd = f"python -m engine profile {what} --mode {run['mode']} --device {run['device']}"
    if phase:
        cmd += f" --phases {phase}"
    if params.get("batch_size"):
        cmd += f" --batch-size {params['batch_size']}"
    return cmd
