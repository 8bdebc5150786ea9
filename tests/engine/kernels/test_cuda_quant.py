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


@pytest.mark.sm90_offline
def test_it_builds_for_sm90a_with_products_on_the_tensor_cores(tmp_path):
    """No GPU needed: nvcc and ptxas for sm_90a, then the SASS of the norm-fused kernel with 8 warps, for each ring
    batch: 4 HMMA per group of 64 (a batch of that many groups, unrolled over the ring's slots), no I2F / I2FP among
    them (the codes become bf16 by bit operations: four LOP3s per mma, low and high nibbles of both rows), the codes
    copied by bulk copies (UBLKCP) waited on by mbarriers; no spills in any instantiation."""
    report, sass = offline_build("int4_gemv.cu", tmp_path, cuda_quant.SOURCE_DIR)
    kernels = re.findall(r"Compiling entry function '(\S*int4_gemv_kernel\S*)'.*?(\d+) bytes spill stores", report,
                         re.S)
    assert len(kernels) == 4 * len(cuda_quant.KSLICES) * len(cuda_quant.RING_BATCHES), report[-4000:]
    assert all(s == "0" for _, s in kernels), report[-4000:]
    for batch in cuda_quant.RING_BATCHES:
        code = _kernel_sass(sass, f"int4_gemv_kernelILi8ELi{batch}ELb1ELb0ELb0E")  # KSLICES 8, BATCH, NORM
        mma = [i for i, op in enumerate(code) if op.startswith("HMMA")]
        assert len(mma) == 4 * batch * cuda_quant.RING_SLOTS, (batch, len(mma))
        assert all(code[i].startswith("HMMA.16816.F32.BF16") for i in mma)
        loop = code[mma[0]:mma[-1] + 1]
        assert not [op for op in loop if op.startswith("I2F")]
        lop3 = [op for op in loop if op.startswith("LOP3.LUT") and "0xf000f" in op]
        assert len(lop3) >= 4 * len(mma) - 4  # per mma: low and high nibbles of both rows (the first may sit before)
        # on sm_90 the codes arrive by bulk copy (TMA) into the ring, a batch per instruction, not through registers
        assert any("UBLKCP.S.G" in op for op in code) and not any("LDGSTS" in op for op in code)
        assert any("SYNCS.PHASECHK" in op for op in code)  # each slot waited on by its mbarrier


@pytest.mark.parametrize("n,k,glu", [(16, 64, False), (38, 300, False), (38, 300, True), (200, 1000, True)])
def test_tile_order_puts_each_rows_codes_and_scales_where_the_kernel_reads_them(n: int, k: int, glu: bool) -> None:
    """tile_major on real packed weights (CPU): tile t's row i, group g is the weight row tile_rows names (gate j then
    up j with glu), its 8 words unchanged; its scale sits at [t, g, i % 8, i // 8]; rows past N are zeros."""
    _, qw, _, _ = _case(n, k)
    w = cuda_quant.tile_major(qw.q, qw.scales, k, glu=glu)
    rows = cuda_quant.tile_rows(n, glu)
    groups = -(-k // 64)
    tiles = rows.numel() // 16
    assert w.q.shape == (tiles, groups, 16, 8) and w.s.shape == (tiles, groups, 8, 2)
    words = qw.q.view(torch.int32)
    for t in range(tiles):
        for i in range(16):
            row = int(rows[t * 16 + i])
            if row == n:
                assert not w.q[t, :, i].any() and not w.s[t, :, i % 8, i // 8].any()
                continue
            if glu:
                j = t * 8 + i % 8
                assert row == (j if i < 8 else n // 2 + j)
            else:
                assert row == t * 16 + i
            assert torch.equal(w.q[t, :, i], words[row].view(groups, 8))
            assert torch.equal(w.s[t, :, i % 8, i // 8], qw.scales[row])
    assert sorted(set(rows.tolist()) - {n}) == list(range(n))  # every row once
    with pytest.raises(ValueError, match="even N"):
        cuda_quant.tile_major(qw.q[:n - 1], qw.scales[:n - 1], k, glu=True)  # every n here is even


# ---- with a GPU ---------------------------------------------------------------------------------------------------

def needs_kernel(test):
    """A GPU test: marked gpu, skipped without a CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not GPU, reason="needs a CUDA device")(test))


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


def test_a_products_block_is_the_tuned_one_else_the_default(monkeypatch) -> None:
    """What tune() measured for that product and device; else kslices(k) warps and 4-group batches."""
    monkeypatch.setattr(cuda_quant, "_TUNED", {(22016, 4096, True, 0): (8, 8)})
    assert cuda_quant.block(22016, 4096, True, torch.device("cuda", 0)) == (8, 8)
    assert cuda_quant.block(22016, 4096, True, torch.device("cuda", 1)) == (16, 4)  # tuned on another device
    assert cuda_quant.block(3072, 2048, False, torch.device("cuda", 0)) == (8, 4)
    assert cuda_quant.block(2048, 1000, False, torch.device("cuda", 0)) == (4, 4)


@needs_kernel
@pytest.mark.parametrize("batch", cuda_quant.RING_BATCHES)
@pytest.mark.parametrize("ks", cuda_quant.KSLICES)
@pytest.mark.parametrize("fusion", ["", "norm", "glu", "add"])
@pytest.mark.parametrize("n,k", [(16, 64), (38, 300), (130, 1000), (4096 + 48, 4096), (200, 11008)])
def test_every_fusion_and_block_matches_float64(built, n: int, k: int, fusion: str, ks: int, batch: int) -> None:
    """Ragged N (not a multiple of the 16-row tile; glu: outputs not a multiple of 8) and K (a last group shorter than
    64), K slices that leave some warps without groups (K = 64 with 16 warps) or a batch part-filled, either ring
    batch, outputs bf16 (2^-9 rounding)."""
    x, qw, g, r = _case(n, k)
    dev = [t.cuda() for t in (x, qw.q, qw.scales, g, r)]
    xc, q, s, gc, rc = dev
    w = cuda_quant.tile_major(q, s, k, glu=fusion == "glu")
    y = cuda_quant.int4_gemv(xc, w, gc if fusion in ("norm", "glu") else None, 1e-5, rc if fusion == "add" else None,
                             ks=ks, batch=batch)
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
        w = cuda_quant.tile_major(quant.pack_int4(codes).cuda(), torch.full((n, 4), 0.5, dtype=torch.bfloat16).cuda(),
                                  features)
        y = cuda_quant.int4_gemv(x.cuda(), w).cpu()
        expected = torch.zeros(n)
        expected[row] = 5 * 0.5 * 3.0
        assert torch.equal(y.float(), expected), (row, y.nonzero().tolist())


@needs_kernel
def test_the_decode_steps_int4_products_take_it_once_tiles_are_attached(built, monkeypatch) -> None:
    """The triton-int4-wo step's fused products (gemv.FusedDecodeOps, what the decoder calls) run this kernel for one
    bf16 row once engine.llm.quant.attach_int4_tiles gave the projections their tile-order codes (gate_up's paired:
    with cuda, and with auto on sm_90 from K = 2048), and the Triton kernel without them; all three products within
    bf16 rounding of float64."""
    from engine.kernels.triton.gemv import FusedDecodeOps

    k = 2048
    x, gate_up, g, _ = _case(256, k)
    _, o, _, r = _case(96, k, seed=1)
    model = torch.nn.Module()
    model.gate_up_proj = quant.QuantLinear(gate_up, "triton").cuda()
    model.o_proj = quant.QuantLinear(o, "triton").cuda()
    xc, gc, rc = x.cuda()[None], g.cuda(), r.cuda()
    refs = {"glu": _reference(x, gate_up, "glu", g, r), "norm": _reference(x, o, "norm", g, r),
            "add": _reference(x, o, "add", g, r)}

    def run() -> dict:
        return {"glu": FusedDecodeOps.norm_swiglu(xc, gc, 1e-5, model.gate_up_proj)[0],
                "norm": FusedDecodeOps.norm_linear(xc, gc, 1e-5, model.o_proj)[0],
                "add": FusedDecodeOps.linear_add(xc, model.o_proj, rc[None])[0]}

    calls = []
    real = cuda_quant.int4_gemv
    monkeypatch.setattr(cuda_quant, "int4_gemv", lambda *a, **kw: calls.append(a[1].glu) or real(*a, **kw))
    via_triton = run()
    assert calls == []
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "auto")
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    assert quant.attach_int4_tiles(model) == ((2, 0) if sm90 else (0, 0))  # auto: K >= 2048 on sm_90 only
    for proj in (model.gate_up_proj, model.o_proj):
        proj.tile_q = proj.tile_s = None  # back to the Triton kernel for the next step
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "cuda")
    assert quant.attach_int4_tiles(model) == (2, 0) and model.gate_up_proj.tile_glu and not model.o_proj.tile_glu
    via_cuda = run()
    assert calls == [True, False, False]
    for got in (via_triton, via_cuda):
        for fusion, y in got.items():
            assert float((y.double().cpu() - refs[fusion]).norm() / refs[fusion].norm()) < 8e-3, fusion


@needs_kernel
def test_tuning_times_every_block_once_per_product_and_the_op_then_runs_the_fastest(built, monkeypatch) -> None:
    """tune() on two products (one glu) times all 6 blocks each, keeps the fastest per (n, k, glu, device) where it
    beats the untuned block by MIN_GAIN, skips a product it has seen; the op's default block is then that one
    (the kernel called with it, output held to float64)."""
    monkeypatch.setattr(cuda_quant, "_TUNED", {})
    monkeypatch.setattr(cuda_quant, "_TIMES", {})
    x, qw, g, _ = _case(512, 4096)
    plain = cuda_quant.tile_major(qw.q.cuda(), qw.scales.cuda(), 4096)
    glu = cuda_quant.tile_major(qw.q.cuda(), qw.scales.cuda(), 4096, glu=True)
    lines = cuda_quant.tune([plain, glu, plain], replays=3)
    assert len(lines) == 2 and lines[1].startswith("512×4096 glu: ")
    for w in (plain, glu):
        times = cuda_quant._TIMES[(512, 4096, w.glu, 0)]
        assert len(times) == 6 and all(t > 0 for t in times.values())
        fastest, untuned = min(times, key=times.get), (cuda_quant.kslices(4096), 4)
        kept = fastest if times[fastest] <= (1 - cuda_quant.MIN_GAIN) * times[untuned] else untuned
        assert cuda_quant.block(512, 4096, w.glu, x.cuda().device) == kept
    assert cuda_quant.tune([plain]) == []  # already tuned
    y = cuda_quant.int4_gemv(x.cuda(), glu, g.cuda(), 1e-5)
    ref = _reference(x, qw, "glu", g, None)
    assert float((y.double().cpu() - ref).norm() / ref.norm()) < 8e-3


@needs_kernel
def test_tuning_without_memory_for_the_copies_keeps_the_untuned_block_and_says_so(built, monkeypatch) -> None:
    monkeypatch.setattr(cuda_quant, "_TUNED", {})
    _, qw, _, _ = _case(256, 2048)
    w = cuda_quant.tile_major(qw.q.cuda(), qw.scales.cuda(), 2048)

    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(cuda_quant, "TileWeight", no_memory)
    (line,) = cuda_quant.tune([w])
    assert line.startswith("256×2048: not tuned, no memory for") and "untuned 8 warps × 4-group" in line
    assert cuda_quant._TUNED == {} and cuda_quant.block(256, 2048, False, torch.device("cuda", 0)) == (8, 4)


@needs_kernel
def test_bad_input_is_refused_by_the_op(built) -> None:
    x, qw, g, _ = _case(32, 128)
    w = cuda_quant.tile_major(qw.q.cuda(), qw.scales.cuda(), 128)
    with pytest.raises(ValueError, match="x has 64 features, the weight 128"):
        cuda_quant.int4_gemv(x.cuda()[:64], w)
    with pytest.raises(ValueError, match="kslices"):
        cuda_quant.int4_gemv(x.cuda(), w, ks=3)
    with pytest.raises(ValueError, match="batch must be one of"):
        cuda_quant.int4_gemv(x.cuda(), w, batch=6)
    with pytest.raises(ValueError, match="one CUDA device"):
        cuda_quant.int4_gemv(x.cuda(), cuda_quant.tile_major(qw.q, qw.scales, 128))



def test_a_weight_not_in_tile_order_is_refused_before_the_library_is_touched(monkeypatch) -> None:
    """The C++ side checks the layout too (a throw there once killed the process: csrc/quant/bindings.cpp); the
    Python check comes first (CPU tensors: each refusal is the layout's, reached before the device check)."""
    monkeypatch.setattr(cuda_quant, "load", lambda: pytest.fail("the library was loaded for a refused input"))
    x, qw, g, _ = _case(32, 128)
    w = cuda_quant.tile_major(qw.q, qw.scales, 128)
    row = x.reshape(-1)
    as_glu = cuda_quant.TileWeight(w.q, w.s, 64, 128, True)  # 32 gate and 32 up rows need 4 tiles, not 2
    cases = {
        "codes (3, 2, 16, 8)": cuda_quant.TileWeight(w.q, w.s, 48, 128, False),  # another layer's N
        "int32 codes (2, 2, 16, 8)": cuda_quant.TileWeight(w.q.view(torch.uint8), w.s, 32, 128, False),
        "scales (2, 2, 8, 2)": cuda_quant.TileWeight(w.q, w.s.float(), 32, 128, False),
        "(4, 2, 16, 8) and bfloat16 scales (4, 2, 8, 2) for N = 64 with glu": as_glu,
        "contiguous": cuda_quant.TileWeight(w.q.transpose(0, 1).contiguous().transpose(0, 1), w.s, 32, 128, False),
    }
    for match, bad in cases.items():
        with pytest.raises(ValueError, match=re.escape(match)):
            cuda_quant.int4_gemv(row, bad, g if bad.glu else None, 1e-5, ks=8, batch=4)
    with pytest.raises(ValueError, match="one CUDA device"):  # the layout itself passes
        cuda_quant.int4_gemv(row, w, ks=8, batch=4)


def test_the_decode_step_says_which_int4_gemv_it_runs(monkeypatch) -> None:
    """$MODELAB_INT4_GEMV: triton keeps every product on the Triton kernel and says how to change it; auto (the
    default) or cuda where the kernel cannot run (here, without a GPU: or without nvcc) fall back to the Triton
    kernel with the reason — never an exception; a value it does not know is refused with the choices."""
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "triton")
    assert cuda_quant.ensure() == ("int4 GEMV: the Triton kernel ($MODELAB_INT4_GEMV=triton; auto or cuda take the "
                                   "tensor-core one)")
    assert not cuda_quant.wanted() and not cuda_quant.takes(8192)
    monkeypatch.setattr(cuda_quant, "available", lambda: "needs a CUDA device")
    for value in ("cuda", "auto"):
        monkeypatch.setenv(cuda_quant.IMPL_ENV, value)
        assert cuda_quant.ensure() == ("int4 GEMV: the Triton kernel (the tensor-core kernel csrc/quant/int4_gemv.cu: "
                                       "needs a CUDA device)")
    # auto where no product of the model takes the kernel (here: no H100; K = 1024): nothing built, said so
    monkeypatch.setattr(cuda_quant, "available", lambda: pytest.fail("built although no product takes it"))
    monkeypatch.setattr(cuda_quant, "takes", lambda k, device=None: k >= cuda_quant.AUTO_MIN_K)  # as on an H100
    assert cuda_quant.ensure([1024, 1024]) == (
        "int4 GEMV: the Triton kernel ($MODELAB_INT4_GEMV=auto: the tensor-core kernel on compute capability 9.0 for "
        "products of K >= 2048 inputs, the Triton one else; none of this model's products here)")
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "tensor-cores")
    with pytest.raises(ValueError, match="MODELAB_INT4_GEMV='tensor-cores': choose one of auto, cuda, triton"):
        cuda_quant.ensure()


def test_the_mode_notes_which_int4_gemv_runs_and_copies_nothing_where_none_takes_it(monkeypatch) -> None:
    """engine.llm.quant.use_tensor_core_int4 (what triton-int4-wo's prepare calls on CUDA) on a real int4 projection:
    where no product takes the kernel (auto without an H100 here, or triton) one note and no tile-order copy."""
    model = torch.nn.Module()
    model.down_proj = quant.QuantLinear(_case(32, 4096)[1], "triton")
    monkeypatch.setattr(cuda_quant, "takes", lambda k, device=None: False)  # as auto on another GPU
    for value, says in (("auto", "none of this model's products here"), ("triton", "$MODELAB_INT4_GEMV=triton")):
        monkeypatch.setenv(cuda_quant.IMPL_ENV, value)
        (note,) = quant.use_tensor_core_int4(model, "cuda")
        assert note.startswith("int4 GEMV: the Triton kernel (") and says in note, note
        assert getattr(model.down_proj, "tile_q", None) is None


def test_a_tile_copy_is_made_only_where_it_leaves_the_device_its_reserve() -> None:
    """The copy and tile_major's temporary (twice its bytes) must leave 2 GiB, or a tenth of a large device."""
    gib = 1 << 30
    assert quant.tile_copy_fits(1 * gib, free=5 * gib, total=80 * gib) is False  # 3 GiB left < 8 GiB (a tenth)
    assert quant.tile_copy_fits(1 * gib, free=10 * gib, total=80 * gib) is True  # 8 GiB left
    assert quant.tile_copy_fits(100 << 20, free=2 * gib + (200 << 20), total=16 * gib) is True  # 2 GiB left
    assert quant.tile_copy_fits(100 << 20, free=2 * gib + (199 << 20), total=16 * gib) is False


@pytest.mark.gpu
def test_auto_takes_the_tensor_core_kernel_only_where_it_was_measured_faster(monkeypatch) -> None:
    """auto (also when unset or empty): K >= 2048 on compute capability 9.0 only (the H100 rule); cuda: every K;
    triton: none."""
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    for value in (None, "", "auto", " AUTO "):
        if value is None:
            monkeypatch.delenv(cuda_quant.IMPL_ENV, raising=False)
        else:
            monkeypatch.setenv(cuda_quant.IMPL_ENV, value)
        assert cuda_quant.impl() == "auto"
        assert cuda_quant.takes(2048) == cuda_quant.takes(4096) == cuda_quant.takes(11008) == hopper
        assert not cuda_quant.takes(1024) and not cuda_quant.takes(2047)
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "cuda")
    assert cuda_quant.takes(64) and cuda_quant.takes(2048)
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "triton")
    assert not cuda_quant.takes(11008)
