"""Run the Triton kernels under Triton's interpreter where there is no GPU.

Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before the kernel modules (and, to be
safe, triton itself) are imported: this conftest is imported by pytest before the test modules of this folder.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
