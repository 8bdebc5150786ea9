"""`python -m engine llm | llm-report`: LLM prefill/decode runs through the job runner, and their reports.

    python -m engine llm --preset 1B --prompt-len 512 --new-tokens 128 --batch 1 --mode all --device cuda
    python -m engine llm --preset 1B --mode compile-cudagraph --device cuda --sweep batch=1,2,4,8,16,32,64
    python -m engine llm --preset 7B --mode eager --device cuda --sweep prompt=128,256,512,1024,2048,4096
    python -m engine llm --list --device cuda

Several runs (`--mode all`, a sweep) on a GPU prepare side by side — build, check against eager, compile — and are
timed and profiled one at a time with the device to themselves (engine.runner.device_lock); --serial runs them one by
one.
    python -m engine llm-report RUN_ID [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.cli.args import (
    Bars,
    CliError,
    add_group_args,
    check_device,
    device_arg,
    file_arg,
    folder_arg,
    int_at_least,
    memory_size,
    non_negative_int,
    open_store,
    path_arg,
    positive_float,
    positive_int,
    run_id_arg,
    seed_arg,
    shown,
)
from engine.store.db import Store

if TYPE_CHECKING:  # imported where used: `python -m engine --help` need not load torch, the runner or the LLM lab
    import torch

    from engine.llm.config import LLMConfig
    from engine.runner.jobs import JobSpec

SWEEPS = {"batch": "batch", "prompt": "prompt_len"}


def _sweep(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, values = text.partition("=")
    name = name.strip().lower()
    if name not in SWEEPS or not values.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write batch=1,2,4 or prompt=128,256,…")
    try:
        points = tuple(dict.fromkeys(int(v) for v in values.split(",") if v.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: sweep values must be whole numbers") from None
    if not points or any(v < 1 or v > 1 << 20 for v in points):
        raise argparse.ArgumentTypeError(f"{shown(text)}: sweep values must be between 1 and {1 << 20}")
    return name, points


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from engine.workloads.llama import PRESETS

    p = sub.add_parser("llm", help="LLM prefill and decode: TTFT, TPOT, MFU, MBU and operator breakdowns per mode")
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model shape (default: tiny)")
    p.add_argument("--hf", type=path_arg, default=None, metavar="FOLDER", help="a Hugging Face checkpoint folder "
                   "(config.json, *.safetensors; read locally, nothing downloaded) instead of a preset: "
                   "docs/llm-checkpoints.md")
    p.add_argument("--hf-config", type=path_arg, default=None, metavar="CONFIG", help="a Hugging Face config.json: "
                   "its architecture with seeded random weights")
    p.add_argument("--prompts", type=file_arg, default=None, metavar="FILE", help="a JSONL prompt file "
                   "({\"prompt\": ...} or {\"ids\": [...]} per line; 'embedded': data/prompts.jsonl): TTFT and TPOT "
                   "across them (p50/p90/p99)")
    p.add_argument("--layers", type=int_at_least(1, 4096), default=None, help="override the preset's layer count")
    p.add_argument("--prompt-len", type=positive_int, default=32, help="prompt tokens P (default 32)")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="decode steps N (default 16)")
    p.add_argument("--batch", type=int_at_least(1, 1 << 20), default=1, help="sequences B (default 1)")
    p.add_argument("--mode", default="eager", help="'all' (every mode available here) or a comma list "
                   "(default: eager; --list shows them)")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--sweep", type=_sweep, action="append", default=None, help="batch=1,2,4,… or "
                   "prompt=128,256,…: one run per value and mode, grouped (the page draws them on a roofline); give "
                   "both (--sweep batch=1,8,32 --sweep prompt=512,8192) for one run per (B, P) cell and mode (the "
                   "page draws heatmaps); cells that do not fit the GPU are skipped, with the reason")
    p.add_argument("--sdpa", choices=["flash", "efficient", "math"], default=None,
                   help="force one SDPA backend in every mode")
    p.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up as separate matmuls")
    p.add_argument("--autotune", action="store_true", help="compile with max-autotune-no-cudagraphs (slow compile)")
    p.add_argument("--prefill-iters", type=positive_int, default=10, help="timed prefills (default 10)")
    p.add_argument("--decode-passes", type=positive_int, default=2, help="timed passes of N steps (default 2)")
    p.add_argument("--check-tokens", type=non_negative_int, default=8,
                   help="greedy tokens compared with eager (default 8)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler passes (faster sweeps)")
    p.add_argument("--deep", action="store_true", help="Nsight Compute on the top-k decode kernels (CUDA, ncu)")
    p.add_argument("--top-k", type=positive_int, default=5)
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--tp", type=positive_int, default=1, help="tensor parallelism over N ranks (torchrun: one "
                   "per GPU with NCCL on cuda, N gloo processes on cpu), beside a 1-rank baseline; eager only")
    p.add_argument("--device-memory", type=memory_size, default=None, metavar="SIZE",
                   help="the most device memory the lab may use, e.g. 80GB: groups admit runs within it and each run "
                        "is held to it, so a smaller card can be rehearsed on a larger one (CUDA)")
    add_group_args(p)
    p.add_argument("--list", action="store_true", help="list the modes and whether each runs on --device")
    p.add_argument("--timeout", type=positive_float, default=1800, help="seconds before a run counts as hung")
    common(p)
    p.set_defaults(func=cmd_llm)

    p = sub.add_parser("llm-report", help="print an LLM run's report.md and where its report files are")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("--out", type=folder_arg, default=None,
                   help="write (rebuild from the store) the report files into this folder")
    common(p)
    p.set_defaults(func=cmd_llm_report)


def _resolve_modes(text: str, device: str, dtype: torch.dtype, hf_folder: str | None = None,
                   label: str = "") -> list[str]:
    """The runs' modes, each once, or one line (CliError) on any that cannot run this model here. `all`: every
    mode that can — on a native --hf folder the native modes and transformers' own (transformers-*), on a
    transformers-route folder its eager / compile / compile-cudagraph, on a preset or --hf-config the native modes."""
    from engine.llm.modes import MODES, availability, route_mode, route_unavailable

    route = "native"
    if hf_folder:  # the checkpoint's route decides which modes apply (a bad folder is one line here)
        from engine.llm import hf

        try:
            ckpt = hf.checkpoint_of(hf_folder, None)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        assert ckpt is not None
        route, label = ckpt.route, ckpt.label()
    folder = bool(hf_folder)
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names == ["all"]:
        names = [n for n, m in MODES.items() if availability(m, device, dtype) is None
                 and route_unavailable(n, route, device, folder) is None]
    unknown = [n for n in names if n not in MODES]
    if unknown or not names:
        raise CliError(f"unknown LLM mode(s) {', '.join(unknown) or '(none)'}; modes: {', '.join(MODES)} or all")
    for name in names:
        reason = route_unavailable(name, route, device, folder)
        if reason:
            raise CliError(f"mode {name} is not available for {label}: {reason}")
        reason = availability(MODES[name], device, dtype)
        if reason:
            raise CliError(f"mode {name} is not available on {device}: {reason}")
    if route == "transformers":  # transformers-eager is the route's own eager: one run, stored as it always was
        names = [route_mode(n) for n in names]
    return list(dict.fromkeys(names))


def cmd_llm(args: argparse.Namespace) -> int:
    """`python -m engine llm`: one run per (sweep value, mode), queued as a group, prepared side by side where they
    fit and timed one at a time; then a table of their headline figures. Exit code 1 when a run failed."""
    from engine.runner.jobs import lane_preload, prestarted_launcher

    if args.list:
        return _llm(args, None)
    # the fork server starts first: its imports overlap ours
    with prestarted_launcher(Store(args.db), lane_preload("llm", args.device)) as launcher:
        return _llm(args, launcher)


def _llm(args: argparse.Namespace, launcher) -> int:
    from engine.runner.jobs import create_runs
    from engine.runner.plan import supervise

    check_device(args.device)
    base = _base_config(args)
    try:
        dtype = base.torch_dtype
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.list:
        _print_modes(args.device, dtype)
        return 0
    modes = _resolve_modes(args.mode, args.device, dtype, args.hf,
                           f"--hf-config {args.hf_config}" if args.hf_config else f"preset {args.preset}")
    if args.tp > 1 and modes != ["eager"]:
        raise CliError(f"--tp runs eager only, not {', '.join(modes)} (use --mode eager)")
    specs, labels = _job_specs(args, base, modes)
    store = open_store(args)
    group = uuid.uuid4().hex[:12] if len(specs) > 1 else None
    ids = create_runs(store, specs, group)
    statuses = supervise(store, ids, Bars(dict(zip(ids, labels))), launcher, args.prepare_parallel, args.serial,
                         out=sys.stderr)
    _print_figures(store, ids, specs, statuses)
    from engine.store.report import flag_lines

    for line in flag_lines(store, ids):  # timings flagged noisy or interfered (engine.measure.noise)
        print(line)
    _print_quantized(store, ids)
    _print_envelope(store, ids, group)
    _print_native_vs_transformers(store, ids)
    if args.tp > 1:
        _print_scaling(store, ids, statuses)
    print("MFU: % of the measured matmul ceiling; MBU: % of the measured copy bandwidth (python -m engine ceilings "
          "--show). J/token, J/prefill: the whole board's energy over the timed decode and prefill (docs/"
          "measurement.md). Reports: python -m engine llm-report RUN_ID")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


def _base_config(args: argparse.Namespace) -> LLMConfig:
    """The run the flags describe (its mode and swept value set per job by _job_specs)."""
    from engine.llm.config import LLMConfig

    if args.device_memory and not args.device.startswith("cuda"):
        raise CliError(f"--device-memory caps a GPU's memory; --device is {args.device}")
    return LLMConfig(preset=args.preset, hf=args.hf, hf_config=args.hf_config, prompts=args.prompts,
                     layers=args.layers, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                     batch=args.batch, device=args.device, dtype=args.dtype, seed=args.seed, fuse=not args.no_fuse,
                     sdpa=args.sdpa, autotune=args.autotune, prefill_iters=args.prefill_iters,
                     decode_passes=args.decode_passes, check_tokens=args.check_tokens, profile=not args.no_profile,
                     deep=args.deep, top_k=args.top_k, tp=args.tp, device_memory=args.device_memory)


def _print_modes(device: str, dtype: torch.dtype) -> None:
    """--list: every mode, and whether (and for which phases) it runs on `device`."""
    from engine.llm.modes import mode_table

    rows = mode_table(device, dtype)
    width = max(len(str(row["mode"])) for row in rows)
    for row in rows:
        state = f"unavailable: {row['unavailable']}" if row["unavailable"] else (
            f"prefill only: {row['decode_unavailable']}" if row["decode_unavailable"] else "available")
        print(f"{row['mode']:<{width}} {state}\n{'':<{width}} {row['description']}")


def _sweep_points(sweeps: list[tuple[str, tuple[int, ...]]] | None) -> tuple[str | None, list[dict[str, int]]]:
    """The swept parameters as the runs record them ("batch", "prompt" or "batch,prompt") and every point: one
    value per axis, the cells of a two-axis sweep in row order (batch outer)."""
    if not sweeps:
        return None, [{}]
    axes = dict(sweeps)
    if len(axes) != len(sweeps):
        raise CliError(f"--sweep {sweeps[-1][0]} is given twice; sweep each of {', '.join(SWEEPS)} at most once")
    names = [name for name in SWEEPS if name in axes]  # batch before prompt, whatever the flags' order
    points: list[dict[str, int]] = [{}]
    for name in names:
        points = [{**point, name: value} for point in points for value in axes[name]]
    return ",".join(names), points


def _fits(cfg: LLMConfig) -> str | None:
    """Why a sweep's cell cannot run on its GPU (its estimated need beyond what the lab may use there) or on the CPU
    (its weights, KV cache and float32 twin beyond the memory available: _check_memory), or None."""
    if cfg.device == "cpu" and not (cfg.hf or cfg.hf_config):
        try:
            _check_memory(cfg)
        except MemoryError as exc:
            return str(exc)
        return None
    if not cfg.device.startswith("cuda") or cfg.hf or cfg.hf_config:
        return None
    from engine.llm.config import device_budget
    from engine.llm.group import MEMORY_MARGIN, estimate

    free, total, capped = device_budget(cfg)
    need = estimate(cfg).most
    if need <= MEMORY_MARGIN * free:
        return None
    return (f"needs about {need / 2**30:.1f} GiB (weights, KV cache of {cfg.max_seq} positions, workspaces); "
            f"{cfg.device} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB{capped}")


def _check_memory(cfg: LLMConfig) -> None:
    """A checkpoint, or any run on the CPU, that will not fit says so (MemoryError) before anything is queued: the
    run's own check (engine.llm.config.check_memory), with the float32 twin unless its key's reference is stored
    already (engine.llm.reference: the run loads it). A preset run on a GPU is admitted by its group's planner
    (engine.llm.group)."""
    from engine.llm import reference
    from engine.llm.config import check_memory

    if not (cfg.hf or cfg.hf_config or cfg.device == "cpu"):
        return
    shares = cfg.tp == 1 and cfg.route != "transformers"  # a run of these checks against a stored reference
    check_memory(cfg, twin=not (shares and cfg.device == "cpu" and reference.path_of(cfg).exists()))


def _job_specs(args: argparse.Namespace, base: LLMConfig, modes: list[str]) -> tuple[list[JobSpec], list[str]]:
    """One job per (sweep point, mode), each config validated; and a label per job for the progress bars. A sweep's
    point that does not fit the GPU is skipped with its reason (on stderr) before anything loads."""
    from engine.llm.config import LLMConfig, params_of
    from engine.runner.jobs import JobSpec

    sweep, points = _sweep_points(args.sweep)
    specs, labels = [], []
    for point in points:
        for mode in modes:
            cfg = LLMConfig(**{**params_of(base), "mode": mode, "sweep": sweep})
            for name, value in point.items():
                setattr(cfg, SWEEPS[name], value)
            if sweep and (reason := _fits(cfg)):
                print(f"skipped {mode} B={cfg.batch} P={cfg.prompt_len}: {reason}", file=sys.stderr)
                continue
            try:
                cfg.validate()
                _check_memory(cfg)
            except (ValueError, MemoryError) as exc:
                raise CliError(str(exc)) from exc
            workload = f"llama-{cfg.preset}"
            if cfg.checkpoint:
                workload = f"hf-{Path(cfg.checkpoint['folder']).name}-{cfg.checkpoint['hash'][:8]}"
            specs.append(JobSpec("llm", workload, mode, args.device, params_of(cfg),
                                 timeout_s=args.timeout))
            labels.append(f"{mode} B={cfg.batch} P={cfg.prompt_len}")
    if not specs:
        raise CliError("no sweep point fits the device: every (B, P) was skipped (see above)")
    return specs, labels


def _print_figures(store: Store, ids: list[int], specs: list[JobSpec], statuses: dict[int, str]) -> None:
    """One line per run: its headline figures, or why it failed."""
    from engine.llm.report import fmt_num, fmt_pct, fmt_time, headline
    from engine.store.report import fmt_joules

    figures = headline(store, [i for i in ids if statuses[i] == "ok"])
    energy = "j_per_token" in figures and figures["j_per_token"].notna().any()  # columns only where measured
    print(f"\n{'run':>5} {'mode':<30} {'B':>3} {'P':>5} {'TTFT':>10} {'TPOT med':>10} {'TPOT p90':>10} "
          f"{'tok/s':>9} {'MFU':>7} {'MBU':>7} {'1st prefill':>11} {'1st decode':>11}"
          + (f" {'J/token':>10} {'tok/J':>8} {'J/prefill':>10}" if energy else ""))
    for run_id, spec in zip(ids, specs):
        if statuses[run_id] != "ok":
            error = (store.run(run_id)["error"] or "").strip().splitlines()
            print(f"{run_id:>5} {spec.mode:<30} failed: {error[0] if error else 'no message'}")
            continue
        f = figures.loc[run_id].to_dict() if run_id in figures.index else {}
        g = lambda k: None if f.get(k) is None or f.get(k) != f.get(k) else float(f[k])  # noqa: E731 - NaN → None
        print(f"{run_id:>5} {spec.mode:<30} {spec.params['batch']:>3} {spec.params['prompt_len']:>5} "
              f"{fmt_time(g('ttft_us')):>10} {fmt_time(g('tpot_median_us')):>10} {fmt_time(g('tpot_p90_us')):>10} "
              f"{fmt_num(g('tokens_per_s')):>9} {fmt_pct(g('mfu_pct')):>7} {fmt_pct(g('mbu_pct')):>7} "
              f"{fmt_time(g('first_call_prefill_us')):>11} {fmt_time(g('first_call_decode_us')):>11}"
              + (f" {fmt_joules(g('j_per_token')):>10} {fmt_num(g('tokens_per_j')):>8} "
                 f"{fmt_joules(g('j_per_prefill')):>10}" if energy else ""))


def _print_quantized(store: Store, ids: list[int]) -> None:
    """Where a quantized mode ran: every run's bytes per token, the gain over unquantized, the lab's GEMV against
    the plain way, and the check each passed (the page's "Modes of this group" table)."""
    from engine.llm.report import llm_runs, modes_table, quant_scheme

    runs = llm_runs(store, status="ok", limit=max(500, len(ids)))
    if runs.empty:
        return
    runs = runs[runs["id"].isin(ids)].sort_values("id")
    if not any(quant_scheme(m) for m in runs["mode"]):
        return
    print()
    print(modes_table(runs).to_string(index=False))


def _print_envelope(store: Store, ids: list[int], group: str | None) -> None:
    """A two-axis sweep: the best mode per (B, P) cell and its ratio to compile-cudagraph (engine.llm.envelope)."""
    from engine.llm.envelope import envelope_cells, envelope_lines
    from engine.llm.report import llm_runs

    if group is None:
        return
    runs = llm_runs(store, status="ok", limit=max(500, len(ids)))
    if runs.empty:
        return
    for line in envelope_lines(envelope_cells(runs[runs["id"].isin(ids)], group)):
        print(line)


def _print_native_vs_transformers(store: Store, ids: list[int]) -> None:
    """A native --hf folder run in native and transformers-* modes together: what the native route buys."""
    from engine.llm.report import llm_runs, native_vs_transformers

    runs = llm_runs(store, status="ok", limit=max(500, len(ids)))
    if runs.empty:
        return
    for found in native_vs_transformers(runs[runs["id"].isin(ids)]):
        print(f"\n{found.line()} (runs #{found.native_run} and #{found.transformers_run})")


def _print_scaling(store: Store, ids: list[int], statuses: dict[int, str]) -> None:
    """--tp: the scaling table each run keeps in its notes."""
    for run_id in ids:
        for note in (store.run(run_id)["notes"] if statuses[run_id] == "ok" else []):
            if note.startswith("tensor parallel"):
                print(f"\nrun {run_id}: {note}")


def cmd_llm_report(args: argparse.Namespace) -> int:
    from engine.llm.report import report_files

    store = open_store(args)
    try:
        files = report_files(store, args.run_id, Path(args.out) if args.out else None)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    except OSError as exc:  # --out cannot be created or written
        raise CliError(f"--out {args.out}: cannot write the report there ({exc.strerror or exc})") from None
    print(files["report.md"].read_text())
    print("files:", file=sys.stderr)
    for name, path in files.items():
        print(f"  {name:<15} {path}", file=sys.stderr)
    return 0
