"""Where the tensor-core kernels' tests run, shared by test_quant_rows and test_gemv_rows: compiled on a GPU, under
Triton's interpreter on a CPU (see conftest), with the 16-bit dtype each can multiply there."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.triton._common import is_interpreted

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter mishandles bf16 dot operands (it reads them as integers), so on a CPU the 16-bit case is fp16; on a
# GPU it is the decode step's bf16.
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def skip_unless_it_runs(kernel: object) -> None:
    """Skip the calling module where `kernel` cannot run: on a CPU, imported before TRITON_INTERPRET=1 was set."""
    if DEVICE == "cpu" and not is_interpreted(kernel):
        pytest.skip("the kernel was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error of `out` against a float64 CPU reference."""
    return float((out.double().cpu() - ref).norm() / ref.norm())
