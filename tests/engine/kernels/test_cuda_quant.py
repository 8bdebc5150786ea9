"""The tensor-core int4 GEMV (csrc/quant/int4_gemv.cu, engine/kernels/cuda_quant.py): without a GPU, its sm_90a build
read back as SASS (tensor-core products, no integer-to-float conversion, no spills); with one, every fusion and
block shape against float64 dequantize-then-matmul on ragged shapes, each code read where the layout puts it, and
the decode step's int4 products taking it when asked for (MODELAB_INT4_GEMV=cuda)."""

from __future__ import annotations

import re

import pytest
import torch
from test_cuda_levels import _kernel_sass, offline_build  # this folder is on sys.path (no __init__.py)

from engine.kernels import cuda_quant
from engine.llm import quant

GPU = torch.cuda.is_available()


def test_it_builds_for_sm90a_with_products_on_the_tensor_cores(tmp_path):
    """No GPU needed: nvcc and ptxas for sm_90a, then the SASS of the norm-fused kernel with 8 warps: 4 HMMA per
    group of 64 (a batch of 4 groups, unrolled over the ring's slots), no I2F / I2FP among them (the codes become
    bf16 by bit operations: four LOP3s per mma, low and high nibbles of both rows), the codes copied by cp.async
    (LDGSTS); no spills in any instantiation."""
    report, sass = offline_build("int4_gemv.cu", tmp_path, cuda_quant.SOURCE_DIR)
    kernels = re.findall(r"Compiling entry function '(\S*int4_gemv_kernel\S*)'.*?(\d+) bytes spill stores", report,
                         re.S)
    assert len(kernels) == 4 * len(cuda_quant.KSLICES) and all(s == "0" for _, s in kernels), report[-4000:]
    code = _kernel_sass(sass, "int4_gemv_kernelILi8ELb1ELb0ELb0E")  # KSLICES 8, NORM
    mma = [i for i, op in enumerate(code) if op.startswith("HMMA")]
    assert len(mma) == 16 * cuda_quant.RING_SLOTS and all(code[i].startswith("HMMA.16816.F32.BF16") for i in mma)
    loop = code[mma[0]:mma[-1] + 1]
    assert not [op for op in loop if op.startswith("I2F")]
    lop3 = [op for op in loop if op.startswith("LOP3.LUT") and "0xf000f" in op]
    assert len(lop3) >= 4 * len(mma) - 4  # per mma: low and high nibbles of both rows (the first may sit before)
    assert sum(op.startswith("LDGSTS") for op in code) >= 4  # the codes arrive by cp.async, not through registers


# ---- with a GPU ---------------------------------------------------------------------------------------------------

needs_kernel = pytest.mark.skipif(not GPU, reason="needs a CUDA device")


@pytest.fixture(scope="module")
def built():
    reason = cuda_quant.available()
    if reason:
        pytest.skip(f"tensor-core int4 GEMV not available here: {reason}")


def _case(n: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + n * 7 + k)
    x = torch.randn(k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    g = (1 + 0.5 * torch.randn(k, generator=gen)).bfloat16()
    r = torch.randn(n, generator=gen).bfloat16()
    return x, quant.quantize(w, "int4-wo"), g, r


def _reference(x, qw, fusion, g, r) -> torch.Tensor:
    w = quant.dequantize(qw, torch.float64)
    xd = x.double()
    if fusion in ("norm", "glu"):
        xd = xd * torch.rsqrt(xd.pow(2).mean() + 1e-5) * g.double()
    y = w @ xd
    if fusion == "add":
        y = y + r.double()
    if fusion == "glu":
        half = y.numel() // 2
        y = torch.nn.functional.silu(y[:half]) * y[half:]
    return y


@needs_kernel
@pytest.mark.parametrize("ks", cuda_quant.KSLICES)
@pytest.mark.parametrize("fusion", ["", "norm", "glu", "add"])
@pytest.mark.parametrize("n,k", [(16, 64), (38, 300), (130, 1000), (4096 + 48, 4096), (200, 11008)])
def test_every_fusion_and_block_matches_float64(built, n: int, k: int, fusion: str, ks: int) -> None:
    """Ragged N (not a multiple of the 16-row tile; glu: outputs not a multiple of 8) and K (a last group shorter than
    64), K slices that leave some warps without groups (K = 64 with 16 warps), outputs bf16 (2^-9 rounding)."""
    x, qw, g, r = _case(n, k)
    dev = [t.cuda() for t in (x, qw.q, qw.scales, g, r)]
    xc, q, s, gc, rc = dev
    words = q.view(torch.int32)
    y = cuda_quant.int4_gemv(xc, words, s, gc if fusion in ("norm", "glu") else None, 1e-5,
                             rc if fusion == "add" else None, fusion == "glu", ks=ks)
    ref = _reference(x, qw, fusion, g, r)
    assert y.shape == ref.shape and y.dtype == torch.bfloat16
    err = float((y.double().cpu() - ref).norm() / ref.norm())
    assert err < 8e-3, err


@needs_kernel
@pytest.mark.parametrize("k", [0, 1, 8, 9, 16, 31, 56, 63, 64, 127, 199])
def test_each_code_is_read_where_the_layout_puts_it(built, k: int) -> None:
    """Every code 8 (value 0) but one: the output is that weight times x[k] alone, in rows either half of a tile."""
    n, features = 24, 200
    for row in (1, 9, 17):
        codes = torch.full((n, features), 8, dtype=torch.uint8)
        codes[row, k] = 13  # 5 · scale
        x = torch.zeros(features, dtype=torch.bfloat16)
        x[k] = 3.0
        y = cuda_quant.int4_gemv(x.cuda(), quant.pack_int4(codes).cuda().view(torch.int32),
                                 torch.full((n, 4), 0.5, dtype=torch.bfloat16).cuda()).cpu()
        expected = torch.zeros(n)
        expected[row] = 5 * 0.5 * 3.0
        assert torch.equal(y.float(), expected), (row, y.nonzero().tolist())


@needs_kernel
def test_the_decode_steps_int4_products_take_it_once_loaded(built, monkeypatch) -> None:
    """quant_gemv.gemv_int4 (what the triton-int4-wo step calls) runs this kernel for one bf16 row with
    MODELAB_INT4_GEMV=cuda once the library is loaded, and the Triton kernel otherwise (the default); both within
    bf16 rounding of float64."""
    from engine.kernels.triton import quant_gemv as qg

    x, qw, g, r = _case(256, 2048)
    xc, q, s, gc = x.cuda(), qw.q.cuda(), qw.scales.cuda(), g.cuda()
    ref = _reference(x, qw, "glu", g, r)
    calls = []
    real = cuda_quant.int4_gemv
    monkeypatch.setattr(cuda_quant, "int4_gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "cuda")
    via_cuda = qg.norm_swiglu(xc[None], gc, 1e-5, q, s)[0]
    assert calls == [1]
    monkeypatch.delenv(cuda_quant.IMPL_ENV)
    via_triton = qg.norm_swiglu(xc[None], gc, 1e-5, q, s)[0]
    assert calls == [1]
    for y in (via_cuda, via_triton):
        assert float((y.double().cpu() - ref).norm() / ref.norm()) < 8e-3


@needs_kernel
def test_bad_input_is_refused_by_the_op(built) -> None:
    x, qw, g, _ = _case(32, 128)
    with pytest.raises(ValueError, match="int32 words"):
        cuda_quant.int4_gemv(x.cuda()[:64], qw.q.cuda().view(torch.int32), qw.scales.cuda())
    with pytest.raises(ValueError, match="kslices"):
        cuda_quant.int4_gemv(x.cuda(), qw.q.cuda().view(torch.int32), qw.scales.cuda(), ks=3)


def test_the_decode_step_says_which_int4_gemv_it_runs(monkeypatch) -> None:
    """By default the Triton kernel, said so with the switch that takes this one; asked for where it cannot run
    (here, without a GPU: or without nvcc), the Triton kernel with the reason — never an exception."""
    monkeypatch.delenv(cuda_quant.IMPL_ENV, raising=False)
    assert cuda_quant.ensure().startswith("int4 GEMV: the Triton kernel ($MODELAB_INT4_GEMV=cuda")
    assert not cuda_quant.wanted()
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "cuda")
    monkeypatch.setattr(cuda_quant, "available", lambda: "needs a CUDA device")
    assert cuda_quant.ensure() == ("int4 GEMV: the Triton kernel (the tensor-core kernel csrc/quant/int4_gemv.cu: "
                                   "needs a CUDA device)")
