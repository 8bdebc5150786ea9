"""Profiling: torch.profiler traces and step figures of a run (profile), Nsight Compute per kernel (ncu), and the
code torch.compile generated, captured in a child process (compiled_code). The trace's reduction to operators and
kernels is engine.measure.op_stats; `python -m engine profile` is engine/cli/profile.py.

`python -m engine profile …` and the dashboard's Profiler page run `engine.profiling.profile:profile_job` in a worker
through engine.runner.jobs (run kind 'profile'); results land in op_stats, ncu_kernel_metrics, metrics and artifacts.
"""
