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

Tiles are fixed, not autotuned (TILE_CHANNEL / TILE_INT4; INTERPRETER_CONFIG under the interpreter): no timing of
them has been done yet (no GPU in their development), so a middle tile of gemv.py's list is the stand-in.
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

from engine.kernels.triton._common import is_interpreted, pdl_enabled

GROUP = 64  # int4 group size along K (engine.llm.quant.INT4_GROUP is this value)

# (BLOCK_N, BLOCK_K, num_warps) launched on the GPU (untimed stand-ins, see the module docstring), and every tile
# the offline compile check (benchmarks/triton_aot_check.py) builds.
TILE_CHANNEL = (8, 512, 8)
TILE_INT4 = (8, 512, 8)
AOT_TILES_CHANNEL = ((4, 256, 4), (8, 512, 8), (16, 256, 8), (4, 1024, 8))
AOT_TILES_INT4 = ((4, 256, 4), (8, 512, 8), (16, 256, 8), (4, 1024, 8))
# One fixed config for the interpreter (CPU tests): few programs (each one runs in Python), K tiles small enough that
# the test shapes have ragged tails along K and N.
INTERPRETER_CONFIG = {"BLOCK_N": 32, "BLOCK_K": 128}


@triton.jit
def _wo_channel_kernel(x_ptr, q_ptr, s_ptr, y_ptr, N, K, stride_qn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       FP8: tl.constexpr = False, PDL: tl.constexpr = False):
    """y[n] = s[n] · Σ_k q[n, k] · x[k]; q 1 byte per weight, passed as uint8 and bitcast in registers to int8 or
    (FP8) float8e4nv (so a masked-off lane's 0 byte is a 0 weight either way), s one scale per output row."""
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
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
        x = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        if FP8:
            wf = w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            wf = w.to(tl.int8, bitcast=True).to(tl.float32)
        acc += wf * x[None, :]
        w = w_next
    s = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    y = tl.sum(acc, axis=1) * s
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _wo_int4_kernel(x_ptr, q_ptr, s_ptr, y_ptr, N, K, stride_qn, stride_sn, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr, PDL: tl.constexpr = False):
    """y[n] = Σ_g s[n, g] · Σ_{k in g} (q[n, k] − 8) · x[k]; q two 4-bit codes per byte (low nibble: even k),
    s one scale per GROUP_K weights of a row. BLOCK_K is a multiple of GROUP_K (and so even)."""
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // GROUP_K
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    kb = (K + 1) // 2  # bytes per row
    acc = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
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
        even = 2 * offs_b
        x_even = tl.load(x_ptr + even, mask=even < K, other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptr + even + 1, mask=even + 1 < K, other=0.0).to(tl.float32)
        b = packed.to(tl.int32)
        lo = ((b & 0xF) - 8).to(tl.float32)
        hi = (((b >> 4) & 0xF) - 8).to(tl.float32)
        part = lo * x_even[None, :] + hi * x_odd[None, :]  # (BLOCK_N, HALF)
        part = tl.sum(tl.reshape(part, (BLOCK_N, GROUPS, GROUP_K // 2)), axis=2)  # per group
        offs_g = k0 // GROUP_K + tl.arange(0, GROUPS)
        s = tl.load(s_ptr + offs_n[:, None] * stride_sn + offs_g[None, :],
                    mask=n_mask[:, None] & (offs_g * GROUP_K < K)[None, :], other=0.0).to(tl.float32)
        acc += part * s
        packed = packed_next
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def _one_row(x: torch.Tensor) -> torch.Tensor:
    if x.numel() != x.shape[-1]:
        raise ValueError(f"the quantized GEMV takes one row; x has shape {tuple(x.shape)}")
    return x.reshape(-1).contiguous()


def gemv_channel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (K,) or (1, K) · dequant(q).T for q (N, K) int8 or float8_e4m3fn and scales (N,): (N,) or (1, N) in x's
    dtype, accumulated in fp32."""
    x_row = _one_row(x)
    if q.dim() != 2 or q.shape[1] != x_row.numel():
        raise ValueError(f"quantized weight {tuple(q.shape)} does not match x's {x_row.numel()} features")
    n, k = q.shape
    if scales.numel() != n:
        raise ValueError(f"{scales.numel()} scales for {n} output channels")
    fp8 = q.dtype == torch.float8_e4m3fn
    if not fp8 and q.dtype != torch.int8:
        raise ValueError(f"per-channel codes are int8 or float8_e4m3fn, got {q.dtype}")
    q = (q if q.stride(1) == 1 else q.contiguous()).view(torch.uint8)
    y = torch.empty(n, device=x.device, dtype=x.dtype)
    args = (x_row, q, scales.reshape(-1).contiguous(), y, n, k, q.stride(0))
    if is_interpreted(_wo_channel_kernel):
        cfg = INTERPRETER_CONFIG
        _wo_channel_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, FP8=fp8)
    else:
        bn, bk, warps = TILE_CHANNEL
        pdl = pdl_enabled(x.device)
        _wo_channel_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, BLOCK_K=bk, FP8=fp8, PDL=pdl,
                                                  num_warps=warps, num_stages=1, launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], n)


def gemv_int4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (K,) or (1, K) · dequant(q).T for q (N, ceil(K/2)) uint8 (two symmetric 4-bit codes a byte, low nibble
    first) and scales (N, ceil(K/64)): (N,) or (1, N) in x's dtype, accumulated in fp32."""
    x_row = _one_row(x)
    n, k = q.shape[0], x_row.numel()
    if q.dim() != 2 or q.dtype != torch.uint8 or q.shape[1] != (k + 1) // 2:
        raise ValueError(f"packed int4 weight {tuple(q.shape)} {q.dtype} does not match x's {k} features "
                         f"(expected uint8 ({n}, {(k + 1) // 2}))")
    if scales.shape != (n, triton.cdiv(k, GROUP)):
        raise ValueError(f"int4 scales {tuple(scales.shape)}: expected ({n}, {triton.cdiv(k, GROUP)})")
    q = q if q.stride(1) == 1 else q.contiguous()
    scales = scales if scales.stride(1) == 1 else scales.contiguous()
    y = torch.empty(n, device=x.device, dtype=x.dtype)
    args = (x_row, q, scales, y, n, k, q.stride(0), scales.stride(0))
    if is_interpreted(_wo_int4_kernel):
        cfg = INTERPRETER_CONFIG
        _wo_int4_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, GROUP_K=GROUP)
    else:
        bn, bk, warps = TILE_INT4
        pdl = pdl_enabled(x.device)
        _wo_int4_kernel[(triton.cdiv(n, bn),)](*args, BLOCK_N=bn, BLOCK_K=bk, GROUP_K=GROUP, PDL=pdl,
                                               num_warps=warps, num_stages=1, launch_pdl=pdl)
    return y.reshape(*x.shape[:-1], n)


def _takes(x: torch.Tensor, kernel: object) -> bool:
    return x.numel() == x.shape[-1] and (x.is_cuda or is_interpreted(kernel))


@torch.library.custom_op("modelab::quant_gemv_channel", mutates_args=())
def channel_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for per-channel int8 / fp8 codes: one row through the Triton kernel, several rows
    (or a device Triton cannot run on) dequantized first."""
    if _takes(x, _wo_channel_kernel):
        return gemv_channel(x, q, scales)
    return F.linear(x, (q.to(torch.float32) * scales.to(torch.float32)[:, None]).to(x.dtype))


@channel_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, k: int, dtype: torch.dtype = torch.float32
                     ) -> torch.Tensor:
    """(N, ceil(K/2)) packed uint8 + (N, ceil(K/64)) scales → (N, K) weights in `dtype` (the plain way)."""
    lo = (q & 0xF).to(torch.int16) - 8
    hi = (q >> 4).to(torch.int16) - 8
    codes = torch.stack([lo, hi], dim=-1).reshape(q.shape[0], -1)[:, :k]
    s = scales.to(torch.float32).repeat_interleave(GROUP, dim=1)[:, :k]
    return (codes.to(torch.float32) * s).to(dtype)


@torch.library.custom_op("modelab::quant_gemv_int4", mutates_args=())
def int4_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """F.linear(x, dequant(q)) for group-wise int4 codes (K = x's last dimension)."""
    if _takes(x, _wo_int4_kernel):
        return gemv_int4(x, q, scales)
    return F.linear(x, dequantize_int4(q, scales, x.shape[-1], x.dtype))


@int4_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def _reference_channel(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 dequantize-then-matmul."""
    w = q.to(torch.float64) * scales.to(torch.float64)[:, None]
    return F.linear(x.double(), w)


def _reference_int4(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), dequantize_int4(q, scales, x.shape[-1], torch.float64))
