"""Kernel Levels L5: the hand-written CUDA kernels in csrc/levels/, built on first use and called as torch ops.

- `attention(q, k, v, causal, scale)`: flash-attention-2 style forward (tensor cores via mma.sync, online softmax in
  fp32, causal block skipping), q/k/v (B, H, S, D) bf16 or fp16, D in {64, 128}, any S.
- `patch_embed(images, weight, bias, cls, pos, patch)`: ViT patch embedding as one implicit GEMM (im2col in the tile
  loads), bias + position embedding (and the cls row) in the epilogue.
- `message_passing(x, src, dst, w, num_nodes, aggr, rowptr)`: out[d] = sum/mean of w_e * x[src_e] over the edges into
  d; one warp per destination row over CSR (no atomics); unsorted edges linked into per-destination lists on the
  device, then a group of lanes per row walking them (or, `unsorted="atomic"`, fp32 atomics into a buffer).
- `available()`: None when these can run here, else why not (never raises, never builds without a GPU).

The build: torch.utils.cpp_extension (ninja) into `$MODELAB_BUILD_DIR/<torch tag>/cuda_levels-<key>/`, where the
key hashes the sources, torch's and nvcc's CUDA versions, the GPU architecture and the flags, so an edit or an upgrade
never reuses a stale library. The machine-wide build lock and the ninja lookup are engine.native.build's. Inputs are
validated here with ValueErrors before anything is launched; the C++ side checks again (TORCH_CHECK) and checks every
CUDA call and launch (CUDA_CHECK in csrc/levels/common.cuh).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import subprocess
import time
from pathlib import Path

import torch

from engine.native import build as native
from engine.runner import device_lock

SOURCE_DIR = native.CSRC / "levels"
SOURCES = ("attention.cu", "attention_ws.cu", "patch_embed.cu", "message_passing.cu", "bindings.cpp")
HEADERS = ("common.cuh", "wgmma.cuh")
OPS = "modelab_levels"  # the TORCH_LIBRARY namespace (bindings.cpp)

# Attention variants (the table in csrc/levels/attention.cu). 0 and 2 are mma.sync (sm_80+); 2 exists for bf16 with
# D=128 only. 7 is FlashAttention-3's design (csrc/levels/attention_ws.cu: TMA producer warpgroup, two consumer
# warpgroups taking turns), built for sm_90a on compute capability 9.0, D=128 or 64, bf16 and fp16. The default is
# the fastest built variant that has passed a GPU run (`default_variant`); benchmarks/cuda_levels_gpu.py times them
# all (docs/figures.md, "Kernel levels").
ATTENTION_VARIANTS = (0,)
ATTENTION_VARIANTS_BF16_D128 = (0, 2)
WS_VARIANTS = (7, 8)  # sm_90a, bf16 and fp16, D=128 or 64
# 8 is 7 with FlashAttention-3's epilogue: O through shared memory, stored by TMA, so a block's tail does not wait on
# scattered global stores; the levels (rotating input sets) time it faster than 7 at both sequence lengths and on the
# ViT shape. Timed on one input set over and over (as cuda_levels_gpu.py times) it is the slower at S=4096: not
# explained (docs/kernel-levels.md).
# (variant, head dim) builds not yet run on a GPU. benchmarks/cuda_levels_gpu.py and the GPU tests check them in a
# child process with a timeout before anything else (`check_variant_in_child`): a hang or a fault there fails that
# check, not the whole run; `attention` does not pick them by default. A build leaves this tuple once a GPU run has
# passed it; every build here has.
UNVERIFIED: tuple[tuple[int, int], ...] = ()
# The error bound of an attention variant against float64 (the GPU tests' ATTN_TOL), per dtype.
ATTN_TOL = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3}


def attention_variants(dtype: torch.dtype, head_dim: int, device: int | None = None) -> tuple[int, ...]:
    """The variants built for this dtype and head dim on this GPU (CUDA device index; the wgmma ones only on 9.0)."""
    built = mma_variants(dtype, head_dim)
    if torch.cuda.is_available() and _arch(device) == (9, 0) and head_dim in (64, 128) and dtype in ATTN_DTYPES:
        built = built + WS_VARIANTS
    return built


def mma_variants(dtype: torch.dtype, head_dim: int) -> tuple[int, ...]:
    """The mma.sync variants built for this dtype and head dim (every GPU from compute capability 8.0)."""
    return ATTENTION_VARIANTS_BF16_D128 if (dtype == torch.bfloat16 and head_dim == 128) else ATTENTION_VARIANTS


def describe_variant(variant: int) -> str:
    """One line naming the attention kernel a variant runs (for a run's notes)."""
    if variant == 8:
        return ("attention: TMA + warp-specialised wgmma kernel with a TMA-stored output, variant 8 "
                "(csrc/levels/attention_ws.cu, built for sm_90a: variant 7 writing O through shared memory)")
    if variant == 7:
        return ("attention: TMA + warp-specialised wgmma kernel, variant 7 (csrc/levels/attention_ws.cu, built for "
                "sm_90a: a producer warpgroup loading by TMA, two consumer warpgroups taking turns)")
    return f"attention: mma.sync kernel, tile variant {variant} (csrc/levels/attention.cu)"


V7_MAX_HEADS = 65535  # variants 7 and 8: grid (row blocks, B · H), heads on its second axis (attention_ws.cu says why)


def default_variant(dtype: torch.dtype, head_dim: int, device: int | None = None) -> int:
    """What `attention` runs: the wgmma kernel where it is built and has passed a GPU run (8, FlashAttention-3's
    design with its TMA-stored epilogue, the fastest measured; 7 where 8 is not verified), else the fastest mma.sync
    tile measured."""
    built = attention_variants(dtype, head_dim, device)
    for variant in (8, 7, 2):  # the fastest measured first (8 ahead of 7: the note above UNVERIFIED)
        if variant in built and (variant, head_dim) not in UNVERIFIED:
            return variant
    return 0


ATTN_DTYPES = (torch.bfloat16, torch.float16)
MP_X_DTYPES = (torch.float32, torch.bfloat16)
MP_W_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IDX_DTYPES = (torch.int32, torch.int64)
AGGRS = ("sum", "mean")
UNSORTED = ("linked", "atomic")  # message passing without a CSR: the default first
# what the level's kernels do with unsorted edges (Kernel Levels' note on the run; engine.levels.builders reads it)
unsorted_note = ("unsorted edges: 4 linked lists of in-edges per destination built on the device (one atomicExch per "
                 "edge, in the timed call), then a group of lanes per row walking its lists")

_loaded: str | None = None  # path of the library loaded into this process (_ops' fast path)


@functools.lru_cache(maxsize=None)
def _arch(device: int | None = None) -> tuple[int, int]:  # asked on every attention call: cached per device
    return torch.cuda.get_device_capability(device)


def arch_flags(major: int, minor: int) -> list[str]:
    """-gencode for one GPU architecture. Compute capability 9.0 (H100, H200) builds for sm_90a, the target with
    Hopper's own instructions (wgmma, TMA: attention variants 7 and 8), and defines MODELAB_SM90A so those are
    compiled;
    a sm_90a binary runs only on 9.0 devices, which is the device it is built for."""
    if (major, minor) == (9, 0):
        return ["-gencode=arch=compute_90a,code=sm_90a", "-DMODELAB_SM90A"]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def cuda_flags() -> list[str]:
    """nvcc flags: -O3 for this GPU's own architecture (sm_90a on H100) and ptxas's register/spill report.
    No --use_fast_math: the softmax uses ex2.approx explicitly and everything else stays IEEE."""
    return ["-O3", *arch_flags(*_arch()), "--resource-usage"]


@functools.lru_cache(maxsize=1)
def _nvcc_version() -> str:
    from torch.utils.cpp_extension import CUDA_HOME

    try:
        out = subprocess.run([str(Path(CUDA_HOME or "") / "bin" / "nvcc"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    found = re.search(r"release [\d.]+, V[\d.]+", out)
    return found.group(0) if found else out.strip()[-80:]


def build_key(sources: dict[str, bytes], torch_version: str, cuda_version: str | None, nvcc_version: str,
              arch: tuple[int, int], flags: list[str]) -> str:
    """16 hex digits naming one build: any change to a source, torch, CUDA, the GPU arch or the flags changes it."""
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name] + b"\0")
    for part in (torch_version, cuda_version or "cpu", nvcc_version, f"sm{arch[0]}{arch[1]}", " ".join(flags)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def source_key(source_dir: Path, names: tuple[str, ...]) -> str:
    """build_key of these files of source_dir (sources and the headers they include) for this torch, nvcc and GPU."""
    sources = {name: (source_dir / name).read_bytes() for name in names}
    return build_key(sources, torch.__version__, torch.version.cuda, _nvcc_version(), _arch(), cuda_flags())


def _current_key() -> str:
    return source_key(SOURCE_DIR, SOURCES + HEADERS)


def build_dir() -> Path:
    return native.build_root() / native.build_tag() / f"cuda_levels-{_current_key()}"


def _first_error_line(text: str) -> str:
    """The compiler's first error line (`file.cu(42): error: ...`, `file.cpp:3:5: error: ...`), else the first line
    mentioning an error, else the first line: what a person needs to see first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    mentions = [line for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)
                and not line.startswith(("FAILED:", "ninja:", "Error building extension"))]
    compiler = [line for line in mentions if re.search(r"(^|[\s:)])error( #[\w-]+)?:", line)]
    return (compiler or mentions or lines or ["no output"])[0][:300]


def offline_nvcc(name: str, out: Path, arch: tuple[int, int] = (9, 0), cubin: bool = False,
                 source_dir: Path = SOURCE_DIR) -> list[str] | str:
    """The nvcc command that compiles `source_dir`/`name` (csrc/levels/ by default) for sm_`arch` without a GPU,
    against this torch's headers with $CUDA_HOME's nvcc (or /usr/local/cuda's), writing `out`: an object file, or
    with `cubin` the device code alone (for nvdisasm); ptxas reports registers and spills. A CPU-only torch lacks one
    generated header (c10/cuda/impl/cuda_cmake_macros.h): an empty stand-in is written beside `out`. Returns the
    reason instead when nvcc is not found."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, CUDA_HOME, include_paths

    # a CPU-only torch leaves its CUDA_HOME unset: $CUDA_HOME, then the usual install place
    homes = [h for h in (os.environ.get("CUDA_HOME"), CUDA_HOME, "/usr/local/cuda") if h]
    home = next((Path(h) for h in homes if (Path(h) / "bin" / "nvcc").exists()), None)
    if home is None:
        return f"nvcc not found (looked in {', '.join(homes)})"
    nvcc = home / "bin" / "nvcc"
    incs = [*include_paths(), str(home / "include"), str(source_dir), str(SOURCE_DIR)]
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in incs):
        stub = out.parent / "stub_include"
        (stub / "c10/cuda/impl").mkdir(parents=True, exist_ok=True)
        (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n")
        incs.insert(0, str(stub))
    return [str(nvcc), "-cubin" if cubin else "-c", "-std=c++17", *COMMON_NVCC_FLAGS, "-O3", *arch_flags(*arch),
            "--resource-usage", "-Xcompiler", "-fPIC", *(f"-I{p}" for p in incs), str(source_dir / name),
            "-o", str(out)]


def _missing_tools() -> str | None:
    """Why nothing can be built or run here (None: try building). Looks only; builds nothing."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    major, minor = _arch()
    if major < 8:
        return f"needs a GPU of compute capability 8.0 or newer (mma.sync bf16, cp.async); this one is {major}.{minor}"
    reason = native.compiler_missing()
    if reason:
        return reason
    if native._ensure_ninja_on_path() is None:
        return "ninja not found (pip install ninja — it is pinned in requirements.txt); cpp_extension builds with it"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None or not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return "nvcc not found (CUDA_HOME unset)"
    return None


def build_library(label: str, source_dir: Path, sources: tuple[str, ...], headers: tuple[str, ...],
                  include_dirs: tuple[Path, ...] = (), verbose: bool = False) -> str:
    """Build (cached under `<build root>/<torch tag>/<label>-<key>/`) and load one library of CUDA sources as
    torch ops; returns its path. Raises NativeBuildError with the reason (the compiler's first error line first).
    Shared by these levels and engine.kernels.cuda_quant."""
    reason = _missing_tools()
    if reason:
        raise native.NativeBuildError(reason)
    from torch.utils import cpp_extension

    key = source_key(source_dir, sources + headers)
    folder = native.build_root() / native.build_tag() / f"{label}-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"modelab_{label}_{key}"
    start = time.perf_counter()
    hit = any(folder.glob(f"{name}*.so"))
    # host-only: other runs of a group may time meanwhile
    # linked by a compiler that keeps libstdc++ out of the library (engine.native.toolchain.library_cxx)
    with device_lock.released(), native.build_lock(f"{label}-{key}"), native.extension_compiler():
        (folder / "lock").unlink(missing_ok=True)  # a killed build's baton; we hold the real lock
        try:
            path = cpp_extension.load(
                name=name, sources=[str(source_dir / s) for s in sources], extra_cflags=["-O3"],
                extra_cuda_cflags=cuda_flags(), extra_include_paths=[str(source_dir), *map(str, include_dirs)],
                build_directory=str(folder), is_python_module=False, with_cuda=True, verbose=verbose)
        except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError) as exc:
            text = str(exc) + "\n" + str(getattr(exc, "output", "") or "")
            raise native.NativeBuildError(f"build failed: {_first_error_line(text)}\n(in {folder})\n"
                                          f"{native._tail(text)}") from exc
    record = getattr(native, "record_build", None)  # bench's cache metrics, where engine.native.build has them
    if record is not None:
        record(label, hit, time.perf_counter() - start)
    return str(path)


class CudaLibrary:
    """One library of CUDA sources (build_library's arguments), loaded at most once per process: a failed build is
    not retried (its first line is kept), a missing tool is asked again next time."""

    def __init__(self, label: str, source_dir: Path, sources: tuple[str, ...], headers: tuple[str, ...],
                 include_dirs: tuple[Path, ...] = ()) -> None:
        self.args = (label, source_dir, sources, headers, include_dirs)
        self.path: str | None = None
        self.failed: str | None = None

    def load(self, verbose: bool = False) -> str:
        if self.path is not None:
            return self.path
        if self.failed is not None:
            raise native.NativeBuildError(self.failed)
        try:
            self.path = build_library(*self.args, verbose=verbose)
        except native.NativeBuildError as exc:
            if str(exc).startswith("build failed"):
                self.failed = str(exc).splitlines()[0]
            raise
        return self.path

    def reason(self) -> str | None:
        """None when the library loads here (building it, cached, where a GPU and nvcc exist), else why not. Never
        raises."""
        try:
            self.load()
            return None
        except native.NativeBuildError as exc:
            return str(exc).strip().splitlines()[0]
        except Exception as exc:  # noqa: BLE001 — the contract is a reason string, never an exception
            return f"build failed: {type(exc).__name__}: {exc}"[:300]


_library = CudaLibrary("cuda_levels", SOURCE_DIR, SOURCES, HEADERS)


def load(verbose: bool = False) -> str:
    """Build (cached; the first build takes a minute or two) and load the kernels; returns the library's path.

    Raises NativeBuildError with the reason. With verbose=True ninja's output (including ptxas's per-kernel
    registers and spills) goes to this process's stdout.
    """
    global _loaded
    _loaded = _library.load(verbose)
    return _loaded


def available() -> str | None:
    """None when the L5 kernels can run here, else the reason ("needs a CUDA device", "nvcc not found (CUDA_HOME
    unset)", "build failed: <first error line>"). Never raises; builds (cached) only where a GPU and nvcc exist."""
    try:
        reason = _missing_tools()
        if reason:
            return reason
        load()
        return None
    except native.NativeBuildError as exc:
        text = str(exc).strip()
        return text.splitlines()[0] if text.startswith("build failed") else f"build failed: {_first_error_line(text)}"
    except Exception as exc:  # noqa: BLE001 — the contract is a reason string, never an exception
        return f"build failed: {type(exc).__name__}: {_first_error_line(str(exc))}"


def _require() -> None:
    reason = available()
    if reason:
        raise RuntimeError(f"CUDA kernel levels cannot run here: {reason}")


def _ops():  # type: ignore[no-untyped-def]
    if _loaded is None:  # the fast path skips the tool checks: they cost tens of µs a call
        _require()
    return getattr(torch.ops, OPS)


# ---- input checks (ValueError, before any launch) -----------------------------------------------------------------

def _tensors(name: str, **tensors: object) -> None:
    for key, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: {key} must be a torch.Tensor, got {type(t).__name__}")


def _on_one_cuda_device(name: str, **tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"{name}: all inputs must be on one device, got {sorted(str(d) for d in devices)}")
    device = next(iter(devices))
    if device.type != "cuda":
        raise ValueError(f"{name}: inputs must be CUDA tensors (the L5 kernels are CUDA only), got {device}")


def _contiguous(name: str, **tensors: torch.Tensor) -> None:
    for key, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name}: {key} must be contiguous (call .contiguous() first)")


def _aligned16(name: str, **tensors: torch.Tensor) -> None:
    for key, t in tensors.items():
        if t.numel() and t.data_ptr() % 16:
            raise ValueError(f"{name}: {key} must start on a 16-byte boundary (the kernel loads 16 bytes at a "
                             f"time); this one is a view at an odd offset, pass a fresh tensor")


# ---- attention ------------------------------------------------------------------------------------------------------

def _check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                     scale: float | None) -> float:
    _tensors("attention", q=q, k=k, v=v)
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"attention: q, k, v must be (B, H, S, D) of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] not in (64, 128):
        raise ValueError(f"attention: head dim D must be 64 or 128, got {q.shape[-1]}")
    if q.dtype not in ATTN_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention: q, k, v must all be bfloat16 or all float16, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if not isinstance(causal, bool):
        raise ValueError(f"attention: causal must be a bool, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"attention: scale must be a finite float or None, got {scale!r}")
    if scale <= 0:  # the wgmma kernels scale the running row maximum (from -inf): -inf * scale is NaN or +inf
        raise ValueError(f"attention: scale must be positive, got {scale!r}")
    if q.shape[0] * q.shape[1] >= 2**31 or q.shape[2] > 65535 * 64:
        raise ValueError(f"attention: shape {tuple(q.shape)} is too large for the grid")
    _on_one_cuda_device("attention", q=q, k=k, v=v)
    _contiguous("attention", q=q, k=k, v=v)
    return float(scale)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q k^T (+ causal mask)) v for q, k, v (B, H, S, D) contiguous CUDA bf16/fp16, D in {64, 128}.

    scale defaults to 1/sqrt(D). Returns (B, H, S, D) in q's dtype. fp32 accumulation and softmax.
    """
    scale = _check_attention(q, k, v, causal, scale)  # first: a bad argument gets its message, not an AttributeError
    # the default is built by definition: no second lookup of the built variants on this per-call path
    variant = fit_grid(default_variant(q.dtype, q.shape[-1], q.device.index), q.shape[0] * q.shape[1], q.dtype,
                       q.shape[-1])
    return _ops().attention(q, k, v, causal, scale, variant)


def fit_grid(variant: int, heads: int, dtype: torch.dtype, head_dim: int) -> int:
    """`variant`, or where B·H = `heads` is past the grid of variants 7 and 8 (V7_MAX_HEADS) the fastest mma.sync
    tile built for this dtype and head dim (whose grid takes B·H up to 2**31)."""
    if variant in WS_VARIANTS and heads > V7_MAX_HEADS:
        return max(mma_variants(dtype, head_dim))
    return variant


def _attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                       variant: int) -> torch.Tensor:
    """`attention` with an explicit tile variant (tests, benchmarks/cuda_levels_gpu.py)."""
    scale = _check_attention(q, k, v, causal, scale)
    allowed = attention_variants(q.dtype, q.shape[-1], q.device.index)
    if variant not in allowed:
        raise ValueError(f"attention: variant {variant} is not built for {q.dtype} with D={q.shape[-1]} "
                         f"(built: {allowed})")
    if variant in (7, 8) and q.shape[0] * q.shape[1] > V7_MAX_HEADS:
        raise ValueError(f"attention: variant {variant} takes at most {V7_MAX_HEADS} heads (B * H), got "
                         f"{q.shape[0] * q.shape[1]}")
    return _ops().attention(q, k, v, causal, scale, variant)


# ---- patch embedding ----------------------------------------------------------------------------------------------

def _squeeze_leading(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """`t` viewed as `shape` if it is `shape` with extra leading 1s (e.g. cls (1, 1, E) or pos (1, 1 + Np, E))."""
    extra = t.dim() - len(shape)
    if extra < 0 or tuple(t.shape[extra:]) != shape or any(s != 1 for s in t.shape[:extra]):
        return None
    return t.reshape(shape)


def patch_embed(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cls: torch.Tensor,
                pos: torch.Tensor, patch: int) -> torch.Tensor:
    """ViT patch embedding: tokens (B, 1 + Np, E); row 0 = cls + pos[0], row 1 + p = conv patch p (row-major over the
    patch grid) + bias + pos[1 + p]. images (B, C, H, W), weight (E, C, P, P), bias (E,), cls (E,), pos (1 + Np, E),
    all contiguous CUDA bf16 (or all fp16); P a multiple of 8 dividing H and W, E a multiple of 8."""
    _tensors("patch_embed", images=images, weight=weight, bias=bias, cls=cls, pos=pos)
    if isinstance(patch, bool) or not isinstance(patch, int) or patch <= 0:
        raise ValueError(f"patch_embed: patch must be a positive int, got {patch!r}")
    if images.dim() != 4:
        raise ValueError(f"patch_embed: images must be (B, C, H, W), got {tuple(images.shape)}")
    B, C, H, W = images.shape
    if patch % 8 or H % patch or W % patch:
        raise ValueError(f"patch_embed: patch must be a multiple of 8 that divides H and W (16-byte loads of whole "
                         f"patch rows); got patch={patch} for {H}x{W}")
    if weight.dim() != 4 or tuple(weight.shape[1:]) != (C, patch, patch):
        raise ValueError(f"patch_embed: weight must be (E, {C}, {patch}, {patch}), got {tuple(weight.shape)}")
    E = weight.shape[0]
    if E % 8 or E == 0:
        raise ValueError(f"patch_embed: the embedding size E must be a positive multiple of 8, got {E}")
    n_patches = (H // patch) * (W // patch)
    bias_v, cls_v, pos_v = (_squeeze_leading(bias, (E,)), _squeeze_leading(cls, (E,)),
                            _squeeze_leading(pos, (1 + n_patches, E)))
    for name, got, t, want in (("bias", bias_v, bias, (E,)), ("cls", cls_v, cls, (E,)),
                               ("pos", pos_v, pos, (1 + n_patches, E))):
        if got is None:
            raise ValueError(f"patch_embed: {name} must be {want}, got {tuple(t.shape)}")
    if images.dtype not in ATTN_DTYPES or any(t.dtype != images.dtype for t in (weight, bias, cls, pos)):
        raise ValueError(f"patch_embed: all inputs must be bfloat16 (or all float16), got images {images.dtype}, "
                         f"weight {weight.dtype}, bias {bias.dtype}, cls {cls.dtype}, pos {pos.dtype}")
    if images.numel() >= 2**31 or weight.numel() >= 2**31:
        raise ValueError("patch_embed: images and weight must each have fewer than 2**31 elements")
    _on_one_cuda_device("patch_embed", images=images, weight=weight, bias=bias, cls=cls, pos=pos)
    _contiguous("patch_embed", images=images, weight=weight, bias=bias, cls=cls, pos=pos)
    _aligned16("patch_embed", images=images, weight=weight)
    return _ops().patch_embed(images, weight, bias_v, cls_v, pos_v, patch)


# ---- message passing ----------------------------------------------------------------------------------------------

def message_passing(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int,
                    aggr: str = "sum", rowptr: torch.Tensor | None = None, unsorted: str = "linked") -> torch.Tensor:
    """out[d] = sum (or mean) over the edges e into d of w[e] * x[src[e]]; (num_nodes, F) in x's dtype, isolated
    nodes 0. x (N, F) float32/bfloat16; src, dst (E,) int32/int64 of one dtype; w (E,) float32 or x's dtype (a
    float16 w, or bfloat16 w with float32 x, is converted to float32 first). With `rowptr` (num_nodes + 1, over edges
    sorted by dst; int64, an int32 one is widened): one warp per row, no atomics, deterministic; dst is then only
    shape-checked. Without it, `unsorted`: "linked" — each edge linked into one of 4 lists of its destination's
    in-edges by an atomic exchange, then a group of lanes per row walks them (E < 2**31, num_nodes < 2**29, else
    "atomic"); "atomic" — fp32 atomics into a buffer, then cast. Either way the order of a row's additions varies
    from run to run."""
    _tensors("message_passing", x=x, src=src, dst=dst, w=w)
    if rowptr is not None:
        _tensors("message_passing", rowptr=rowptr)
    if x.dim() != 2:
        raise ValueError(f"message_passing: x must be (N, F), got shape {tuple(x.shape)}")
    if x.dtype not in MP_X_DTYPES:
        raise ValueError(f"message_passing: x must be float32 or bfloat16, got {x.dtype}")
    if w.dtype not in MP_W_DTYPES:
        raise ValueError(f"message_passing: w must be float32, bfloat16 or float16, got {w.dtype}")
    if src.dtype not in IDX_DTYPES or dst.dtype != src.dtype:
        raise ValueError(f"message_passing: src and dst must be int32 or int64, of one dtype; got {src.dtype}, "
                         f"{dst.dtype}")
    if src.dim() != 1 or not (src.shape == dst.shape == w.shape):
        raise ValueError(f"message_passing: src, dst, w must be 1-D of one length E, got {tuple(src.shape)}, "
                         f"{tuple(dst.shape)}, {tuple(w.shape)}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"message_passing: num_nodes must be an int >= 0, got {num_nodes!r}")
    if aggr not in AGGRS:
        raise ValueError(f"message_passing: aggr must be one of {AGGRS}, got {aggr!r}")
    if unsorted not in UNSORTED:
        raise ValueError(f"message_passing: unsorted must be one of {UNSORTED}, got {unsorted!r}")
    if rowptr is not None and (rowptr.dtype not in IDX_DTYPES or tuple(rowptr.shape) != (num_nodes + 1,)):
        raise ValueError(f"message_passing: rowptr must be int32/int64 of shape ({num_nodes + 1},), got "
                         f"{rowptr.dtype} {tuple(rowptr.shape)}")
    if (x.shape[1] + 31) // 32 > 65535 or x.shape[0] >= 2**31:
        raise ValueError(f"message_passing: x of shape {tuple(x.shape)} is too large (N < 2**31, F < 2**21)")
    extra = {"rowptr": rowptr} if rowptr is not None else {}
    _on_one_cuda_device("message_passing", x=x, src=src, dst=dst, w=w, **extra)
    _contiguous("message_passing", x=x, src=src, dst=dst, w=w, **extra)
    if w.dtype != torch.float32 and w.dtype != x.dtype:
        w = w.float()
    ops = _ops()
    if rowptr is not None:
        # The kernel reads rowptr in src's index type: int32 when the edge count fits, else both widened.
        if src.dtype == torch.int32 and src.numel() < 2**31:
            rowptr = rowptr.to(torch.int32)
        else:
            src, rowptr = src.long(), rowptr.long()
        return ops.message_passing_csr(x, src, w, rowptr, num_nodes, aggr == "mean")
    if unsorted == "linked" and src.numel() < 2**31 and num_nodes < 2**29:
        return ops.message_passing_linked(x, src, dst, w, num_nodes, aggr == "mean")
    return ops.message_passing_coo(x, src, dst, w, num_nodes, aggr == "mean")


# ---- a variant checked in a child process ----------------------------------------------------------------------

_CHILD_CHECK = """
import sys, torch
from engine.kernels import cuda_levels as cl
variant, head_dim, failed, checked = int(sys.argv[1]), int(sys.argv[2]), 0, 0
for dtype in (torch.bfloat16, torch.float16):
    if variant not in cl.attention_variants(dtype, head_dim):
        continue
    for S in (1, 17, 128, 200, 300, 1024):
        for causal in (False, True):
            q, k, v = (torch.randn(2, 3, S, head_dim, device="cuda").to(dtype) for _ in range(3))
            err = cl._rel_l2(cl._attention_variant(q, k, v, causal, None, variant), cl._ref_attention(q, k, v, causal))
            ok = err < cl.ATTN_TOL[dtype]
            failed, checked = failed + (not ok), checked + 1
            print(f"{str(dtype)[6:]:>8} S={S:<5} causal={causal!s:<5} rel L2 {err:.2e} {'ok' if ok else 'FAIL'}",
                  flush=True)
if not checked:
    print(f"variant {variant} is not built here for D = {head_dim} (it needs a compute capability 9.0 GPU)")
sys.exit(1 if failed or not checked else 0)
"""


def check_variant_in_child(variant: int, timeout_s: float = 300.0, head_dim: int = 128) -> tuple[bool, str]:
    """Run attention `variant` at `head_dim` on small ragged shapes (S 1 … 1024, causal or not, bf16 and fp16) in a
    child process and compare it with float64. Returns (passed, report): a wrong result, a fault or no answer within
    timeout_s (a deadlocked kernel) fails with the child's output and why, and this process stays usable."""
    import sys

    from engine.native.toolchain import with_libstdcxx_preloaded

    env = with_libstdcxx_preloaded(dict(os.environ))
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD_CHECK, str(variant), str(head_dim)], env=env,
                              capture_output=True, text=True, timeout=timeout_s, cwd=str(native.REPO_ROOT))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return False, out + f"variant {variant}: no answer within {timeout_s:g} s (a hang: the child was killed)"
    report = done.stdout + (done.stderr[-2000:] if done.returncode else "")
    if done.returncode < 0:
        report += f"variant {variant}: the child died on signal {-done.returncode}"
    return done.returncode == 0, report


# ---- float64 references and the error measure (tests, benchmarks/cuda_levels_gpu.py) --------------------------------

def _rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out has a NaN/inf (a poisoned element never written)."""
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return math.inf
    return float(torch.linalg.vector_norm(out64 - ref64) / torch.linalg.vector_norm(ref64).clamp_min(1e-300))


def _ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: float | None = None) -> torch.Tensor:
    q64, k64, v64 = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        S = q.shape[-2]
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64


def _ref_patch_embed(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cls: torch.Tensor,
                     pos: torch.Tensor, patch: int) -> torch.Tensor:
    conv = torch.nn.functional.conv2d(images.double(), weight.double(), bias.double().reshape(-1), stride=patch)
    tokens = conv.flatten(2).transpose(1, 2)  # (B, Np, E), patches row-major over the grid
    cls_row = cls.double().reshape(1, 1, -1).expand(images.shape[0], 1, -1)
    return torch.cat([cls_row, tokens], dim=1) + pos.double().reshape(1, tokens.shape[1] + 1, -1)


def _ref_message_passing(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor, num_nodes: int,
                         aggr: str = "sum") -> torch.Tensor:
    msg = x.double()[src.long()] * w.double()[:, None]
    out = torch.zeros(num_nodes, x.shape[1], dtype=torch.float64, device=x.device)
    out.index_add_(0, dst.long(), msg)
    if aggr == "mean":
        out = out / torch.bincount(dst.long(), minlength=num_nodes).clamp(min=1).double()[:, None]
    return out
