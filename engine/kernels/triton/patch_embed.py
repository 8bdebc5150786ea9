"""Fused ViT patch embedding in Triton (Kernel Levels, L4), kernel and plain-torch check side by side.

tokens[b, 0]     = cls + pos[0]
tokens[b, 1 + p] = sum_{c,ky,kx} weight[e, c, ky, kx] * images[b, c, py*P + ky, px*P + kx] + bias[e] + pos[1 + p]
(p = py * (Wi/P) + px, row-major over the patch grid) -- i.e. Conv2d(stride=P) -> flatten -> cat cls -> + pos.

How it works: one GEMM, tokens = A @ W^T with M = B*Np patch rows, N = E, K = C*P*P.
- A (the im2col matrix) is never materialised: each A tile is gathered straight from the image. For a patch row m and
  a K index k = (c, ky, kx), the address is  row_base(m) + c*Hi*Wi + ky*Wi + kx, a row term plus a column term; along
  k the kx runs are P contiguous elements, so (P = 16, bf16) each thread loads 16-byte vectors and a warp's load
  covers whole 32-byte sectors; neighbouring patches (px, px+1) are neighbouring runs of one image row.
- W is the Conv2d weight viewed as (E, K) (its natural layout), read as K-major tiles and fed transposed to tl.dot.
- fp32 accumulation; the epilogue adds bias and the positional row, casts, and stores token row 1 + p; the programs
  whose tile holds an image's first patch also write that image's cls row (cls + pos[0]): one launch in all.
- tiles are autotuned on the GPU (keyed on M, E, K); the interpreter uses one small fixed config.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton._common import LaunchCache, check_device, is_interpreted

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP32_DOT = "tf32x3"  # float32 GEMMs: three TF32 tensor-core products, about fp32 accuracy (see attention.FP32_DOT)


@triton.jit
def _patch_embed_kernel(img, w, bias, cls, pos, out,
                        M, E, K, Np, Gw, Wi, img_b_stride, img_c_stride,
                        P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                        IDX64: tl.constexpr, DOT_PREC: tl.constexpr):
    # Grouped launch order: GROUP_M row tiles share each column tile while it is hot in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(E, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % group_size
    pid_n = (pid % (GROUP_M * num_n)) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < E
    b = offs_m // Np
    p = offs_m % Np
    py = p // Gw
    px = p % Gw
    if IDX64:
        b = b.to(tl.int64)
    a_row = b * img_b_stride + py * (P * Wi) + px * P  # top-left pixel of patch m in channel 0
    w_row = offs_n * K

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        c = offs_k // (P * P)
        r = offs_k % (P * P)
        a_col = c * img_c_stride + (r // P) * Wi + (r % P)
        a_ptrs = img + (a_row[:, None] + a_col[None, :])
        w_ptrs = w + (w_row[:, None] + offs_k[None, :])
        if EVEN_M and EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        if EVEN_N and EVEN_K:
            wt = tl.load(w_ptrs)
        else:
            wt = tl.load(w_ptrs, mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        acc = tl.dot(a, wt.T, acc, input_precision=DOT_PREC)

    # Epilogue: + bias + pos[1 + p], stored at token row 1 + p of image b.
    bias_v = tl.load(bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    tile_ok = m_ok[:, None] & n_ok[None, :]
    pos_v = tl.load(pos + (1 + p)[:, None] * E + offs_n[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    acc = acc + bias_v[None, :] + pos_v
    tok_row = b * (Np + 1) + 1 + p
    tl.store(out + tok_row[:, None] * E + offs_n[None, :], acc.to(out.dtype.element_ty), mask=tile_ok)

    # cls rows: the tile holding patch 0 of image b writes token row 0 of b (a masked store; all-false elsewhere).
    cls_v = tl.load(cls + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    pos0 = tl.load(pos + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    cls_tile = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32) + (cls_v + pos0)[None, :]
    tl.store(out + (b * (Np + 1))[:, None] * E + offs_n[None, :], cls_tile.to(out.dtype.element_ty),
             mask=tile_ok & (p == 0)[:, None])


_patch_embed = triton.heuristics({
    "EVEN_M": lambda a: a["M"] % a["BLOCK_M"] == 0,
    "EVEN_N": lambda a: a["E"] % a["BLOCK_N"] == 0,
    "EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0,
})(_patch_embed_kernel)


def _gpu_configs() -> list[triton.Config]:
    shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
        (128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3),
        (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 8, 3),
    ]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in shapes]


_patch_embed_tuned = triton.autotune(_gpu_configs(), key=["M", "E", "K"])(_patch_embed)
_LAUNCH = LaunchCache(_patch_embed_kernel)  # tuned launches after the first per key, without Triton's per-call Python

INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2}


def _check_inputs(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cls: torch.Tensor,
                  pos: torch.Tensor, patch: int) -> None:
    named = (("images", images), ("weight", weight), ("bias", bias), ("cls", cls), ("pos", pos))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"patch_embed: {name} must be a torch.Tensor, got {type(t).__name__}")
    if images.dtype not in DTYPES:
        raise ValueError(f"patch_embed: images dtype must be bfloat16, float16 or float32, got {images.dtype}")
    if weight.dtype != images.dtype:  # the GEMM operands share a dtype, as Conv2d requires
        raise ValueError(f"patch_embed: weight dtype {weight.dtype} differs from images dtype {images.dtype}")
    for name, t in named[2:]:  # epilogue terms are read as fp32 whatever they are stored in
        if t.dtype not in DTYPES:
            raise ValueError(f"patch_embed: {name} dtype must be bfloat16, float16 or float32, got {t.dtype}")
    if not isinstance(patch, int) or isinstance(patch, bool) or patch < 1:
        raise ValueError(f"patch_embed: patch must be a positive int, got {patch!r}")
    if images.dim() != 4:
        raise ValueError(f"patch_embed: images must be (B, C, Hi, Wi), got shape {tuple(images.shape)}")
    B, C, Hi, Wi = images.shape
    if Hi % patch or Wi % patch or Hi == 0 or Wi == 0:
        raise ValueError(f"patch_embed: image size {Hi}x{Wi} is not a positive multiple of patch {patch}")
    if weight.dim() != 4 or weight.shape[1:] != (C, patch, patch):
        raise ValueError(f"patch_embed: weight must be (E, {C}, {patch}, {patch}), got {tuple(weight.shape)}")
    E = weight.shape[0]
    n_patches = (Hi // patch) * (Wi // patch)
    if bias.shape != (E,) or cls.shape != (E,):
        raise ValueError(f"patch_embed: bias and cls must be ({E},), got {tuple(bias.shape)}, {tuple(cls.shape)}")
    if pos.shape != (1 + n_patches, E):
        raise ValueError(f"patch_embed: pos must be ({1 + n_patches}, {E}), got {tuple(pos.shape)}")


def _patch_embed_impl(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cls: torch.Tensor,
                      pos: torch.Tensor, patch: int, config: dict | None = None) -> torch.Tensor:
    """`patch_embed` with an optional fixed tile config (tests, benchmarks)."""
    _check_inputs(images, weight, bias, cls, pos, patch)
    check_device(_patch_embed_kernel, "patch_embed", images, weight, bias, cls, pos)
    images, weight, bias, cls, pos = (t.contiguous() for t in (images, weight, bias, cls, pos))
    B, C, Hi, Wi = images.shape
    E = weight.shape[0]
    gh, gw = Hi // patch, Wi // patch
    n_patches = gh * gw
    M, K = B * n_patches, C * patch * patch
    out = torch.empty(B, 1 + n_patches, E, dtype=images.dtype, device=images.device)
    if out.numel() == 0:
        return out
    interpreted = is_interpreted(_patch_embed_kernel)
    if interpreted and config is None:
        config = dict(INTERPRETER_CONFIG)

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(E, meta["BLOCK_N"]),)

    args = (images, weight, bias, cls, pos, out, M, E, K, n_patches, gw, Wi, C * Hi * Wi, Hi * Wi)
    meta = dict(P=patch, IDX64=max(images.numel(), out.numel()) >= 2**31,
                DOT_PREC=FP32_DOT if images.dtype == torch.float32 else None)
    if config is not None:
        cfg = dict(config)
        launch = {key: cfg.pop(key) for key in ("num_warps", "num_stages") if key in cfg}
        cfg.setdefault("GROUP_M", 8)
        _patch_embed[grid](*args, **meta, **cfg, **({} if interpreted else launch))
        return out
    key = (tuple(images.shape), images.dtype, tuple(weight.shape), bias.dtype, cls.dtype, pos.dtype,
           images.device.index, LaunchCache.aligned(images, weight, bias, cls, pos, out))
    tuned = None if interpreted else _LAUNCH.meta(key)
    if tuned is not None and _LAUNCH.launch(key, grid(tuned), *args):
        pass
    elif not interpreted and key not in _LAUNCH.entries:
        _LAUNCH.first(key, lambda: _patch_embed_tuned[grid](*args, **meta), len(args))
    else:
        _patch_embed_tuned[grid](*args, **meta)
    return out


def patch_embed(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cls: torch.Tensor,
                pos: torch.Tensor, patch: int) -> torch.Tensor:
    """ViT patch embedding: Conv2d(kernel=stride=patch) + flatten + cls token + positional embedding, in one kernel.

    images (B, C, Hi, Wi), weight (E, C, P, P), bias (E,), cls (E,), pos (1 + Np, E) with Np = (Hi/P)*(Wi/P).
    images and weight share one dtype (bfloat16/float16; float32 too, with 3xTF32 dots); bias, cls and pos may be
    any of those (added in fp32). Returns tokens (B, 1 + Np, E) in the images' dtype; fp32 accumulation.
    """
    return _patch_embed_impl(images, weight, bias, cls, pos, patch)


def _reference(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cls: torch.Tensor,
               pos: torch.Tensor, patch: int) -> torch.Tensor:
    """Plain torch in float64: conv -> (B, Np, E) -> cls row in front -> + pos. Returns float64."""
    x = torch.nn.functional.conv2d(images.double(), weight.double(), bias.double(), stride=patch)
    tokens = x.flatten(2).transpose(1, 2)  # (B, Np, E), patches row-major
    cls_rows = cls.double().expand(images.shape[0], 1, -1)
    return torch.cat([cls_rows, tokens], dim=1) + pos.double()
