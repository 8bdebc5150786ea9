"""Profiling: torch.profiler traces, op_stats and step figures (profile, op_stats), Nsight Compute (ncu), CLI (cli).

`python -m engine profile …` and the dashboard's Profiler page run `engine.profiling.profile:profile_job` in a worker
through engine.runner.jobs (run kind 'profile'); results land in op_stats, ncu_kernel_metrics, metrics and artifacts.
"""
