"""Hand-written kernels and their Python wrappers. Imports nothing heavy at package import.

- triton/: the Triton kernels — Kernel Levels' L4 (attention, patch embedding, message passing), the LLM decode
  step's (GEMVs, quantized GEMVs, decode attention, argmax) and the triton mode's MLP.
- cuda_levels: the L5 CUDA kernels of csrc/levels/, built on first use and called as torch ops.
- cuda_quant: the tensor-core int4 GEMV of csrc/quant/ for the quantized decode step.
- int4_layout: how int4 codes are packed, the one place that writes (and undoes) that order.
"""
