"""IR Explorer: extract a zoo model's IR on the meta device, browse its graph, ops and nodes, download it, verify it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from app import tables
from app.common import (
    first_line,
    flash,
    fmt_time,
    get_store,
    model_field,
    page_header,
    show_flash,
    submit,
    watch_active_runs,
)
from engine.ir import zoo
from engine.ir.errors import IRError, WeightLoadError
from engine.ir.graph import IR
from engine.ir.mermaid import MermaidGraph, default_view, module_depth, modules_at, short_op, to_mermaid
from engine.ir.overlay import (
    BASIS_TEXT,
    Overlay,
    compare,
    fractions,
    module_table,
    overlay_for_run,
    profile_runs,
    profile_workloads,
    reproduce_command,
)
from engine.ir.runs import (
    extract_run,
    extract_spec,
    extractions,
    verifications,
    verify_refusal,
    verify_spec,
)
from engine.ir.serialize import load_ir

GRAPH_HEIGHT = 640  # the graph pane's largest height (px); a small graph gets less, the user may resize
# The mermaid bundle of streamlit-mermaid-interactive, as the Streamlit server serves it (no network needed).
MERMAID_PACKAGE = "streamlit_mermaid_interactive"
MERMAID_COMPONENT = "streamlit_mermaid_interactive.mermaid"

st.set_page_config(page_title="IR Explorer · Mode Lab", layout="wide")
store = get_store()
page_header("IR Explorer", "A model's graph — ops, shapes, dtypes, who produces what — exported with torch.export on "
            "the meta device (no weights in memory), saved as JSON, and verified against the model with real weights.")


# -- cached engine calls ------------------------------------------------------------------------------------------
@st.cache_data(show_spinner=False, max_entries=64)
def preset_size(name: str, preset: str) -> tuple[int, int]:
    return zoo.parameter_bytes(name, preset)


@st.cache_data(show_spinner="Loading the IR…", max_entries=16)
def cached_ir(path: str, mtime: float) -> IR:
    return load_ir(path)


@st.cache_data(show_spinner=False, max_entries=64)
def cached_graph(path: str, mtime: float, depth: int | None, expand: tuple[str, ...]) -> MermaidGraph:
    return to_mermaid(cached_ir(path, mtime), depth=depth, expand=expand)


@st.cache_data(show_spinner="Attributing the profile to the IR…", max_entries=16)
def cached_overlay(path: str, mtime: float, profile_run: int) -> Overlay | None:
    return overlay_for_run(get_store(), cached_ir(path, mtime), profile_run)


def fmt_params(n: float) -> str:
    for scale, suffix in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if n >= scale:
            return f"{n / scale:,.2f}{suffix}"
    return f"{int(n)}"


def fmt_bytes(n: float) -> str:
    for scale, suffix in ((2**30, " GiB"), (2**20, " MiB"), (2**10, " KiB")):
        if n >= scale:
            return f"{n / scale:,.1f}{suffix}"
    return f"{int(n)} B"


# -- the graph component: mermaid from the installed bundle, in a pan/zoom viewport --------------------------------
GRAPH_CSS = """
.irg { border: 1px solid rgba(128,128,128,.35); border-radius: .5rem; background: #fff; user-select: none; }
.irg-stage { position: relative; overflow: hidden; resize: vertical; min-height: 160px;
             border-radius: .5rem .5rem 0 0; }
.irg-view { position: absolute; inset: 0; overflow: hidden; cursor: grab; }
.irg-view.dragging { cursor: grabbing; }
.irg-canvas { position: absolute; left: 0; top: 0; transform-origin: 0 0; }
.irg-canvas svg { max-width: none !important; display: block; }
.irg-tools { position: absolute; right: .5rem; top: .5rem; display: flex; gap: .25rem; z-index: 2; }
.irg-tools button { font: 13px sans-serif; min-width: 2rem; padding: .2rem .45rem; border-radius: .3rem;
                    border: 1px solid #bbb; background: #f7f7f9; cursor: pointer; }
.irg-status { font: 12px sans-serif; color: #666; padding: .25rem .6rem; border-top: 1px solid rgba(128,128,128,.2); }
.irg-error { color: #b00020; font: 13px sans-serif; padding: 1rem; white-space: pre-wrap; }
.irg g.node.irg-clickable { cursor: pointer; }
"""

GRAPH_JS = """
const STATE = new WeakMap();
// The mermaid bundle logs its internals (layout, garbage collection) to the console while it renders: quiet while
// it draws, back as it was once the drawing is done (or failed).
let quietDepth = 0, saved = null;
function quiet(on) {
  if (on) {
    if (quietDepth++ === 0) {
      saved = { log: console.log, info: console.info, debug: console.debug };
      console.log = console.info = console.debug = () => {};
    }
  } else if (quietDepth > 0 && --quietDepth === 0 && saved) {
    Object.assign(console, saved);
    saved = null;
  }
}

function setup(parent) {
  let root = parent.querySelector('.irg');
  if (root) return STATE.get(root);
  root = document.createElement('div');
  root.className = 'irg';
  root.innerHTML = `<div class="irg-stage"><div class="irg-view"><div class="irg-canvas">
    <div id="mermaid-container"></div></div></div>
    <div class="irg-tools"><button data-z="in" title="Zoom in">+</button>
    <button data-z="out" title="Zoom out">−</button><button data-z="fit" title="Fit the whole graph">Fit</button>
    <button data-z="one" title="Actual size">1:1</button></div></div>
    <div class="irg-status">rendering…</div>`;
  parent.appendChild(root);
  const s = { root, stage: root.querySelector('.irg-stage'), view: root.querySelector('.irg-view'),
              canvas: root.querySelector('.irg-canvas'), status: root.querySelector('.irg-status'),
              x: 0, y: 0, k: 1, w: 0, h: 0, code: null, trigger: null };
  STATE.set(root, s);
  const apply = () => { s.canvas.style.transform = `translate(${s.x}px, ${s.y}px) scale(${s.k})`; };
  s.apply = apply;
  const zoomAt = (factor, cx, cy) => {
    const k = Math.min(8, Math.max(0.02, s.k * factor));
    s.x = cx - (cx - s.x) * (k / s.k); s.y = cy - (cy - s.y) * (k / s.k); s.k = k; apply();
  };
  // Fit: the whole graph in the pane, centred (never enlarged past 1.5×).
  s.fit = () => {
    const vw = s.view.clientWidth, vh = s.view.clientHeight;
    if (!s.w || !s.h || !vw || !vh) return;
    s.k = Math.min(1.5, vw / s.w, vh / s.h);
    s.x = (vw - s.w * s.k) / 2; s.y = (vh - s.h * s.k) / 2; apply();
  };
  // The first view of a graph: whole if that stays legible, else its width, from the top.
  s.start = () => {
    const vw = s.view.clientWidth, vh = s.view.clientHeight;
    if (!s.w || !s.h || !vw) return;
    if (Math.min(vw / s.w, vh / s.h) >= 0.35) { s.fit(); return; }
    s.k = Math.min(1, vw / s.w); s.x = (vw - s.w * s.k) / 2; s.y = 8; apply();
  };
  root.querySelector('.irg-tools').addEventListener('click', (e) => {
    const z = e.target.getAttribute && e.target.getAttribute('data-z');
    const cx = s.view.clientWidth / 2, cy = s.view.clientHeight / 2;
    if (z === 'in') zoomAt(1.25, cx, cy);
    if (z === 'out') zoomAt(0.8, cx, cy);
    if (z === 'fit') s.fit();
    if (z === 'one') { s.k = 1; s.x = 8; s.y = 8; apply(); }
  });
  // Dragging the pane's corner resizes it: the graph is fitted again.
  new ResizeObserver(() => { if (s.userSized) s.fit(); }).observe(s.stage);
  s.stage.addEventListener('pointerdown', (e) => {
    const r = s.stage.getBoundingClientRect();
    if (e.clientY > r.bottom - 18 && e.clientX > r.right - 18) s.userSized = true;
  });
  // Wheel pans (so the page still scrolls past the graph), ctrl/⌘ + wheel or a pinch zooms around the cursor.
  s.view.addEventListener('wheel', (e) => {
    e.preventDefault();
    const r = s.view.getBoundingClientRect();
    if (e.ctrlKey || e.metaKey) zoomAt(Math.exp(-e.deltaY * 0.002), e.clientX - r.left, e.clientY - r.top);
    else { s.x -= e.deltaX; s.y -= e.deltaY; apply(); }
  }, { passive: false });
  let drag = null;
  s.view.addEventListener('pointerdown', (e) => {
    drag = { x: e.clientX, y: e.clientY, sx: s.x, sy: s.y, moved: false };
  });
  window.addEventListener('pointermove', (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true; s.view.classList.add('dragging');
    s.x = drag.sx + dx; s.y = drag.sy + dy; apply();
  });
  window.addEventListener('pointerup', () => {
    if (drag && drag.moved) s.justDragged = true;
    drag = null; s.view.classList.remove('dragging');
  });
  return s;
}

// The pane's height for a graph: what it needs at the width's scale (never above 1:1), between a floor and
// data.height; a pane the user resized keeps its size.
function sizeStage(s, maxHeight) {
  if (s.userSized) return;
  const vw = s.view.clientWidth || s.stage.clientWidth;
  const k = Math.min(1, vw / s.w);
  const needed = Math.max(Math.min(s.h * k, s.h * 1.5), 0) + 24;
  s.stage.style.height = `${Math.round(Math.min(maxHeight, Math.max(160, needed)))}px`;
}

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  const s = setup(parentElement);
  s.trigger = setTriggerValue;
  if (!s.stage.style.height) s.stage.style.height = `${data.height}px`;
  if (s.code === data.code) return;
  s.code = data.code;
  const container = s.root.querySelector('#mermaid-container');
  container.innerHTML = '';
  s.root.removeAttribute('data-rendered');
  s.status.textContent = 'rendering…';
  const started = performance.now();
  quiet(true);
  const finished = () => { quiet(false); };
  const done = new MutationObserver(() => {
    const svg = container.querySelector('svg');
    const failed = container.querySelector('p');
    if (failed && !svg) {
      done.disconnect();
      finished();
      s.status.textContent = '';
      container.className = 'irg-error';
      s.root.setAttribute('data-rendered', 'error');
      return;
    }
    if (!svg) return;
    done.disconnect();
    container.className = '';
    const vb = svg.viewBox && svg.viewBox.baseVal;
    s.w = vb && vb.width ? vb.width : svg.getBoundingClientRect().width;
    s.h = vb && vb.height ? vb.height : svg.getBoundingClientRect().height;
    svg.setAttribute('width', s.w); svg.setAttribute('height', s.h);
    svg.style.maxWidth = 'none';
    sizeStage(s, data.height);
    s.start();
    setTimeout(finished, 500);  // the bundle's last logs follow the drawing by a moment
    const ms = Math.round(performance.now() - started);
    s.root.setAttribute('data-rendered', 'ok');
    s.root.setAttribute('data-render-ms', String(ms));
    s.status.textContent = `${data.boxes} boxes · rendered in ${ms} ms · drag to pan, ctrl + wheel to zoom, ` +
      'Fit to see it whole, the lower right corner to resize' + (data.clickable ? ' · click a module to open it' : '');
    // Module boxes (and opened modules' frames) report their mermaid id; Python maps it back to the module.
    svg.querySelectorAll('g.node, g.cluster').forEach((g) => {
      const m = /(?:flowchart-)?([gs]\\d+)(?:-\\d+)?$/.exec(g.id || '');
      if (!m || !data.clickable || !data.clickable.includes(m[1])) return;
      g.classList.add('irg-clickable');
      g.addEventListener('click', (e) => {
        e.stopPropagation();
        if (s.justDragged) { s.justDragged = false; return; }
        s.trigger('clicked', m[1]);
      });
    });
  });
  done.observe(container, { childList: true, subtree: true });
  const url = `${window.location.origin}${data.base}/_stcore/bidi-components/${data.component}/main.js`;
  import(url).then((mod) => {
    // The bundle's entry renders data.mermaid_code into #mermaid-container; its own click hooks get no-ops.
    mod.default({ data: { mermaid_code: data.code, theme: 'neutral' }, parentElement: s.canvas,
                  setStateValue: () => {}, setTriggerValue: () => {} });
  }).catch((err) => {
    done.disconnect();
    finished();
    container.className = 'irg-error';
    container.textContent = `Could not load mermaid from ${url}: ${err}`;
    s.root.setAttribute('data-rendered', 'error');
  });
}
"""


@st.cache_resource(show_spinner=False)
def graph_component():
    """Register the component once per process (re-registering on every rerun would warn)."""
    return st.components.v2.component("modelab_ir_graph", html="<div></div>", css=GRAPH_CSS, js=GRAPH_JS)


def mermaid_available() -> bool:
    import importlib.util

    return importlib.util.find_spec(MERMAID_PACKAGE) is not None


def on_graph_click(key: str, graph: MermaidGraph) -> None:
    """A module box was clicked: open it (or, for an opened module's frame, close it)."""
    value = st.session_state.get(key)
    clicked = value.get("clicked") if hasattr(value, "get") else getattr(value, "clicked", None)
    module = graph.module_of(str(clicked)) if clicked else None
    if not module:
        return
    expanded = list(st.session_state.get("expand", []))
    if module in expanded:
        expanded = [m for m in expanded if not (m == module or m.startswith(module + "."))]
    else:
        expanded.append(module)
    st.session_state["expand"] = expanded


def show_graph(graph: MermaidGraph, key: str) -> None:
    if not mermaid_available():
        st.warning(f"The graph needs the {MERMAID_PACKAGE} package (pip install -r requirements.txt); here is the "
                   "mermaid source instead.", icon=":material/warning:")
        st.code(graph.text, language=None)
        return
    clickable = [mid for mid, (kind, _) in graph.items.items() if kind == "module"]
    base = (st.get_option("server.baseUrlPath") or "").strip("/")
    data = {"code": graph.text, "height": GRAPH_HEIGHT, "boxes": graph.boxes, "clickable": clickable,
            "component": MERMAID_COMPONENT, "base": f"/{base}" if base else ""}
    graph_component()(data=data, key=key, on_clicked_change=lambda: on_graph_click(key, graph))


# -- measured time on the graph (engine.ir.overlay) --------------------------------------------------------------
def profile_label(r: Any) -> str:
    return f"#{r.id} · {r.workload} · {r.mode} · {r.device} · {fmt_time(r.finished_at)}"


def overlay_controls(store: Any, row: Any, path: str) -> Overlay | None:
    """The toggle and the profile-run picker; the overlay of the chosen run, or None."""
    preset = row.get("preset") if isinstance(row.get("preset"), str) else None
    default = zoo.get_zoo(row["workload"]).default_preset if preset and row["workload"] in zoo.ZOO else None
    runs = profile_runs(store, profile_workloads(str(row["workload"]), preset, default))
    if runs.empty:
        st.caption(f"No profile run of {row['workload']} in the store: profile it (Profiler page, or "
                   f"`python -m engine profile --workload {row['workload']} --mode eager --device cpu --phases infer`)"
                   " to colour this graph by measured time.")
        return None
    if not st.toggle("Colour by measured time", key="overlay-on"):
        return None
    labels = {int(r.id): profile_label(r) for r in runs.itertuples()}
    pick = st.selectbox("Profile run", list(labels), key="overlay-run", format_func=labels.get)
    ov = cached_overlay(path, Path(path).stat().st_mtime, int(pick))
    if ov is None:
        st.warning(f"The trace of profile run #{pick} is gone.", icon=":material/warning:")
    return ov


def overlay_tables(store: Any, ov: Overlay) -> None:
    """The attributed share, the per-module table, what matched nothing, and the two-mode comparison."""
    run = store.run(ov.run_id)
    cmd = reproduce_command(run, ov.phase)
    st.markdown(f"**{ov.share_text()}** — {ov.attributed_us:,.0f} of {ov.total_us:,.0f} µs per step "
                f"({BASIS_TEXT[ov.basis]}, {ov.phase} phase, {ov.steps} profiled steps of run #{ov.run_id}).")
    if ov.phase == "train":
        st.caption("A training step: backward and optimizer ops map to no node of this forward graph. Profile the "
                   "infer phase (`--phases infer`) to colour the forward alone.")
    table = module_table(ir, ov)
    table["reproduce"] = cmd
    tables.show(table, {"module": "module", "type": "type", "ops": ("ops", "int"),
                        "us_per_step": ("time per step", "us"), "share_of_step": ("share of the step", "share"),
                        "reproduce": "reproduce"}, key="overlay-modules")
    if ov.unmatched:
        with st.expander(f"Matched no IR node ({len(ov.unmatched)})"):
            tables.show(pd.DataFrame([{"name": m.name, "calls": m.calls, "us_per_step": m.us, "reproduce": cmd}
                                      for m in ov.unmatched]),
                        {"name": "operator or kernel", "calls": ("calls per step", "num"),
                         "us_per_step": ("time per step", "us"), "reproduce": "reproduce"}, key="overlay-unmatched")
    two_mode_view(store, run, ov)


def two_mode_view(store: Any, run: dict, ov: Overlay) -> None:
    """Eager against a compiled profile of the same workload and device, when both exist."""
    others = profile_runs(store, [str(run["workload"])])
    others = others[(others["device"] == run["device"]) & (others["id"] != ov.run_id)]
    eager = ov if run["mode"] == "eager" else None
    if eager is None:
        found = others[others["mode"] == "eager"]
        eager = cached_overlay(path, Path(path).stat().st_mtime, int(found["id"].iloc[0])) if not found.empty else None
        other = ov
    else:
        found = others[others["mode"] != "eager"]
        other = cached_overlay(path, Path(path).stat().st_mtime, int(found["id"].iloc[0])) if not found.empty else None
    if eager is None or other is None:
        return
    other_run = store.run(other.run_id)
    st.markdown(f"**Eager (run #{eager.run_id}) against {other_run['mode']} (run #{other.run_id})**")
    c = compare(ir, eager, other)
    cmd_b = reproduce_command(other_run, other.phase)
    nodes = c.nodes.assign(reproduce=cmd_b)
    tables.show(nodes, {"node": "node", "op": "op", "module": "module", "us_a": ("eager, per step", "us"),
                        "us_b": (f"{other_run['mode']}, per step", "us"), "status": "status",
                        "reproduce": "reproduce"}, key="overlay-compare")
    f1, f2 = st.columns(2)
    f1.caption("Fused kernels (map to no single node)")
    kernels = {"name": "kernel", "calls": ("calls per step", "num"), "us_per_step": ("time per step", "us"),
               "reproduce": "reproduce"}
    tables.show(c.fused.assign(reproduce=cmd_b), kernels, where=f1, key="overlay-fused")
    f2.caption(f"New in {other_run['mode']}")
    tables.show(c.new.assign(reproduce=cmd_b), kernels, where=f2, key="overlay-new")


# -- sidebar: what to extract ---------------------------------------------------------------------------------------
names = list(zoo.ZOO)
with st.sidebar:
    st.header("Model")
    name = st.selectbox("Zoo model", names, key="model", format_func=lambda n: n.replace("_", " "))
    zm = zoo.get_zoo(name)
    st.caption(zm.description)
    presets = list(zm.presets)
    preset = st.selectbox("Size preset", presets, key=f"preset-{name}", index=presets.index(zm.default_preset))
    params, nbytes = preset_size(name, preset)
    st.caption(f"{zoo.describe(name, preset)} · {fmt_params(params)} parameters ({fmt_bytes(nbytes)} if real; "
               "none allocated to extract)")
    st.divider()
    mine = model_field("ir")  # your own model by import path: extracted in a worker instead of the zoo model
    if mine is not None and mine.ok:
        st.caption(f"Extract IR takes this model instead of the zoo's: {mine.description}")
    extract_clicked = st.button("Extract IR", key="extract", type="primary", icon=":material/account_tree:",
                                help="torch.export on the meta device, converted to the JSON IR; recorded as a run.")

if extract_clicked and mine is not None:
    if not mine.ok:
        flash("error", f"Cannot extract {mine.spec.model}: {first_line(mine.error)}")
    else:
        ids = submit([extract_spec(mine.spec)])  # a worker imports the user's code, never the dashboard
        if ids:
            flash("success", f"Extraction #{ids[0]} of {mine.spec.model} queued: it runs in a worker process and "
                  "appears in the IR list when it finishes.")
elif extract_clicked:
    with st.spinner(f"Exporting {name}/{preset} on the meta device…"):
        try:
            ex = extract_run(store, name, preset)
        except IRError as exc:
            flash("error", f"Extraction of {name}/{preset} failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - the run is marked failed; the page stays up and says why
            flash("error", f"Extraction of {name}/{preset} failed: {type(exc).__name__}: {exc}")
        else:
            st.session_state["ir-run"] = ex.run_id
            st.session_state["expand"] = []
            flash("success", f"Extracted {ex.ir.summary()} (run #{ex.run_id}) in "
                  f"{ex.metrics['export_s'] + ex.metrics['convert_s'] + ex.metrics['json_s']:.1f} s.")
show_flash()

# -- which IR to show -----------------------------------------------------------------------------------------------
runs = extractions(store)
if runs.empty and watch_active_runs(kind="ir"):  # a queued extraction of your own model: its progress
    st.stop()
if runs.empty:
    st.info("No IR extracted yet. Pick a model and a size in the sidebar and press **Extract IR**; every extraction "
            "is kept, so past IRs can be browsed here.", icon=":material/info:")
    st.stop()

labels = {int(r.run_id): f"#{r.run_id} · {r.workload}{'/' + r.preset if isinstance(r.preset, str) else ''} · "
                         f"{int(r.nodes or 0)} nodes · {fmt_time(r.finished_at)}" for r in runs.itertuples()}
if st.session_state.get("ir-run") not in labels:
    st.session_state["ir-run"] = next(iter(labels))
run_id = st.selectbox("IR", list(labels), key="ir-run", format_func=labels.get,
                      help="Every extraction is a run in the store; pick any past one.")
row = runs.set_index("run_id").loc[run_id]
path = store.query("SELECT path FROM artifacts WHERE run_id = ? AND kind = 'ir_json'", [run_id])["path"].iloc[0]
try:
    ir = cached_ir(path, Path(path).stat().st_mtime)
except (OSError, IRError) as exc:
    st.error(f"The IR of run #{run_id} cannot be read: {exc}", icon=":material/error:")
    st.stop()

cols = st.columns(6)
cols[0].metric("Nodes", f"{len(ir.nodes):,}")
cols[1].metric("Op types", len(ir.op_histogram()))
cols[2].metric("Parameters", fmt_params(ir.parameter_count()))
cols[3].metric("torch.export", f"{row['export_s']:.2f} s")
cols[4].metric("Conversion", f"{row['convert_s'] * 1e3:.0f} ms")
cols[5].metric("JSON", fmt_bytes(row["json_bytes"]))

# -- graph ----------------------------------------------------------------------------------------------------------
with st.container(border=True, key="graph-section"):
    st.subheader("Graph")
    max_depth = module_depth(ir)
    suggested = default_view(ir)
    run_state = st.session_state.get("_graph-run")
    if run_state != run_id:  # a different IR: start from its suggested view
        st.session_state["_graph-run"] = run_id
        st.session_state["view"] = "modules" if suggested is not None else "ops"
        st.session_state["depth"] = suggested or 1
        st.session_state["expand"] = []
    c1, c2, c3 = st.columns([1.2, 1, 2])
    view = c1.radio("Show", ["modules", "ops"], key="view", horizontal=True, disabled=max_depth == 0,
                    format_func={"modules": "One box per module", "ops": "Every op"}.get)
    depth = None
    if view == "modules" and max_depth > 0:
        depth = int(c2.number_input("Module depth", 1, max(1, max_depth), key="depth",
                                    help="1 = the model's direct children (e.g. each decoder layer)"))
        openable = sorted({m for d in range(depth, max_depth + 1) for m in modules_at(ir, d)},
                          key=lambda m: (m.count("."), m))
        st.session_state["expand"] = [m for m in st.session_state.get("expand", []) if m in openable]
        expand = c3.multiselect("Open modules", openable, key="expand",
                                help="Show an opened module's inside; clicking a box in the graph does the same.")
    else:
        expand = []
    graph = cached_graph(path, Path(path).stat().st_mtime, depth, tuple(sorted(expand)))
    overlay = overlay_controls(store, row, path)
    if overlay is not None:
        graph = to_mermaid(ir, depth=depth, expand=tuple(sorted(expand)),
                           colour=fractions(graph.items.values(), overlay))
    if graph.fits_browser():
        show_graph(graph, key=f"graph-{run_id}")
    else:
        st.warning(f"This view has {graph.boxes:,} boxes and {graph.edges:,} edges, more than the browser's mermaid "
                   "renders (50,000 characters / 500 edges). Show one box per module, or download the .mmd file.",
                   icon=":material/warning:")
    d1, d2 = st.columns(2)
    d1.caption(f"{graph.boxes:,} boxes · {graph.edges:,} edges · "
               + ("every op" if depth is None else f"modules at depth {depth}")
               + (f" · opened: {', '.join(expand)}" if expand else ""))
    d2.download_button("Download this graph (.mmd)", graph.text, file_name=f"{ir.model_name.replace('/', '_')}.mmd",
                       mime="text/plain", key="download-mmd", icon=":material/download:")

    if overlay is not None:
        overlay_tables(store, overlay)

# -- op types and nodes ---------------------------------------------------------------------------------------------
left, right = st.columns([1, 2])
with left, st.container(border=True, key="ops-section"):
    st.subheader("Op types")
    hist = pd.DataFrame(ir.op_histogram().most_common(), columns=["op_type", "count"])
    fig = px.bar(hist.iloc[::-1], x="count", y="op_type", orientation="h", height=max(260, 22 * len(hist) + 80))
    fig.update_layout(margin=dict(l=0, r=10, t=10, b=0), yaxis_title=None, xaxis_title="nodes")
    st.plotly_chart(fig, key="chart-ops")

with right, st.container(border=True, key="nodes-section"):
    st.subheader("Nodes")
    tensors = ir.tensors()
    table = pd.DataFrame([{
        "node": n.name, "op": short_op(n.op_type), "op_type": n.op_type, "module": n.module_path or "(root)",
        "inputs": ", ".join(ir.weight_name_mapping.get(i, i) for i in n.inputs),
        "output shapes": "; ".join(str(o.shape) for o in n.outputs),
        "dtypes": ", ".join(sorted({o.dtype for o in n.outputs})),
        "attrs": json.dumps(n.attrs, separators=(",", ":"))[:200],
    } for n in ir.nodes])
    query = st.text_input("Search nodes", key="node-search", placeholder="name, op, module, shape or dtype…")
    if query.strip():
        needle = query.strip().lower()
        mask = table.astype(str).apply(lambda col: col.str.lower().str.contains(needle, regex=False)).any(axis=1)
        table = table[mask]
    ins = ", ".join(f"{t.name} {t.shape_str()}" for t in ir.graph_inputs)
    outs = ", ".join(f"{o} {tensors[o].shape_str()}" for o in ir.graph_outputs)
    st.caption(f"{len(table):,} of {len(ir.nodes):,} nodes · inputs {ins} · outputs {outs}")
    st.dataframe(table, hide_index=True, key="node-table", height=420)

# -- download and verify --------------------------------------------------------------------------------------------
with st.container(border=True, key="verify-section"):
    st.subheader("JSON and verification")
    v1, v2 = st.columns([1, 2])
    v1.download_button("Download IR JSON", Path(path).read_bytes(),
                       file_name=f"{ir.model_name.replace('/', '_')}.ir.json", mime="application/json",
                       key="download-ir", icon=":material/download:")
    refuse = verify_refusal(store, run_id)  # too large to materialise, or a zoo model that no longer exists

    def queue_verify(ir_run: int) -> None:
        try:
            spec = verify_spec(get_store(), ir_run)
        except (WeightLoadError, ValueError) as exc:
            flash("error", f"Cannot verify run #{ir_run}: {exc}")
            return
        ids = submit([spec])
        if ids:
            flash("success", f"Verification #{ids[0]} queued: the model is built on the CPU with seeded real weights "
                  "in a worker process, and the IR is run against it.")

    v1.button("Verify", key="verify", icon=":material/verified:", disabled=refuse is not None, on_click=queue_verify,
              args=(run_id,), help=refuse or "Run the IR with real weights and compare with the model's own output.")
    if refuse:
        v2.caption(f":material/block: {refuse}")
    else:
        v2.caption("Verification materialises the model with real weights (seed 0) in a worker process, runs the IR "
                   "with the executor and compares every output (rtol 1e-4, atol 1e-4).")
    watch_active_runs(kind="ir")
    checks = verifications(store, run_id)
    done = checks[checks["status"].isin(["ok", "failed"])] if not checks.empty else checks
    if not done.empty:
        latest = done.iloc[0]
        if latest["status"] == "failed":
            st.error(f"Verification #{latest['run_id']} failed: {first_line(latest['error'])}", icon=":material/error:")
            with st.expander(f"Full error of run #{latest['run_id']}"):
                st.code(latest["error"] or "", language=None)
        else:
            report: dict[str, Any] = {}
            if isinstance(latest["report_path"], str) and Path(latest["report_path"]).exists():
                report = json.loads(Path(latest["report_path"]).read_text())
            ok = bool(latest["verify_ok"])
            text = (f"Verification #{latest['run_id']}: the IR computes the model's outputs — max abs error "
                    f"{latest['max_abs_err']:.3g}, max rel error {latest['max_rel_err']:.3g} "
                    f"(rtol {report.get('rtol', 1e-4):g}, atol {report.get('atol', 1e-4):g}).")
            if ok:
                st.success(text, icon=":material/check_circle:")
            else:
                st.error(f"Verification #{latest['run_id']}: MISMATCH — max abs error {latest['max_abs_err']:.3g}, "
                         f"max rel error {latest['max_rel_err']:.3g}.", icon=":material/error:")
            if report.get("outputs"):
                tables.show(pd.DataFrame([{
                    "output": o["name"], "shape": str(o["shape"]), "dtype": o["dtype"],
                    "max abs err": o["max_abs_err"], "max rel err": o["max_rel_err"], "ok": "yes" if o["ok"] else "no",
                    "note": o.get("message", ""),
                } for o in report["outputs"]]), {"output": "output", "shape": "shape", "dtype": "dtype",
                                                 "max abs err": ("max abs error", "sci"),
                                                 "max rel err": ("max rel error", "sci"), "ok": "within tolerance",
                                                 "note": "note"}, key="verify-table")
        if len(done) > 1:
            st.caption("Earlier: " + ", ".join(
                f"#{r.run_id} {'ok' if r.verify_ok == 1 else ('failed' if r.status == 'failed' else 'mismatch')}"
                for r in done.iloc[1:].itertuples()))

# -- failures -------------------------------------------------------------------------------------------------------
failed = extractions(store, limit=10, status="failed")
if not failed.empty:
    with st.expander(f"Failed extractions ({len(failed)})", icon=":material/error:"):
        for r in failed.itertuples():
            what = f"{r.workload}/{r.preset}" if isinstance(r.preset, str) else r.workload
            st.markdown(f"**#{r.run_id}** `{what}` · {fmt_time(r.finished_at)}")
            st.error(first_line(r.error) or "failed without a message", icon=":material/error:")
