"""Hand-written kernels for the Kernel Levels feature: `triton` (L4). Imports nothing heavy at package import."""
