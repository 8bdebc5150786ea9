"""`python -m tests.engine.runner.lock_holder DEVICE GO HOLD_S`: wait for GO, take
engine.runner.jobs.device_lock(DEVICE), hold it
HOLD_S seconds, print {"pid", "start", "end", "waited"} as JSON (times from time.time(), comparable across processes).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from engine.runner.jobs import device_lock


def main(argv: list[str]) -> int:
    device, go, hold_s = argv[0], Path(argv[1]), float(argv[2])
    deadline = time.monotonic() + 30
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.002)
    waited: list[str] = []
    with device_lock(device, on_wait=waited.append, poll_s=0.02):
        start = time.time()
        time.sleep(hold_s)
        end = time.time()
    print(json.dumps({"pid": os.getpid(), "start": start, "end": end, "waited": waited}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
