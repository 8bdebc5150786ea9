"""`python -m engine ir`: extract a zoo model's IR on the meta device, write JSON and mermaid, optionally verify.

    python -m engine ir --workload llama --preset 7B --out ir.json --mermaid graph.mmd
    python -m engine ir --workload llama --preset tiny --out ir.json --verify
    python -m engine ir --list
    python -m engine ir --model my_pkg.models:make_model --inputs "float32[B,16]" --verify     # your own model
    python -m engine ir --model transformers:llama-tiny --verify                             # a built-in example
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.ir.runs import Extraction
    from engine.store.db import Store
    from engine.workloads.user_model import ModelSpec


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from engine.cli.args import file_arg, int_at_least, non_negative_float, seed_arg

    p = sub.add_parser("ir", help="extract a model's IR on the meta device (JSON, mermaid graph, verification)",
                       description="Export a zoo model on the meta device, convert it to the JSON IR and record the "
                                   "extraction as a run; --verify runs the IR with real weights against the model in a "
                                   "worker process.")
    p.add_argument("--workload", help="zoo model (see --list)")
    p.add_argument("--preset", default=None, help="size preset (default: the model's smallest)")
    p.add_argument("--out", type=file_arg, default=None, help="write the IR JSON here (it is also kept with the run)")
    p.add_argument("--mermaid", type=file_arg, default=None, help="write the mermaid graph here (.mmd)")
    p.add_argument("--depth", type=int_at_least(0, 1000), default=None,
                   help="mermaid: one box per module at this depth (default: every op for small graphs, else "
                        "collapsed); 0 = every op")
    p.add_argument("--verify", action="store_true", help="run the IR with real weights and compare with the model")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the real weights and inputs for --verify")
    p.add_argument("--rtol", type=non_negative_float, default=1e-4, help="--verify's relative tolerance (default 1e-4)")
    p.add_argument("--atol", type=non_negative_float, default=1e-4, help="--verify's absolute tolerance (default 1e-4)")
    p.add_argument("--list", action="store_true", help="list the zoo's models and presets, and the built-in --model "
                   "examples")
    common(p)
    from engine.cli.args import add_model_args

    add_model_args(p, seed=False)  # --seed above seeds --model's weights and inputs too
    p.set_defaults(func=cmd_ir)


def cmd_ir(args: argparse.Namespace) -> int:
    from engine.cli.args import open_store

    if args.list:
        _print_list()
        return 0
    user_spec = _check_args(args)
    store = open_store(args)
    ex = _extract(store, args, user_spec)
    _write_files(args, ex)
    status = 0
    if args.verify:
        report = _verify(store, args, ex.run_id, user_spec)
        if report is None:  # the verification run failed (its error is printed)
            return 1
        status = 0 if report["ok"] else 1
    print(f"stored in {store.path} (run {ex.run_id})")
    return status


def _print_list() -> None:
    """--list: the zoo's models with their presets, then the built-in --model examples."""
    from engine.ir import zoo
    from engine.workloads.user_model import examples

    for name, zm in zoo.ZOO.items():
        print(f"{name:15} {zm.description}")
        for preset in zm.presets:
            print(f"{'':15}   {preset:10} {zoo.describe(name, preset)}")
    print("\nbuilt-in --model examples (your own: --model my_pkg.module:factory --inputs 'float32[B,16]'):")
    for name, ex in examples().items():
        print(f"  {name:30} {ex.description}")


def _check_args(args: argparse.Namespace) -> ModelSpec | None:
    """The --model spec, or None for a zoo model; CliError for bad arguments (a bad import path is one line here,
    before a run is created)."""
    from engine.cli.args import CliError
    from engine.ir import zoo

    user_spec = None
    if args.model:
        if args.workload or args.preset:
            raise CliError("give --workload (and --preset) or --model, not both")
        from engine.cli.args import user_model
        from engine.workloads.user_model import ModelSpec

        checked = user_model(args, probe=False)  # imported in a child: the CLI never imports the user's code
        user_spec = ModelSpec.from_params(checked.params) if checked else None
    elif args.inputs:
        raise CliError("--inputs needs --model (zoo models bring their own inputs)")
    elif not args.workload:
        raise CliError("--workload or --model is required (see `python -m engine ir --list`)")
    else:
        try:
            zoo.preset_config(args.workload, args.preset)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
    from engine.cli.args import check_writable

    for flag, path in (("--out", args.out), ("--mermaid", args.mermaid)):
        if path:
            check_writable(flag, path)  # refused before the extraction run, not after it
    return user_spec


def _extract(store: Store, args: argparse.Namespace, user_spec: ModelSpec | None) -> Extraction:
    """The extraction run, its summary and timings printed."""
    from engine.cli.args import CliError
    from engine.ir.errors import IRError
    from engine.ir.runs import extract_run
    from engine.workloads.user_model import UserModelError

    if user_spec is not None:  # the user's code is imported in a worker process, never in the CLI's
        from engine.ir.runs import extract_spec, extraction_of
        from engine.runner.jobs import create_runs, run_jobs

        (run_id,) = create_runs(store, [extract_spec(user_spec)])
        if run_jobs(store, [run_id])[run_id] != "ok":
            error = (store.run(run_id) or {}).get("error") or "failed without a message"
            raise CliError(f"extraction failed (run {run_id}): {error.strip().splitlines()[0]}")
        ex = extraction_of(store, run_id)
    else:
        try:
            ex = extract_run(store, args.workload, args.preset, spec=None)
        except (IRError, UserModelError) as exc:
            raise CliError(f"extraction failed: {exc}") from exc
    m = ex.metrics
    print(f"run {ex.run_id}: {ex.ir.summary()}")
    print(f"export {m['export_s']:.2f} s, conversion {m['convert_s']:.3f} s, JSON {m['json_s']:.3f} s "
          f"({m['json_bytes'] / 1e6:.2f} MB)")
    return ex


def _write_files(args: argparse.Namespace, ex: Extraction) -> None:
    """--out (the IR JSON) and --mermaid (redrawn at --depth when one is given)."""
    from engine.cli.args import CliError

    try:
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ex.ir_path, args.out)
            print(f"IR: {args.out}")
        if args.mermaid:
            text = ex.mermaid_path.read_text()
            if args.depth is not None:
                from engine.ir.mermaid import to_mermaid

                text = to_mermaid(ex.ir, depth=args.depth or None).text
            Path(args.mermaid).parent.mkdir(parents=True, exist_ok=True)
            Path(args.mermaid).write_text(text)
            print(f"mermaid: {args.mermaid}")
    except OSError as exc:  # the run is stored; only the copy at the named path failed
        raise CliError(f"cannot write {exc.filename}: {exc.strerror or exc} (run {ex.run_id} is stored; its IR is "
                       f"{ex.ir_path})") from None


def _verify(store: Store, args: argparse.Namespace, run_id: int, user_spec: ModelSpec | None) -> dict | None:
    """--verify: run the IR with real weights against the model in a worker and print each output's error. The
    verification report, or None when the run failed (its error printed)."""
    from engine.cli.args import Bars, CliError
    from engine.ir.errors import WeightLoadError
    from engine.ir.runs import verify_spec
    from engine.runner.jobs import create_runs, run_jobs

    try:
        spec = verify_spec(store, run_id, seed=args.seed, rtol=args.rtol, atol=args.atol)
    except WeightLoadError as exc:
        raise CliError(f"--verify: {exc}") from exc
    ids = create_runs(store, [spec])
    label = f"verify {user_spec.model}" if user_spec else f"verify {args.workload}/{args.preset or ''}".rstrip("/")
    statuses = run_jobs(store, ids, Bars({ids[0]: label}))
    run = store.run(ids[0])
    if statuses[ids[0]] != "ok":
        print(f"verification run {ids[0]} failed: {run['error']}", file=sys.stderr)
        return None
    report = json.loads(Path(store.artifacts(ids[0]).query("kind == 'verify_report'")["path"].iloc[0]).read_text())
    for o in report["outputs"]:
        print(f"  output {o['name']}: {o['dtype']} {o['shape']}  max abs err {o['max_abs_err']:.3g}  "
              f"max rel err {o['max_rel_err']:.3g}  {'ok' if o['ok'] else 'MISMATCH ' + o['message']}")
    verdict = "OK: the IR computes the model's outputs" if report["ok"] else "MISMATCH"
    print(f"verification run {ids[0]}: {verdict} (rtol {report['rtol']:g}, atol {report['atol']:g})")
    return report
