"""Home: what the lab is, where it runs, and what happened lately. Must stay fast: no torch import, only aggregate
or LIMITed queries (10,000 runs render in well under 1.5 s; see benchmarks/home_render_bench.py)."""

from __future__ import annotations

import streamlit as st

from app import queries
from app.axes import fmt_rate
from app.common import first_line, flash, fmt_time, fmt_us, get_store, show_flash, submit, watch_active_runs
from engine.runner.jobs import JobSpec
from engine.store.envinfo import host_env

st.set_page_config(page_title="Mode Lab", layout="wide")
store = get_store()

st.title("Mode Lab")
st.markdown(
    "A PyTorch performance lab: how **execution modes** trade off on your hardware. It covers:\n"
    "- **Benchmark** — a house-price MLP trained and timed in eager, FX, TorchScript, `torch.compile` (default, "
    "reduce-overhead, max-autotune), a custom C++ op, AOTInductor, CUDA graphs, hand-written Triton and CUDA; "
    "*why is X slower than Y*.\n"
    "- **Predict** — price a house with a model trained in any mode.\n"
    "- **IR Explorer** — a model's graph exported on the meta device, browsed, downloaded and verified.\n"
    "- **Profiler** — kernels, launches and idle time of a step, and what torch.compile generated.\n"
    "- **Kernel Levels** — attention, ViT patch embedding and GNN message passing written five ways "
    "(native → CUDA), on a roofline under this device's measured ceilings.\n"
    "- **LLM** — prefill and decode of a Llama-style decoder per mode: TTFT, TPOT, MFU, MBU.\n"
    "- **Compare** — did it get slower? Two sets of runs (commits, torch versions, devices) compared series by "
    "series with a statistical gate.\n"
    "- **Your own model** — Benchmark, Profiler and IR Explorer also take a model by import path.\n\n"
    "Every mode's output is checked against eager before its time counts, every run executes in its own worker "
    "process, and every sample lands in DuckDB."
)
show_flash()


def quick_first_run() -> None:
    params = {"workload": "house_price", "mode": "eager", "device": "cpu"}  # the engine's default sizes and iters
    ids = submit([JobSpec("bench", "house_price", "eager", "cpu", params)])
    if ids:
        flash("success", f"Queued run #{ids[0]} (eager on CPU): its progress shows below; **Benchmark** shows the "
                         "result.")


counts = store.status_counts()
left, right = st.columns([3, 2])
with left, st.container(border=True):
    st.subheader("Environment")
    env = host_env()
    st.markdown(
        f"- **Python** {env['python']} · **torch** {env['torch'] or 'not installed'} · "
        f"**Triton** {env['triton'] or 'not installed'}\n"
        f"- **CPU** {env['cpu_model']} ({env['cpu_count']} logical cores)\n"
        f"- **Host** {env['hostname']} · {env['platform']}\n"
        f"- **Git commit** `{env['git_commit'] or 'unknown'}`"
    )
    last = queries.latest_environment(store)
    if last:
        cuda = f" · CUDA {last['cuda']}" if isinstance(last.get("cuda"), str) and last["cuda"] else ""
        st.caption(f"Latest run (#{int(last['run_id'])}, {fmt_time(last['finished_at'])}) ran on "
                   f"**{last['device']}**: {last.get('device_name') or '—'}{cuda}, torch {last.get('torch')}, "
                   f"{last.get('threads') or '?'} threads.")
    else:
        st.caption("No run has recorded its device yet.")
with right, st.container(border=True):
    st.subheader("Runs")
    cols = st.columns(4)
    for col, status in zip(cols, ("queued", "running", "ok", "failed")):
        col.metric(status.capitalize(), f"{counts.get(status, 0):,}")
watch_active_runs()  # every run in progress, whatever its kind, with its state and a Cancel button

if sum(counts.values()) == 0:
    with st.container(border=True):
        st.subheader("Quick first run")
        st.markdown("The store is empty. Benchmark eager PyTorch on the CPU (about half a minute) to get a baseline.")
        st.button("Run eager on CPU", key="quick-run", type="primary", on_click=quick_first_run)
else:
    st.subheader("Latest results")
    latest = queries.latest_medians(store)
    if latest.empty:
        st.info("No benchmark has finished yet.")
    else:
        latest["column"] = latest["phase"] + " B=" + latest["batch_size"].astype("Int64").astype(str)
        table = latest.pivot_table(index=["mode", "device", "run_id"], columns="column", values="median_us",
                                   aggfunc="first").reset_index()
        columns = sorted(c for c in table.columns if " B=" in c)
        columns.sort(key=lambda c: (c.split(" ")[0] != "infer", int(c.split("=")[1])))  # infer first, by batch
        table = table.sort_values(["device", "mode"], key=lambda s: s.map(lambda v: (v != "eager", v)))
        for c in columns:
            table[c] = table[c].map(fmt_us)
        st.caption("Median latency per call of the latest ok benchmark of each mode and device, per phase and "
                   "batch size.")
        st.dataframe(table[["mode", "device", "run_id", *columns]], hide_index=True,
                     column_config={"run_id": st.column_config.NumberColumn("run", format="#%d")})

    failed = store.runs(status=["failed"], limit=5)
    if not failed.empty:
        st.subheader("Recent failures")
        for row in failed.itertuples():
            st.markdown(f"**#{row.id}** {row.kind} `{row.mode}` on {row.device} · {fmt_time(row.finished_at)}")
            st.error(first_line(row.error) or "failed without a message", icon=":material/error:")

ceilings = queries.device_ceilings(store)
if not ceilings.empty:
    st.subheader("Device ceilings")
    st.caption("Measured by the lab on each device (`python -m engine ceilings`); every \"% of\" on the pages "
               "divides by one of these and names it.")
    rates = {"copy_bw": ("copy bandwidth", "B/s"), "matmul_bf16": ("bf16 matmul", "FLOP/s"),
             "matmul_tf32": ("tf32 matmul", "FLOP/s"), "matmul_fp32": ("fp32 matmul", "FLOP/s")}
    shown = ceilings[["device"]].assign(run=ceilings["run_id"].map(lambda i: f"#{int(i)}"))
    for column, (label, unit) in rates.items():  # each device in its own unit: GB/s on a CPU, TB/s on a GPU
        shown[label] = ceilings[column].map(lambda v, unit=unit: fmt_rate(v if v == v else None, unit))
    for column, label in (("launch_us", "launch"), ("graph_kernel_us", "kernel in a CUDA graph")):
        shown[label] = ceilings[column].map(fmt_us)
    st.dataframe(shown, hide_index=True)

st.subheader("Pages")
c1, c2 = st.columns(2)
c1.page_link("pages/1_Benchmark.py", label="Benchmark — compare modes, run benchmarks, watch progress",
             icon=":material/speed:")
c2.page_link("pages/2_Predict.py", label="Predict — price a house with a trained model", icon=":material/home:")
c1.page_link("pages/3_IR_Explorer.py", label="IR Explorer — export a model's graph, browse and verify it",
             icon=":material/account_tree:")
c2.page_link("pages/4_Profiler.py", label="Profiler — kernels, launches and idle time of a step",
             icon=":material/troubleshoot:")
c1.page_link("pages/5_Kernel_Levels.py", label="Kernel Levels — one component written five ways, on a roofline",
             icon=":material/stacks:")
c2.page_link("pages/6_LLM.py", label="LLM — prefill and decode per mode: TTFT, TPOT, MFU, MBU",
             icon=":material/chat:")
c1.page_link("pages/7_Compare.py", label="Compare — did it get slower? Two sets of runs, statistically gated",
             icon=":material/compare_arrows:")
