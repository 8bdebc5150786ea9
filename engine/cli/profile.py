"""`python -m engine profile | profile-show | profile-compare`: profiles run by the job runner, read from the store.

    python -m engine profile --workload house_price --mode eager,fx --device cpu [--phases train,infer] [--deep]
    python -m engine profile-show RUN_ID
    python -m engine profile-compare RUN_A RUN_B
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
    add_model_args,
    check_device,
    device_arg,
    non_negative_int,
    open_store,
    positive_float,
    positive_int,
    text_arg,
    user_model,
)
from engine.measure.op_stats import comparable_kinds, compare, compare_metrics, short_name
from engine.store.db import Store


def phases_arg(text: str) -> tuple[str, ...]:
    from engine.profiling.profile import PHASES

    phases = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not phases or any(p not in PHASES for p in phases):
        raise argparse.ArgumentTypeError(f"{text!r}: phases are a comma list of {', '.join(PHASES)}")
    return phases


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("profile", help="profile a mode's step with torch.profiler (trace, op stats, idle time)")
    p.add_argument("--workload", type=text_arg, default=None, help="a lab workload (default: house_price); or see "
                   "--model")
    p.add_argument("--mode", default="eager", help="a mode or a comma list, e.g. eager,compile (default: eager); "
                   "two or more are compared at the end")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--phases", type=phases_arg, default=None,
                   help="train,infer (default: train, or infer for inference-only modes such as aoti)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: the workload's training batch")
    p.add_argument("--wait", type=non_negative_int, default=1, help="profiler schedule: skipped steps (default 1)")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="traced, discarded steps (default 2)")
    p.add_argument("--active", type=positive_int, default=None,
                   help="profiled steps (default: as many as fit in --budget, 3 to 30)")
    p.add_argument("--budget", type=positive_float, default=None,
                   help="seconds of profiled steps to aim at without --active (default 2)")
    p.add_argument("--deep", action="store_true", help="also run Nsight Compute (ncu) on the top-k kernels (CUDA)")
    p.add_argument("--top-k", type=positive_int, default=10, help="rows to print; kernels for --deep (max 10)")
    p.add_argument("--timeout", type=positive_float, default=1800, help="seconds before a run counts as hung")
    common(p)
    add_model_args(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("profile-show", help="print a stored profile: step figures and top operators/kernels")
    p.add_argument("run_id", type=int)
    p.add_argument("--top-k", type=positive_int, default=10)
    common(p)
    p.set_defaults(func=cmd_profile_show)

    p = sub.add_parser("profile-compare", help="compare two stored profiles: kernels fused away, launches, time")
    p.add_argument("run_a", type=int)
    p.add_argument("run_b", type=int)
    p.add_argument("--phase", default=None, help="default: the first phase both profiled")
    p.add_argument("--top-k", type=positive_int, default=15)
    common(p)
    p.set_defaults(func=cmd_profile_compare)


def cmd_profile(args: argparse.Namespace) -> int:
    from engine.modes import get_mode
    from engine.profiling import ncu
    from engine.profiling.profile import default_phases, supported_phases
    from engine.runner.jobs import JobSpec, create_runs, run_jobs
    from engine.workloads import get_workload

    if args.model and args.workload:
        raise CliError("give --workload or --model, not both")
    try:
        get_workload(args.workload or "house_price")
        modes = [get_mode(m) for m in dict.fromkeys(m.strip() for m in args.mode.split(",")) if m]  # each once
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if not modes:
        raise CliError("--mode: give a mode, e.g. eager or eager,compile")
    check_device(args.device)
    phases = {}
    for mode in modes:
        ok, reason = mode.available(args.device)
        if not ok:
            raise CliError(f"mode {mode.name} is not available on {args.device}: {reason}")
        wanted = args.phases or default_phases(mode)
        phases[mode.name] = supported_phases(mode, wanted)
        if not phases[mode.name]:
            raise CliError(f"mode {mode.name} runs only the {', '.join(mode.phases)} phase(s); "
                           f"use --phases {','.join(mode.phases)}")
        for skipped in (p for p in wanted if p not in phases[mode.name]):
            print(f"warning: {mode.skip_note(skipped)}", file=sys.stderr)
    if args.deep:
        reason = ncu.unavailable(args.device)
        if reason:
            print(f"warning: --deep: {reason}; the profile runs without it", file=sys.stderr)
    mine = user_model(args)  # your own model: checked in a child first, so a bad one fails before any run
    workload = mine.name if mine else args.workload or "house_price"
    store = open_store(args)
    params = {"workload": workload, "device": args.device, "wait": args.wait, "warmup": args.warmup,
              "active": args.active, "deep": args.deep, "top_k": min(args.top_k, 10),
              **(mine.params if mine else {})}
    if args.batch_size:
        params["batch_size"] = args.batch_size
    if args.budget:
        params["budget_s"] = args.budget
    specs = [JobSpec("profile", workload, m.name, args.device, {**params, "mode": m.name, "phases": phases[m.name]},
                     timeout_s=args.timeout) for m in modes]
    ids = create_runs(store, specs, group_id=uuid.uuid4().hex[:12] if len(specs) > 1 else None)
    statuses = run_jobs(store, ids, Bars({i: f"profile {m.name}" for i, m in zip(ids, modes)}))
    ok_ids = [i for i in ids if statuses[i] == "ok"]
    for run_id in ok_ids:
        print_profile(store, run_id, args.top_k)
    for run_id in ok_ids[1:]:
        try:
            print_comparison(store, ok_ids[0], run_id, None, args.top_k)
        except CliError as exc:  # e.g. an inference-only mode beside a training profile
            print(f"\nno comparison of runs {ok_ids[0]} and {run_id}: {exc}")
    for run_id, status in statuses.items():
        if status != "ok":
            run = store.run(run_id)
            print(f"\nrun {run_id} ({run['mode']}) failed: {run['error']}", file=sys.stderr)
    print(f"\nstored in {store.path} (runs {', '.join(map(str, ids))})")
    return 0 if len(ok_ids) == len(ids) else 1


def _profile_run(store: Store, run_id: int) -> dict:
    run = store.run(run_id)
    if run is None:
        raise CliError(f"no run {run_id} in {store.path}")
    if run["kind"] != "profile":
        raise CliError(f"run {run_id} is a {run['kind']} run, not a profile")
    if run["status"] != "ok":
        raise CliError(f"run {run_id} is {run['status']}" + (f": {run['error']}" if run.get("error") else ""))
    return run


def run_metrics(store: Store, run_id: int) -> dict[str, dict[str, float]]:
    """phase → {metric name: value} of one profile run."""
    frame = store.metrics([run_id])
    out: dict[str, dict[str, float]] = {}
    for row in frame.itertuples():
        out.setdefault(str(row.phase), {})[row.name] = float(row.value)
    return out


def _us(value: float | None) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{value / 1e3:,.2f} ms" if abs(value) >= 10_000 else f"{value:,.1f} µs"


def _spread(m: dict[str, float], prefix: str) -> str:
    return (f"{_us(m.get(prefix + '_median_us'))} median, p10–p90 {_us(m.get(prefix + '_p10_us'))} – "
            f"{_us(m.get(prefix + '_p90_us'))}")


def print_profile(store: Store, run_id: int, top_k: int = 10) -> None:
    from engine.profiling.profile import judgements

    run = _profile_run(store, run_id)
    stats = store.op_stats([run_id])
    traces = store.artifacts(run_id).query("kind == 'chrome_trace'")
    for phase, m in run_metrics(store, run_id).items():
        steps = max(m.get("steps", 1.0), 1.0)
        print(f"\nrun {run_id} · {run['mode']} on {run['device']} · {phase} · {int(steps)} profiled steps")
        print(f"  host wall per step      {_us(m.get('step_wall_us'))}"
              + (f" mean; {_spread(m, 'step_wall')}" if "step_wall_p10_us" in m else ""))
        for series, state, flags in judgements(run.get("conditions"), phase):
            if state and state != "clean":
                print(f"  warning: {series} {state}: {'; '.join(flags)}")
            elif state:
                print(f"  {series:<24}clean")
        if "step_p10_us" in m:  # the step without the profiler: its spread says whether the machine was steady
            print(f"  step, unprofiled        {_us(m.get('step_median_us'))} median, p10–p90 "
                  f"{_us(m['step_p10_us'])} – {_us(m.get('step_p90_us'))}")
        print(f"  CPU time per step       {_us(m.get('cpu_time_per_step_us'))} (operators "
              f"{_us(m.get('cpu_op_self_us', 0) / steps)}, {m.get('op_calls', 0) / steps:,.0f} op calls)")
        if "device_busy_us" in m:
            print(f"  device busy per step    {_us(m.get('device_busy_per_step_us'))}"
                  + (f" mean; {_spread(m, 'device_busy')}" if "device_busy_p10_us" in m else ""))
            print(f"  device idle fraction    {m['idle_fraction']:.1%} of {_us(m['device_window_us'])}")
            print(f"  kernels per step        {m.get('kernels_per_step', 0):,.1f}")
            print(f"  kernel launches/step    {m.get('launches_per_step', 0):,.1f} "
                  f"(CPU launching: {_us(m.get('cpu_launch_per_step_us'))} per step)")
        else:
            print("  device figures          not applicable on CPU (no device kernels)")
        rows = stats[stats["phase"] == phase] if not stats.empty else stats
        if rows.empty:
            continue
        for title, sel in (("kernels by device time", rows[rows["device"] != "cpu"]),
                           ("operators by self CPU time", rows[rows["kind"] == "operator"])):
            if sel.empty:
                continue
            top = sel.nlargest(top_k, "self_us")
            total = sel["self_us"].sum() or 1.0
            table = pd.DataFrame({
                "name": top["name"].map(lambda n: short_name(n, 60)),
                "calls/step": (top["calls"] / steps).round(1),
                "self/step": (top["self_us"] / steps).map(_us),
                "share": (top["self_us"] / total).map("{:.1%}".format),
                "p10–p90/step": [f"{_us(a)} – {_us(b)}" if not pd.isna(a) else "—"
                                 for a, b in zip(top.get("self_p10_us", [None] * len(top)),
                                                 top.get("self_p90_us", [None] * len(top)))],
                "shapes": top["input_shapes"].fillna("").map(lambda s: s[:40]),
            })
            print(f"  top {len(top)} {title}:")
            print("    " + table.to_string(index=False).replace("\n", "\n    "))
        trace = traces[traces["name"] == f"trace-{phase}.json.gz"]
        if not trace.empty:
            print(f"  trace (Perfetto / chrome://tracing): {trace['path'].iloc[0]}")
    kernels = store.kernel_metrics([run_id])
    if not kernels.empty:
        print("  Nsight Compute (mean per launch):")
        table = kernels[["phase", "kernel", "launches", "duration_us", "mem_throughput_pct", "sm_throughput_pct"]]
        table = table.assign(kernel=table["kernel"].map(lambda n: short_name(n, 50)))
        print("    " + table.to_string(index=False).replace("\n", "\n    "))
    for note in run["notes"]:
        print(f"  note: {note}")


def print_comparison(store: Store, run_a: int, run_b: int, phase: str | None, top_k: int = 15) -> None:
    a, b = _profile_run(store, run_a), _profile_run(store, run_b)
    ma, mb = run_metrics(store, run_a), run_metrics(store, run_b)
    common = [p for p in ma if p in mb]
    if not common:
        raise CliError(f"runs {run_a} and {run_b} profiled no phase in common ({list(ma)} vs {list(mb)})")
    phase = phase or common[0]
    if phase not in common:
        raise CliError(f"phase {phase!r} is not in both runs (common: {', '.join(common)})")
    print(f"\nA = run {run_a} ({a['mode']} on {a['device']}) vs B = run {run_b} ({b['mode']} on {b['device']}), "
          f"{phase}")
    figures = compare_metrics(ma[phase], mb[phase])
    shown = figures.assign(
        A=[_us(v) if u == "us" else ("—" if v is None or pd.isna(v) else f"{v:,.3g}")
           for v, u in zip(figures["a"], figures["unit"])],
        B=[_us(v) if u == "us" else ("—" if v is None or pd.isna(v) else f"{v:,.3g}")
           for v, u in zip(figures["b"], figures["unit"])],
        ratio=figures["ratio_b_over_a"].map(lambda r: "—" if r is None or pd.isna(r) else f"{r:.2f}×"))
    print("  " + shown[["figure", "A", "B", "ratio"]].to_string(index=False).replace("\n", "\n  "))
    kinds = comparable_kinds([a["device"], b["device"]])
    table = compare(store.op_stats([run_a], phase), store.op_stats([run_b], phase), kinds,
                    ma[phase].get("steps", 1.0), mb[phase].get("steps", 1.0))
    what = "kernels" if "kernel" in kinds else "operators"
    for where in ("only in A", "only in B", "both"):
        sel = table[table["where"] == where].head(top_k)
        n = int((table["where"] == where).sum())
        print(f"  {what} {where} ({n}):" + ("" if n else " none"))
        if n:
            out = pd.DataFrame({"name": sel["name"].map(lambda s: short_name(s, 60)),
                                "calls/step A": sel["calls_a"].round(1), "calls/step B": sel["calls_b"].round(1),
                                "self/step A": sel["self_us_a"].map(_us), "self/step B": sel["self_us_b"].map(_us)})
            print("    " + out.to_string(index=False).replace("\n", "\n    "))


def cmd_profile_show(args: argparse.Namespace) -> int:
    print_profile(open_store(args), args.run_id, args.top_k)
    return 0


def cmd_profile_compare(args: argparse.Namespace) -> int:
    print_comparison(open_store(args), args.run_a, args.run_b, args.phase, args.top_k)
    return 0
