"""AOTInductor on CPU: a .pt2 round trip, the aoti mode through bench (native_* metrics beside Python's), and the
native runner (csrc/aoti_runner.cpp) built and run in the suite. One compile and one runner build per session
(both cached in .build/ across sessions)."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import torch

from engine.bench.run import BenchConfig, bench_mode
from engine.modes import get_mode
from engine.native import aoti, build
from engine.workloads.house_price import make_batch, make_model

pytestmark = pytest.mark.slow
ITERS = 5


def _need_compiler() -> None:
    reason = build.compiler_missing()
    if reason:
        pytest.skip(f"AOTInductor and the native runner need a C++ compiler: {reason}")


@pytest.fixture(scope="session")
def package() -> aoti.Package:
    _need_compiler()
    model = make_model().eval()
    inputs, _ = make_batch(4, "cpu")
    return aoti.compile_package(model, inputs, options={})


@pytest.fixture(scope="session")
def runner() -> Path:
    _need_compiler()
    return build.build_aoti_runner()


def _expected(batch: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    inputs, _ = make_batch(batch, "cpu")
    with torch.no_grad():
        return inputs, make_model().eval()(*inputs)


def test_pt2_round_trip_matches_eager(package):
    assert package.path.is_file() and package.path.suffix == ".pt2" and package.dynamic_batch
    names = zipfile.ZipFile(package.path).namelist()
    assert any(n.endswith(".wrapper.so") for n in names)  # compiled, not just C++ source
    compiled = aoti.load(package.path, "cpu")
    for batch in (4, 1, 37):  # the batch dimension is dynamic: one package for every size
        inputs, expected = _expected(batch)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-5, atol=1e-5)


def test_package_is_cached_by_content(package):
    model = make_model().eval()
    inputs, _ = make_batch(16, "cpu")  # another batch size: same dynamic package
    again = aoti.compile_package(model, inputs, options={})
    assert again.cache_hit and again.path == package.path and again.compile_s == 0
    assert aoti.package_digest(model, inputs, options={}) == package.digest
    assert aoti.package_digest(model, inputs, options={"aot_inductor.compile_wrapper_opt_level": "O0"}) != \
        package.digest  # other options: another package
    with torch.no_grad():
        model.fc3.bias += 1.0  # other weights: another package
    assert aoti.package_digest(model, inputs, options={}) != package.digest
    assert aoti.generated_sources(package.path).keys() >= {"aoti_wrapper.cpp"}


def test_native_runner_builds_and_runs(package, runner):
    assert os.access(runner, os.X_OK)
    assert runner == build.build_aoti_runner()  # cached: same file, no rebuild
    inputs, expected = _expected(4)
    result = aoti.run_native(runner, package.path, inputs, "cpu", warmup=2, iters=ITERS)
    assert result["ok"] and result["iters"] == ITERS and result["device"] == "cpu"
    assert len(result["samples_us"]) == ITERS and all(v > 0 for v in result["samples_us"])
    assert result["peak_device_bytes"] is None and result["max_rss_bytes"] > 0 and result["load_us"] > 0
    out = result["outputs"][0]
    assert out["shape"] == [4, 1] and out["dtype"] == "float32"
    torch.testing.assert_close(out["tensor"], expected, rtol=1e-5, atol=1e-5)
    assert out["sum"] == pytest.approx(float(expected.sum()), rel=1e-5, abs=1e-5)


def test_native_runner_prints_json_errors(package, runner, tmp_path):
    with pytest.raises(aoti.NativeRunError, match="zip archive|open"):
        aoti.run_native(runner, tmp_path / "missing.pt2", (torch.zeros(4, 5),), "cpu", warmup=0, iters=1)
    spec = aoti.write_tensor(torch.zeros(4, 5), tmp_path / "x.bin").replace(":4,5", ":4,6")
    import subprocess

    done = subprocess.run([str(runner), "--package", str(package.path), "--input", spec], capture_output=True,
                          text=True)
    assert done.returncode == 1
    error = json.loads(done.stdout.strip().splitlines()[-1])
    assert error["ok"] is False and "need 96" in error["error"]


def test_native_crash_becomes_an_error(tmp_path):
    fake = tmp_path / "crashing_runner"
    fake.write_text("#!/bin/sh\nkill -SEGV $$\n")
    fake.chmod(0o755)
    with pytest.raises(aoti.NativeRunError, match="crashed with SIGSEGV"):
        aoti.run_native(fake, tmp_path / "m.pt2", (torch.zeros(2, 5),), "cpu", warmup=0, iters=1)


def test_load_checked_in_a_child_process(package):
    inputs, _ = make_batch(4, "cpu")
    aoti.check_load_in_child(package.path, inputs, "cpu")  # no exception: loads and runs in a fresh process


def test_child_load_check_runs_once_per_package(package, monkeypatch):
    """The aoti mode's crash check (forced on here; default on CUDA) runs in a child the first time, leaves a marker
    beside the cached package, and a later prepare of the same package skips it."""
    from engine.modes import aoti as aoti_mode

    monkeypatch.setenv(aoti_mode.CHECK_ENV, "1")
    marker = aoti_mode._check_marker(package.path, torch.device("cpu"))
    marker.unlink(missing_ok=True)
    calls = []
    real = aoti.check_load_in_child
    monkeypatch.setattr(aoti, "check_load_in_child", lambda *a, **k: (calls.append(a[0]), real(*a, **k)))
    inputs, _ = make_batch(4, "cpu")
    first = get_mode("aoti").prepare(make_model(), inputs, False)
    assert calls == [package.path] and marker.is_file()
    assert any("child process first" in n for n in first.notes)
    second = get_mode("aoti").prepare(make_model(), inputs, False)
    assert calls == [package.path]  # not checked again
    torch.testing.assert_close(second.fn(*inputs), first.fn(*inputs))
    marker.unlink()


def test_train_phase_is_refused_clearly():
    from engine.modes.aoti import InferenceOnlyError

    inputs, _ = make_batch(4, "cpu")
    with pytest.raises(InferenceOnlyError, match="inference-only"):
        get_mode("aoti").prepare(make_model(), inputs, True)


def test_aoti_mode_bench(package, runner, tmp_path):
    """Default phases: train is skipped with a note; infer matches eager in Python and in the native runner."""
    cfg = BenchConfig(mode="aoti", batch_sizes=(4,), train_batch_sizes=(8,), warmup=1, iters=ITERS,
                      artifacts_dir=str(tmp_path))
    result = bench_mode(cfg)
    assert [(s.phase, s.batch_size, len(s.values)) for s in result.samples] == [("infer", 4, ITERS)]
    metrics = {m.name: m for m in result.metrics}
    assert all(m.phase == "infer" and m.batch_size == 4 for m in result.metrics)
    assert metrics["max_abs_err"].value <= 1e-4 and metrics["native_max_abs_err"].value <= 1e-4
    for name in ("native_median", "native_p10", "native_p90"):
        assert metrics[name].unit == "us" and metrics[name].value > 0
    assert metrics["native_p10"].value <= metrics["native_median"].value <= metrics["native_p90"].value
    assert "export_time" in metrics
    assert any("train skipped" in n for n in result.notes)
    assert any("aoti_runner.cpp" in n for n in result.notes)
    artifacts = {a.name: a for a in result.artifacts}
    assert {"model.pt2", "aoti_exported_program.txt", "aoti_wrapper.cpp"} <= set(artifacts)
    assert artifacts["model.pt2"].kind == "file" and Path(artifacts["model.pt2"].path).read_bytes()[:2] == b"PK"


def test_only_train_asked_is_an_error():
    with pytest.raises(ValueError, match="supports infer"):
        bench_mode(BenchConfig(mode="aoti", phases=("train",), train_batch_sizes=(8,), warmup=0, iters=1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip_and_native_runner(runner):
    """On a GPU machine: the CUDA package loads (checked in a child first), matches eager, and runs natively."""
    model = make_model().to("cuda").eval()
    inputs, _ = make_batch(64, "cuda")
    pkg = aoti.compile_package(model, inputs, options=aoti.env_options())
    aoti.check_load_in_child(pkg.path, inputs, "cuda")
    result = aoti.run_native(runner, pkg.path, inputs, "cuda", warmup=2, iters=ITERS)
    with torch.no_grad():
        expected = model(*inputs).cpu()
    torch.testing.assert_close(result["outputs"][0]["tensor"], expected, rtol=1e-4, atol=1e-4)
    assert result["peak_device_bytes"] is None or result["peak_device_bytes"] > 0
    # No in-process load here: on the GPU image that needs libstdc++ preloaded, which workers get and pytest does not
    # (engine/native/toolchain.py: with_libstdcxx_preloaded); the aoti mode's bench covers the Python path there.


def _lock_waiters(pid: int) -> set[str]:
    """The flocks `pid` waits for, 'READ' or 'WRITE', from the kernel's table: "1: -> FLOCK ADVISORY WRITE <pid> …"."""
    kinds = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[2] == "FLOCK" and fields[5] == str(pid):
            kinds.add(fields[4])
    return kinds


def _wait_for(predicate, timeout_s: float, what: str):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the kernel's lock table (/proc/locks)")
def test_native_runner_holds_the_device_lock_itself(package, runner, tmp_path):
    """Beside a group the runner takes engine.runner.device_lock's file itself: shared to start and load (so it waits
    while
    another run times), exclusive to time (so it waits while another run prepares), and lets go when it ends."""
    import fcntl
    import subprocess

    inputs, expected = _expected(4)
    lock = tmp_path / "modelab-device-cuda0.lock"
    cmd = [str(runner), "--package", str(package.path), "--device", "cpu", "--warmup", "1", "--iters", "3",
           "--output-dir", str(tmp_path), "--input", aoti.write_tensor(inputs[0], tmp_path / "x.bin"),
           "--device-lock", str(lock), "--timing-cores", ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))]
    other = os.open(lock, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # another run is timing: the runner may not even start
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: _lock_waiters(proc.pid) == {"READ"}, 60, "the runner to wait for a shared hold")
        fcntl.flock(other, fcntl.LOCK_UN)
        fcntl.flock(other, fcntl.LOCK_SH)  # now another run prepares beside it: the runner loads, then waits to time
        _wait_for(lambda: _lock_waiters(proc.pid) == {"WRITE"}, 120, "the runner to wait for the device alone")
        assert proc.poll() is None
        gate = os.open(lock.with_suffix(".gate"), os.O_RDWR)
        try:  # it queues at the gate meanwhile: a later preparation waits behind it
            with pytest.raises(BlockingIOError):
                fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(gate)
        fcntl.flock(other, fcntl.LOCK_UN)
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(other)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ok"] and len(result["samples_us"]) == 3
    torch.testing.assert_close(aoti.read_tensor(result["outputs"][0]["path"], "float32", [4, 1]), expected,
                               rtol=1e-5, atol=1e-5)
    probe = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go at exit
    finally:
        os.close(probe)
    assert lock.read_text() == ""  # no stale "(timing)" label for whoever waits next
