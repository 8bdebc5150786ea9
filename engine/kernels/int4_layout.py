"""How int4 weight codes are packed: the byte order engine/kernels/triton/quant_gemv.py's int4 GEMV reads, and the
one place that writes it (pack_int4) or undoes it (unpack_int4). Plain PyTorch: no Triton needed to quantize.

Each row is padded to whole groups of GROUP = 64 weights (code 8, i.e. the value 0). A group's 32 bytes are 8
little-endian 32-bit words, and nibble j (bits 4j..4j+3) of word t holds the code of k = 64·g + 8·j + t:

    word t:  nibble 0 → k = t,  nibble 1 → k = 8 + t,  …,  nibble 7 → k = 56 + t         (t = 0 … 7)

Why not the usual "two per byte, low nibble = even k": the GEMV then splits x into its even and odd halves and
shifts every byte's high nibble down — one more integer operation per weight in a kernel that the unpacking, not
memory, holds back at batch 1. In this order nibble j of all 8 words of a group meets 8 consecutive inputs (one
contiguous load of x per nibble position), and nibbles 0–3 (4–7, after one shift of the word by 16) are masked in
place: OR-ed into the mantissa of 2^23 they give 2^23 + code · 16^i exactly, and the kernel scales x by 16^-i
instead of shifting the code (docs/quantization.md, "int4 layout").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

GROUP = 64
INT4_LAYOUT = "g64-word-interleaved"  # part of the quantization cache's key: a new order must change it


def int4_row_bytes(k: int) -> int:
    """Bytes of one packed row of k weights: whole groups of 64, half a byte each."""
    return math.ceil(k / GROUP) * GROUP // 2


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes in [0, 15] → (N, int4_row_bytes(K)) uint8 in the order above (rows padded with code 8)."""
    n, k = codes.shape
    groups = math.ceil(k / GROUP)
    c = F.pad(codes.to(torch.uint8), (0, groups * GROUP - k), value=8)
    # [n, g, j, t] → [n, g, t, j]: word t's eight nibbles in order; nibble j = byte j // 2, low half when j is even
    c = c.reshape(n, groups, 8, 8).transpose(2, 3).reshape(n, groups, 8, 4, 2)
    return (c[..., 0] | (c[..., 1] << 4)).reshape(n, groups * GROUP // 2).contiguous()


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """(N, int4_row_bytes(K)) uint8 → (N, K) codes in [0, 15] (uint8): pack_int4 undone."""
    n = packed.shape[0]
    groups = packed.shape[1] * 2 // GROUP
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1)  # [n, g·32, 2] = [n, g, t, j]
    return nibbles.reshape(n, groups, 8, 8).transpose(2, 3).reshape(n, groups * GROUP)[:, :k]
