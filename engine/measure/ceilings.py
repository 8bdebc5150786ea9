"""Device ceilings: what this device can really do, measured once and reused by every "% of peak" in the product.

Four measured numbers (METHOD.md's "two numbers first", plus the two that launch-bound code meets):

- `copy_bw`      device-to-device copy of a large buffer, bytes read + bytes written per second (B/s);
- `matmul_<dt>`  a large square matrix product through torch (cuBLAS / MKL), FLOP/s, for fp32 (no tf32), tf32, bf16;
- `launch_us`    one tiny eager op launched back to back from Python (what a launch-bound step pays per kernel);
- `graph_kernel_us`  one tiny kernel inside a replayed CUDA graph (the floor once launches leave the host);
- `sync_us`      launch + synchronize round trip of one tiny op (host wall time).

Datasheet peaks are kept beside them where the device is known, always named as such: a page that divides by one says
"of the datasheet bf16 peak", never just "of peak". A ceilings measurement is a run (kind `ceilings`) whose metrics
are these values; `latest_ceilings` reads the newest one for a device name back from the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.runner.kinds import RunKind, register
from engine.store.db import Metric, RunResult, Store

# A ceilings measurement is a run of its own kind (`python -m engine ceilings`, ensure_ceilings), registered here.
KIND = register(RunKind("ceilings", "engine.measure.ceilings:ceilings_job"))

# name -> (unit, plain label). The label is what pages print after "% of".
CEILINGS: dict[str, tuple[str, str]] = {
    "copy_bw": ("B/s", "measured device-to-device copy bandwidth"),
    "matmul_fp32": ("FLOP/s", "measured fp32 matmul rate (no tf32)"),
    "matmul_tf32": ("FLOP/s", "measured tf32 matmul rate"),
    "matmul_bf16": ("FLOP/s", "measured bf16 matmul rate"),
    "launch_us": ("us", "measured eager launch cost per op"),
    "graph_kernel_us": ("us", "measured per-kernel cost inside a CUDA graph"),
    "sync_us": ("us", "measured launch + synchronize round trip"),
}


@dataclass(frozen=True)
class Datasheet:
    """Vendor peaks (dense, no sparsity), for reference only: products divide by measured ceilings first."""
    name: str
    bf16_flops: float
    tf32_flops: float
    fp32_flops: float
    mem_bw: float  # B/s


# Matched by substring of torch.cuda.get_device_name(); the first match wins, so specific names come first.
DATASHEETS: list[tuple[str, Datasheet]] = [
    ("H100 PCIe", Datasheet("NVIDIA H100 PCIe", 756e12, 378e12, 51e12, 2.0e12)),
    ("H100", Datasheet("NVIDIA H100 SXM5 80GB", 989e12, 494.7e12, 66.9e12, 3.35e12)),
    ("H200", Datasheet("NVIDIA H200 SXM 141GB", 989e12, 494.7e12, 66.9e12, 4.8e12)),
    ("A100", Datasheet("NVIDIA A100 SXM4 80GB", 312e12, 156e12, 19.5e12, 2.039e12)),
    ("L40S", Datasheet("NVIDIA L40S", 362e12, 183e12, 91.6e12, 0.864e12)),
]


def datasheet_for(device_name: str | None) -> Datasheet | None:
    for key, sheet in DATASHEETS:
        if device_name and key in device_name:
            return sheet
    return None


@dataclass
class Ceilings:
    device_name: str
    values: dict[str, float] = field(default_factory=dict)  # CEILINGS name -> value
    run_id: int | None = None
    measured_at: Any = None

    @property
    def datasheet(self) -> Datasheet | None:
        return datasheet_for(self.device_name)

    def get(self, name: str) -> float | None:
        value = self.values.get(name)
        return float(value) if value is not None and value == value and value > 0 else None

    def matmul(self, dtype: str) -> float | None:
        """Measured matmul FLOP/s for 'fp32' | 'tf32' | 'bf16' (fp16 shares bf16's units on these devices)."""
        return self.get(f"matmul_{'bf16' if dtype == 'fp16' else dtype}")

    @property
    def copy_bw(self) -> float | None:
        return self.get("copy_bw")

    def label(self, name: str) -> str:
        return CEILINGS[name][1] + (f" on {self.device_name}" if self.device_name else "")


def dtype_key(dtype: Any, allow_tf32: bool = False) -> str:
    """torch dtype -> the ceilings' matmul key."""
    text = str(dtype).replace("torch.", "")
    if text in ("bfloat16", "bf16"):
        return "bf16"
    if text in ("float16", "half", "fp16"):
        return "fp16"
    return "tf32" if allow_tf32 else "fp32"


def percent_of(value: float, ceiling: float | None) -> float | None:
    return None if not ceiling else 100.0 * value / ceiling


# -- measuring ---------------------------------------------------------------------------------------------------------

def _median_time_s(fn: Callable[[], object], device: str, iters: int, warmup: int = 3) -> float:
    import numpy as np
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure(device: str, quick: bool = False, progress: Callable[[float, str], None] = lambda f, m: None
            ) -> dict[str, float]:
    """Measure every ceiling this device has (CUDA: all; CPU: copy, fp32 matmul, eager launch). Random data, never
    zeros (zeros can run faster than real data)."""
    import torch

    cuda = device.startswith("cuda")
    values: dict[str, float] = {}
    gen = torch.Generator(device=device).manual_seed(0)

    progress(0.05, "copy bandwidth")
    n_bytes = (1 << 30 if cuda else 1 << 27) // (8 if quick else 1)  # 1 GiB on GPU: far beyond L2
    src = torch.rand(n_bytes // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    t = _median_time_s(lambda d=dst, s=src: d.copy_(s), device, iters=10 if cuda else 5)
    values["copy_bw"] = 2 * n_bytes / t  # read + write
    del src, dst

    progress(0.3, "matmul rates")
    size = (8192 if cuda else 1024) // (4 if quick else 1)
    dtypes = [("fp32", torch.float32, False)]
    if cuda:
        dtypes += [("tf32", torch.float32, True), ("bf16", torch.bfloat16, False)]
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for key, dtype, tf32 in dtypes:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(size, size, device=device, generator=gen).to(dtype)
            b = torch.randn(size, size, device=device, generator=gen).to(dtype)
            t = _median_time_s(lambda: a @ b, device, iters=10 if cuda else 3)
            values[f"matmul_{key}"] = 2 * size ** 3 / t
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32

    progress(0.7, "launch latency")
    tiny = torch.zeros(1, device=device)
    n = 200 if quick else 2000
    for _ in range(50):
        tiny.add_(1)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        tiny.add_(1)
    if cuda:
        torch.cuda.synchronize()
    values["launch_us"] = (time.perf_counter() - t0) / n * 1e6
    if cuda:
        round_trips = []
        for _ in range(200):
            t0 = time.perf_counter()
            tiny.add_(1)
            torch.cuda.synchronize()
            round_trips.append(time.perf_counter() - t0)
        round_trips.sort()
        values["sync_us"] = round_trips[len(round_trips) // 2] * 1e6
        # Per-kernel floor once the host is out of the loop: 100 tiny kernels in one graph, replayed.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                tiny.add_(1)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(100):
                tiny.add_(1)
        t = _median_time_s(graph.replay, device, iters=50)
        values["graph_kernel_us"] = t / 100 * 1e6
    return values


def ceilings_job(params: dict, progress: Callable[[float, str], None]) -> RunResult:
    """Job-runner entry point (kind `ceilings`): measure and hand back one metric per ceiling."""
    from engine.store.envinfo import capture_env

    device = params.get("device", "cpu")
    result = RunResult(env=capture_env(device))
    values = measure(device, quick=bool(params.get("quick")), progress=progress)
    for name, value in values.items():
        result.metrics.append(Metric(name, value, CEILINGS[name][0]))
    sheet = datasheet_for(result.env.get("device_name"))
    if sheet:
        result.notes.append(f"datasheet ({sheet.name}): bf16 {sheet.bf16_flops / 1e12:.0f} TFLOP/s, tf32 "
                            f"{sheet.tf32_flops / 1e12:.0f}, fp32 {sheet.fp32_flops / 1e12:.1f}, memory "
                            f"{sheet.mem_bw / 1e12:.2f} TB/s (dense peaks; shown for reference)")
    return result


# -- reading back ------------------------------------------------------------------------------------------------------

def latest_ceilings(store: Store, device_name: str | None = None, device: str | None = None) -> Ceilings | None:
    """The newest ok ceilings run for this device name (or, without a name, this device string), or None."""
    if not store.path.exists():
        return None
    where, args = ["r.kind = 'ceilings'", "r.status = 'ok'"], []
    if device_name:
        where.append("e.device_name = ?")
        args.append(device_name)
    elif device:
        where.append("r.device = ?")
        args.append(device)
    runs = store.query(f"SELECT r.id, r.finished_at, e.device_name FROM runs r LEFT JOIN environments e "
                       f"ON e.run_id = r.id WHERE {' AND '.join(where)} ORDER BY r.id DESC LIMIT 1", args)
    if runs.empty:
        return None
    row = runs.iloc[0]
    metrics = store.metrics([int(row["id"])])
    return Ceilings(device_name=str(row["device_name"] or device or ""), run_id=int(row["id"]),
                    measured_at=row["finished_at"],
                    values={str(n): float(v) for n, v in zip(metrics["name"], metrics["value"])})


def all_ceilings(store: Store) -> list[Ceilings]:
    """The newest ceilings of every device name in the store (for pages that compare stored devices)."""
    if not store.path.exists():
        return []
    names = store.query("SELECT DISTINCT e.device_name FROM runs r JOIN environments e ON e.run_id = r.id "
                        "WHERE r.kind = 'ceilings' AND r.status = 'ok'")
    found = [latest_ceilings(store, device_name=name) for name in names.get("device_name", [])]
    return [c for c in found if c is not None]


def ceilings_for(device: str, db: str | None, measure_if_missing: bool = True, quick: bool = False
                 ) -> Ceilings | None:
    """For code running in a worker that holds the device lock: the stored ceilings of this device, else measure
    them now (and store them as their own `ceilings` run, so the next run reuses them)."""
    from engine.store.envinfo import capture_env

    env = capture_env(device)
    name = env.get("device_name")
    store = Store(db) if db else None
    if store is not None:
        found = latest_ceilings(store, device_name=name, device=device)
        if found is not None:
            return found
    if not measure_if_missing:
        return None
    from engine.runner.device_lock import exclusive

    with exclusive():  # a measurement: the device alone, even in a worker that prepares beside others
        if store is not None:  # another run of the group may have measured them while this one waited
            found = latest_ceilings(store, device_name=name, device=device)
            if found is not None:
                return found
        values = measure(device, quick=quick)
        run_id = None
        if store is not None:
            store.init()
            run_id = store.create_run("ceilings", "ceilings", "measure", device,
                                      {"device": device, "auto": True, "quick": quick})
            store.start_run(run_id, "measuring (asked for by another run)")
            result = RunResult(env=env, metrics=[Metric(k, v, CEILINGS[k][0]) for k, v in values.items()])
            store.record_result(run_id, result)
    return Ceilings(device_name=str(name or device), values=values, run_id=run_id)


def ceiling_metrics(ceilings: Ceilings | None, names: tuple[str, ...]) -> list[Metric]:
    """The ceilings a run divided by, copied into its own metrics (`ceiling_<name>`), so every stored percentage
    names its denominator even if the ceilings are re-measured later."""
    if ceilings is None:
        return []
    out = [Metric(f"ceiling_{n}", ceilings.values[n], CEILINGS[n][0]) for n in names if ceilings.get(n)]
    if ceilings.run_id is not None:
        out.append(Metric("ceilings_run_id", ceilings.run_id, ""))
    return out


def ensure_ceilings(store: Store, device: str, timeout_s: float) -> None:
    """Runs that prepare side by side (engine.runner.plan) would each wait for the device alone to measure missing
    ceilings: measure them once, first, as their own run (what the first run would have done; a failure leaves MFU,
    MBU and the % of peak out)."""
    import sys

    from engine.runner.jobs import JobSpec, create_runs, run_jobs
    from engine.store.envinfo import capture_env

    if latest_ceilings(store, device_name=capture_env(device).get("device_name"), device=device) is not None:
        return
    ids = create_runs(store, [JobSpec("ceilings", "ceilings", "measure", device, {"device": device, "auto": True},
                                      timeout_s=timeout_s)])
    if run_jobs(store, ids)[ids[0]] != "ok":
        print(f"ceilings run {ids[0]} failed (MFU, MBU and % of peak will be left out): {store.run(ids[0])['error']}",
              file=sys.stderr)


def ensure_for_group(store: Store, runs: list[dict[str, Any]]) -> None:
    """A group_start hook (engine.runner.kinds): the ceilings of the group's device, measured first if missing, with
    the group's first run's timeout."""
    ensure_ceilings(store, str(runs[0]["device"]), float(runs[0]["params"].get("_timeout_s", 1800)))
