"""y = x @ W.T for one row x (decode at batch 1): a bandwidth-bound GEMV, hand-written in Triton.

Why: a decode step at B=1 reads every weight once and does 2 FLOPs per weight, so its speed is the speed at which
the GEMVs stream W from memory. Each program owns BLOCK_N output features and walks K in BLOCK_K chunks: the W tile
(BLOCK_N, BLOCK_K) is contiguous along K in nn.Linear's (N, K) layout, so every load is coalesced; x's chunk is
broadcast; products accumulate in fp32 and are reduced once at the end. Tiles are autotuned per (N, K); small
BLOCK_N keeps enough programs in flight for 132 SMs even where N is 2048 (no split-K, so no atomics and no extra
buffer or cast kernel inside the decode graph).

`linear(x, w)` is a torch custom op (`modelab::gemv_linear`): torch.compile treats it as one opaque kernel (no graph
break), CUDA graphs capture it. Rows other than one (B > 1, prefill) take F.linear: this kernel re-reading W per row
would lose to a GEMM. For one row it picks, per weight shape and fusion and once per process, whichever of this
kernel and cuBLAS (F.linear) is faster here, both timed the way the decode step runs them (`time_choice`): like
Inductor's max-autotune, which keeps cuBLAS among its candidates. A fused op's cuBLAS side is timed with the ops it
then runs one by one (`_unfused`: the norm, the SwiGLU, the add): timed bare, cuBLAS can tie a product the fused
kernel wins once the unfused ops are counted, and a step that took it would run those ops as kernels of their own.
`choices()` lists what was picked, with both times.
`norm_linear`, `norm_swiglu` and `linear_add` (custom ops `modelab::gemv_norm_linear` / `gemv_norm_swiglu` /
`gemv_linear_add`, the `triton-fused` mode) run the same kernel with an RMSNorm in its prologue, SwiGLU in the gate_up
product's epilogue, or a residual in its epilogue: at B=1 the norms, the adds and the SwiGLU are kernels of their own
that read a few KB each, so moving them into the GEMVs saves four launches and their ramps per layer, at no extra
traffic (the norm's sum of squares is taken in the GEMV's pass over x). SwiGLU sits in gate_up's epilogue rather than
in down's prologue because there it costs one sigmoid per output, once; formed as down loads its input, every one of
down's programs read [gate, up] (twice down's input) and took the sigmoid of all of it.
`_reference` is F.linear in float64; the checks sit in tests/engine/kernels/test_gemv.py, the table of both
implementations per preset shape in benchmarks/gemv_bench.py, the offline sm_90 compile in
benchmarks/triton_aot_check.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from engine.kernels import cuda_quant
from engine.kernels.choice import decode_products
from engine.kernels.triton._common import is_interpreted, load_fused_x, output_rows, pdl_enabled, store_output
from engine.runner.device_lock import exclusive
from engine.workloads.llama import rms_norm  # the decoder's own RMSNorm: the unfused fallbacks compute exactly it

# (BLOCK_N, BLOCK_K, num_warps): few enough that the first decode step's autotuning stays short (every config is a
# compile), spread from many small programs (N = 2048 still fills 132 SMs) to wide tiles for the 7B's long rows.
# The two BLOCK_K = 2048 tiles hold a whole row block of the K = 2048 weights: with programmatic dependent launch the
# entire W slice of a program is loaded before it waits for the kernel before it.
TILES = ((2, 512, 4), (4, 256, 4), (4, 512, 4), (4, 1024, 4), (8, 256, 4), (8, 512, 8), (8, 1024, 8), (16, 256, 8),
         (16, 512, 8), (32, 256, 8), (2, 2048, 4), (4, 2048, 8))


def _configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=1) for n, k, w in TILES]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_wn, eps, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, NORM: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr = False,
                 GLU: tl.constexpr = False):
    """y = x @ W.T; NORM: x is first RMS-normalised and scaled by g (y = rstd · (x∘g) @ W.T, the sum of squares
    taken in the same pass over x, so the norm costs no extra traffic); ADD: y += r (a residual); GLU: W is
    [gate; up] and y = silu(x @ gate.T) · (x @ up.T), N / 2 values formed in fp32 (`output_rows`, `store_output`).
    PDL (programmatic dependent launch, sm_90+): the next kernel may start once every program here has; this one
    loads its first W tile before waiting for the previous kernel (W does not depend on it), so the weight stream
    of one GEMV starts while the one before drains."""
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n, n_mask = output_rows(pid_n, N, BLOCK_N, GLU)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    w_rows = w_ptr + offs_n[:, None] * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    # W tiles are loaded one iteration ahead (streamed once: evict_first keeps L2 for x and the activations)
    w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k < K)[None, :], other=0.0,
                eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, g and r may be the previous kernel's output: visible from here on
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        offs_next = offs_k + BLOCK_K
        w_next = tl.load(w_rows + offs_next[None, :], mask=n_mask[:, None] & (offs_next < K)[None, :], other=0.0,
                         eviction_policy="evict_first")
        x, sumsq = load_fused_x(x_ptr, g_ptr, offs_k, k_mask, sumsq, NORM)
        acc += w.to(tl.float32) * x[None, :]
        w = w_next
    y = tl.sum(acc, axis=1)
    if NORM:
        y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
    store_output(y, y_ptr, r_ptr, offs_n, n_mask, pid_n, N, BLOCK_N, ADD, GLU)


def _quick_bench(fn, quantiles):  # type: ignore[no-untyped-def]
    """Triton's do_bench (L2 flushed before every call) over 20 ms instead of its default 100 ms (+25 ms of
    warm-up): a 5–100 µs GEMV still gets hundreds of calls, and ten configs per weight shape stay under a second."""
    with exclusive():  # a timing: never beside another run's work (engine.runner.device_lock)
        return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


# cache_results: the winning tile per key is kept on disk (Triton's cache dir), so the next process — the next LLM
# mode of `llm --mode all`, each in its own worker — reuses it instead of timing ten configs again.
_gemv_tuned = triton.autotune(_configs(), key=["N", "K", "NORM", "ADD", "GLU"], do_bench=_quick_bench,
                              cache_results=True)(_gemv_kernel)
# One fixed config for the interpreter (CPU tests): autotuning there would time Python.
INTERPRETER_CONFIG = {"BLOCK_N": 8, "BLOCK_K": 128}
# The untimed stand-in while tuning is deferred: a middle tile of TILES.
DEFAULT_CONFIG = {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 8}

# Deferred tuning (defer_tuning / tune_pending): an LLM run that compiles beside other runs must not time anything
# until it has the device to itself, so its first decode step records what it would have timed and runs stand-ins.
_DEFERRED = False
_TUNED: set[tuple] = set()  # (N, K, dtype, device, flags) that went through the autotuner in this process
_PENDING_TILES: set[tuple] = set()  # ... that ran the stand-in tile instead
_PENDING_CHOICES: set[tuple] = set()  # choice keys (N, K, dtype, device, flags) to time later


def _kernel_args(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, residual: torch.Tensor | None,
                 eps: float, glu: bool = False) -> tuple[tuple, dict]:
    """The kernel's arguments (y allocated) and its fusion flags, exactly as every launch passes them."""
    n, k = w.shape
    if w.stride(1) != 1:
        w = w.contiguous()
    x_row = x.reshape(-1).contiguous()
    g = norm_weight.reshape(-1).contiguous() if norm_weight is not None else x_row  # unread unless NORM
    r = residual.reshape(-1).contiguous() if residual is not None else x_row  # unread unless ADD
    y = torch.empty(n // 2 if glu else n, device=x.device, dtype=x.dtype)
    flags = dict(NORM=norm_weight is not None, ADD=residual is not None, GLU=glu)
    return (x_row, w, y, g, r, n, k, w.stride(0), float(eps)), flags


def gemv(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
         residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """x (K,) or (1, K) · W (N, K) → (N,) or (1, N), in x's dtype, accumulated in fp32.

    With `norm_weight` (K,): x is replaced by RMSNorm(x) = x · rsqrt(mean(x²) + eps) · norm_weight first (in fp32,
    never rounded to x's dtype in between). With `residual` (N elements): it is added to the product. With
    `glu`: W is [gate; up] (N = 2F rows) and the result is silu(x @ gate.T) · (x @ up.T), F values (formed in fp32
    in the epilogue)."""
    if x.numel() != x.shape[-1]:
        raise ValueError(f"gemv takes one row; x has shape {tuple(x.shape)}")
    features = x.shape[-1]
    if w.dim() != 2 or w.shape[1] != features:
        raise ValueError(f"weight {tuple(w.shape)} does not match x's {features} features")
    n, k = w.shape
    if norm_weight is not None and norm_weight.numel() != k:
        raise ValueError(f"norm weight has {norm_weight.numel()} elements for {k} features")
    if residual is not None and residual.numel() != n:
        raise ValueError(f"residual has {residual.numel()} elements for {n} outputs")
    if glu and (n % 2 or residual is not None):
        raise ValueError(f"gemv: glu needs an even number of rows ([gate; up], got {n}) and no residual")
    args, flags = _kernel_args(x, w, norm_weight, residual, eps, glu)
    y = args[2]
    if is_interpreted(_gemv_kernel):
        cfg = INTERPRETER_CONFIG
        _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, **cfg, **flags)
        return y.reshape(*x.shape[:-1], y.numel())
    pdl = pdl_enabled(x.device)
    spec = (n, k, x.dtype, str(x.device), tuple(flags.values()))
    if _DEFERRED and spec not in _TUNED:  # untimed stand-in until tune_pending() (see defer_tuning)
        _PENDING_TILES.add(spec)
        cfg = DEFAULT_CONFIG
        _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                                                        **flags, PDL=pdl, num_warps=cfg["num_warps"],
                                                        num_stages=1, launch_pdl=pdl)
    else:
        _gemv_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](*args, **flags, PDL=pdl, launch_pdl=pdl)
        _TUNED.add(spec)
    return y.reshape(*x.shape[:-1], y.numel())


# (N, K, dtype, device, (norm, add, glu)) → {"impl": "triton" | "cublas", "triton_us": …, "cublas_us": …}
_CHOICES: dict[tuple, dict] = {}


def _unfused(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
             residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """What a fused op runs when cuBLAS is the choice: the decoder's RMSNorm, F.linear, then SwiGLU or the residual
    add, one op after another (each its own kernels)."""
    y = F.linear(rms_norm(x, norm_weight, eps) if norm_weight is not None else x, w)
    if glu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return y if residual is None else residual + y


def time_choice(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-5,
                residual: torch.Tensor | None = None, glu: bool = False, l2_multiple: float = 3.0) -> dict:
    """Device time per call of the two ways a one-row op can run: cuBLAS with the op's unfused norm / SwiGLU / add
    (`_unfused`) and the Triton GEMV with them fused: calls on rotating copies of W (more bytes than L2 holds, so W
    comes from HBM as in a decode step) captured in one CUDA graph (no launch cost)."""
    from engine.measure.timing import time_in_graph

    l2 = torch.cuda.get_device_properties(x.device).L2_cache_size or (50 << 20)
    copies = max(2, min(32, int(l2_multiple * l2 // (w.numel() * w.element_size())) + 1))
    weights = [w.clone() for _ in range(copies)]
    fusions = dict(norm_weight=norm_weight, eps=eps, residual=residual, glu=glu)
    gemv(x, w, **fusions)  # autotune outside the capture
    times = {}
    with exclusive():  # its times are shown: the device is this run's alone while they are taken
        for impl, fn in (("cublas", _unfused), ("triton", gemv)):
            calls = [lambda ww=ww, fn=fn: fn(x, ww, **fusions) for ww in weights]
            times[impl + "_us"] = time_in_graph(calls, replays=10).stats.median
    del weights
    return times


def _choose(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
            residual: torch.Tensor | None, glu: bool) -> dict:
    times = time_choice(x, w, norm_weight, eps, residual, glu)
    return {"impl": "triton" if times["triton_us"] < times["cublas_us"] else "cublas", **times}


def defer_tuning(on: bool = True) -> None:
    """While on, nothing is timed: each new weight shape takes the Triton GEMV and each new autotune key a fixed
    tile (DEFAULT_CONFIG); both are remembered. tune_pending() then times them all — where the device is this run's
    alone — and the caller re-captures whatever graph recorded the stand-ins."""
    global _DEFERRED
    _DEFERRED = on


def _example(spec: tuple, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                          torch.Tensor | None]:
    """Random x, W, norm weight and residual shaped like a pending (N, K, dtype, device, flags) call."""
    n, k, dtype, device, (norm, add, _) = spec
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=dtype)
    w = torch.randn(n, k, generator=gen).to(device=device, dtype=dtype)
    return (x, w, torch.ones(k, device=device, dtype=dtype) if norm else None,
            torch.zeros(1, n, device=device, dtype=dtype) if add else None)


def compile_pending() -> int:
    """Compile every autotune candidate of the pending keys without running one (Triton's warmup), so that
    tune_pending, which needs the device alone, only times them; this part may run beside other runs' work.
    Returns how many kernels were compiled."""
    gen = torch.Generator().manual_seed(0)
    count = 0
    for spec in sorted(_PENDING_TILES, key=str):
        x, w, norm_weight, residual = _example(spec, gen)
        args, flags = _kernel_args(x, w, norm_weight, residual, 1e-5, spec[4][2])
        pdl = pdl_enabled(x.device)
        for config in _configs():
            _gemv_kernel.warmup(*args, **config.kwargs, **flags, PDL=pdl, num_warps=config.num_warps,
                                num_stages=config.num_stages, launch_pdl=pdl, grid=(1,))
            count += 1
    return count


def tune_pending() -> list[str]:
    """Autotune every (shape, fusion) that ran a stand-in tile and time cuBLAS (with the op's unfused ops) against
    the Triton GEMV for every (shape, fusion) decided provisionally; returns what was tuned (empty: nothing was
    pending). Call it with the device to oneself (engine.runner.device_lock.exclusive) and outside any CUDA graph
    capture."""
    done: list[str] = []
    gen = torch.Generator().manual_seed(0)
    was = _DEFERRED
    defer_tuning(False)
    try:
        with exclusive():
            for spec in sorted(_PENDING_TILES, key=str):
                x, w, norm_weight, residual = _example(spec, gen)
                gemv(x, w, norm_weight=norm_weight, eps=1e-5, residual=residual, glu=spec[4][2])  # autotunes
                done.append(f"tiles {spec[0]}×{spec[1]}{_fusion_name(spec[4])}")
            _PENDING_TILES.clear()
            for key in sorted(_PENDING_CHOICES, key=str):
                x, w, norm_weight, residual = _example(key, gen)
                _CHOICES[key] = _choose(x, w, norm_weight, 1e-5, residual, key[4][2])
                done.append(f"choice {key[0]}×{key[1]}{_fusion_name(key[4])}: {_CHOICES[key]['impl']}")
            _PENDING_CHOICES.clear()
    finally:
        defer_tuning(was)
    return done


def _fusion_name(flags: tuple[bool, bool, bool]) -> str:
    norm, add, glu = flags
    return (" +norm" if norm else "") + (" +glu" if glu else "") + (" +residual" if add else "")


def choices() -> list[dict]:
    """What the one-row ops picked per weight shape and fusion in this process, with the times they compared."""
    return [{"N": k[0], "K": k[1], "dtype": str(k[2]).replace("torch.", ""), "fusion": _fusion_name(k[4]).strip(),
             **v} for k, v in _CHOICES.items()]


def _gemv_takes(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                residual: torch.Tensor | None = None, glu: bool = False) -> bool:
    """One row, on CUDA (or interpreted), and the Triton GEMV with these fusions the faster choice for this weight
    shape (timed once per process: `time_choice`)."""
    if x.numel() != x.shape[-1]:
        return False
    if not x.is_cuda:
        return is_interpreted(_gemv_kernel)  # the interpreter (CPU tests)
    key = (w.shape[0], w.shape[1], w.dtype, str(x.device), (norm_weight is not None, residual is not None, glu))
    if key not in _CHOICES:
        if _DEFERRED:  # the Triton GEMV, untimed, until tune_pending()
            _PENDING_CHOICES.add(key)
            return True
        if torch.cuda.is_current_stream_capturing():
            return True  # no timing inside someone's capture; decided at the next call outside one
        _CHOICES[key] = _choose(x, w, norm_weight, eps, residual, glu)
    return _CHOICES[key]["impl"] == "triton"


@torch.library.custom_op("modelab::gemv_linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) (no bias); one row goes to the faster of the Triton GEMV and cuBLAS for its shape."""
    if _gemv_takes(x, weight):
        return gemv(x, weight)
    return F.linear(x, weight)


@linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("modelab::gemv_norm_linear", mutates_args=())
def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(rms_norm(x, norm_weight, eps), weight): for one row, the norm inside the GEMV (one kernel instead of
    a norm kernel and a GEMV) where the GEMV is the faster choice for this shape; else the two ops."""
    if _gemv_takes(x, weight, norm_weight, eps):
        return gemv(x, weight, norm_weight=norm_weight, eps=eps)
    return _unfused(x, weight, norm_weight, eps)


@norm_linear.register_fake
def _(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("modelab::gemv_norm_swiglu", mutates_args=())
def norm_swiglu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up for [gate, up] = F.linear(rms_norm(x, norm_weight, eps), weight): for one row, the norm in
    the gate_up GEMV's prologue and the SwiGLU in its epilogue (half as many outputs as rows) where the GEMV is the
    faster choice for this shape; else the ops one by one."""
    if weight.shape[0] % 2 == 0 and _gemv_takes(x, weight, norm_weight, eps, glu=True):
        return gemv(x, weight, norm_weight=norm_weight, eps=eps, glu=True)
    return _unfused(x, weight, norm_weight, eps, glu=True)


@norm_swiglu.register_fake
def _(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


@torch.library.custom_op("modelab::gemv_linear_add", mutates_args=())
def linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + F.linear(x, weight): for one row, the residual added in the GEMV's epilogue."""
    if residual.shape == (*x.shape[:-1], weight.shape[0]) and _gemv_takes(x, weight, residual=residual):
        return gemv(x, weight, residual=residual)
    return _unfused(x, weight, residual=residual)


@linear_add.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(residual)


def _quantized(proj: torch.nn.Module) -> bool:
    """A weight-only quantized projection (engine.llm.quant.QuantLinear: codes `q` and `scales`, no .weight)."""
    return hasattr(proj, "q") and hasattr(proj, "scales")


def _tiled(proj: torch.nn.Module, x: torch.Tensor, glu: bool) -> bool:
    """A quantized int4 projection that also holds its codes in the tensor-core kernel's tile order (where
    $MODELAB_INT4_GEMV sends it: engine.llm.quant.attach_int4_tiles), for this product (gate_up's tiles pair gate and
    up rows), and one CUDA row of x."""
    return (getattr(proj, "tile_q", None) is not None and proj.tile_glu == glu and x.is_cuda
            and x.numel() == x.shape[-1])


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def _plain(x: torch.Tensor, proj: torch.nn.Module, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
           residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """A fused op's product as plain torch ops, for the batches engine.kernels.choice.decode_products sends to the
    GEMM: rms_norm, the projection (F.linear for a bf16 weight, a quantized module's own several-row product), then
    SwiGLU or the residual add — all visible to Inductor inside the compiled step, which fuses the element-wise ops
    into its own kernels around the cuBLAS GEMM."""
    h = rms_norm(x, norm_weight, eps) if norm_weight is not None else x
    y = proj(h) if _quantized(proj) else F.linear(h, proj.weight)
    if glu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return y if residual is None else residual + y


def _as_gemm(x: torch.Tensor) -> bool:
    """This many rows take plain torch ops (engine.kernels.choice.decode_products); decided when the step is
    traced, from the static batch."""
    return decode_products(_rows(x)) == "gemm"


class FusedDecodeOps:
    """What the decoder calls for its one-row products when the LLM lab's triton-fused mode sets it
    (LlamaDecoder.set_fused_ops): the RMSNorm in front of qkv, gate_up and lm_head, SwiGLU after gate_up, the
    residual adds after o and down, inside the GEMVs — four kernels fewer per layer than the ops one by one. Each is
    given the projection module: a bf16 nn.Linear takes this module's GEMV; a weight-only quantized one (the
    triton-int8-wo / -fp8-wo / -int4-wo modes) the same fusions in engine.kernels.triton.quant_gemv, dequantizing
    inside the weight loads; an int4 one holding tile-order codes (by default on an H100 for K >= 2048:
    $MODELAB_INT4_GEMV) the tensor-core kernel engine.kernels.cuda_quant. Batches above
    engine.kernels.choice.GEMV_MAX_BATCH rows take plain torch ops instead (`_plain`: cuBLAS GEMMs, Inductor's
    fusions), chosen by engine.kernels.choice.decode_products."""

    @staticmethod
    def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, proj: torch.nn.Module) -> torch.Tensor:
        if _as_gemm(x):
            return _plain(x, proj, norm_weight, eps)
        if _tiled(proj, x, glu=False):
            return cuda_quant.tile_gemv(x, proj.tile_q, proj.tile_s, proj.out_features, False, norm_weight, eps, None)
        if _quantized(proj):
            from engine.kernels.triton import quant_gemv

            return quant_gemv.norm_linear(x, norm_weight, eps, proj.q, proj.scales)
        return norm_linear(x, norm_weight, eps, proj.weight)

    @staticmethod
    def norm_swiglu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, proj: torch.nn.Module) -> torch.Tensor:
        if _as_gemm(x):
            return _plain(x, proj, norm_weight, eps, glu=True)
        if _tiled(proj, x, glu=True):
            return cuda_quant.tile_gemv(x, proj.tile_q, proj.tile_s, proj.out_features, True, norm_weight, eps, None)
        if _quantized(proj):
            from engine.kernels.triton import quant_gemv

            return quant_gemv.norm_swiglu(x, norm_weight, eps, proj.q, proj.scales)
        return norm_swiglu(x, norm_weight, eps, proj.weight)

    @staticmethod
    def linear_add(x: torch.Tensor, proj: torch.nn.Module, residual: torch.Tensor) -> torch.Tensor:
        if _as_gemm(x):
            return _plain(x, proj, residual=residual)
        if _tiled(proj, x, glu=False):
            return cuda_quant.tile_gemv(x, proj.tile_q, proj.tile_s, proj.out_features, False, None, 0.0, residual)
        if _quantized(proj):
            from engine.kernels.triton import quant_gemv

            return quant_gemv.linear_add(x, proj.q, proj.scales, residual)
        return linear_add(x, proj.weight, residual)


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), w.double())


class GemvLinear(torch.nn.Linear):
    """nn.Linear whose product goes through `linear` (the Triton GEMV for one row). swap_linears makes them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            # several rows (prefill, B > 1): plain F.linear, visible to Inductor (its own GEMM choice and fusions)
            # rather than an opaque custom op that would call F.linear anyway
            return F.linear(x, self.weight, self.bias)
        y = linear(x, self.weight)
        return y if self.bias is None else y + self.bias


def swap_linears(module: torch.nn.Module) -> int:
    """Turn every nn.Linear inside `module` into a GemvLinear in place (same parameters, same state dict); returns
    how many. Undo with `module.apply(lambda m: setattr(m, '__class__', torch.nn.Linear) if isinstance(m,
    GemvLinear) else None)`."""
    count = 0
    for sub in module.modules():
        if type(sub) is torch.nn.Linear:
            sub.__class__ = GemvLinear
            count += 1
    return count
