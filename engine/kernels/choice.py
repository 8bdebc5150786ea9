"""Which kernels the LLM lab's fused decode step runs for a shape: one small pure rule, shared by the step
(engine.kernels.triton.gemv.FusedDecodeOps, engine.kernels.triton.decode_attention), the run's notes
(engine.llm.modes) and benchmarks/decode_envelope.py, which times both sides of every threshold here on a GPU.

Products: a decode step multiplies B rows (one new token per sequence) by every weight. At B = 1 it is a chain of
weight-streaming GEMVs, and the fused Triton GEMVs (RMSNorm in the prologue, SwiGLU or the residual add in the
epilogue) save a kernel and its ramp per op. With more rows the hand-written GEMV (one row per launch) is not the
product any more: plain torch ops — rms_norm, F.linear (a cuBLAS GEMM that reads W once for all rows), SwiGLU and the
residual add — let Inductor fuse the element-wise ops inside the compiled step, where the fused custom ops would run
them opaquely one by one.

Decode attention: flash-decoding gives every (sequence, kv head, split of the cache) a program. At B = 1 the
sequence × kv-head programs are few, so the cache is split to fill the device; at B = 32 they already fill it, and
each split costs its partial results' write and a combine, so fewer (at short contexts one: no combine kernel).
"""

from __future__ import annotations

import math

# The most rows (sequences B) for which the decode step's products take the fused Triton GEMVs; above it, plain torch
# ops (cuBLAS GEMMs, Inductor's fusions). The GEMV kernels take one row, so 1 is the largest value that keeps them.
# To be measured by benchmarks/decode_envelope.py, which times both choices per (B, P) and prints the crossover.
GEMV_MAX_BATCH = 1
# Programs per SM the decode attention's split kernel aims for (batch × kv heads × splits ≈ SMs × this): enough to
# keep every SM's loads in flight. To be measured by benchmarks/decode_envelope.py (the attention table).
PROGRAMS_PER_SM = 4
# The fewest cached positions a split walks: shorter splits add partial results to write and combine for little
# more parallelism. The kernel passes its tile's own length (64 or 32 positions) in its place; this is the rule's
# default for callers without a tile. To be measured by benchmarks/decode_envelope.py.
MIN_SPLIT_POSITIONS = 64

# The most rows (sequences B) for which an int4 layer's products take engine.kernels.triton.quant_rows (the codes
# dequantized in the loads, a tensor-core dot over the rows) instead of the weight dequantized into a bf16 copy for
# cuBLAS. benchmarks/quant_rows_bench.py on an H200, a layer's four products: the rows kernel at its tile per shape
# 7B 209-243 µs against 512 for B = 2..16 (1B 93-109 against 161): faster at every B it timed, 16 the largest.
QUANT_ROWS_MAX_BATCH = 16

PRODUCTS = ("gemv", "gemm")
QUANT_PRODUCTS = ("rows", "dequantize")


def decode_products(batch: int) -> str:
    """"gemv" (the fused Triton GEMVs) for B ≤ GEMV_MAX_BATCH rows, else "gemm" (rms_norm + F.linear + SwiGLU or the
    residual add as plain torch ops, fused by Inductor)."""
    if batch < 1:
        raise ValueError(f"decode_products: batch must be at least 1, got {batch}")
    return "gemv" if batch <= GEMV_MAX_BATCH else "gemm"


def quant_products(rows: int) -> str:
    """How an int4 layer multiplies several rows: "rows" (engine.kernels.triton.quant_rows) for 2 ≤ rows ≤
    QUANT_ROWS_MAX_BATCH, else "dequantize" (the weight formed in one kernel, then cuBLAS). One row is the GEMV's."""
    if rows < 1:
        raise ValueError(f"quant_products: rows must be at least 1, got {rows}")
    return "rows" if 2 <= rows <= QUANT_ROWS_MAX_BATCH else "dequantize"


def attention_splits(batch: int, context: int, sms: int, kv_heads: int = 1,
                     min_positions: int = MIN_SPLIT_POSITIONS) -> int:
    """How many splits of the cache the decode attention's kernel runs per (sequence, kv head): the largest power of
    two that keeps batch × kv_heads × splits within about sms × PROGRAMS_PER_SM and splits no shorter than
    `min_positions` cached positions (so 1 at contexts up to twice that long). Grows with context, shrinks with
    batch."""
    if min(batch, context, sms, kv_heads, min_positions) < 1:
        raise ValueError(f"attention_splits: batch {batch}, context {context}, sms {sms}, kv_heads {kv_heads} and "
                         f"min_positions {min_positions} must all be at least 1")
    wanted = math.ceil(sms * PROGRAMS_PER_SM / (batch * kv_heads))
    most = max(1, context // min_positions)
    # The largest power of two within both: a count just past a power of two (9 or 3 splits) runs slower than the
    # power of two below it (benchmarks/decode_envelope.py times every count per shape).
    return 1 << (min(wanted, most).bit_length() - 1)


def describe(batch: int, context: int, splits: int, products: tuple[str, ...] = (), int4: bool = False) -> str:
    """The run's note of what the rule chose, e.g. 'B=8: qkv, o, gate_up, down, lm_head via GEMM (cuBLAS); decode
    attention 4 splits over 8192 positions' (without `products`, the attention's part alone; `int4`: the products
    are int4 layers', so several rows go as quant_products says)."""
    head = f"B={batch}: "
    if products:
        if decode_products(batch) == "gemv":
            how = "the fused Triton GEMV"
        elif int4 and quant_products(batch) == "rows":
            how = "the int4 rows kernel (codes dequantized in its loads)"
        elif int4:
            how = "the weight dequantized each step, then GEMM (cuBLAS)"
        else:
            how = "GEMM (cuBLAS)"
        head += f"{', '.join(products)} via {how}; "
    return f"{head}decode attention {splits} split{'s' * (splits != 1)} over {context} positions"
