"""Turn a torch.profiler Chrome trace into op_stats rows and step-level figures, and compare two profiles.

Everything here reads the exported trace (the same file the user downloads), not the profiler object, so the numbers
in DuckDB are the numbers one sees in Perfetto, and the code is the same on every torch version that writes Kineto
traces. Pure functions: trace dict in, rows and figures out (no torch, no store).

Definitions (all times in µs, summed over the profiled "active" steps):

- host event: a complete event ("ph": "X") of an operator (cpu_op), a CUDA runtime/driver call, a user annotation
  (record_function, ProfilerStep#N) or a Python function. Its *self* time is its duration minus the time covered by
  the host events nested in it on the same thread (what key_averages() calls self CPU time).
- device event: a kernel, memcpy or memset on the GPU. Its self time is the part of its duration that no device event
  started before it on the same GPU covers (its total time is the whole duration). Without overlap the two are equal;
  with programmatic dependent launch a kernel starts while the one before it drains and waits inside for it, so its
  duration counts that wait too: self times are the critical path, and they add up to the device's busy time.
- step window: from the start of the first ProfilerStep#N to the later of the last step's end and the last device
  event's end. Device busy = length of the union of device-event intervals inside the window; idle = window − busy.
- kernel launches: host calls that put kernels on the device (cudaLaunchKernel*, cuLaunchKernel*, cudaGraphLaunch —
  a CUDA graph replay is one launch for all its kernels); CPU launch time is the duration of those calls.
- per step: a host event belongs to the step (ProfilerStep#N) it starts in, a device event to the step of the
  operator that launched it (its own start where no launcher is found). Per row, `self_p10_us` and `self_p90_us` are
  the 10th and 90th percentiles of its self time per step over the profiled steps (a step without the row counts 0);
  per profile, `step_wall_{p10,median,p90}_us` spread the steps' wall times and, on a GPU,
  `device_busy_{p10,median,p90}_us` the union of each step's device events.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HOST_KINDS = {"cpu_op": "operator", "cuda_runtime": "runtime", "cuda_driver": "runtime",
              "user_annotation": "annotation", "python_function": "python"}
DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_RE = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")
STEP_RE = re.compile(r"^ProfilerStep#\d+$")
# op_stats' sum check: host self times add up to the host time they were measured in, within this fraction.
SUM_TOLERANCE = 0.10


@dataclass
class Event:
    name: str
    kind: str  # operator, runtime, annotation, python | kernel, memcpy, memset
    device: str  # "cpu" for host events, "cuda" for device events
    thread: tuple[Any, Any]
    ts: float
    dur: float
    args: dict[str, Any]
    children_us: float = 0.0
    overlap_us: float = 0.0  # device events: the part of it earlier-started device events cover (assign_overlaps)
    children: list[Event] = field(default_factory=list, repr=False)
    merged: bool = False  # the only child of a same-name parent: counted as part of it, like key_averages does

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def self_us(self) -> float:
        return max(0.0, self.dur - self.children_us - self.overlap_us)


@dataclass
class TraceAnalysis:
    op_stats: list[dict[str, Any]]
    metrics: dict[str, float]
    has_device: bool
    notes: list[str] = field(default_factory=list)
    step_walls_us: list[float] = field(default_factory=list)  # each profiled step's wall time, in order
    device_busy_steps_us: list[float] = field(default_factory=list)  # each step's device busy time (GPU only)


def load_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace file, gzipped (by suffix) or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def trace_events(trace: dict[str, Any] | list) -> list[dict[str, Any]]:
    return trace.get("traceEvents", []) if isinstance(trace, dict) else list(trace)


def parse_events(trace: dict[str, Any] | list) -> list[Event]:
    """The complete events this module counts (host and device), everything else (flows, metadata) dropped."""
    out = []
    for e in trace_events(trace):
        if e.get("ph") != "X" or "dur" not in e or "ts" not in e:
            continue
        cat = str(e.get("cat", "")).lower()
        if cat in HOST_KINDS:
            kind, device = HOST_KINDS[cat], "cpu"
        elif cat in DEVICE_KINDS:
            kind, device = DEVICE_KINDS[cat], "cuda"
        else:
            continue
        out.append(Event(name=str(e.get("name", "")), kind=kind, device=device, thread=(e.get("pid"), e.get("tid")),
                         ts=float(e["ts"]), dur=max(0.0, float(e["dur"])), args=e.get("args") or {}))
    return out


def assign_self_times(events: Iterable[Event]) -> None:
    """Fill children_us of host events: per thread, the time covered by events nested directly inside each one.

    As torch's key_averages() does, an event whose only child has its own name (aten::sum calling its other
    overload) absorbs that child: one call, one self time, the grandchildren as its children.
    """
    by_thread: dict[tuple, list[Event]] = defaultdict(list)
    for e in events:
        if e.device == "cpu":
            by_thread[e.thread].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        stack: list[Event] = []
        for e in evs:
            while stack and stack[-1].end <= e.ts:
                stack.pop()
            if stack:
                parent = stack[-1]
                parent.children_us += max(0.0, min(e.end, parent.end) - e.ts)  # clipped: rounding can overhang
                parent.children.append(e)
            stack.append(e)
        for e in reversed(evs):  # children before parents, so chains of same-name events collapse fully
            if len(e.children) == 1 and e.children[0].name == e.name and e.children[0].kind == e.kind:
                child = e.children[0]
                child.merged = True
                e.children_us = child.children_us
                e.children = child.children


def assign_overlaps(events: Iterable[Event]) -> float:
    """Fill overlap_us of device events: per GPU (the trace's pid), in start order, the part of each event that the
    events started before it already cover. Returns the total overlap."""
    by_gpu: dict[Any, list[Event]] = defaultdict(list)
    for e in events:
        if e.device != "cpu":
            by_gpu[e.thread[0]].append(e)
    total = 0.0
    for evs in by_gpu.values():
        covered = float("-inf")
        for e in sorted(evs, key=lambda e: (e.ts, e.end)):
            e.overlap_us = max(0.0, min(e.end, covered) - e.ts)
            total += e.overlap_us
            covered = max(covered, e.end)
    return total


def timed_events(trace: dict[str, Any] | list) -> list[Event]:
    """The trace's events with every self time filled in (host: nested events; device: earlier-started ones), as
    every reader of a profile (analyze, the IR overlay, explain) counts them."""
    events = parse_events(trace)
    assign_self_times(events)
    assign_overlaps(events)
    return events


def union_length(intervals: Iterable[tuple[float, float]], lo: float | None = None, hi: float | None = None) -> float:
    """Total length covered by the intervals, each clipped to [lo, hi]. Kernels on several streams overlap: a plain sum
    of their durations would count the overlap twice and exceed the wall time the device was busy."""
    clipped = sorted((max(s, lo) if lo is not None else s, min(e, hi) if hi is not None else e) for s, e in intervals)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in clipped:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _shape_text(args: dict[str, Any]) -> str | None:
    dims = args.get("Input Dims")
    if dims is None or dims == []:
        return None
    return json.dumps(dims, separators=(",", ":"))


def _ext_id(args: dict[str, Any]) -> Any:
    return args.get("External id", args.get("external id"))


def launchers(events: Sequence[Event]) -> dict[Any, Event]:
    """External id → the operator (or record_function range) that launched the device events carrying it."""
    op_by_ext: dict[Any, Event] = {}
    for e in events:
        if e.kind in ("operator", "annotation") and _ext_id(e.args) is not None:
            op_by_ext.setdefault(_ext_id(e.args), e)
    return op_by_ext


def step_index(events: Sequence[Event], spans: Sequence[tuple[float, float]]) -> dict[int, int]:
    """id(event) → the index of the profiled step it belongs to: a host event's step is the one it starts in, a
    device event's the one its launching operator starts in (its own start where none is found). Events before the
    first step count in it."""
    starts = [s for s, _ in spans] or [0.0]
    op_by_ext = launchers(events)

    def at(ts: float) -> int:
        return max(0, bisect.bisect_right(starts, ts) - 1)

    out = {}
    for e in events:
        launcher = op_by_ext.get(_ext_id(e.args)) if e.device != "cpu" else None
        out[id(e)] = at(launcher.ts if launcher is not None else e.ts)
    return out


def _p10_p90(values: np.ndarray) -> tuple[float, float]:
    p10, p90 = np.percentile(values, [10, 90])  # linear, as engine.measure.noise.spread
    return float(p10), float(p90)


def aggregate(events: Sequence[Event], spans: Sequence[tuple[float, float]] | None = None) -> list[dict[str, Any]]:
    """op_stats rows: one per (kind, device, name), with calls, self/total time, device time of the kernels an
    operator launched itself, the most frequent input shapes, for kernels the operator that launched them, and the
    p10 and p90 of the self time per step over the steps in `spans` (the whole trace as one step when None)."""
    op_by_ext = launchers(events)  # External id → the operator (or record_function range) that launched
    steps = max(1, len(spans or ()))
    where = step_index(events, spans or [])
    per_step: dict[tuple[str, str, str], np.ndarray] = defaultdict(lambda: np.zeros(steps))
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in events:
        if e.merged:
            continue
        name = "ProfilerStep*" if e.kind == "annotation" and STEP_RE.match(e.name) else e.name
        key = (e.kind, e.device, name)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"kind": e.kind, "device": e.device, "name": name, "calls": 0, "self_us": 0.0,
                               "total_us": 0.0, "device_us": None, "shapes": Counter(), "parents": Counter()}
        g["calls"] += 1
        g["self_us"] += e.self_us
        g["total_us"] += e.dur
        per_step[key][min(where[id(e)], steps - 1)] += e.self_us
        if e.device == "cpu":
            shape = _shape_text(e.args)
            if shape:
                g["shapes"][shape] += 1
        else:
            op = op_by_ext.get(_ext_id(e.args))
            if op is not None:
                op_name = "ProfilerStep*" if op.kind == "annotation" and STEP_RE.match(op.name) else op.name
                g["parents"][op_name] += 1
                opg = groups.setdefault((op.kind, "cpu", op_name), {
                    "kind": op.kind, "device": "cpu", "name": op_name, "calls": 0, "self_us": 0.0,
                    "total_us": 0.0, "device_us": None, "shapes": Counter(), "parents": Counter()})
                opg["device_us"] = (opg["device_us"] or 0.0) + e.dur
    rows = []
    for key, g in groups.items():
        shapes, parents = g.pop("shapes"), g.pop("parents")
        g["input_shapes"] = " | ".join(s for s, _ in shapes.most_common(3)) or None
        g["parent"] = parents.most_common(1)[0][0] if parents else None
        g["self_p10_us"], g["self_p90_us"] = _p10_p90(per_step[key])
        rows.append(g)
    rows.sort(key=lambda r: (r["device"], -r["self_us"]))
    return rows


def step_spans(events: Sequence[Event]) -> list[tuple[float, float]]:
    return sorted((e.ts, e.end) for e in events if e.kind == "annotation" and STEP_RE.match(e.name))


def spread_metrics(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """{prefix}_p10_us, _median_us and _p90_us of a per-step series (nothing for an empty one)."""
    if not len(values):
        return {}
    p10, p50, p90 = np.percentile(np.asarray(values, dtype=np.float64), [10, 50, 90])
    return {f"{prefix}_p10_us": float(p10), f"{prefix}_median_us": float(p50), f"{prefix}_p90_us": float(p90)}


def device_busy_per_step(events: Sequence[Event], spans: Sequence[tuple[float, float]]) -> list[float]:
    """Each step's device busy time: the union of the device events it launched (step_index), in step order."""
    where = step_index(events, spans)
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.device != "cpu":
            by_step[where[id(e)]].append((e.ts, e.end))
    return [union_length(by_step.get(i, [])) for i in range(max(1, len(spans)))]


def analyze(trace: dict[str, Any] | list, phase: str | None = None) -> TraceAnalysis:
    """op_stats rows (with `phase`) and step figures of one profiled trace."""
    events = timed_events(trace)
    overlap = sum(e.overlap_us for e in events)
    host = [e for e in events if e.device == "cpu" and not e.merged]
    device = [e for e in events if e.device != "cpu"]
    notes: list[str] = []
    spans = step_spans(events)
    if spans:
        start, host_end = spans[0][0], spans[-1][1]
        wall = sum(e - s for s, e in spans)
    elif host:
        notes.append("no ProfilerStep#N in the trace: the whole trace counts as one step")
        start, host_end = min(e.ts for e in host), max(e.end for e in host)
        wall = host_end - start
        spans = [(start, host_end)]
    else:
        start = host_end = wall = 0.0
    steps = max(1, len(spans))
    launches = [e for e in host if e.kind == "runtime" and LAUNCH_RE.match(e.name)]
    op_self = sum(e.self_us for e in host if e.kind == "operator")
    metrics: dict[str, float] = {
        "steps": float(len(spans)),
        "profiled_wall_us": wall,
        "step_wall_us": wall / steps,
        "cpu_time_us": sum(e.self_us for e in host),
        "cpu_time_per_step_us": sum(e.self_us for e in host) / steps,
        "cpu_op_self_us": op_self,
        "host_untracked_us": sum(e.self_us for e in host if e.kind == "annotation" and STEP_RE.match(e.name)),
        "op_calls": float(sum(1 for e in host if e.kind == "operator")),
    }
    walls = [end - begin for begin, end in spans]
    metrics.update(spread_metrics("step_wall", walls))
    busy_steps: list[float] = []
    if device or launches:  # launch figures mean nothing on a CPU-only profile: left out, not zero
        metrics.update({
            "kernel_launches": float(len(launches)),
            "launches_per_step": len(launches) / steps,
            "cpu_launch_us": sum(e.dur for e in launches),
            "cpu_launch_per_step_us": sum(e.dur for e in launches) / steps,
            "runtime_us": sum(e.dur for e in host if e.kind == "runtime"),
        })
    if device:
        kernels = [e for e in device if e.kind == "kernel"]
        end = max([host_end] + [e.end for e in device if e.ts < host_end])
        window = max(0.0, end - start)
        busy = union_length(((e.ts, e.end) for e in device), start, end)
        metrics.update({
            "kernels": float(len(kernels)),
            "kernels_per_step": len(kernels) / steps,
            "kernel_us": sum(e.dur for e in kernels),
            "device_window_us": window,
            "device_busy_us": busy,
            "device_idle_us": window - busy,
            "idle_fraction": (window - busy) / window if window > 0 else 0.0,
            "device_busy_per_step_us": busy / steps,
            "memcpy_us": sum(e.dur for e in device if e.kind == "memcpy"),
            "device_overlap_us": overlap,
        })
        busy_steps = device_busy_per_step(events, spans)
        metrics.update(spread_metrics("device_busy", busy_steps))
        total = sum(e.dur for e in device)
        if total > 0 and overlap > 0.01 * total:
            notes.append(f"device events overlap ({overlap / steps:,.1f} µs per step, {overlap / total:.0%} of their "
                         "durations: programmatic dependent launch or concurrent streams): a kernel's self time is "
                         "the part of it no earlier-started one covers, so self times add up to the busy time; "
                         "total_us keeps whole durations")
    rows = aggregate(events, spans)
    for r in rows:
        r["phase"] = phase
    return TraceAnalysis(op_stats=rows, metrics=metrics, has_device=bool(device), notes=notes, step_walls_us=walls,
                         device_busy_steps_us=busy_steps)


# -- presenting and comparing ---------------------------------------------------------------------------------------
def short_name(name: str, width: int = 70) -> str:
    """A kernel or operator name short enough for a chart axis (template arguments and parameters elided)."""
    text = re.sub(r"\s+", " ", str(name)).strip()
    if len(text) <= width:
        return text
    if "(" in text or "<" in text:  # a demangled C++ signature: its function name says which kernel it is
        compact = kernel_label(text)
        if len(compact) <= width:
            return compact
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]  # both ends: names often differ at the end


def base_name(name: str) -> str:
    """The bare function name of a (demangled) kernel: no return type, namespaces, template arguments or parameters.

    'void at::native::vectorized_elementwise_kernel<4, Op>(int, Op)' → 'vectorized_elementwise_kernel'
    (what Nsight Compute calls the kernel's *function* name).
    """
    text = str(name).replace("(anonymous namespace)", "")
    prev = None
    while prev != text:  # innermost template brackets first, so nesting unwinds
        prev, text = text, re.sub(r"<[^<>]*>", "", text)
    text = text.split("(", 1)[0].strip()
    text = text.split()[-1] if text.split() else text
    segments = [s for s in text.split("::") if s]
    while len(segments) > 1 and segments[-1].startswith(("operator", "{lambda")):  # sum_functor<…>::operator()
        segments.pop()
    return segments[-1] if segments else str(name)


def _template_args(text: str) -> list[str]:
    """The top-level arguments of the first template argument list in `text`."""
    start = text.find("<")
    if start < 0:
        return []
    depth, parts, cur = 0, [], []
    for ch in text[start + 1:]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def kernel_label(name: str) -> str:
    """A readable label for a demangled kernel: its function name and the functor that tells kernels apart.

    'void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, …>(int, …)'
    → 'vectorized_elementwise_kernel<FillFunctor>(…)'; a lambda functor is named by its enclosing function.
    """
    text = str(name).replace("(anonymous namespace)", "")
    base = base_name(text)
    label = base
    head = text.split("(", 1)[0] if "<" not in text.split("(", 1)[0] else text
    for arg in _template_args(head):
        if re.fullmatch(r"[\d\s+\-*uUlL]+|true|false|(unsigned |signed |const )*(float|double|int|long|short|char|"
                        r"bool|half|c10::Half|c10::BFloat16|__half|__nv_bfloat16)( const)?\s*\**", arg):
            continue
        inner = arg.split("::{lambda", 1)[0] if "lambda" in arg else arg
        functor = base_name(inner)
        if functor and functor != base:
            label = f"{base}<{functor}>"
        break
    return label + ("(…)" if "(" in text else "")


def comparable_kinds(devices: Iterable[str]) -> tuple[str, ...]:
    """Kernels (and copies) when both profiles ran on a GPU; host operators otherwise."""
    return ("kernel", "memcpy", "memset") if all(str(d).startswith("cuda") for d in devices) else ("operator",)


def compare(a: pd.DataFrame, b: pd.DataFrame, kinds: Sequence[str], steps_a: float = 1.0, steps_b: float = 1.0
            ) -> pd.DataFrame:
    """Per name (kernels or operators): calls and self time per step in A and in B, and where each one appears.

    `where` is 'only in A' (e.g. a kernel that fusion removed in B), 'only in B' (e.g. a fused kernel), or 'both'.
    """
    def per_step(frame: pd.DataFrame, steps: float) -> pd.DataFrame:
        if frame is None or frame.empty:
            return pd.DataFrame(columns=["name", "kind", "calls", "self_us"])
        sel = frame[frame["kind"].isin(kinds)]
        grouped = sel.groupby(["name", "kind"], as_index=False)[["calls", "self_us"]].sum()
        grouped["calls"] = grouped["calls"] / max(steps, 1.0)
        grouped["self_us"] = grouped["self_us"] / max(steps, 1.0)
        return grouped

    left, right = per_step(a, steps_a), per_step(b, steps_b)
    merged = left.merge(right, on=["name", "kind"], how="outer", suffixes=("_a", "_b"))
    for col in ("calls_a", "calls_b", "self_us_a", "self_us_b"):
        merged[col] = pd.to_numeric(merged[col], errors="coerce").fillna(0.0)
    merged["where"] = ["both" if ca > 0 and cb > 0 else ("only in A" if ca > 0 else "only in B")
                       for ca, cb in zip(merged["calls_a"], merged["calls_b"])]
    merged["delta_us"] = merged["self_us_b"] - merged["self_us_a"]
    order = {"only in A": 0, "only in B": 1, "both": 2}
    merged["_o"] = merged["where"].map(order)
    merged["_t"] = -(merged[["self_us_a", "self_us_b"]].max(axis=1))
    merged = merged.sort_values(["_o", "_t"]).drop(columns=["_o", "_t"]).reset_index(drop=True)
    return merged[["where", "kind", "name", "calls_a", "calls_b", "self_us_a", "self_us_b", "delta_us"]]


SUMMARY_FIGURES = (
    ("steps", "profiled steps", ""),
    ("step_wall_us", "host wall time per step", "us"),
    ("cpu_time_per_step_us", "CPU time per step (all threads)", "us"),
    ("launches_per_step", "kernel launches per step", ""),
    ("cpu_launch_per_step_us", "CPU time launching per step", "us"),
    ("kernels_per_step", "kernels per step (device)", ""),
    ("device_busy_per_step_us", "device busy per step", "us"),
    ("idle_fraction", "device idle fraction", ""),
)


def compare_metrics(a: dict[str, float], b: dict[str, float]) -> pd.DataFrame:
    """Side-by-side step figures of two profiles (missing figures, e.g. device time on CPU, are NaN)."""
    rows = []
    for key, label, unit in SUMMARY_FIGURES:
        va, vb = a.get(key), b.get(key)
        if va is None and vb is None:
            continue
        rows.append({"figure": label, "key": key, "unit": unit, "a": va, "b": vb,
                     "ratio_b_over_a": (vb / va) if va not in (None, 0) and vb is not None else None})
    return pd.DataFrame(rows)
