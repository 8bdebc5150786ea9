"""`python -m engine levels`: run components at each level through the job runner, one run per (shape, level).

    python -m engine levels --component causal_attention --level all --device cuda
    python -m engine levels --component all --level L1-naive,L4-triton --shape small --device cpu
    python -m engine levels --list
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable

import pandas as pd

from engine.cli.args import (
    Bars,
    CliError,
    add_group_args,
    devices_arg,
    expand_devices,
    folder_arg,
    names_arg,
    non_negative_int,
    open_store,
    positive_float,
    positive_int,
)
from engine.store.db import Store
from engine.store.report import flag_lines


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("levels", help="kernel levels: a component written five ways (native → CUDA), each checked "
                       "against the naive module and timed")
    p.add_argument("--component", type=names_arg, default="all", help="causal_attention, vit_patch_attention, "
                   "gnn_message_passing or all (default: all); or your own, PKG.MOD:SPEC (a Component with its "
                   "reference module, shapes, "
                   "FLOP and byte formulas, from --impl-path): L1-naive, L2 and L3 run on its reference")
    p.add_argument("--level", type=names_arg, default="all", help="'all' or a comma list: L1-naive,L1-native,"
                   "L2-torchscript,L3-compile,L4-triton,L5-cuda (or 1–5)")
    p.add_argument("--shape", type=names_arg, default=None, help="a shape name or a comma list (default: every shape "
                   "meant for the device: small ones on CPU, real ones on CUDA)")
    p.add_argument("--device", type=devices_arg, default="cpu", help="cpu, cuda or cuda:N; several (cuda:0,cuda:1 or "
                   "cuda:all) spread the runs over them (default: cpu)")
    p.add_argument("--iters", type=positive_int, default=30, help="timed calls (default: 30)")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="untimed calls first (default: 5)")
    p.add_argument("--timeout", type=positive_float, default=1200, help="seconds before a run counts as hung")
    p.add_argument("--impl", action="append", default=[], metavar="PKG.MOD:FN", help="your own kernel: a callable "
                   "with the component's reference signature, run as level yours:PKG.MOD:FN beside the others and "
                   "judged by the guards (repeat to compare several)")
    p.add_argument("--impl-path", type=folder_arg, default=None, metavar="DIR", help="the folder that holds --impl's "
                   "module and a PKG.MOD:SPEC --component's (default: the current directory)")
    p.add_argument("--deep", action="store_true", help="Nsight Compute on every kernel of each level after it is "
                   "timed (CUDA, ncu on PATH): time, DRAM and SM throughput, occupancy, registers per thread")
    p.add_argument("--list", action="store_true", help="list components, shapes and levels, then exit")
    common(p)
    add_group_args(p)
    p.set_defaults(func=cmd_levels)


def _user_path(args: argparse.Namespace) -> str:
    """The folder of --impl's and a user component's modules, absolute (default: the current directory)."""
    import os
    from pathlib import Path

    return str(Path(args.impl_path or os.getcwd()).expanduser().resolve())


def _user_component(name: str, args: argparse.Namespace):
    """A `pkg.mod:spec` component checked in a separate process (never imported here): a stand-in with its name
    (the import path, which workers resolve), shapes and which optional levels it provides; CliError if it is bad."""
    from types import SimpleNamespace

    from engine.levels import yours

    report = yours.check_component_in_subprocess(name, _user_path(args), args.device)
    if not report.ok:
        raise CliError(report.error)
    return SimpleNamespace(name=name, shapes=report.shape_objects(), native=report.native, kernels=report.kernels)


def _plan(args: argparse.Namespace) -> tuple[list[tuple[str, str, str]], list[str]]:
    from engine.levels import COMPONENTS, get_component, resolve_levels, yours

    names = list(COMPONENTS) if args.component == "all" else list(dict.fromkeys(c.strip()
                                                                                for c in args.component.split(",")))
    try:
        levels, skipped = resolve_levels(args.level, args.device)
        components = [get_component(n) for n in names if n and not yours.is_component_path(n)]
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    components += [_user_component(n, args) for n in names if n and yours.is_component_path(n)]
    notes = [f"skipping {k}: {reason}" for k, reason in skipped.items()]
    if skipped and args.level.strip() != "all" and not levels:
        raise CliError("; ".join(f"level {k} is not available on {args.device}: {r}" for k, r in skipped.items()))
    plan = []
    for component in components:
        component_levels = levels
        if yours.is_component_path(component.name):  # L1-native, L4, L5 only where the component provides them
            missing = {lv.key: yours.missing_level(component.name, lv.key, component.native, component.kernels)
                       for lv in levels}
            missing = {k: r for k, r in missing.items() if r}
            notes += [f"skipping {k}: {r}" for k, r in missing.items()]
            component_levels = [lv for lv in levels if lv.key not in missing]
            if not component_levels:
                raise CliError("; ".join(f"level {k} is not available: {r}" for k, r in missing.items()))
        if args.shape:
            shapes = []
            for s in dict.fromkeys(s.strip() for s in args.shape.split(",") if s.strip()):  # each shape once
                if s not in component.shapes:
                    if len(components) == 1:
                        raise CliError(f"unknown shape {s!r} for {component.name}; known: "
                                       f"{', '.join(component.shapes)}")
                    continue
                if not component.shapes[s].runs_on(args.device):
                    raise CliError(f"shape {s} of {component.name} is meant for "
                                   f"{', '.join(component.shapes[s].devices)}, not {args.device}")
                shapes.append(s)
        else:
            shapes = [n for n, s in component.shapes.items() if s.runs_on(args.device)
                      and (args.device == "cpu" or "cpu" not in s.devices)]
        plan += [(component.name, s, level.key) for s in shapes for level in component_levels]
    if not plan:
        raise CliError("nothing to run: no shape of the chosen components is meant for this device")
    return plan, notes


def cmd_levels(args: argparse.Namespace) -> int:
    if args.list:
        print_catalogue()
        return 0
    from engine.runner.jobs import lane_preload, prestarted_launcher

    # the fork server starts first: its imports overlap ours
    with prestarted_launcher(Store(args.db), lane_preload("levels", args.device)) as launcher:
        return _levels(args, launcher)


def _levels(args: argparse.Namespace, launcher) -> int:
    from engine.runner.jobs import JobSpec, create_runs, run_jobs_spread, spread
    from engine.runner.plan import supervise

    devices = expand_devices(args.device)
    args.device = devices[0]
    plan, notes = _plan(args)
    impl_path = _add_impls(args, plan)
    for note in notes:
        print(note, file=sys.stderr)
    store = open_store(args)
    lanes = spread(devices, len(plan))
    from engine.levels.yours import is_component_path

    specs = [JobSpec("levels", component, level, device,
                     {"component": component, "shape": shape, "level": level, "device": device,
                      "iters": args.iters, "warmup": args.warmup, **({"impl_path": impl_path} if impl_path else {}),
                      **({"deep": True} if args.deep else {}),
                      **({"component_path": _user_path(args)} if is_component_path(component) else {})},
                     timeout_s=args.timeout)
             for (component, shape, level), device in zip(plan, lanes)]
    ids = create_runs(store, specs, group_id=uuid.uuid4().hex[:12])
    labels = {i: f"{c[:12]} {s} {lv}" + (f" {d}" if len(devices) > 1 else "")
              for i, (c, s, lv), d in zip(ids, plan, lanes)}
    if len(devices) > 1:
        statuses = run_jobs_spread(store, ids, Bars(labels))
    else:
        statuses = supervise(store, ids, Bars(labels), launcher, args.prepare_parallel, args.serial,
                             out=sys.stderr)
    frame = levels_table(store, ids)
    if not frame.empty:
        print()
        print(frame.to_string(index=False))
        if frame["in_graph_us"].ne("").any():
            print("in_graph_us: the same calls captured in one CUDA graph and replayed (device time, no per-call host "
                  "cost); median_us is per call from Python, CUDA events around each call")
        if frame["kernel_us"].ne("").any():
            print("kernel_us: the profiler's kernel (+memcpy/memset) busy time per call, no gaps; normally kernel_us "
                  "<= in_graph_us <= median_us; where not, the run's 'cross-timer:' notes (Kernel Levels page) say why")
    stages = stage_table(store, ids)
    if not stages.empty:
        print()
        print(stages.to_string(index=False))
    for line in flag_lines(store, ids):  # timings flagged noisy or interfered (engine.measure.noise)
        print(line)
    if args.deep:
        _print_deep(store, ids)
    for run_id, status in statuses.items():
        if status != "ok":
            run = store.run(run_id)
            print(f"\nrun {run_id} ({labels[run_id]}) failed: {run['error']}", file=sys.stderr)
    print(f"\nstored in {store.path} (runs {ids[0]}–{ids[-1]})")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


def _add_impls(args: argparse.Namespace, plan: list[tuple[str, str, str]]) -> str | None:
    """Check each --impl in a separate process (never imported here) and add its level to every (component, shape)
    of the plan; a bad one is a CliError (one line, exit 2) before anything is queued. Returns the impl folder."""
    if not args.impl:
        return None
    from engine.levels import yours

    path = _user_path(args)
    pairs = list(dict.fromkeys((c, s) for c, s, _ in plan))
    for impl in dict.fromkeys(i.strip() for i in args.impl):
        for component, shape in pairs:
            report = yours.check_in_subprocess(component, shape, impl, path, args.device,
                                               component_path=path if yours.is_component_path(component) else None)
            if not report.ok:
                raise CliError(report.error)
        plan += [(c, s, yours.level_key(impl)) for c, s in pairs]
    return path


def levels_table(store: Store, run_ids: list[int]) -> pd.DataFrame:
    """One printable row per run: latency, throughput, % of the named ceilings, error, speedup vs L1-naive."""
    from engine.levels.results import level_results

    frame = level_results(store, run_ids=run_ids)
    if frame.empty:
        return frame
    rows = []
    for _, r in frame.iterrows():
        rows.append({
            "component": r["workload"], "shape": r["shape"], "level": r["mode"], "status": r["status"],
            "median_us": _fmt(r.get("median_us"), "{:.1f}"), "p10-p90": _range(r),
            "in_graph_us": _fmt(r.get("graph_median_us"), "{:.1f}"),
            "kernel_us": _fmt(r.get("kernel_median_us"), "{:.1f}"),
            "TFLOP/s": _fmt(r.get("flops_per_s"), "{:.2f}", 1e12), "TB/s": _fmt(r.get("bytes_per_s"), "{:.3f}", 1e12),
            "%matmul": _fmt(r.get("pct_matmul"), "{:.0f}"), "%copy": _fmt(r.get("pct_copy_bw"), "{:.0f}"),
            "vs L1-naive": _fmt(r.get("speedup"), "{:.2f}x"), "rel_err": _fmt(r.get("rel_l2_err"), "{:.1e}"),
            "note": "interpreted" if r.get("interpreted") == 1 else _guard_note(r.get("notes")),
        })
    return pd.DataFrame(rows)


def _print_deep(store: Store, ids: list[int]) -> None:
    """--deep: Nsight Compute's rows per kernel, or each run's reason it did not run."""
    from engine.levels.results import deep_table

    table = deep_table(store, ids)
    if not table.empty:
        print("\nNsight Compute (--clock-control none), per kernel of the measured calls:")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    for run_id in ids:
        run = store.run(run_id)
        for note in (run["notes"] or []) if run else []:
            if note.startswith(("deep profile skipped", "Nsight Compute")):
                print(f"run {run_id}: {note}")


def stage_table(store: Store, run_ids: list[int]) -> pd.DataFrame:
    """One printable row per stage timed on its own (the ViT patch embedding): per call and in a CUDA graph."""
    from engine.levels.results import stage_results

    frame = stage_results(store, run_ids)
    if frame.empty:
        return pd.DataFrame()
    levels = store.query(f"SELECT id, mode FROM runs WHERE id IN ({','.join('?' * len(run_ids))})",
                         [int(i) for i in run_ids]).set_index("id")["mode"]
    return pd.DataFrame([{
        "stage": r["phase"], "level": levels.get(r["run_id"], ""), "run": int(r["run_id"]),
        "median_us": _fmt(r.get("median"), "{:.1f}"), "in_graph_us": _fmt(r.get("graph_median"), "{:.1f}"),
    } for _, r in frame.iterrows()])


def _guard_note(notes) -> str:
    """The guards that flagged or skipped a run ("guards: roofline flagged"), from its notes."""
    import json

    if isinstance(notes, str):
        notes = json.loads(notes or "[]")
    if not isinstance(notes, list):  # no notes: NULL (NaN in the frame)
        return ""
    lines = [n for n in notes if isinstance(n, str) and n.startswith("guard ")]
    flagged = [n.split(":", 1)[0][len("guard "):] for n in lines if ": FLAG" in n]
    if not lines:
        return ""
    return "guards: " + (", ".join(flagged) + " flagged" if flagged else "pass")


def _fmt(value, pattern: str, scale: float = 1.0) -> str:
    if value is None or pd.isna(value):
        return ""
    return pattern.format(value / scale)


def _range(row) -> str:
    if pd.isna(row.get("p10_us")) or pd.isna(row.get("p90_us")):
        return ""
    return f"{row['p10_us']:.1f}-{row['p90_us']:.1f}"


def print_catalogue() -> None:
    from engine.levels import COMPONENTS, LEVELS

    for component in COMPONENTS.values():
        print(f"{component.name}: {component.description}")
        for shape in component.shapes.values():
            print(f"  shape {shape.label()} — {', '.join(shape.devices)}{' — ' + shape.note if shape.note else ''}")
        print(f"  FLOPs: {component.flops_formula}")
        print(f"  bytes: {component.bytes_formula}")
    print("levels:")
    for level in LEVELS.values():
        ok, reason = level.available("cpu")
        print(f"  {level.key:<15} {level.title}{'' if ok else ' — on cpu: ' + reason}")
