"""Environment capture: what a number was measured on, stored with every run."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def host_env() -> dict[str, Any]:
    """What can be known without importing torch (cheap enough for every page render)."""
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "hostname": socket.gethostname(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "executable": sys.executable,
    }


def capture_env(device: str = "cpu") -> dict[str, Any]:
    """Full capture for a run, including what torch says about the device it runs on."""
    import torch

    env = host_env()
    env["torch"] = torch.__version__
    env["threads"] = torch.get_num_threads()
    env["cuda"] = torch.version.cuda
    env["cuda_available"] = torch.cuda.is_available()
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        env["device_name"] = props.name
        env["device_capability"] = f"{props.major}.{props.minor}"
        env["device_memory_gb"] = round(props.total_memory / 2**30, 1)
    else:
        env["device_name"] = f"CPU: {env['cpu_model']}"
    return env


def device_report() -> dict[str, Any]:
    """Which devices this machine can run on, for the CLI and the dashboard's device picker."""
    import torch

    devices = ["cpu"]
    names = {"cpu": cpu_model()}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            key = "cuda" if i == 0 else f"cuda:{i}"
            devices.append(key)
            names[key] = torch.cuda.get_device_name(i)
    return {"devices": devices, "names": names, "torch": torch.__version__, "cuda": torch.version.cuda}
