"""y = x @ dequant(W).T for one row x, with W stored weight-only quantized: int8 or fp8 (e4m3) per output channel,
or int4 in groups of 64 along K. The dequantization happens inside the weight loads; W is never materialised.

Same structure as engine/kernels/triton/gemv.py: each program owns BLOCK_N output features and walks K in BLOCK_K
chunks of its rows (contiguous along K, so every load is coalesced), products accumulate in fp32 and are reduced once
at the end; PDL (programmatic dependent launch, sm_90+) lets the packed-weight stream of one GEMV start while the
kernel before it drains. What changes is what a weight load brings in:

- int8 / fp8 (`_wo_channel_kernel`): a (BLOCK_N, BLOCK_K) tile of 1-byte codes, converted to fp32 in registers.
  The per-output-channel scale is the same along the whole row, so it multiplies the row's sum once at the end
  (y[n] = s[n] · Σ_k q[n, k] x[k]): one scale load per row, no multiply per weight.
- int4 (`_wo_int4_kernel`): a (BLOCK_N, BLOCK_K / 2) tile of bytes, two codes each (low nibble: even k, high nibble:
  odd k; engine/llm/quant.py packs them so), split by a mask and a shift; x is loaded as its even and odd halves to
  match. Symmetric codes (value = (nibble − 8) · scale). The group scale (one per 64 weights of a row) is loaded with
  the tile (each of the tile's BLOCK_K / 64 groups) and applied to the group's partial products, so scales cross
  memory once, next to the weights they belong to.

Tiles are fixed per code type, not autotuned (TILE_INT8 / TILE_FP8 / TILE_INT4, chosen from the tile sweep of
benchmarks/quant_gemv_bench.py on an H100; INTERPRETER_CONFIG under the interpreter).
BLOCK_K for int4 is a multiple of the group size (64), so a tile never splits a group.

`channel_linear(x, q, scales)` and `int4_linear(x, q, scales, k)` are torch custom ops (`modelab::quant_gemv_channel`,
`modelab::quant_gemv_int4`): opaque single kernels to torch.compile, captured by CUDA graphs. Several rows (prefill,
B > 1) take dequantize-then-F.linear (engine.llm.quant's plain dequantization). The references are float64
dequantize-then-matmul (`_reference_channel`, `_reference_int4`); the checks sit in
tests/engine/kernels/test_quant_gemv.py, the offline sm_90 compile in benchmarks/triton_aot_check.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels.triton._common import is_interpreted, load_fused_x, pdl_enabled
from engine.workloads.llama import rms_norm  # the decoder's own RMSNorm: the unfused fallbacks compute exactly it

GROUP = 64  # int4 group size along K (engine.llm.quant.INT4_GROUP is this value)

# (BLOCK_N, BLOCK_K, num_warps) launched on the GPU (untimed stand-ins, see the module docstring), and every tile
# the offline compile check (benchmarks/triton_aot_check.py) builds.
# Chosen from `python benchmarks/quant_gemv_bench.py --preset 1B,7B` on an H100 (2026-11-24): the tile with the least
# time summed over each preset's weight shapes (qkv, o, gate_up, down, lm_head), the same for both presets within 2 %.
TILE_INT8 = (4, 1024, 4)  # 1B 58.7 µs, 7B 139.1 µs (the earlier (8, 512, 8): 64.8, 142.1)
TILE_FP8 = (8, 512, 4)  # 1B 70.2, 7B 146.3 (the earlier (8, 512, 8): 71.7, 153.6)
TILE_INT4 = (8, 512, 8)  # 1B 81.8, 7B 190.8 (best on both)
GROUPED_INT4 = True  # _wo_int4_kernel's GROUPED (see there)
AOT_TILES_CHANNEL = ((4, 256, 4), (8, 512, 8), (16, 256, 8), (4, 1024, 8), (4, 1024, 4), (8, 512, 4))
AOT_TILES_INT4 = ((4, 256, 4), (8, 512, 8), (16, 256, 8), (4, 1024, 8))
# One fixed config for the interpreter (CPU tests): few programs (each one runs in Python), K tiles small enough that
# the test shapes have ragged tails along K and N.
INTERPRETER_CONFIG = {"BLOCK_N": 32, "BLOCK_K": 128}


@triton.jit
def _wo_channel_kernel(x_ptr, q_ptr, s_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_qn, eps, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, FP8: tl.constexpr = False, NORM: tl.constexpr = False,
                       ADD: tl.constexpr = False, SWIGLU: tl.constexpr = False, PDL: tl.constexpr = False):
    """y[n] = s[n] · Σ_k q[n, k] · x[k]; q 1 byte per weight, passed as uint8 and bitcast in registers to int8 or
    (FP8) float8e4nv (so a masked-off lane's 0 byte is a 0 weight either way), s one scale per output row.
    NORM / ADD / SWIGLU as in gemv._gemv_kernel: x RMS-normalised and scaled by g (the sum of squares taken in the
    same pass over x), r added to y, or x = silu(gate) · up formed from [gate, up] as it is loaded."""
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    rows = q_ptr + offs_n[:, None] * stride_qn
    offs_k = tl.arange(0, BLOCK_K)
    # the weight tiles are loaded one iteration ahead; they do not depend on the previous kernel (PDL)
    w = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k < K)[None, :], other=0,
                eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        offs_next = offs_k + BLOCK_K
        w_next = tl.load(rows + offs_next[None, :], mask=n_mask[:, None] & (offs_next < K)[None, :], other=0,
                         eviction_policy="evict_first")
        x, sumsq = load_fused_x(x_ptr, g_ptr, offs_k, k_mask, K, sumsq, SWIGLU, NORM)
        if FP8:
            wf = w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            wf = w.to(tl.int8, bitcast=True).to(tl.float32)
        acc += wf * x[None, :]
        w = w_next
    s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    y = tl.sum(acc, axis=1) * s
    if NORM:
        y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
    if ADD:
        y += tl.load(r_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _x_pair(x_ptr, g_ptr, even, K, sumsq, SWIGLU: tl.constexpr, NORM: tl.constexpr):
    """x at the even and at the odd positions `even`, `even + 1` (fp32), with SWIGLU / NORM applied as the channel
    kernel applies them; sumsq gathers both halves' squares."""
    xe, sumsq = load_fused_x(x_ptr, g_ptr, even, even < K, K, sumsq, SWIGLU, NORM)
    xo, sumsq = load_fused_x(x_ptr, g_ptr, even + 1, even + 1 < K, K, sumsq, SWIGLU, NORM)
    return xe, xo, sumsq


@triton.jit
def _wo_int4_kernel(x_ptr, q_ptr, s_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_qn, stride_sn, eps, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr, NORM: tl.constexpr = False,
                    ADD: tl.constexpr = False, SWIGLU: tl.constexpr = False, GROUPED: tl.constexpr = True,
                    PDL: tl.constexpr = False):
    """y[n] = Σ_g s[n, g] · Σ_{k in g} (q[n, k] − 8) · x[k]; q two 4-bit codes per byte (low nibble: even k),
    s one scale per GROUP_K weights of a row. BLOCK_K is a multiple of GROUP_K (and so even). NORM / ADD / SWIGLU
    as in the channel kernel.

    The unpack avoids integer-to-float conversions: a nibble c OR-ed into the mantissa of 2^23 is the float
    2^23 + c exactly, and subtracting 2^23 + 8 leaves c − 8 — one logic op and one add per weight. Measured on an
    H100 it changed nothing (7B qkv + o + gate_up + down: 119.6 µs vs 120.6 µs with conversions): the kernel
    stays near 0.6-1.0 TB/s, and what holds it there is not yet profiled (docs/quantization.md).
    GROUPED: the tile's products are summed per group and each group sum scaled once (a reduction inside the loop);
    else each weight's scale is gathered per position and applied before the sum (no reduction, a load per weight).
    benchmarks/quant_gemv_bench.py times both (GROUPED_INT4 is the faster one on an H100)."""
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // GROUP_K
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    kb = (K + 1) // 2  # bytes per row
    acc = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)
    acc_g = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
    sumsq = tl.zeros((HALF,), dtype=tl.float32)
    rows = q_ptr + offs_n[:, None] * stride_qn
    offs_b = tl.arange(0, HALF)
    packed = tl.load(rows + offs_b[None, :], mask=n_mask[:, None] & (offs_b < kb)[None, :], other=0x88,
                     eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    for k0 in range(0, K, BLOCK_K):
        offs_b = k0 // 2 + tl.arange(0, HALF)
        offs_next = offs_b + HALF
        packed_next = tl.load(rows + offs_next[None, :], mask=n_mask[:, None] & (offs_next < kb)[None, :],
                              other=0x88, eviction_policy="evict_first")
        xe, xo, sumsq = _x_pair(x_ptr, g_ptr, 2 * offs_b, K, sumsq, SWIGLU, NORM)
        b = packed.to(tl.int32)
        lo = ((b & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
        hi = (((b >> 4) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
        part = lo * xe[None, :] + hi * xo[None, :]  # (BLOCK_N, HALF)
        if GROUPED:
            part_g = tl.sum(tl.reshape(part, (BLOCK_N, GROUPS, GROUP_K // 2)), axis=2)
            offs_g = k0 // GROUP_K + tl.arange(0, GROUPS)
            s = tl.load(s_ptr + offs_n[:, None] * stride_sn + offs_g[None, :],
                        mask=n_mask[:, None] & (offs_g * GROUP_K < K)[None, :], other=0.0).to(tl.float32)
            acc_g += part_g * s
        else:
            s = tl.load(s_ptr + offs_n[:, None] * stride_sn + (offs_b // (GROUP_K // 2))[None, :],
                        mask=n_mask[:, None] & (offs_b < kb)[None, :], other=0.0).to(tl.float32)
            acc += part * s
        packed = packed_next
    if GROUPED:
        y = tl.sum(acc_g, axis=1)
    else:
        y = tl.sum(acc, axis=1)
    if NORM:
        y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
    if ADD:
        y += tl.load(r_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def _one_row(x: torch.Tensor) -> torch.Tensor:
    if x.numel() != x.shape[-1]:
        raise ValueError(f"the quantized GEMV takes one row; x has shape {tuple(x.shape)}")
    return x.reshape(-1).contiguous()


def _fusion_args(x_row: torch.Tensor, n: int, k: int, norm_weight: torch.Tensor | None,
                 residual: torch.Tensor | None, swiglu: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(g, r, flags) for the kernels' NORM / ADD / SWIGLU, checked against the weight's (n, k)."""
    if swiglu and norm_weight is not None:
        raise ValueError("the quantized GEMV: swiglu and norm_weight do not combine")
    if norm_weight is not None and norm_weight.numel() != k:
        raise ValueError(f"norm weight has {norm_weight.numel()} elements for {k} features")
    if residual is not None and residual.numel() != n:
        raise ValueError(f"residual has {residual.numel()} elements for {n} outputs")
    g = norm_weight.reshape(-1).contiguous() if norm_weight is not None else x_row  # unread unless NORM
    r = residual.reshape(-1).contiguous() if residual is not None else x_row  # unread unless ADD
    return g, r, dict(NORM=norm_weight is not None, ADD=residual is not None, SWIGLU=swiglu)


def _features(x: torch.Tensor, swiglu: bool) -> int:
    if swiglu and x.shape[-1] % 2:
        raise ValueError(f"swiglu needs [gate, up]: an even number of features, got {x.shape[-1]}")
    return x.shape[-1] // 2 if swiglu else x.shape[-1]


def gemv_channel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, norm_weight: torch.Tensor | None = None,
                 eps: float = 0.0, residual: torch.Tensor | None = None, swiglu: bool = False) -> torch.Tensor:
    """x (K,) or (1, K) · dequant(q).T for q (N, K) int8 or float8_e4m3fn and scales (N,): (N,) or (1, N) in x's
    dtype, accumulated in fp32. norm_weight / residual / swiglu fuse as engine.kernels.triton.gemv.gemv's do."""
    x_row = _one_row(x)
    k = _features(x, swiglu)
    if q.dim() != 2 or q.shape[1] != k:
        raise ValueError(f"quantized weight {tuple(q.shape)} does not match x's {k} features")
    n = q.shape[0]
    if scales.numel() != n:
        raise ValueError(f"{scales.numel()} scales for {n} output channels")
    fp8 = q.dtype == torch.float8_e4m3fn
    if not fp8 and q.dtype != torch.int8:
        raise ValueError(f"per-channel codes are int8 or float8_e4m3fn, got {q.dtype}")
    g, r, flags = _fusion_args(x_row, n, k, norm_weight, residual, swiglu)
    q = (q if q.stride(1) == 1 else q.contiguous()).view(torch.uint8)
    y = torch.empty(n, device=x.device, dtype=x.dtype)
    args = (x_row, q, scales.reshape(-1).contiguous(), y, g, r, n, k, q.stride(0), float(eps))
    if is_interpreted(_wo_channel_kernel):
        cfg = INTERPRETER_CONFIG
        _wo_channel_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, FP8=fp8, **flags)
    else:
        bn, bk, warps = TILE_FP8 if fp8 else TILE_INT8
        pdl = pdl_enabled(x.device)
        _wo_channel_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, BLOCK_K=bk, FP8=fp8, **flags, PDL=pdl,
                                                  num_warps=warps, num_stages=1, launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], n)


def gemv_int4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, norm_weight: torch.Tensor | None = None,
              eps: float = 0.0, residual: torch.Tensor | None = None, swiglu: bool = False) -> torch.Tensor:
    """x (K,) or (1, K) · dequant(q).T for q (N, ceil(K/2)) uint8 (two symmetric 4-bit codes a byte, low nibble
    first) and scales (N, ceil(K/64)): (N,) or (1, N) in x's dtype, accumulated in fp32. norm_weight / residual /
    swiglu fuse as in gemv_channel."""
    x_row = _one_row(x)
    k = _features(x, swiglu)
    n = q.shape[0]
    if q.dim() != 2 or q.dtype != torch.uint8 or q.shape[1] != (k + 1) // 2:
        raise ValueError(f"packed int4 weight {tuple(q.shape)} {q.dtype} does not match x's {k} features "
                         f"(expected uint8 ({n}, {(k + 1) // 2}))")
    if scales.shape != (n, triton.cdiv(k, GROUP)):
        raise ValueError(f"int4 scales {tuple(scales.shape)}: expected ({n}, {triton.cdiv(k, GROUP)})")
    g, r, flags = _fusion_args(x_row, n, k, norm_weight, residual, swiglu)
    q = q if q.stride(1) == 1 else q.contiguous()
    scales = scales if scales.stride(1) == 1 else scales.contiguous()
    y = torch.empty(n, device=x.device, dtype=x.dtype)
    args = (x_row, q, scales, y, g, r, n, k, q.stride(0), scales.stride(0), float(eps))
    if is_interpreted(_wo_int4_kernel):
        cfg = INTERPRETER_CONFIG
        _wo_int4_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, GROUP_K=GROUP, **flags, GROUPED=GROUPED_INT4)
    else:
        bn, bk, warps = TILE_INT4
        pdl = pdl_enabled(x.device)
        _wo_int4_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, BLOCK_K=bk, GROUP_K=GROUP, **flags,
                                               GROUPED=GROUPED_INT4, PDL=pdl, num_warps=warps, num_stages=1,
                                               launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], n)


def gemv_quant(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, **fusions: object) -> torch.Tensor:
    """gemv_int4 for packed uint8 codes, gemv_channel for int8 / fp8."""
    return (gemv_int4 if q.dtype == torch.uint8 else gemv_channel)(x, q, scales, **fusions)  # type: ignore[arg-type]


def _takes(x: torch.Tensor, kernel: object) -> bool:
    return x.numel() == x.shape[-1] and (x.is_cuda or is_interpreted(kernel))


@torch.library.custom_op("modelab::quant_gemv_channel", mutates_args=())
def channel_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for per-channel int8 / fp8 codes: one row through the Triton kernel, several rows
    (or a device Triton cannot run on) dequantized first."""
    if _takes(x, _wo_channel_kernel):
        return gemv_channel(x, q, scales)
    return F.linear(x, dequantize_channel(q, scales, x.dtype))


@channel_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def dequantize_channel(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) int8 / fp8 codes + (N,) scales → (N, K) weights in `dtype` (the plain way)."""
    return (q.to(torch.float32) * scales.to(torch.float32)[:, None]).to(dtype)


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype = torch.float32
                     ) -> torch.Tensor:
    """(N, ceil(K/2)) packed uint8 + (N, ceil(K/64)) scales → (N, K) weights in `dtype` (the plain way)."""
    lo = (q & 0xF).to(torch.int16) - 8
    hi = (q >> 4).to(torch.int16) - 8
    codes = torch.stack([lo, hi], dim=-1).reshape(q.shape[0], -1)[:, :k]
    s = scales.to(torch.float32).repeat_interleave(GROUP, dim=1)[:, :k]
    return (codes.to(torch.float32) * s).to(dtype)


def _dequantized(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_int4(q, scales, k, dtype) if q.dtype == torch.uint8 else dequantize_channel(q, scales, dtype)


@torch.library.custom_op("modelab::quant_gemv_int4", mutates_args=())
def int4_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for group-wise int4 codes (K = x's last dimension)."""
    if _takes(x, _wo_int4_kernel):
        return gemv_int4(x, q, scales)
    return F.linear(x, dequantize_int4(q, scales, x.shape[-1], x.dtype))


@int4_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


# -- the triton-fused step's three products over quantized weights (engine.kernels.triton.gemv.FusedDecodeOps) --
# The unfused fallbacks (several rows, a device Triton cannot run on) compute exactly what the decoder's own modules
# do: rms_norm in the decoder's way, then the dequantized product.

@torch.library.custom_op("modelab::quant_norm_linear", mutates_args=())
def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, q: torch.Tensor,
                scales: torch.Tensor) -> torch.Tensor:
    """F.linear(rms_norm(x, norm_weight, eps), dequant(q)): for one row, the norm inside the quantized GEMV."""
    if _takes(x, _wo_channel_kernel):
        return gemv_quant(x, q, scales, norm_weight=norm_weight, eps=eps)
    return F.linear(rms_norm(x, norm_weight, eps), _dequantized(q, scales, x.shape[-1], x.dtype))


@norm_linear.register_fake
def _(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


@torch.library.custom_op("modelab::quant_linear_add", mutates_args=())
def linear_add(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + F.linear(x, dequant(q)): for one row, the residual added in the quantized GEMV's epilogue."""
    if _takes(x, _wo_channel_kernel) and residual.shape == (*x.shape[:-1], q.shape[0]):
        return gemv_quant(x, q, scales, residual=residual)
    return residual + F.linear(x, _dequantized(q, scales, x.shape[-1], x.dtype))


@linear_add.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(residual)


@torch.library.custom_op("modelab::quant_swiglu_linear_add", mutates_args=())
def swiglu_linear_add(gate_up: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                      residual: torch.Tensor) -> torch.Tensor:
    """residual + F.linear(silu(gate) · up, dequant(q)) for gate_up = [gate, up]: for one row, the SwiGLU formed
    as the quantized GEMV loads its input and the residual added in its epilogue."""
    gate, up = gate_up.chunk(2, dim=-1)
    if _takes(gate_up, _wo_channel_kernel) and residual.shape == (*gate_up.shape[:-1], q.shape[0]):
        return gemv_quant(gate_up, q, scales, residual=residual, swiglu=True)
    return residual + F.linear(F.silu(gate) * up, _dequantized(q, scales, gate.shape[-1], gate.dtype))


@swiglu_linear_add.register_fake
def _(gate_up: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(residual)


def _reference_channel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 dequantize-then-matmul."""
    w = q.to(torch.float64) * scales.to(torch.float64)[:, None]
    return F.linear(x.double(), w)


def _reference_int4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), dequantize_int4(q, scales, x.shape[-1], torch.float64))
