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
    """No GPU needed: nvcc and ptxas for sm_90a, then the SASS of the norm-fused kernel with 8 warps, for each ring
    batch: 4 HMMA per group of 64 (a batch of that many groups, unrolled over the ring's slots), no I2F / I2FP among
    them (the codes become bf16 by bit operations: four LOP3s per mma, low and high nibbles of both rows), the codes
    copied by bulk copies (UBLKCP) waited on by mbarriers; no spills in any instantiation. The MLP in one kernel:
    more HMMA than its gate_up loop alone has (down's products), its sums leaving by fp32 atomic adds."""
    report, sass = offline_build("int4_gemv.cu", tmp_path, cuda_quant.SOURCE_DIR)
    kernels = re.findall(r"Compiling entry function '(\S*int4_gemv_kernel\S*)'.*?(\d+) bytes spill stores", report,
                         re.S)
    # four fusions at every block, and the MLP in one kernel (int4_mlp) at its blocks
    want = (4 * len(cuda_quant.KSLICES) + len(cuda_quant.MLP_KSLICES)) * len(cuda_quant.RING_BATCHES)
    assert len(kernels) == want, report[-4000:]
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
    for ks in cuda_quant.MLP_KSLICES:  # the MLP: down's products on the tensor cores too, added by reductions
        code = _kernel_sass(sass, f"int4_gemv_kernelILi{ks}ELi4ELb1ELb0ELb1ELb1E")
        adds = [op for op in code if ".ADD.F32" in op and ("RED" in op or "ATOM" in op)]
        # down's sums leave by fp32 atomic adds whose old value nobody reads (a RED, or an ATOM into RZ: ptxas's
        # form before the fence the last-block count needs)
        assert adds and all("RED" in op or "PT, RZ," in op for op in adds), adds
        assert sum(op.startswith("HMMA.16816.F32.BF16") for op in code) > 4 * 4 * cuda_quant.RING_SLOTS


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


def test_group_order_puts_each_groups_tiles_together_for_the_mlp() -> None:
    """group_major (CPU): down's codes and scales of group g, tile t are tile_major's [t, g] — the same 16 rows' words
    and scales — so a block's unit reads its group of every row as one run; the MLP's argument checks refuse a
    gate_up without whole groups of 64 features, a down in tile order or of another K, before any launch."""
    n, k = 40, 200  # ragged: tiles past N, a last group shorter than 64
    _, qw, _, _ = _case(n, k)
    tiles = cuda_quant.tile_major(qw.q, qw.scales, k)
    groups = cuda_quant.group_major(qw.q, qw.scales, k)
    assert groups.by_group and not tiles.by_group and (groups.n, groups.k) == (n, k)
    assert groups.q.shape == (4, 3, 16, 8) and groups.s.shape == (4, 3, 8, 2) and groups.q.is_contiguous()
    for g in range(4):
        for t in range(3):
            assert torch.equal(groups.q[g, t], tiles.q[t, g]) and torch.equal(groups.s[g, t], tiles.s[t, g])
    _, gu, _, _ = _case(2 * 128, 64)
    gate_up = cuda_quant.tile_major(gu.q, gu.scales, 64, glu=True)
    _, dw, _, _ = _case(64, 128)
    down = cuda_quant.group_major(dw.q, dw.scales, 128)
    x, g = torch.zeros(64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    scratch = cuda_quant.mlp_scratch(64, "cpu")
    assert not scratch[0].any() and scratch[0].dtype == torch.float32 and scratch[1].tolist() == [0]
    with pytest.raises(ValueError, match="multiple of 64"):
        _, odd, _, _ = _case(2 * 96, 64)
        cuda_quant.int4_mlp(x, cuda_quant.tile_major(odd.q, odd.scales, 64, glu=True), down, g, 1e-5, scratch)
    with pytest.raises(ValueError, match="group_major"):
        cuda_quant.int4_mlp(x, gate_up, cuda_quant.tile_major(dw.q, dw.scales, 128), g, 1e-5, scratch)
    with pytest.raises(ValueError, match="64 x 128"):  # down's N must be gate_up's K (the residual is x)
        _, wide, _, _ = _case(80, 128)
        cuda_quant.int4_mlp(x, gate_up, cuda_quant.group_major(wide.q, wide.scales, 128), g, 1e-5, scratch)
    with pytest.raises(ValueError, match="ks must be one of"):
        cuda_quant.int4_mlp(x, gate_up, down, g, 1e-5, scratch, ks=4)
    with pytest.raises(ValueError, match="one CUDA device"):  # on the CPU: the device check, after the shapes'
        cuda_quant.int4_mlp(x, gate_up, down, g, 1e-5, scratch)


def test_the_one_kernel_mlp_is_attached_only_when_asked_for_and_where_it_applies(monkeypatch) -> None:
    """$MODELAB_INT4_MLP (off by default; anything but on/off refused with the choices). With it on,
    attach_int4_mlp (CPU tensors here: tile copies made by hand) gives an MLP whose gate_up and down hold tile-order
    codes down's group-order copy in place of its tile copy and a zero scratch, and leaves alone an MLP without tile
    copies or whose features are not whole groups of 64."""
    monkeypatch.delenv(cuda_quant.MLP_ENV, raising=False)
    assert not cuda_quant.mlp_wanted()
    monkeypatch.setenv(cuda_quant.MLP_ENV, "yes")
    with pytest.raises(ValueError, match="choose one of off, on"):
        cuda_quant.mlp_wanted()

    def mlp(dim: int, ffn: int, tiles: bool) -> torch.nn.Module:
        m = torch.nn.Module()
        _, gu, _, _ = _case(2 * ffn, dim)
        _, dw, _, _ = _case(dim, ffn, seed=1)
        m.gate_up_proj, m.down_proj = quant.QuantLinear(gu, "triton"), quant.QuantLinear(dw, "triton")
        if tiles:
            for proj, glu in ((m.gate_up_proj, True), (m.down_proj, False)):
                w = cuda_quant.tile_major(proj.q, proj.scales, proj.in_features, glu=glu)
                proj.register_buffer("tile_q", w.q)
                proj.register_buffer("tile_s", w.s)
                proj.tile_glu = glu
        return m

    model = torch.nn.Module()
    model.a, model.b, model.c = mlp(64, 128, True), mlp(64, 96, True), mlp(64, 128, False)
    monkeypatch.setenv(cuda_quant.MLP_ENV, "off")
    assert quant.attach_int4_mlp(model) == 0 and model.a.down_proj.tile_q is not None
    monkeypatch.setenv(cuda_quant.MLP_ENV, "on")
    assert quant.attach_int4_mlp(model) == 1
    down = model.a.down_proj
    assert getattr(down, "tile_q", None) is None and "tile_q" not in dict(down.named_buffers())
    want = cuda_quant.group_major(down.q, down.scales, 128)
    assert torch.equal(down.mlp_q, want.q) and torch.equal(down.mlp_s, want.s)
    assert down.mlp_acc.shape == (64,) and not down.mlp_acc.any() and down.mlp_done.tolist() == [0]
    for other in (model.b, model.c):  # 96 features: not whole groups of 64; c: no tile copies
        assert getattr(other.down_proj, "mlp_q", None) is None


def test_the_decoders_mlp_takes_the_one_op_and_its_pair_gives_the_same_step() -> None:
    """The fused decoder's MLP calls FusedDecodeOps.mlp (its residual is its input) — once per layer and step — and
    without a one-kernel MLP attached that op is the pair the decoder called before: the same logits, bit for bit, as
    ops that offer no mlp (the decoder then calls norm_swiglu and linear_add itself)."""
    from engine.kernels.triton import gemv
    from engine.workloads.llama import build_model, preset

    cfg = preset("tiny")
    model = build_model(cfg, "cpu", torch.float32, seed=5).eval()
    model.fuse_projections()
    calls = []

    class Counting(gemv.FusedDecodeOps):
        @staticmethod
        def mlp(*args):
            calls.append(1)
            return gemv.FusedDecodeOps.mlp(*args)

    class WithoutMlp:
        norm_linear = staticmethod(gemv.FusedDecodeOps.norm_linear)
        norm_swiglu = staticmethod(gemv.FusedDecodeOps.norm_swiglu)
        linear_add = staticmethod(gemv.FusedDecodeOps.linear_add)

    tokens = torch.randint(0, cfg.vocab, (1, 6), generator=torch.Generator().manual_seed(2))
    outs = []
    for ops in (Counting, WithoutMlp):
        model.set_fused_ops(ops)
        model.setup_cache(1, 16)
        with torch.no_grad():
            model.forward_cached(tokens, torch.arange(6))
            outs.append(model.forward_cached(tokens[:, -1:], torch.tensor([6])))
    assert len(calls) == cfg.layers  # the one-row step only (the prefill's six rows take the modules)
    assert torch.equal(outs[0], outs[1])


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


def test_a_products_block_is_the_environments_then_the_tuned_then_the_default(monkeypatch) -> None:
    """$MODELAB_INT4_GEMV_TILE (KS,BATCH) wins; else what tune() measured for that product and device; else
    kslices(k) warps and 4-group batches. Bad values are refused with the choices."""
    monkeypatch.delenv(cuda_quant.TILE_ENV, raising=False)
    monkeypatch.setattr(cuda_quant, "_TUNED", {(22016, 4096, True, 0): (8, 8)})
    assert cuda_quant.block(22016, 4096, True, torch.device("cuda", 0)) == (8, 8)
    assert cuda_quant.block(22016, 4096, True, torch.device("cuda", 1)) == (16, 4)  # tuned on another device
    assert cuda_quant.block(3072, 2048, False, torch.device("cuda", 0)) == (8, 4)
    assert cuda_quant.block(2048, 1000, False, torch.device("cuda", 0)) == (4, 4)
    monkeypatch.setenv(cuda_quant.TILE_ENV, "16,8")
    assert cuda_quant.block(22016, 4096, True, torch.device("cuda", 0)) == (16, 8)
    for bad, match in (("16", "want two integers KS,BATCH"), ("12,4", "KS must be one of"), ("8,6", "BATCH one of")):
        monkeypatch.setenv(cuda_quant.TILE_ENV, bad)
        with pytest.raises(ValueError, match=match):
            cuda_quant.block(64, 64, False, torch.device("cuda", 0))


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
    monkeypatch.delenv(cuda_quant.TILE_ENV, raising=False)
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
    monkeypatch.delenv(cuda_quant.TILE_ENV, raising=False)
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


@needs_kernel
@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("dim,ffn,ks,batch", [(256, 512, 8, 4), (256, 512, 8, 8), (256, 512, 16, 4),
                                              (256, 512, 16, 8), (200, 320, 8, 4), (200, 320, 16, 8),
                                              (2048, 8192, 8, 4), (2048, 8192, 16, 8), (4096, 11008, 16, 4)])
def test_the_mlp_in_one_kernel_adds_what_the_two_products_give(built, dim: int, ffn: int, ks: int, batch: int,
                                                                 stage: bool) -> None:
    """int4_mlp against float64: x + down · h, h being the GLU product's own bf16 output at the same block (the one
    kernel computes h by the same code, then multiplies it by down's group in place of writing it), rounded to bf16
    once as the pair's down product with its residual rounds. Ragged: dim 200 (K's last group short, down's last tile
    part-filled), 5 units; the 1B's and 7B's shapes (128 and 172 units: more than some GPUs' SMs, so a block takes a
    second unit, whose group is staged while the first's is read). Down's group staged in shared memory (sm_90) or
    read from global memory. The scratch is left zero, so a second call (as a graph replay) gives the same y."""
    x, gu, g, _ = _case(2 * ffn, dim)
    _, dw, _, _ = _case(dim, ffn, seed=1)
    xc, gc = x.cuda(), g.cuda()
    gate_up = cuda_quant.tile_major(gu.q.cuda(), gu.scales.cuda(), dim, glu=True)
    down = cuda_quant.group_major(dw.q.cuda(), dw.scales.cuda(), ffn)
    h = cuda_quant.int4_gemv(xc, gate_up, gc, 1e-5, ks=ks, batch=batch)
    want = x.double() + quant.dequantize(dw, torch.float64) @ h.double().cpu()
    scratch = cuda_quant.mlp_scratch(dim, "cuda")
    y = cuda_quant.int4_mlp(xc, gate_up, down, gc, 1e-5, scratch, ks=ks, batch=batch, stage=stage)
    assert y.shape == (dim,) and y.dtype == torch.bfloat16
    err = float((y.double().cpu() - want).norm() / want.norm())
    assert err < 8e-3, err  # bf16 output (2^-9); a misplaced code, unit or tile: O(1)
    assert not scratch[0].any() and scratch[1].item() == 0, "the last block leaves the scratch zero"
    again = cuda_quant.int4_mlp(xc, gate_up, down, gc, 1e-5, scratch, ks=ks, batch=batch, stage=stage)
    assert float((again.double() - y.double()).norm() / y.double().norm()) < 1e-3  # fp32 sums in another order


@needs_kernel
def test_the_mlp_reads_each_down_code_where_the_group_order_puts_it(built) -> None:
    """Down's codes all 8 (value 0) but one, in each unit in turn (its feature of largest |h|, h the GLU product's
    output): y is x plus that one weight times h in that one row and x elsewhere (up to bf16 rounding and the fp32
    rounding of the 136 · Σh the kernel subtracts per row), so a code read from another row, column or unit shows."""
    dim, ffn = 64, 256
    x, gu, g, _ = _case(2 * ffn, dim)
    gate_up = cuda_quant.tile_major(gu.q.cuda(), gu.scales.cuda(), dim, glu=True)
    h = cuda_quant.int4_gemv(x.cuda(), gate_up, g.cuda(), 1e-5).cpu().double()
    for unit, row in enumerate((0, 9, 33, 63)):
        col = 64 * unit + int(h[64 * unit:64 * unit + 64].abs().argmax())
        codes = torch.full((dim, ffn), 8, dtype=torch.uint8)
        codes[row, col] = 13  # 5 · scale
        down = cuda_quant.group_major(quant.pack_int4(codes).cuda(), torch.full((dim, 4), 0.5, dtype=torch.bfloat16)
                                      .cuda(), ffn)
        y = cuda_quant.int4_mlp(x.cuda(), gate_up, down, g.cuda(), 1e-5, cuda_quant.mlp_scratch(dim, "cuda"))
        want = x.double()
        want[row] += 2.5 * h[col]
        err = float((y.cpu().double() - want).abs().max())
        tol = 1e-2 * abs(2.5 * float(h[col])) + 2 ** -8 * float(want.abs().max())  # the products; y's bf16
        assert err <= tol, (unit, row, col, err, tol)


@needs_kernel
def test_the_decode_steps_mlp_runs_as_one_kernel_when_asked_for(built, monkeypatch) -> None:
    """With $MODELAB_INT4_MLP=on, once attach_int4_tiles and attach_int4_mlp have run, FusedDecodeOps.mlp (what the
    decoder's MLP calls) runs int4_mlp once and gives what the pair of tensor-core products gave before (both bf16,
    their fp32 sums in other orders), twice in a row (the scratch left zero)."""
    from engine.kernels.triton.gemv import FusedDecodeOps

    dim, ffn = 2048, 1024
    x, gu, g, _ = _case(2 * ffn, dim)
    _, dw, _, _ = _case(dim, ffn, seed=1)
    model = torch.nn.Module()
    model.gate_up_proj = quant.QuantLinear(gu, "triton").cuda()
    model.down_proj = quant.QuantLinear(dw, "triton").cuda()
    monkeypatch.setenv(cuda_quant.IMPL_ENV, "cuda")
    assert quant.attach_int4_tiles(model) == (2, 0)
    xc, gc = x.cuda()[None], g.cuda()
    pair = FusedDecodeOps.mlp(xc, gc, 1e-5, model.gate_up_proj, model.down_proj)
    monkeypatch.setenv(cuda_quant.MLP_ENV, "on")
    assert quant.attach_int4_mlp(model) == 1
    calls = []
    real = cuda_quant.int4_mlp
    monkeypatch.setattr(cuda_quant, "int4_mlp", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for _ in range(2):
        one = FusedDecodeOps.mlp(xc, gc, 1e-5, model.gate_up_proj, model.down_proj)
        assert one.shape == pair.shape and one.dtype == torch.bfloat16
        assert float((one.double() - pair.double()).norm() / pair.double().norm()) < 8e-3
    assert len(calls) == 2
