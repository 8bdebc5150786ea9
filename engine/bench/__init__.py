"""Benchmark: each execution mode of a workload checked against eager, then timed (run: the `bench` run kind), and
compiled ahead of the timed group (ahead)."""
