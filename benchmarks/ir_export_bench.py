"""IR extraction cost on a 7B-shaped Llama decoder (meta device): torch.export alone vs extract_ir + JSON, and the
render time of the collapsed mermaid view in Chromium.

    .venv/bin/python benchmarks/ir_export_bench.py [--preset 7B] [--repeat 3] [--no-browser]

Each measurement runs in a fresh subprocess (peak RSS is per process: a measurement run after another would report
the larger of the two), alternating between the two kinds so that machine noise hits both alike; the table gives the
median over --repeat runs. A last child runs both in one process (export alone, then extract_ir + JSON) as the
issue's "same process" figure; its second export is warm, so that ratio is the optimistic one.

Targets (issue): extract_ir + JSON ≤ 1.5 × torch.export alone; peak RSS ≤ 1 GB; collapsed view rendered in ≤ 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def peak_rss_mb() -> float:
    """Peak resident set of this process (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- children -----------------------------------------------------------------------------------------------------
def child(kind: str, preset: str) -> dict:
    import torch
    import torch.export  # noqa: F401 - both kinds import the same modules before the clock starts

    from engine.ir import zoo
    from engine.ir.export import convert, export_meta
    from engine.ir.serialize import save_ir

    t0 = time.perf_counter()
    model, inputs = zoo.build("llama", preset, device="meta")
    build_s = time.perf_counter() - t0
    out: dict = {"kind": kind, "build_s": build_s, "rss_after_build_mb": peak_rss_mb()}
    if kind in ("export", "both"):
        t0 = time.perf_counter()
        torch.export.export(model, inputs, strict=False)
        out["export_alone_s"] = time.perf_counter() - t0
    if kind in ("extract", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            ep = export_meta(model, inputs)
            t1 = time.perf_counter()
            ir = convert(ep, f"llama/{preset}")
            t2 = time.perf_counter()
            out["json_bytes"] = save_ir(ir, Path(tmp) / "ir.json")
            t3 = time.perf_counter()
        out.update(extract_export_s=t1 - t0, convert_s=t2 - t1, json_s=t3 - t2, extract_total_s=t3 - t0,
                   nodes=len(ir.nodes), parameters=ir.parameter_count())
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def run_child(kind: str, preset: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--preset", preset], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"child {kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- browser ------------------------------------------------------------------------------------------------------
RENDER_HTML = """<!doctype html><meta charset="utf-8"><body><div id="host"><div id="mermaid-container"></div></div>
<script type="module">
const code = await (await fetch('graph.mmd')).text();
const t0 = performance.now();
const mod = await import('./main.js');
const t1 = performance.now();
const container = document.getElementById('mermaid-container');
const seen = new Promise((resolve) => {
  new MutationObserver((_, obs) => { if (container.querySelector('svg')) { obs.disconnect(); resolve(); } })
    .observe(container, { childList: true, subtree: true });
});
mod.default({ data: { mermaid_code: code, theme: 'neutral' }, parentElement: document.getElementById('host'),
              setStateValue: () => {}, setTriggerValue: () => {} });
await seen;
const t2 = performance.now();
window.RESULT = { load_ms: t1 - t0, render_ms: t2 - t1, total_ms: t2 - t0,
                  nodes: container.querySelectorAll('g.node').length };
</script>"""


def browser_render(mmd: str, repeat: int) -> list[dict]:
    """Render the mermaid text with the bundled mermaid (the page's) in headless Chromium, from a loopback server."""
    import functools
    import http.server
    import importlib.util

    from playwright.sync_api import sync_playwright

    spec = importlib.util.find_spec("streamlit_mermaid_interactive")
    if spec is None or spec.origin is None:
        raise SystemExit("streamlit-mermaid-interactive is not installed (pip install -r requirements.txt)")
    bundle = Path(spec.origin).parent / "frontend" / "main.js"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "main.js").write_bytes(bundle.read_bytes())
        Path(tmp, "graph.mmd").write_text(mmd)
        Path(tmp, "index.html").write_text(RENDER_HTML)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=tmp)
        handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
        results = []
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
                for _ in range(repeat):
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    t0 = time.perf_counter()
                    page.goto(url)
                    page.wait_for_function("() => window.RESULT", timeout=60_000)
                    result = page.evaluate("() => window.RESULT")
                    result["wall_ms"] = (time.perf_counter() - t0) * 1e3  # navigation to SVG on screen
                    results.append(result)
                    page.close()
                browser.close()
        finally:
            server.shutdown()
    return results


# -- main ---------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="7B")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--child", choices=["export", "extract", "both"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.preset)))
        return 0

    import torch

    print(f"llama/{args.preset} on meta · torch {torch.__version__} · {os.cpu_count()} CPUs · "
          f"{args.repeat} fresh process(es) per measurement\n")
    runs: dict[str, list[dict]] = {"export": [], "extract": []}
    for i in range(args.repeat):
        for kind in ("export", "extract") if i % 2 == 0 else ("extract", "export"):
            runs[kind].append(run_child(kind, args.preset))
            print(f"  run {i + 1} {kind}: done", file=sys.stderr)
    both = run_child("both", args.preset)

    med = lambda kind, key: statistics.median(r[key] for r in runs[kind])  # noqa: E731
    export_s, extract_s = med("export", "export_alone_s"), med("extract", "extract_total_s")
    rows = [
        ("torch.export alone", f"{export_s:.2f} s", f"{med('export', 'peak_rss_mb'):.0f} MB", "1.00×"),
        ("extract_ir + JSON", f"{extract_s:.2f} s", f"{med('extract', 'peak_rss_mb'):.0f} MB",
         f"{extract_s / export_s:.2f}×"),
        ("  of which export", f"{med('extract', 'extract_export_s'):.2f} s", "", ""),
        ("  of which conversion", f"{med('extract', 'convert_s') * 1e3:.0f} ms", "", ""),
        ("  of which JSON", f"{med('extract', 'json_s') * 1e3:.0f} ms", "", ""),
        ("same process: export alone", f"{both['export_alone_s']:.2f} s", "", ""),
        ("same process: extract_ir + JSON", f"{both['extract_total_s']:.2f} s", f"{both['peak_rss_mb']:.0f} MB",
         f"{both['extract_total_s'] / both['export_alone_s']:.2f}×"),
    ]
    last = runs["extract"][-1]
    print(f"{'measurement':34} {'time':>10} {'peak RSS':>10} {'ratio':>7}")
    for name, t, rss, ratio in rows:
        print(f"{name:34} {t:>10} {rss:>10} {ratio:>7}")
    print(f"\n{last['nodes']} nodes, {last['parameters'] / 1e9:.2f} B parameters, "
          f"JSON {last['json_bytes'] / 1e6:.2f} MB; building the meta model: {med('extract', 'build_s'):.2f} s "
          "(not in the times above)")
    ok_time = extract_s <= 1.5 * export_s
    ok_rss = med("extract", "peak_rss_mb") <= 1024
    print(f"targets: time ≤ 1.5× export: {'yes' if ok_time else 'NO'}; peak RSS ≤ 1 GB: {'yes' if ok_rss else 'NO'}")

    if args.no_browser:
        return 0 if ok_time and ok_rss else 1
    from engine.ir import zoo
    from engine.ir.export import extract_ir
    from engine.ir.mermaid import default_view, to_mermaid

    model, inputs = zoo.build("llama", args.preset, device="meta")
    ir = extract_ir(model, inputs)
    depth = default_view(ir) or 1
    graph = to_mermaid(ir, depth=depth)
    results = browser_render(graph.text, args.repeat)
    print(f"\ncollapsed mermaid view (depth {depth}: {graph.boxes} boxes, {graph.edges} edges, {len(graph.text):,} "
          "characters) in Chromium, bundled mermaid:")
    for key, label in (("load_ms", "load + parse mermaid bundle"), ("render_ms", "render to SVG"),
                       ("total_ms", "both (what the page waits)"), ("wall_ms", "navigation → SVG on screen")):
        values = [r[key] for r in results]
        print(f"  {label:32} median {statistics.median(values):7.0f} ms  "
              f"(min {min(values):.0f}, max {max(values):.0f})")
    ok_render = statistics.median(r["wall_ms"] for r in results) <= 5000
    print(f"target: rendered in ≤ 5 s: {'yes' if ok_render else 'NO'} ({results[-1]['nodes']} SVG nodes)")
    return 0 if ok_time and ok_rss and ok_render else 1


if __name__ == "__main__":
    sys.exit(main())
