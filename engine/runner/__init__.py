"""The runner: runs executed in worker processes, so that a crash, an OOM or a hang fails one run and nothing else.

jobs (queue, launch, supervise and record runs), worker (the child process that runs one job), forkserver (warm
workers forked from a process that imported torch once), device_lock (one timing run per device at a time, phases for
runs that prepare side by side), plan (how a group of runs is ordered and how many prepare at once), kinds (the
registry of run kinds: each feature registers its own), worker_env (a worker's environment: libstdc++ preloaded,
Inductor's caches under the build folder). Imports only the store.
"""
