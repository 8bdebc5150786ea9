"""Command line: `python -m engine <command> --help`. Same store and job runner as the dashboard."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from engine.cli.args import (
    Bars,
    CliError,
    Parser,
    add_common_args,
    add_group_args,
    add_model_args,
    check_device,
    check_writable,
    device_arg,
    devices_arg,
    expand_devices,
    file_arg,
    int_at_least,
    non_negative_int,
    open_store,
    phases_arg,
    positive_float,
    positive_int,
    positive_ints,
    seconds_between,
    seed_arg,
    text_arg,
    user_model,
)
from engine.cli.kinds import KINDS  # noqa: F401 - every run kind registered before a command queues runs
from engine.store import settings
from engine.store.db import Store, StoreError, default_db_path

# Modules that contribute subcommands (profiling, IR, …); each defines add_commands(subparsers, add_common_args).
COMMAND_MODULES: list[str] = ["engine.cli.profile", "engine.cli.ir", "engine.cli.levels", "engine.cli.llm",
                               "engine.cli.explain", "engine.cli.compare"]


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.runner.jobs import lane_preload, prestarted_launcher

    # The fork server's imports (torch, Inductor) overlap this process's own — torch for the device check, then the
    # checks below (the store is opened only after them: a refused command leaves no results file behind).
    with prestarted_launcher(Store(args.db), lane_preload("bench", args.device)) as launcher:
        return _bench(args, expand_devices(args.device), launcher)


def _bench(args: argparse.Namespace, devices: list[str], launcher) -> int:
    from engine.modes import resolve_modes
    from engine.runner.jobs import JobSpec, create_runs, run_jobs_spread, spread
    from engine.runner.plan import supervise
    from engine.workloads import get_workload

    if args.model and args.workload:
        raise CliError("give --workload or --model, not both")
    try:
        get_workload(args.workload or "house_price")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    args.device = devices[0]  # availability is the same on every device of a sweep (one host, one kind)
    try:
        modes, skipped = resolve_modes(args.mode, args.device)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if skipped and args.mode.strip() != "all":
        raise CliError("; ".join(f"mode {m} is not available on {args.device}: {r}" for m, r in skipped.items()))
    mine = user_model(args)  # your own model: checked in a child first, so a bad one fails before any run
    for name, reason in skipped.items():  # after every check: a refused command prints its one line only
        print(f"skipping {name}: {reason}", file=sys.stderr)
    workload = mine.name if mine else args.workload or "house_price"
    store = open_store(args)
    params = {"workload": workload, "device": args.device, "phases": list(args.phases), "warmup": args.warmup,
              "iters": args.iters, **(mine.params if mine else {})}
    if args.batch_sizes:
        params["batch_sizes"] = list(args.batch_sizes)
    if args.train_batch_sizes:
        params["train_batch_sizes"] = list(args.train_batch_sizes)
    if args.loop != "auto":
        params["loop"] = args.loop == "on"
    lanes = spread(devices, len(modes))
    # --repeat N: each mode in N worker processes, interleaved across modes (A B C A B C …); each process is a run
    # whose params say which repeat it is, so its samples keep their process (engine.compare.verdict resamples them).
    repeat = getattr(args, "repeat", 1)
    rounds = [{"repeat": r, "repeats": repeat} if repeat > 1 else {} for r in range(repeat)]
    specs = [JobSpec("bench", workload, m.name, d, {**params, "mode": m.name, "device": d, **extra},
                     timeout_s=args.timeout) for extra in rounds for m, d in zip(modes, lanes)]
    ids = create_runs(store, specs, group_id=uuid.uuid4().hex[:12])
    labels = [(m, d, r) for r in range(repeat) for m, d in zip(modes, lanes)]
    bars = Bars({i: f"bench {m.name}" + (f" {d}" if len(devices) > 1 else "") + (f" #{r + 1}" if repeat > 1 else "")
                 for i, (m, d, r) in zip(ids, labels)})
    if len(devices) > 1:
        statuses = run_jobs_spread(store, ids, bars)
    else:
        statuses = supervise(store, ids, bars, launcher, args.prepare_parallel, args.serial, out=sys.stderr)
    print_bench_table(store, ids)
    for run_id, status in statuses.items():
        if status != "ok":
            run = store.run(run_id)
            print(f"\nrun {run_id} ({run['mode']}) failed: {run['error']}", file=sys.stderr)
    print(f"\nstored in {store.path} (runs {ids[0]}–{ids[-1]})")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


def print_bench_table(store: Store, run_ids: Sequence[int]) -> None:
    """The group's table, then why any row is flagged: a speedup in parentheses rests on a noisy or interfered
    series (engine.measure.noise) and is no headline."""
    from engine.store.report import bench_flags, bench_table

    frame = bench_table(store, run_ids)
    if frame.empty:
        return
    print()
    print(frame.to_string(index=False))
    flags = bench_flags(store, run_ids)
    if flags:
        print("\nflagged (a speedup in parentheses rests on a flagged series: not a headline):")
        for line in flags:
            print(f"  {line}")


def cmd_train(args: argparse.Namespace) -> int:
    from engine.modes import get_mode
    from engine.runner.jobs import JobSpec, create_runs, run_jobs

    try:
        mode = get_mode(args.mode)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    check_device(args.device)
    ok, reason = mode.available(args.device)
    if not ok:
        raise CliError(f"mode {args.mode} is not available on {args.device}: {reason}")
    if args.csv:
        from engine.workloads.housing_data import DatasetError, load_housing_csv

        try:
            load_housing_csv(args.csv)  # fail here, with the reason, rather than in a worker
        except DatasetError as exc:
            raise CliError(f"--csv {args.csv}: {exc}") from exc
    store = open_store(args)
    params = {"mode": args.mode, "device": args.device, "epochs": args.epochs, "batch_size": args.batch_size,
              "lr": args.lr, "csv": str(Path(args.csv).resolve()) if args.csv else None}
    ids = create_runs(store, [JobSpec("train", "house_price", args.mode, args.device, params, timeout_s=args.timeout)])
    statuses = run_jobs(store, ids, Bars({ids[0]: f"train {args.mode}"}))
    run = store.run(ids[0])
    if statuses[ids[0]] != "ok":
        print(f"run {ids[0]} failed: {run['error']}", file=sys.stderr)
        return 1
    metrics = store.metrics(ids).set_index("name")["value"]
    weights = store.artifacts(ids[0]).query("kind == 'weights'")["path"].iloc[0]
    print(f"trained {args.mode} on {args.device}: {int(metrics['steps'])} steps in {metrics['train_seconds']:.1f} s, "
          f"validation MAE ${metrics['val_mae_usd']:,.0f}, RMSE ${metrics['val_rmse_usd']:,.0f}")
    print(f"weights: {weights}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from engine.housing.predict import InvalidInputError, WeightLoadError, list_weights, load_trained, predict
    from engine.housing.train import models_dir
    from engine.workloads.housing_data import FEATURE_NAMES

    weights = list_weights(models_dir(args.db or default_db_path()))
    if args.mode not in weights:
        known = ", ".join(weights) or "none"
        raise CliError(f"no trained weights for mode {args.mode!r} (trained: {known}); run "
                       f"`python -m engine train --mode {args.mode}` first")
    try:
        trained = load_trained(weights[args.mode])
        result = predict(trained, {name: getattr(args, name) for name in FEATURE_NAMES})
    except (WeightLoadError, InvalidInputError) as exc:
        raise CliError(str(exc)) from exc
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"${result.price_usd:,.0f}")
    return 0


def _missing(value: object) -> bool:
    """None, NaN or pandas' NA/NaT: a column the store left empty."""
    import pandas as pd

    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or another value pandas cannot test
        return False


def _check_kind(store: Store, kind: str | None) -> None:
    """CliError for a --kind that no command queues and no stored run has."""
    from engine.runner import kinds

    if kind is None or kinds.get(kind) is not None:
        return
    stored = store.query("SELECT DISTINCT kind FROM runs ORDER BY kind") if store.path.exists() else None
    seen = [] if stored is None or stored.empty else [str(k) for k in stored["kind"]]
    if kind not in seen:
        raise CliError(f"--kind {kind!r}: no run of that kind in this store, and no command queues one (the kinds: "
                       f"{kinds.known()}" + (f"; this store holds {', '.join(seen)}" if seen else "") + ")")


def cmd_runs(args: argparse.Namespace) -> int:
    from engine.store.report import run_condition_summary, run_state

    store = open_store(args)
    frame = store.runs(kind=args.kind, status=[args.status] if args.status else None, limit=args.limit)
    if frame.empty:
        _check_kind(store, args.kind)  # a misspelt kind is an error, not "no runs"
        if not args.json:
            print("no runs")
        return 0
    judged = [run_state(c) for c in frame.get("conditions", [None] * len(frame))]
    repeats = [_repeat_label(p) for p in frame["params"]]
    if args.json:  # one object per line per run; "flags" empty when its timing was clean (or never judged)
        conditions = frame.get("conditions", [None] * len(frame))
        for row, (state, flags), repeat, cond in zip(frame.to_dict("records"), judged, repeats, conditions):
            row = {k: (None if _missing(v) else v) for k, v in row.items()}
            print(json.dumps({"id": int(row["id"]),
                              "group_id": row["group_id"],
                              "kind": row["kind"], "workload": row["workload"], "mode": row["mode"],
                              "device": row["device"], "status": row["status"], "repeat": repeat or None,
                              "created_at": str(row["created_at"]),
                              "error": str(row["error"] or "").split("\n")[0] or None, "state": state or None,
                              "flags": flags, "conditions": run_condition_summary(cond)}))
        return 0
    cols = ["id", "kind", "workload", "mode", "device", "status", "created_at", "error"]
    frame = frame[cols].copy()
    frame.insert(5, "rep", repeats)
    frame.insert(7, "timing", [state + (f": {flags[0]}" + (f" (+{len(flags) - 1})" if len(flags) > 1 else "")
                                        if flags else "") for state, flags in judged])
    frame["timing"] = frame["timing"].str[:60]
    frame["error"] = frame["error"].fillna("").str.split("\n").str[0].str[:70]
    if not any(repeats):
        frame = frame.drop(columns=["rep"])
    print(frame.to_string(index=False))
    return 0


def _repeat_label(params: object) -> str:
    """'2/3' for the second of three processes of a `bench --repeat 3` measurement, else ''."""
    try:
        p = json.loads(params) if isinstance(params, str) else dict(params or {})
    except (TypeError, ValueError):
        return ""
    return f"{int(p['repeat']) + 1}/{int(p['repeats'])}" if int(p.get("repeats", 1) or 1) > 1 else ""


def cmd_sql(args: argparse.Namespace) -> int:
    from engine.store.sql import read_only_query

    store = Store(args.db)
    if not store.path.exists():
        raise CliError(f"no results database at {store.path}")
    result = read_only_query(store, args.query, args.limit)  # StoreError (one line) for a refused or failed query
    print(result.frame.to_string(index=False) if not result.frame.empty else "(no rows)")
    if result.truncated:
        print(f"(the first {result.limit:,} rows; the query returns more: --limit raises the cap)", file=sys.stderr)
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from engine.workloads.housing_data import DEFAULT_CSV, ensure_default_dataset, generate_housing

    if args.out is None and args.rows is None and args.seed == 0:
        path = ensure_default_dataset(DEFAULT_CSV)
        print(f"dataset: {path}")
        return 0
    out = Path(args.out or DEFAULT_CSV)
    check_writable("--out", out)
    frame = generate_housing(n=args.rows or 5000, seed=args.seed)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # written whole, then renamed: never half a file at --out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(tmp, index=False)
        os.replace(tmp, out)
    except OSError as exc:
        raise CliError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {out}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from engine.store.envinfo import capture_env, device_report

    print(json.dumps({"env": capture_env("cpu"), "devices": device_report()}, indent=2, default=str))
    return 0


CEILINGS_MIN_TIMEOUT_S = 10.0  # a worker imports torch before it measures anything: a shorter limit always fails


def cmd_ceilings(args: argparse.Namespace) -> int:
    from engine.measure.ceilings import CEILINGS, all_ceilings, datasheet_for
    from engine.runner.jobs import JobSpec, create_runs, run_jobs

    store = open_store(args)
    if not args.show:
        check_device(args.device)
        ids = create_runs(store, [JobSpec("ceilings", "ceilings", "measure", args.device,
                                          {"device": args.device, "quick": args.quick}, timeout_s=args.timeout)])
        status = run_jobs(store, ids, Bars({ids[0]: f"ceilings {args.device}"}))[ids[0]]
        if status != "ok":
            print(f"run {ids[0]} failed: {store.run(ids[0])['error']}", file=sys.stderr)
            return 1
    found = all_ceilings(store)
    if not found:
        print("no ceilings measured yet; run `python -m engine ceilings --device cuda` (or cpu)")
        return 0
    scale = {"B/s": (1e12, "TB/s"), "FLOP/s": (1e12, "TFLOP/s"), "us": (1, "us")}
    for c in found:
        print(f"{c.device_name} (run {c.run_id}, {c.measured_at}):")
        for name, (unit, label) in CEILINGS.items():
            if c.get(name) is not None:
                div, shown = scale[unit]
                print(f"  {name:<16} {c.values[name] / div:>10.3f} {shown:<8} {label}")
        sheet = datasheet_for(c.device_name)
        if sheet:
            print(f"  datasheet ({sheet.name}): bf16 {sheet.bf16_flops / 1e12:.0f} TFLOP/s, tf32 "
                  f"{sheet.tf32_flops / 1e12:.0f}, fp32 {sheet.fp32_flops / 1e12:.1f}, memory "
                  f"{sheet.mem_bw / 1e12:.2f} TB/s")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from engine.store.merge import check_source, merge_store

    target = Store(args.db).path
    for other in args.other:  # every file checked before this store is opened (or created) for writing
        try:
            check_source(other, target)
        except StoreError as exc:
            raise CliError(str(exc)) from exc
    store = open_store(args)
    for other in args.other:
        try:
            report = merge_store(store, other)
        except StoreError as exc:
            raise CliError(str(exc)) from exc
        print(report.summary())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m engine", description="Mode Lab engine: benchmark, train and "
                                     "predict with PyTorch execution modes; every run lands in DuckDB.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for add in (_add_bench, _add_train, _add_predict, _add_runs, _add_sql, _add_data, _add_ceilings, _add_merge,
                _add_env):
        add(sub)

    # Feature areas keep their commands beside their code: each module has add_commands(sub, add_common_args).
    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub, add_common_args)
    return parser


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark execution modes (each in a worker process)")
    p.add_argument("--workload", type=text_arg, default=None, help="a lab workload (default: house_price); or see "
                   "--model")
    p.add_argument("--mode", default="all", help="'all' or a comma list, e.g. eager,fx,compile (default: all)")
    p.add_argument("--device", type=devices_arg, default="cpu", help="cpu, cuda or cuda:N; several (cuda:0,cuda:1 or "
                   "cuda:all) spread the runs over them, one timing run per device at a time (default: cpu)")
    p.add_argument("--phases", type=phases_arg, default=("infer", "train"),
                   help="infer,train (default: both)")
    p.add_argument("--batch-sizes", type=positive_ints, default=None,
                   help="inference batch sizes, comma-separated (default: the workload's, 1,64,1024)")
    p.add_argument("--train-batch-sizes", type=positive_ints, default=None,
                   help="training-step batch sizes (default: 64)")
    p.add_argument("--iters", type=positive_int, default=100, help="timed iterations (default: 100)")
    p.add_argument("--warmup", type=non_negative_int, default=10, help="untimed warm-up iterations (default: 10)")
    p.add_argument("--loop", choices=("auto", "on", "off"), default="auto",
                   help="also time blocks of 20 back-to-back calls, one event pair per block (metrics loop_*): "
                        "the step time a loop sees without per-call event cost (default: auto = on CUDA only)")
    p.add_argument("--timeout", type=positive_float, default=1800, help="seconds before a run counts as hung")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                   help="run each mode in N worker processes, interleaved across modes (A B C A B C …): the "
                        "process-to-process noise `compare` needs (2 or more) to call a change (default: 1)")
    add_common_args(p)
    add_group_args(p)
    add_model_args(p)
    p.set_defaults(func=cmd_bench)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the house-price model in one mode and save its weights")
    p.add_argument("--mode", default="eager")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.add_argument("--epochs", type=positive_int, default=30)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--csv", type=file_arg, default=None, help="training CSV (default: the embedded data/housing.csv)")
    p.add_argument("--timeout", type=positive_float, default=1800)
    add_common_args(p)
    p.set_defaults(func=cmd_train)


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict a price with trained weights")
    p.add_argument("--mode", default="eager", help="which trained weights to use")
    from engine.workloads.housing_data import FEATURES

    for spec in FEATURES:
        p.add_argument(f"--{spec.name.replace('_', '-')}", dest=spec.name, type=float, required=True,
                       help=f"{spec.label} ({spec.unit}); trained on {spec.train_min:g}–{spec.train_max:g}")
    add_common_args(p)
    p.set_defaults(func=cmd_predict)


def _add_runs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list recent runs")
    p.add_argument("--kind", default=None)
    p.add_argument("--status", choices=["queued", "running", "ok", "failed"], default=None)
    p.add_argument("--limit", type=positive_int, default=30)
    p.add_argument("--json", action="store_true", help="one JSON object per line per run, with its timing's state "
                   "and flags (short reasons; empty when clean)")
    add_common_args(p)
    p.set_defaults(func=cmd_runs)


def _add_sql(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sql", help="run one read-only query against the store (SELECT, WITH … SELECT, DESCRIBE, "
                       "SHOW, SUMMARIZE or EXPLAIN; no files, writes or extensions)")
    p.add_argument("query")
    p.add_argument("--limit", type=int_at_least(1, 1_000_000), default=10_000,
                   help="print at most this many rows (default 10,000); more are never fetched")
    add_common_args(p)
    p.set_defaults(func=cmd_sql)


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="write the embedded synthetic housing dataset (data/housing.csv)")
    from engine.workloads.housing_data import MAX_ROWS

    p.add_argument("--out", type=file_arg, default=None, help="the CSV to write (default: data/housing.csv)")
    p.add_argument("--rows", type=int_at_least(1, MAX_ROWS), default=None, help="rows (default 5,000)")
    p.add_argument("--seed", type=seed_arg, default=0, help="generator seed (default 0)")
    p.set_defaults(func=cmd_data)


def _add_ceilings(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ceilings", help="measure this device's ceilings (copy bandwidth, matmul rates, launch "
                       "latency) that every %% of peak divides by")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--quick", action="store_true", help="smaller sizes (tests); not for reported figures")
    p.add_argument("--show", action="store_true", help="print the stored ceilings, measure nothing")
    p.add_argument("--timeout", type=seconds_between(CEILINGS_MIN_TIMEOUT_S), default=600,
                   help=f"seconds before the measurement counts as hung (default 600; at least "
                        f"{CEILINGS_MIN_TIMEOUT_S:g}: its worker alone takes seconds to start)")
    add_common_args(p)
    p.set_defaults(func=cmd_ceilings)


def _add_merge(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge", help="copy every finished run of other stores into this one (ids remapped, "
                       "environments kept; merging twice copies nothing new)")
    p.add_argument("other", nargs="+", type=file_arg, help="another results .duckdb file (opened read-only)")
    add_common_args(p)
    p.set_defaults(func=cmd_merge)


def _add_env(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="print the environment a run would record")
    p.set_defaults(func=cmd_env)


def _leave_now(code: int) -> None:
    """`python -m engine bench|train|ceilings` only supervised workers: everything is in the store (each write is its
    own closed connection) and printed, so skip torch's interpreter teardown (1–3 s on a small CPU), as workers do.
    MODELAB_FAST_EXIT=0 keeps the normal exit."""
    if not settings.get("MODELAB_FAST_EXIT"):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from engine.runner.jobs import interrupt_on_sigterm

    try:
        with interrupt_on_sigterm():  # SIGTERM marks the command's runs interrupted, as Ctrl-C does
            code = args.func(args)
        if argv is None and args.func in (cmd_bench, cmd_train, cmd_ceilings):
            _leave_now(code)
        return code
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:  # e.g. a damaged results.duckdb, found by any command's first read: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
