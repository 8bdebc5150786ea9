"""Measurement: how the lab takes a number and what it compares it with.

timing (host and device timers, sample statistics), kernel_timers (the cross-timer panel: CUDA events, graph replay,
profiler kernel time), inductor_timing (torch.compile's own benchmarking held to the device lock), checks (a mode's
output against its reference), caches (what a first call found in the compile caches), ceilings (the device's measured
copy bandwidth, matmul rates and launch costs: every "% of peak" divides by one of these), nvtx_ranges (named ranges
for Nsight), op_stats (a torch.profiler trace reduced to operators, kernels and busy time). Imports the store and the
runner only.
"""
