"""The decode step's attention in one kernel per layer, its splits combined inside a thread-block cluster
(csrc/decode/decode_attention.cu, sm_90): RoPE on q and the new key, the cache write, flash-decoding and the combine,
where the Triton kernel (engine/kernels/triton/decode_attention.py) runs a split kernel and a combine kernel.

Which decode steps take it: $MODELAB_DECODE_ATTENTION (`impl`): auto (the default) on compute capability 9.0, cuda
on any GPU with clusters (9.0 and newer), triton never; and only where the shapes fit (`fits`: a bf16 cache and
rotary tables, head dim 64 or 128, 1, 2, 4 or 8 query heads per kv head, an int64 position). The lab's fused decode
modes load it while they prepare (`ensure`; nothing builds on a call's path; where it cannot build, the Triton
kernels run and the run's note says why); engine.kernels.triton.decode_attention.decode_attention_qkv_fwd then
sends the calls that fit here. $MODELAB_DECODE_CLUSTER sets the CTAs per (sequence, kv head), 1–8 (default 8).

    load() -> path        build (cached) and load; NativeBuildError with the reason
    available() -> None | reason   never raises
    ensure(device) -> note   load where asked for; one line saying which decode attention the step runs
    fits(qkv, cos, sin, k_cache, v_cache, input_pos) -> bool
    attend_qkv(qkv, cos, sin, k_cache, v_cache, input_pos, cluster, pdl) -> (B, H, 1, D)
"""

from __future__ import annotations

import functools
import os

import torch

from engine.kernels import cuda_levels
from engine.native import build as native

SOURCE_DIR = native.CSRC / "decode"
SOURCES = ("decode_attention.cu", "bindings.cpp")
INCLUDE_DIRS = (cuda_levels.SOURCE_DIR,)  # common.cuh: CUDA_CHECK, cp.async
HEADERS = ("../levels/common.cuh",)  # part of the build key
IMPL_ENV = "MODELAB_DECODE_ATTENTION"
IMPLS = {
    "auto": "the cluster kernel on compute capability 9.0, the Triton kernels else",
    "cuda": "the cluster kernel on any GPU with thread-block clusters (compute capability 9.0 and newer)",
    "triton": "the Triton split and combine kernels",
}
CLUSTER_ENV = "MODELAB_DECODE_CLUSTER"
MAX_CLUSTER = 8  # the portable cluster size (csrc/decode/decode_attention.cu: MAX_CLUSTER)
HEAD_DIMS = (64, 128)  # the kernel's instantiations
REPS = (1, 2, 4, 8)  # query heads per kv head

_library = cuda_levels.CudaLibrary("cuda_decode", SOURCE_DIR, SOURCES, HEADERS, INCLUDE_DIRS)


def load(verbose: bool = False) -> str:
    """Build (cached) and load the library; its path. Raises NativeBuildError with the reason."""
    return _library.load(verbose)


def available() -> str | None:
    """None when the kernel can run here (building it, cached, where a GPU and nvcc exist), else why not."""
    return _library.reason()


def impl() -> str:
    """$MODELAB_DECODE_ATTENTION: auto (default), cuda or triton. ValueError naming the choices for anything else."""
    return cuda_levels.env_choice(IMPL_ENV, IMPLS)


def cluster_size() -> int:
    """$MODELAB_DECODE_CLUSTER: CTAs per (sequence, kv head), 1..8 (default 8). ValueError for anything else."""
    raw = os.environ.get(CLUSTER_ENV, "").strip()
    if not raw:
        return MAX_CLUSTER
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CLUSTER:
        raise ValueError(f"${CLUSTER_ENV}={raw!r}: want an integer from 1 to {MAX_CLUSTER}")
    return value


@functools.lru_cache(maxsize=16)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def takes(device: torch.device | str | None) -> bool:
    """Whether $MODELAB_DECODE_ATTENTION sends this CUDA device's decode attention to the cluster kernel."""
    choice = impl()
    if choice == "triton" or not torch.cuda.is_available():
        return False
    device = torch.device(device) if device is not None else torch.device("cuda")
    if device.type != "cuda":
        return False
    major_minor = _capability(device.index if device.index is not None else torch.cuda.current_device())
    return major_minor == (9, 0) if choice == "auto" else major_minor >= (9, 0)


def ensure(device: torch.device | str | None) -> str:
    """Load the kernel where it is asked for and can run; one line saying which decode attention the step runs."""
    choice = impl()
    if not takes(device):
        return (f"decode attention: the Triton split and combine kernels (${IMPL_ENV}={choice}: {IMPLS[choice]})")
    reason = available()
    if reason:
        return f"decode attention: the Triton kernels (the cluster kernel csrc/decode/decode_attention.cu: {reason})"
    return (f"decode attention (${IMPL_ENV}={choice}): one kernel per layer, the splits of each kv head the "
            f"{cluster_size()} CTAs of a cluster, combined through distributed shared memory "
            "(csrc/decode/decode_attention.cu)")


def wanted(device: torch.device) -> bool:
    """Whether the kernel is loaded in this process and asked for on this device (host only: no GPU work)."""
    return _library.path is not None and takes(device)


def fits(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
         input_pos: torch.Tensor) -> bool:
    """Whether the kernel's instantiations cover these tensors (else the Triton kernels take the call)."""
    bf16 = all(t.dtype == torch.bfloat16 for t in (qkv, cos, sin, k_cache, v_cache))
    if not bf16 or input_pos.dtype != torch.int64 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        return False
    b, kvh, _, d = k_cache.shape
    if d not in HEAD_DIMS or qkv.numel() % max(b, 1) or (qkv.numel() // max(b, 1)) % d:
        return False
    heads = qkv.numel() // max(b, 1) // d - 2 * kvh
    return heads > 0 and heads % kvh == 0 and heads // kvh in REPS and b * kvh <= 65535


def attend_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, input_pos: torch.Tensor, cluster: int | None = None, pdl: bool = True
               ) -> torch.Tensor:
    """(B, H, 1, D): RoPE on q and the new key at input_pos[-1], k and v written into the caches there, attention
    over positions 0..input_pos[-1]. qkv (B, 1, (H + 2·KVH)·D) before RoPE; cos, sin (≥ S_max, D)."""
    if not fits(qkv, cos, sin, k_cache, v_cache, input_pos):
        raise ValueError(f"decode attention (cluster kernel): qkv {tuple(qkv.shape)} {qkv.dtype}, cache "
                         f"{tuple(k_cache.shape)} {k_cache.dtype}, tables {cos.dtype}, position {input_pos.dtype}: "
                         f"want bf16, head dim in {HEAD_DIMS}, {REPS} query heads per kv head, an int64 position")
    cluster = cluster or cluster_size()
    if not 1 <= cluster <= MAX_CLUSTER:
        raise ValueError(f"decode attention (cluster kernel): cluster {cluster}: want 1 to {MAX_CLUSTER} CTAs")
    load()
    return torch.ops.modelab_decode.decode_attention(qkv.contiguous(), cos.contiguous(), sin.contiguous(), k_cache,
                                                     v_cache, input_pos, cluster, pdl)
