"""IR extraction + verification of real-world models on the CPU: transformers GPT-2, BERT, Llama, T5-encoder and ViT
(small configs, random weights, nothing downloaded), plus the lab's own Llama-style decoder for comparison.

    .venv/bin/python benchmarks/real_models_ir.py [--only transformers:gpt2-tiny,...] [--batch 2]

Per model, in one process:
  extract s  build on the meta device + torch.export + conversion + JSON written (engine.ir.runs' path)
  verify s   JSON read back + the model built on the CPU with seeded real weights + the IR executed + compared
             (engine.ir.verify.verify_ir, rtol = atol = 1e-4)
The first torch.export in a process pays for lazy imports and dispatcher set-up (seconds); it is taken once on a
two-layer MLP before the table and printed on its own, so the table shows what each model costs. The first
transformers model of the table still carries transformers' lazy submodule imports (about 1-2 s here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from engine.ir import extract_ir, load_ir, save_ir, verify_ir  # noqa: E402
from engine.workloads import user_model as um  # noqa: E402

MODELS = ["transformers:gpt2-tiny", "transformers:bert-tiny", "transformers:llama-tiny",
          "transformers:t5-encoder-tiny", "transformers:vit-tiny", "lab:llama"]


def first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text}"[:160]


def one(name: str, batch: int, folder: Path) -> dict:
    row = {"model": name, "nodes": "", "extract s": float("nan"), "verify s": float("nan"), "result": "fail",
           "reason": ""}
    try:
        t0 = time.perf_counter()
        res = um.resolve(um.ModelSpec(name))
        meta = um.build_model(res, "meta").eval()
        ir = extract_ir(meta, um.build_inputs(res, batch, "meta"), model_name=name)
        path = folder / f"{name.replace(':', '_')}.json"
        save_ir(ir, path)
        row["extract s"] = time.perf_counter() - t0
        row["nodes"] = f"{len(ir.nodes)}" + (f"+{sum(len(s.nodes) for s in ir.subgraphs.values())}"
                                             if ir.subgraphs else "")
    except Exception as exc:  # noqa: BLE001 - the table reports the reason
        row["reason"] = "extract: " + first_line(exc)
        return row
    try:
        t0 = time.perf_counter()
        loaded = load_ir(path)
        model = um.build_model(res, "cpu").eval()
        report = verify_ir(loaded, model, um.build_inputs(res, batch, "cpu"))
        row["verify s"] = time.perf_counter() - t0
        row["result"] = "pass" if report.ok else "fail"
        row["reason"] = "" if report.ok else report.summary()[:160]
        if report.ok:
            row["reason"] = f"max abs err {report.max_abs_err:.2g}"
    except Exception as exc:  # noqa: BLE001
        row["reason"] = "verify: " + first_line(exc)
        traceback.print_exc(file=sys.stderr)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma list of model names")
    parser.add_argument("--batch", type=int, default=um.IR_BATCH_SIZE, help="batch size B of the inputs")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else MODELS

    t0 = time.perf_counter()
    with torch.device("meta"):
        warm = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    extract_ir(warm, (torch.empty(2, 4, device="meta"),))
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        import transformers  # noqa: F401

        tf_s = time.perf_counter() - t0
    except ImportError:
        tf_s = None

    rows = []
    with tempfile.TemporaryDirectory(prefix="real-models-ir-") as tmp:
        for name in names:
            rows.append(one(name, args.batch, Path(tmp)))
            r = rows[-1]
            print(f"  {r['model']}: {r['result']} ({r['extract s']:.2f} s + {r['verify s']:.2f} s)", file=sys.stderr)

    print(f"torch {torch.__version__}, transformers {sys.modules['transformers'].__version__ if tf_s else 'missing'},"
          f" {torch.get_num_threads()} threads; batch {args.batch}")
    print(f"first export in the process (2-layer MLP, warm-up, not in the table): {warm_s:.2f} s"
          + (f"; import transformers: {tf_s:.2f} s" if tf_s is not None else ""))
    widths = (30, 8, 10, 9, 6)
    print(f"{'model':<{widths[0]}} {'nodes':>{widths[1]}} {'extract s':>{widths[2]}} {'verify s':>{widths[3]}} "
          f"{'result':<{widths[4]}} reason")
    for r in rows:
        print(f"{r['model']:<{widths[0]}} {r['nodes']:>{widths[1]}} {r['extract s']:>{widths[2]}.2f} "
              f"{r['verify s']:>{widths[3]}.2f} {r['result']:<{widths[4]}} {r['reason']}")
    return 0 if all(r["result"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
