"""engine.runner.jobs + engine.runner.worker: every failure of a worker becomes a failed run with its reason; the
supervisor's own
death is caught by the stale-run check; device locks serialise processes; submit() detaches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.runner.jobs import JobSpec, create_runs, describe_exit, lock_path, run_jobs, submit
from engine.runner.worker import classify
from engine.store.db import Store, pid_alive
from tests.engine.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[3]
TARGETS = "tests.engine.runner.fault_targets"
# The hang's timeout runs from the worker's start: a fresh worker imports torch before its target runs (~1-3 s here,
# 5-6 s on a GPU machine, where 4 s would end the run before its target had started).
HANG_TIMEOUT_S = 12.0 if any(Path("/dev").glob("nvidia*")) else 4.0


def spec(target: str, timeout_s: float = 60.0, **params) -> JobSpec:
    return JobSpec("bench", "house_price", target, "cpu", params, target=f"{TARGETS}:{target}", timeout_s=timeout_s)




def target_pid(run_dir: Path) -> int:
    return int((run_dir / "target.pid").read_text())


@pytest.fixture(scope="module", params=["forked", "fresh"])
def faults(request, tmp_path_factory):
    """Run every fault target once, in one supervisor (this process): once with workers forked by the lane's fork
    server (the default), once with every worker started afresh (MODELAB_FORKSERVER=0, the fallback)."""
    tmp = tmp_path_factory.mktemp("faults")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELAB_FORKSERVER", "1" if request.param == "forked" else "0")
        mp.setenv("ARTIFACTS_DIR", str(tmp / "artifacts"))
        mp.setenv("MODELAB_LOCK_DIR", str(tmp / "locks"))
        store = Store(tmp / "results.duckdb")
        specs = {
            "ok": spec("ok", value=7),
            "segfault": spec("segfault"),
            "hang": spec("hang", timeout_s=HANG_TIMEOUT_S),
            "value_error": spec("raise_value_error"),
            "oom": spec("oom"),
            "exit_3": spec("exit_3"),
            "not_a_result": spec("not_a_result"),
            "missing_function": JobSpec("bench", "house_price", "x", "cpu", target=f"{TARGETS}:nope"),
            "missing_module": JobSpec("bench", "house_price", "x", "cpu", target="no_such_module_anywhere:run"),
            "where_am_i": spec("where_am_i"),
        }
        ids = dict(zip(specs, create_runs(store, list(specs.values()), group_id="faults")))
        events: list[tuple[int, float, str]] = []
        statuses = run_jobs(store, list(ids.values()), lambda rid, frac, msg: events.append((rid, frac, msg)))
    return SimpleNamespace(store=store, ids=ids, statuses=statuses, events=events, launch=request.param,
                           dirs={name: tmp / "artifacts" / f"run_{rid}" for name, rid in ids.items()})


def progress_of(faults, name: str) -> list[tuple[float, str]]:
    return [(frac, msg) for rid, frac, msg in faults.events if rid == faults.ids[name]]


def test_ok_target_stores_its_result(faults):
    rid = faults.ids["ok"]
    assert faults.statuses[rid] == "ok"
    run = faults.store.run(rid)
    assert run["status"] == "ok" and run["progress"] == 1.0 and run["notes"] == ["ran ok"]
    assert run["params"]["value"] == 7 and run["params"]["_target"] == f"{TARGETS}:ok"
    assert run["pid"] == os.getpid()  # run_jobs made this process the owner
    metrics = faults.store.metrics([rid]).set_index("name")["value"]
    assert metrics["answer"] == 42.0 and metrics["echo"] == 7.0
    assert faults.store.samples([rid])["value"].tolist() == [1.0, 2.0, 3.0]
    assert faults.store.environment(rid)["python"] == "test"
    assert not pid_alive(target_pid(faults.dirs["ok"]))


def test_ok_run_records_the_worker_log(faults):
    rid = faults.ids["ok"]
    artifacts = faults.store.artifacts(rid).set_index("name")
    assert set(artifacts.index) == {"note.txt", "worker.log", "progress.jsonl"}
    timeline = [json.loads(line) for line in Path(artifacts.loc["progress.jsonl", "path"]).read_text().splitlines()]
    assert [e["message"] for e in timeline] == ["step 0.25", "step 0.5", "step 0.75"]
    assert all(0 <= a["t"] <= b["t"] for a, b in zip(timeline, timeline[1:]))
    from engine.store.report import run_timeline

    steps = run_timeline(faults.store, rid)
    assert list(steps["step"]) == ["step 0.25", "step 0.5", "step 0.75"]
    assert steps["seconds"].iloc[:2].ge(0).all() and steps["seconds"].isna().iloc[-1]
    log = artifacts.loc["worker.log"]
    assert log["kind"] == "log"
    assert Path(log["path"]) == faults.dirs["ok"] / "worker.log"
    text = Path(log["path"]).read_text()
    assert "hello from the ok target" in text  # prints went to the log ...
    assert "step 0.25" not in text  # ... and progress lines did not
    assert log["bytes"] == len(text.encode())
    assert artifacts.loc["note.txt", "bytes"] == len("made by the ok target\n")


def test_progress_callback_gets_increasing_fractions(faults):
    events = progress_of(faults, "ok")
    fracs = [f for f, _ in events]
    assert fracs == sorted(fracs), events
    assert events[0] == (0.0, "starting worker")
    assert [e for e in events if 0 < e[0] < 1] == [(0.25, "step 0.25"), (0.5, "step 0.5"), (0.75, "step 0.75")]
    assert events[-1] == (1.0, "done")


def test_segfault_names_the_signal_and_the_stack(faults):
    rid = faults.ids["segfault"]
    assert faults.statuses[rid] == "failed"
    error = faults.store.run(rid)["error"]
    assert error.startswith("worker crashed with SIGSEGV: segmentation fault")
    assert "fault_targets.py" in error  # faulthandler's Python stack, from the log's tail
    assert "Extension modules:" not in error
    assert progress_of(faults, "segfault")[-1] == (1.0, "failed")


def test_a_failed_run_keeps_its_log_and_its_timeline(faults):
    from engine.store.report import run_timeline

    rid = faults.ids["hang"]  # reported "hanging" before it stopped answering
    artifacts = faults.store.artifacts(rid).set_index("name")
    assert {"worker.log", "progress.jsonl"} <= set(artifacts.index)
    assert "hanging" in list(run_timeline(faults.store, rid)["step"])


def test_hang_times_out_and_the_worker_is_killed(faults):
    rid = faults.ids["hang"]
    assert faults.statuses[rid] == "failed"
    run = faults.store.run(rid)
    assert run["error"].startswith(f"timed out: no result after {HANG_TIMEOUT_S:.0f} s")
    took = (run["finished_at"] - run["started_at"]).total_seconds()
    assert HANG_TIMEOUT_S <= took < HANG_TIMEOUT_S + 10
    assert not pid_alive(target_pid(faults.dirs["hang"]))


def test_exception_is_reported_with_its_traceback(faults):
    rid = faults.ids["value_error"]
    assert faults.statuses[rid] == "failed"
    error = faults.store.run(rid)["error"]
    assert error.startswith("ValueError: bad parameter: learning rate -1")
    assert "--- traceback" in error and "raise_value_error" in error


def test_out_of_memory_is_classified(faults):
    error = faults.store.run(faults.ids["oom"])["error"]
    assert error.startswith("out of memory: RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB")


def test_exit_without_result(faults):
    assert faults.store.run(faults.ids["exit_3"])["error"].startswith("worker exited with code 3 without a result")


def test_target_returning_the_wrong_type_fails(faults):
    error = faults.store.run(faults.ids["not_a_result"])["error"]
    assert error.startswith("AttributeError:") and "to_json" in error


def test_unknown_targets_fail_with_the_import_error(faults):
    assert faults.store.run(faults.ids["missing_function"])["error"].startswith("AttributeError:")
    error = faults.store.run(faults.ids["missing_module"])["error"]
    assert error.startswith("ModuleNotFoundError:") and "no_such_module_anywhere" in error


def test_every_run_ends_ok_or_failed(faults):
    counts = faults.store.status_counts()
    assert counts == {"queued": 0, "running": 0, "ok": 2, "failed": len(faults.ids) - 2}


def test_forked_workers_start_with_the_imports_done_and_nothing_else(faults):
    rid = faults.ids["where_am_i"]
    assert faults.statuses[rid] == "ok", faults.store.run(rid)["error"]
    metrics = faults.store.metrics([rid]).set_index("name")["value"]
    assert metrics["matmul_sum"] == 256.0 ** 3  # torch's thread pool works in the child
    log = (faults.dirs["where_am_i"] / "worker.log").read_text()
    if faults.launch == "forked":
        assert metrics["torch_preloaded"] == 1.0 and "forked by the fork server" in log
        pids = {target_pid(faults.dirs[name]) for name in ("ok", "segfault", "where_am_i")}
        assert len(pids) == 3  # a process per run, even from one server
    else:
        assert "forked by the fork server" not in log


def test_a_finished_run_is_not_run_again(faults):
    rid = faults.ids["ok"]
    before = (faults.dirs["ok"] / "target.pid").read_text()
    assert run_jobs(faults.store, [rid]) == {rid: "ok"}
    assert (faults.dirs["ok"] / "target.pid").read_text() == before


def test_describe_exit_and_classify():
    assert "SIGKILL" in describe_exit(-9, False, 10) and "out of memory" in describe_exit(-9, False, 10)
    assert "SIGABRT" in describe_exit(-6, False, 10)
    assert describe_exit(-15, False, 10) == "worker crashed with SIGTERM: terminated by a signal"
    assert describe_exit(0, True, 12).startswith("timed out: no result after 12 s")
    assert classify(RuntimeError("CUDA error: device-side assert triggered")).startswith("CUDA error: ")
    assert classify(KeyError("x")) == "KeyError: 'x'"


# -- the supervisor killed -------------------------------------------------------------------------------------------

def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            pass
    return found


def test_kill_9_of_the_supervisor_kills_the_worker_and_leaves_a_stale_run(store, child_env, lab_env):
    [rid] = create_runs(store, [spec("hang", timeout_s=120)])
    worker = None
    supervisor = subprocess.Popen([sys.executable, "-m", "engine.runner.jobs", "--db", str(store.path), str(rid)],
                                  cwd=REPO_ROOT, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_dir = Path(lab_env["ARTIFACTS_DIR"]) / f"run_{rid}"
        # The worker reported progress and the supervisor wrote it to the store: the job is really under way.
        wait_until(lambda: (r := store.run(rid))["status"] == "running" and r["message"] == "hanging", 30,
                   "the run to be running")
        worker = target_pid(run_dir)
        assert worker in children(supervisor.pid)
        assert store.run(rid)["pid"] == supervisor.pid
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(timeout=10)
        wait_until(lambda: not pid_alive(worker), 10, "the worker to die with its supervisor (PR_SET_PDEATHSIG)")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        if worker and pid_alive(worker):  # leave no orphan behind when the check above failed
            os.kill(worker, signal.SIGKILL)
    assert store.run(rid)["status"] == "running"  # nobody was left to record the end
    assert store.fail_stale_runs() == [rid]
    run = store.run(rid)
    assert run["status"] == "failed"
    assert run["error"].startswith(f"interrupted: the process that ran it (pid {supervisor.pid}) is gone")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_kill_9_of_the_supervisor_also_ends_its_fork_server_and_the_forked_worker(store, child_env, lab_env):
    ids = create_runs(store, [spec("hang", timeout_s=120), spec("ok")])
    worker = server = None
    supervisor = subprocess.Popen([sys.executable, "-m", "engine.runner.jobs", "--db", str(store.path), *map(str, ids)],
                                  cwd=REPO_ROOT, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (r := store.run(ids[0]))["status"] == "running" and r["message"] == "hanging", 60,
                   "the first run to be running")
        worker = target_pid(Path(lab_env["ARTIFACTS_DIR"]) / f"run_{ids[0]}")
        server = parent_of(worker)
        assert server in children(supervisor.pid) and worker in children(server)  # forked, not started afresh
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(timeout=10)
        wait_until(lambda: not pid_alive(server) and not pid_alive(worker), 10, "server and worker to die")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        for pid in (worker, server):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert sorted(store.fail_stale_runs()) == ids  # the running one and the queued one behind it


def test_a_dead_fork_server_fails_only_the_run_it_was_running(store, lab_env, monkeypatch):
    import threading

    monkeypatch.setenv("MODELAB_FORKSERVER", "1")
    ids = create_runs(store, [spec("hang", timeout_s=120), spec("ok", value=5)])
    statuses: dict = {}
    thread = threading.Thread(target=lambda: statuses.update(run_jobs(store, ids)))
    thread.start()
    try:
        wait_until(lambda: store.run(ids[0])["message"] == "hanging", 60, "the first run to be running")
        worker = target_pid(Path(lab_env["ARTIFACTS_DIR"]) / f"run_{ids[0]}")
        os.kill(parent_of(worker), signal.SIGKILL)  # the fork server, not the run
        thread.join(timeout=90)
    finally:
        if thread.is_alive():
            os.kill(target_pid(Path(lab_env["ARTIFACTS_DIR"]) / f"run_{ids[0]}"), signal.SIGKILL)
            thread.join()
    assert statuses == {ids[0]: "failed", ids[1]: "ok"}
    assert store.run(ids[0])["error"].startswith("the fork server died")
    wait_until(lambda: not pid_alive(worker), 10, "the orphaned worker to die with its server")
    assert store.metrics([ids[1]]).set_index("name")["value"]["echo"] == 5.0


# -- device lock -----------------------------------------------------------------------------------------------------

def test_device_lock_serialises_processes(tmp_path, child_env, lab_env):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.engine.runner.lock_holder", "cpu", str(go), "0.5"],
                              cwd=REPO_ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(0.5)  # let both import and start polling for the go file
    go.touch()
    held = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        held.append(json.loads(out))
    first, second = sorted(held, key=lambda h: h["start"])
    assert first["end"] - first["start"] >= 0.5 and second["end"] - second["start"] >= 0.5
    assert second["start"] >= first["end"], f"the lock was held twice at once: {held}"
    # The one that waited was told who held the lock: its pid, its command line and for how long.
    (told,) = second["waited"]
    assert told.startswith(f"waiting for cpu: held by pid {first['pid']} (python -m tests.engine.runner.lock_holder")
    assert told.endswith(" s")
    assert first["waited"] == []
    assert lock_path("cpu").parent == Path(lab_env["MODELAB_LOCK_DIR"])


def test_lock_names():
    assert lock_path("cuda") == lock_path("cuda:0")
    assert lock_path("cuda:1") != lock_path("cuda:0") != lock_path("cpu")


# -- submit ----------------------------------------------------------------------------------------------------------

def test_submit_returns_at_once_and_the_run_completes(store, lab_env):
    started = time.monotonic()
    [rid] = submit(store, [spec("ok", step_s=0.3, value=3)])
    assert time.monotonic() - started < 5
    run = store.run(rid)
    assert run["status"] in ("queued", "running")
    supervisor = int(run["pid"])
    assert supervisor != os.getpid() and pid_alive(supervisor)
    wait_until(lambda: store.run(rid)["status"] in ("ok", "failed"), 30, "the submitted run to finish", 0.2)
    run = store.run(rid)
    assert run["status"] == "ok", run["error"]
    assert store.metrics([rid]).set_index("name")["value"]["echo"] == 3.0
    assert (Path(lab_env["ARTIFACTS_DIR"]) / f"supervisor-{rid}.log").exists()
    wait_until(lambda: not pid_alive(supervisor), 10, "the supervisor to exit")


# -- fork server -----------------------------------------------------------------------------------------------------

def test_fork_server_refuses_to_fork_a_threaded_process_and_runs_start_afresh(tmp_path, child_env, lab_env):
    from engine.runner.forkserver import ForkServer, ForkServerError
    from engine.runner.jobs import Launcher, _FreshWorker

    with pytest.raises(ForkServerError, match="forking a threaded process is unsafe"):
        ForkServer(["tests.engine.runner.starts_a_thread"], child_env, REPO_ROOT, tmp_path / "server.log").wait_ready()
    launcher = Launcher(tmp_path / "server2.log", preload=["tests.engine.runner.starts_a_thread"])
    (tmp_path / "job.json").write_text(json.dumps({
        "run_id": 1, "target": f"{TARGETS}:ok", "params": {"artifacts_dir": str(tmp_path), "steps": []},
        "result_file": str(tmp_path / "result.json"), "progress_file": str(tmp_path / "progress.jsonl")}))
    try:
        worker = launcher.start(tmp_path / "job.json", tmp_path / "worker.log")
        assert isinstance(worker, _FreshWorker) and "unsafe" in launcher.why_not
        assert worker.proc.wait(timeout=60) == 0 and (tmp_path / "result.json").exists()
    finally:
        launcher.close()


def test_submitted_group_runs_through_one_fork_server_that_ends_with_its_supervisor(store, lab_env):
    ids = submit(store, [spec("ok", value=1), spec("where_am_i"), spec("ok", value=2)])
    supervisor = int(store.run(ids[0])["pid"])
    wait_until(lambda: all(store.run(i)["status"] in ("ok", "failed") for i in ids), 90, "the group to finish", 0.2)
    assert [store.run(i)["status"] for i in ids] == ["ok", "ok", "ok"]
    assert store.metrics([ids[1]]).set_index("name")["value"]["torch_preloaded"] == 1.0  # forked, imports done
    logs = [(Path(lab_env["ARTIFACTS_DIR"]) / f"run_{i}" / "worker.log").read_text() for i in ids]
    servers = {line.split("(pid ")[1].rstrip(")") for log in logs for line in log.splitlines()
               if "forked by the fork server" in line}
    assert len(servers) == 1  # one server for the whole group, a child per run
    server = int(next(iter(servers)))
    wait_until(lambda: not pid_alive(supervisor) and not pid_alive(server), 15,
               "the supervisor and its fork server to exit")


def test_lanes_with_cpu_kernel_levels_switch_triton_to_its_interpreter_before_importing_it(store):
    from engine.runner.jobs import default_preload, preload_for

    bench = create_runs(store, [JobSpec("bench", "house_price", "eager", "cpu", {})])
    cpu_level = create_runs(store, [JobSpec("levels", "causal_attention", "L4-triton", "cpu", {})])
    gpu_level = create_runs(store, [JobSpec("levels", "causal_attention", "L4-triton", "cuda", {})])
    assert preload_for(store, bench) == default_preload() and "torch._dynamo" in default_preload()
    assert preload_for(store, gpu_level) == default_preload()
    # CPU levels alone: the interpreter's switch right after torch, then the default's dynamo, Inductor and Triton
    assert preload_for(store, cpu_level) == ("torch", "engine.levels.interpreter", *default_preload()[1:])
    # Beside a bench run neither list's next import suits the other: the part they share, torch alone.
    assert preload_for(store, bench + cpu_level) == ("torch",)
    assert preload_for(store, cpu_level + bench) == ("torch",)


def test_exit_reports_never_swallow_the_started_event_a_spawner_waits_for(tmp_path):
    """The supervisor polls exit_code() from one thread per running run while another waits in spawn() for its
    'started': the server's report lines reach each of them whatever the order they were read in."""
    import queue
    import threading

    from engine.runner.forkserver import ForkServer

    script = ("import json, sys, time\n"
              "for line in ({'exited': 11, 'code': 0}, {'started': 'job', 'pid': 12}, {'exited': 13, 'code': -9}):\n"
              "    print(json.dumps(line), flush=True)\n"
              "time.sleep(5)\n")
    server = object.__new__(ForkServer)
    server.proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server.log_path = tmp_path / "server.log"
    server._events, server._exits, server._eof = queue.Queue(), {}, False
    polled: list[int | None] = []
    poller = threading.Thread(target=lambda: [polled.append(server.exit_code(11)) or time.sleep(0.01)
                                              for _ in range(50)])
    threading.Thread(target=server._read, daemon=True).start()
    poller.start()
    poller.join(5)  # the poller ran through every line first…
    assert polled.count(0) == 1  # …took the exit of pid 11, once
    assert server._next_event(1.0, "started") == {"started": "job", "pid": 12}  # …and left the spawner its event
    deadline = time.monotonic() + 5
    code = server.exit_code(13)
    while code is None and time.monotonic() < deadline:
        time.sleep(0.01)
        code = server.exit_code(13)
    assert code == -9 and server.exit_code(13) is None  # reported once
    server.proc.kill()
    server.proc.wait()
