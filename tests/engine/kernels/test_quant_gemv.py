"""The weight-only quantized Triton GEMVs (int8 / fp8 per channel, int4 in groups of 64) against float64
dequantize-then-matmul (interpreted on CPU; see conftest), on ragged shapes (K and N not multiples of the tile),
and their custom ops: several rows dequantized first, one row compiled without a graph break."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from engine.kernels.triton import quant_gemv as qg  # noqa: E402
from engine.kernels.triton._common import is_interpreted  # noqa: E402
from engine.llm import quant  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
if DEVICE == "cpu" and not is_interpreted(qg._wo_channel_kernel):
    pytest.skip("the quantized GEMV kernels were imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

# The reference dequantizes the same codes in float64, so only the fp32 summation order (and, in bf16, the rounded
# output) differs: the same bounds as the bf16 GEMV's test.
TOL = {torch.float32: 1e-6, torch.bfloat16: 8e-3}
SHAPES = [(37, 300), (130, 129), (5, 1000), (64, 256), (3, 65)]  # INTERPRETER_CONFIG: BLOCK_N 32, BLOCK_K 128


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double().cpu() - ref.cpu()).norm() / ref.cpu().norm())


def _quantized(scheme: str, n: int, k: int) -> tuple[torch.Tensor, quant.QuantWeight]:
    gen = torch.Generator().manual_seed(n * 1000 + k)
    x = torch.randn(1, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    return x, quant.quantize(w, scheme).to(DEVICE)


def _gemv(x: torch.Tensor, qw: quant.QuantWeight) -> torch.Tensor:
    return (qg.gemv_int4 if qw.scheme == "int4-wo" else qg.gemv_channel)(x, qw.q, qw.scales)


def _reference(x: torch.Tensor, qw: quant.QuantWeight) -> torch.Tensor:
    ref = qg._reference_int4 if qw.scheme == "int4-wo" else qg._reference_channel
    return ref(x.cpu(), qw.q.cpu(), qw.scales.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["int8-wo", "fp8-wo", "int4-wo"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_quantized_gemv_matches_float64_dequantize_then_matmul(scheme: str, n: int, k: int,
                                                               dtype: torch.dtype) -> None:
    x, qw = _quantized(scheme, n, k)
    x = x.to(DEVICE, dtype)
    y = _gemv(x, qw)
    assert y.shape == (1, n) and y.dtype == dtype
    assert rel_err(y, _reference(x, qw)) < TOL[dtype]
    assert _gemv(x[0], qw).shape == (n,)
    # the plain dequantization (engine.llm.quant) is the same function as the kernel's
    assert rel_err(y, torch.nn.functional.linear(x.double().cpu(), quant.dequantize(qw.to("cpu"), torch.float64))) \
        < TOL[dtype]


def test_int4_kernel_reads_every_group_scale() -> None:
    """A scale changed in one group of one row changes exactly that output (the kernel loads every group's scale,
    the ragged last one included)."""
    x, qw = _quantized("int4-wo", 9, 200)  # 4 groups: 64, 64, 64, 8
    base = _gemv(x.to(DEVICE), qw).cpu()
    for group in range(4):
        scales = qw.scales.clone()
        scales[2, group] *= 3
        changed = qg.gemv_int4(x.to(DEVICE), qw.q, scales).cpu()
        diff = (changed - base).abs().flatten() > 1e-6
        assert diff.tolist() == [i == 2 for i in range(9)], group
        assert rel_err(changed, qg._reference_int4(x, qw.q.cpu(), scales.cpu())) < 1e-6


def test_refuses_mismatched_shapes_and_codes() -> None:
    x, qw = _quantized("int8-wo", 16, 64)
    with pytest.raises(ValueError, match="one row"):
        qg.gemv_channel(torch.randn(2, 64, device=DEVICE), qw.q, qw.scales)
    with pytest.raises(ValueError, match="does not match"):
        qg.gemv_channel(torch.randn(1, 63, device=DEVICE), qw.q, qw.scales)
    with pytest.raises(ValueError, match="scales"):
        qg.gemv_channel(x.to(DEVICE), qw.q, qw.scales[:-1])
    with pytest.raises(ValueError, match="int8 or float8"):
        qg.gemv_channel(x.to(DEVICE), qw.q.view(torch.uint8), qw.scales)
    _, q4 = _quantized("int4-wo", 16, 64)
    with pytest.raises(ValueError, match="packed int4"):
        qg.gemv_int4(torch.randn(1, 66, device=DEVICE), q4.q, q4.scales)
    with pytest.raises(ValueError, match="int4 scales"):
        qg.gemv_int4(x.to(DEVICE), q4.q, q4.scales[:, :0])


@pytest.mark.parametrize("scheme", ["int8-wo", "int4-wo"])
def test_the_ops_dequantize_for_several_rows_and_compile_without_a_graph_break(scheme: str) -> None:
    x, qw = _quantized(scheme, 24, 130)
    op = qg.int4_linear if scheme == "int4-wo" else qg.channel_linear
    rows = torch.randn(3, 1, 130).to(DEVICE)
    want = torch.nn.functional.linear(rows, quant.dequantize(qw, torch.float32))
    assert rel_err(op(rows, qw.q, qw.scales), want.double()) < 1e-6
    compiled = torch.compile(lambda a, q, s: op(a, q, s) * 2, fullgraph=True, backend="eager")
    x = x.to(DEVICE)
    assert rel_err(compiled(x, qw.q, qw.scales), 2 * _reference(x, qw)) < 1e-6


# What AOTAutograd (torch.compile's second stage) makes of a quantized layer over several rows on CUDA, traced with
# fake CUDA tensors: no GPU and no driver needed, but the compiled Triton kernels (no interpreter), so it runs in a
# process without TRITON_INTERPRET. Prints each scheme's call targets, the Triton kernels by name.
_TRACE_PREFILL = """
import torch
from functorch.compile import aot_function
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from engine.kernels.choice import QUANT_ROWS_MAX_BATCH
from engine.llm import quant

for scheme in ("int4-wo", "int8-wo", "fp8-wo"):
    qw = quant.quantize(torch.randn(64, 256) / 16, scheme)
    graphs = []
    layer = quant.QuantLinear(qw, impl="triton")
    with FakeTensorMode():
        # a prefill's rows: more than int4 sends to its rows kernel at decode
        x = torch.empty(QUANT_ROWS_MAX_BATCH + 8, 256, device="cuda", dtype=torch.bfloat16)
        q = torch.empty_strided(qw.q.shape, qw.q.stride(), device="cuda", dtype=qw.q.dtype)
        s = torch.empty_strided(qw.scales.shape, qw.scales.stride(), device="cuda", dtype=qw.scales.dtype)
        # the buffers passed in, as torch.compile lifts them
        traced = aot_function(lambda a, q, s: torch.func.functional_call(layer, {"q": q, "scales": s}, (a,)),
                              fw_compiler=lambda gm, _: graphs.append(gm) or gm)
        try:
            traced(x, q, s)
        except RuntimeError:
            pass  # running the traced graph needs a CUDA torch; the graph is what is asked for
    names = []
    for node in graphs[0].graph.nodes:
        if node.op == "call_function":
            kernel = node.kwargs.get("kernel_idx")
            names.append(kernel_side_table.get_kernel(kernel).fn.__name__ if kernel is not None else str(node.target))
    print(scheme, " ".join(names))
"""


def test_a_compiled_prefill_launches_the_dequantization_kernel_itself() -> None:
    """The lab's quantized layers over several rows: Inductor sees the dequantization kernel (a triton_op), then the
    GEMM — not an opaque Python op whose host cost left the 1B prefill's GPU idle 85 % of the time."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(repo)
    done = subprocess.run([sys.executable, "-c", _TRACE_PREFILL], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    traced = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert set(traced) == {"int4-wo", "int8-wo", "fp8-wo"}
    for scheme, calls in traced.items():
        kernel = "_dequant_int4_kernel" if scheme == "int4-wo" else "_dequant_channel_kernel"
        assert kernel in calls.split() and "aten.mm.default" in calls.split(), (scheme, calls)
        assert "modelab" not in calls, (scheme, calls)  # no opaque op left


@pytest.mark.sm90_offline
def test_the_quantized_kernels_compile_for_sm90_offline(aot_check_rows) -> None:
    """Every tile of the quantized GEMVs (int8, fp8, int4) and the int4 dequantization compile for sm_90 with
    Triton's own ptxas (benchmarks/triton_aot_check.py --kernels quant), in a process without TRITON_INTERPRET, cache
    empty."""
    rows = aot_check_rows("--kernels", "quant")
    # plain at every tile (int8, fp8, int4), and the three fusions at every tile launched (int8's per shape)
    # int8 and fp8 through the word kernel (plain at every tile, fused at every launched one), each through the
    # byte kernel at its one tile; int4; the several-row products' dequantizations (int4, then int8 and fp8)
    want = (2 * (len(qg.AOT_TILES_WORDS) + 3 * len({*qg.LAUNCHED_TILES_WORDS}) + 1) + len(qg.AOT_TILES_INT4)
            + 3 * len({*qg.LAUNCHED_TILES_INT4}) + 1 + 2)
    assert set(qg.LAUNCHED_TILES_WORDS) <= set(qg.AOT_TILES_WORDS)
    assert set(qg.LAUNCHED_TILES_INT4) <= set(qg.AOT_TILES_INT4)
    assert len(rows) == want and all(line.endswith("ok") for line in rows), rows


def _reference_fused(x: torch.Tensor, qw: quant.QuantWeight, fusion: str, g: torch.Tensor, r: torch.Tensor
                     ) -> torch.Tensor:
    """float64: the decoder's own ops around the dequantized product."""
    x, g, r = x.double().cpu(), g.double().cpu(), r.double().cpu()
    w = quant.dequantize(qw.to("cpu"), torch.float64)
    if fusion == "add":
        return r + torch.nn.functional.linear(x, w)
    y = torch.nn.functional.linear(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g, w)
    if fusion == "glu":
        gate, up = y.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    return y


def _fused(fusion: str, x: torch.Tensor, qw: quant.QuantWeight, g: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The custom op the decoder calls for this fusion."""
    if fusion == "norm":
        return qg.norm_linear(x, g, 1e-5, qw.q, qw.scales)
    if fusion == "glu":
        return qg.norm_swiglu(x, g, 1e-5, qw.q, qw.scales)
    return qg.linear_add(x, qw.q, qw.scales, r.expand(x.shape[0], -1).contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["int8-wo", "fp8-wo", "int4-wo"])
@pytest.mark.parametrize("fusion", ["norm", "glu", "add"])
@pytest.mark.parametrize("n,k", [(38, 300), (130, 129)])
def test_the_fused_products_match_the_decoders_ops_in_float64(fusion: str, scheme: str, n: int, k: int,
                                                              dtype: torch.dtype) -> None:
    """The triton-fused step's products over quantized weights (norm inside; norm inside and SwiGLU of the
    [gate; up] rows in the epilogue; residual added), through the custom ops the decoder calls, against float64
    rms_norm / silu / add around the dequantized product; ragged K and N (int4: a last group shorter than 64;
    glu: 19 and 65 outputs, not a multiple of a tile's 16)."""
    gen = torch.Generator().manual_seed(n + k)
    _, qw = _quantized(scheme, n, k)
    x = torch.randn(1, k, generator=gen).to(DEVICE, dtype)
    g = (1 + 0.5 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    r = torch.randn(1, n, generator=gen).to(DEVICE, dtype)
    y = _fused(fusion, x, qw, g, r)
    assert y.shape == (1, n // 2 if fusion == "glu" else n) and y.dtype == dtype
    ref = _reference_fused(x, qw, fusion, g, r)
    assert rel_err(y, ref) < TOL[dtype] * (4 if fusion == "glu" and dtype == torch.float32 else 1)
    # several rows take the unfused fallback: the same function
    many = _fused(fusion, x.expand(3, -1).contiguous(), qw, g, r)
    assert rel_err(many[1:2], ref) < TOL[dtype] * 4


def test_a_wrong_fusion_input_is_refused() -> None:
    x, qw = _quantized("int8-wo", 16, 64)
    with pytest.raises(ValueError, match="norm weight"):
        qg.gemv_channel(x.to(DEVICE), qw.q, qw.scales, norm_weight=torch.ones(63, device=DEVICE))
    with pytest.raises(ValueError, match="residual"):
        qg.gemv_channel(x.to(DEVICE), qw.q, qw.scales, residual=torch.ones(15, device=DEVICE))
    _, q4 = _quantized("int4-wo", 15, 64)
    with pytest.raises(ValueError, match="even number of rows"):
        qg.gemv_int4(x.to(DEVICE), q4.q, q4.scales, glu=True)
    with pytest.raises(ValueError, match="no residual"):
        qg.gemv_channel(x.to(DEVICE), qw.q, qw.scales, residual=torch.ones(16, device=DEVICE), glu=True)


@pytest.mark.parametrize("k", [0, 7, 8, 16, 24, 32, 40, 48, 57, 63, 64, 127, 128, 199])  # every nibble position
def test_the_int4_kernel_reads_each_code_where_the_layout_puts_it(k: int) -> None:
    """Every code 8 (the value 0) but one, at input k: the kernel's output is that weight times x[k] alone, so it
    matches each nibble to the input int4_layout assigns it (not merely a pack/unpack pair agreeing with itself)."""
    n, features = 3, 200  # 4 groups, the last one ragged (8 weights)
    codes = torch.full((n, features), 8, dtype=torch.uint8)
    codes[1, k] = 13  # value 5 · scale
    scales = torch.full((n, 4), 0.5)
    x = torch.arange(1, features + 1, dtype=torch.float32)[None]
    y = qg.gemv_int4(x.to(DEVICE), quant.pack_int4(codes).to(DEVICE), scales.to(DEVICE)).cpu()
    assert y.tolist() == [[0.0, 5 * 0.5 * (k + 1), 0.0]]


def test_the_tile_rules_pick_by_fusion_and_shape() -> None:
    """The measured rules (quant_gemv.TILE_WORDS_* for int8 and fp8, TILE_INT4_*): by what is fused, then by the
    number of outputs and inputs."""
    assert qg.channel_tile(4096, add=True, k=11008) == qg.TILE_WORDS_ADD_LONG_WIDE
    assert qg.channel_tile(2048, add=True, k=8192) == qg.TILE_WORDS_ADD_LONG
    assert qg.channel_tile(16384, norm=True, k=2048) == qg.channel_tile(8192, norm=True, k=2048) \
        == qg.TILE_WORDS_NORM_WIDE
    assert qg.channel_tile(3072, norm=True, k=2048) == qg.TILE_WORDS_NORM
    assert qg.channel_tile(12288, norm=True, k=4096) == qg.channel_tile(32000, norm=True, k=4096) \
        == qg.TILE_WORDS_NORM_LONG
    assert qg.channel_tile(4096, add=True, k=4096) == qg.TILE_WORDS_ADD
    assert qg.channel_tile(2048, add=True, k=2048) == qg.TILE_WORDS_ADD_SHORT
    assert qg.channel_tile(4096) == qg.channel_tile(32000) == qg.TILE_WORDS
    # fp8 codes: their own tiles for the norm-fused long-K GEMVs, the int8 ones elsewhere
    assert qg.channel_tile(12288, norm=True, k=4096, fp8=True) == qg.TILE_FP8_NORM_LONG
    assert qg.channel_tile(22016, norm=True, k=4096, fp8=True) == qg.TILE_FP8_NORM_WIDE
    assert qg.channel_tile(32000, norm=True, k=4096, fp8=True) == qg.TILE_FP8_NORM_VOCAB
    assert qg.channel_tile(16384, norm=True, k=2048, fp8=True) == qg.TILE_WORDS_NORM_WIDE
    assert qg.channel_tile(4096, add=True, k=11008, fp8=True) == qg.TILE_WORDS_ADD_LONG_WIDE
    assert qg.int4_tile(16384, norm=True, k=2048) == qg.int4_tile(22016, norm=True, k=4096) == qg.TILE_INT4_NORM_WIDE
    assert qg.int4_tile(32000, norm=True, k=2048) == qg.TILE_INT4_NORM_VOCAB
    assert qg.int4_tile(12288, norm=True, k=4096) == qg.TILE_INT4_NORM_LONG
    assert qg.int4_tile(3072, norm=True, k=2048) == qg.TILE_INT4_NORM
    assert qg.int4_tile(2048, add=True, k=2048) == qg.int4_tile(4096, add=True, k=11008) == qg.TILE_INT4_ADD
    assert qg.int4_tile(32000) == qg.TILE_INT4
    assert set(qg.LAUNCHED_TILES_INT4) <= set(qg.AOT_TILES_INT4)
    assert set(qg.LAUNCHED_TILES_WORDS) == {qg.channel_tile(n, **f) for n, f in (
        (2048, {}), (22016, {"norm": True, "k": 4096}), (16384, {"norm": True, "k": 2048}), (2048, {"norm": True}),
        (2048, {"add": True, "k": 2048}),
        (4096, {"add": True, "k": 4096}), (4096, {"add": True, "k": 11008}), (2048, {"add": True, "k": 8192}),
        *((n, {"norm": True, "k": 4096, "fp8": True}) for n in (12288, 22016, 32000)))}
    assert set(qg.LAUNCHED_TILES_WORDS) <= set(qg.AOT_TILES_WORDS)


@pytest.mark.parametrize("dtype, code", [(torch.int8, -77), (torch.float8_e4m3fn, -1.75)])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 126, 127, 199])
def test_the_word_kernel_pairs_each_byte_with_its_input(k: int, dtype: torch.dtype, code: float) -> None:
    """Codes read four to a word: one nonzero code at input k (every byte position j = k mod 4 of a word) and x = 1,
    2, 3, ...: the output is that code times x[k] times the scale, so byte j of word t meets x[4t + j] (for fp8 also
    the order in which cvt.rn.f16x2.e4m3x2 takes a half's two bytes on the GPU)."""
    n, features = 3, 200
    codes = torch.zeros(n, features, dtype=dtype)
    codes[1, k] = code
    y = qg.gemv_channel(torch.arange(1, features + 1, dtype=torch.float32)[None].to(DEVICE), codes.to(DEVICE),
                        torch.full((n,), 0.5).to(DEVICE)).cpu()
    assert y.tolist() == [[0.0, code * 0.5 * (k + 1), 0.0]]


def test_every_fp8_code_converts_exactly() -> None:
    """All 254 finite e4m3 codes (subnormals, ±0, the largest), each row one code at all 64 inputs, x = 1: the word
    kernel's y is exactly 64 · value · scale."""
    codes = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(torch.float8_e4m3fn)
    codes = codes[~torch.isnan(codes.float())]
    q = codes[:, None].expand(len(codes), 64).contiguous()
    y = qg.gemv_channel(torch.ones(1, 64).to(DEVICE), q.to(DEVICE), torch.full((len(codes),), 0.25).to(DEVICE)).cpu()
    assert len(codes) == 254 and y.tolist() == [(codes.double() * 64 * 0.25).tolist()]


def test_every_int4_code_converts_exactly_at_every_nibble() -> None:
    """All 16 codes (row c holds code c at all 64 inputs, so at every nibble of every word), x = 1, scale 0.5:
    y = (c − 8) · 64 · 0.5 exactly, through the kernel's conversion (2^23 + code · 16^i, then one FMA back to
    code − 8) on the GPU's LOP3 path and the interpreter's masks."""
    codes = torch.arange(16, dtype=torch.uint8)[:, None].expand(16, 64).contiguous()
    y = qg.gemv_int4(torch.ones(1, 64).to(DEVICE), quant.pack_int4(codes).to(DEVICE),
                     torch.full((16, 1), 0.5).to(DEVICE)).cpu()
    assert y.tolist() == [[(c - 8) * 64 * 0.5 for c in range(16)]]


def test_every_int8_code_converts_exactly() -> None:
    """All 256 codes (each row one code, every position), x = 1: y = code · K · scale exactly, through the word
    kernel's conversion (2^23 + 128 + code, less 2^23 + 128) on the GPU's PRMT path and the interpreter's shifts."""
    codes = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)[:, None].expand(256, 64).contiguous()
    y = qg.gemv_channel(torch.ones(1, 64).to(DEVICE), codes.to(DEVICE), torch.ones(256).to(DEVICE)).cpu()
    assert y[0].tolist() == [64.0 * c for c in range(-128, 128)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", [(37, 300), (5, 1000), (16, 64), (3, 65), (130, 129)])  # ragged rows, groups, tails
def test_the_one_kernel_dequantization_gives_the_plain_weights_bit_for_bit(n: int, k: int, dtype: torch.dtype) -> None:
    """The quantized modes' several-row products (prefill) multiply by the weight dequantize_int4_fused forms in one
    kernel: the plain dequantization's values exactly, every code at its place (a nibble read from the wrong
    position or the wrong group's scale would differ), nothing written past K; bad packed shapes refused."""
    _, qw = _quantized("int4-wo", n, k)
    q, s = qw.q.to(DEVICE), qw.scales.to(DEVICE)
    want = qg.dequantize_int4(q, s, k, dtype)
    got = qg.dequantize_int4_fused(q, s, k, dtype)
    assert got.shape == (n, k) and got.dtype == dtype
    if dtype == torch.bfloat16 and is_interpreted(qg._dequant_int4_kernel):
        # the interpreter rounds fp32 → bf16 toward zero (the GPU to nearest even, as torch): same fp32 values,
        # truncated
        fp32 = qg.dequantize_int4(q, s, k, torch.float32)
        want = (fp32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    else:
        assert torch.equal(want.float(), quant.dequantize(qw, torch.float32).to(DEVICE).to(dtype).float())
    assert torch.equal(got, want)
    s_strided = s.t().contiguous().t()  # the same scales, column-major
    assert torch.equal(qg.dequantize_int4_fused(q, s_strided, k, dtype), got)
    with pytest.raises(ValueError, match="does not match"):
        qg.dequantize_int4_fused(q[:, :-4], s, k, dtype)
    with pytest.raises(ValueError, match="int4 scales"):
        qg.dequantize_int4_fused(q, s[:, :1] if s.shape[1] > 1 else s[:1], k, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scheme", ["int8-wo", "fp8-wo"])
@pytest.mark.parametrize("n,k", [(37, 300), (5, 1000), (3, 65), (130, 129)])  # ragged rows and columns
def test_the_one_kernel_channel_dequantization_gives_the_plain_weights_bit_for_bit(scheme: str, n: int, k: int,
                                                                                     dtype: torch.dtype) -> None:
    """The int8 / fp8 modes' several-row products multiply by the weight dequantize_channel_fused forms in one kernel:
    the plain dequantization's values exactly (a code paired with another row's scale, or read as the other code
    type, would differ), the same from column-strided codes; a mismatched scale count or code type is refused."""
    _, qw = _quantized(scheme, n, k)
    q, s = qw.q.to(DEVICE), qw.scales.to(DEVICE)
    got = qg.dequantize_channel_fused(q, s, dtype)
    assert got.shape == (n, k) and got.dtype == dtype
    fp32 = qg.dequantize_channel(q, s, torch.float32)
    if dtype == torch.bfloat16 and is_interpreted(qg._dequant_channel_kernel):  # toward zero there: see above
        want = (fp32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    else:
        want = qg.dequantize_channel(q, s, dtype)
        assert torch.equal(want.float(), quant.dequantize(qw, torch.float32).to(DEVICE).to(dtype).float())
    assert torch.equal(got, want)
    assert torch.count_nonzero(fp32) > 0.9 * n * k  # real codes, not a zero weight passing by accident
    strided = q.t().contiguous().t()  # the same codes, column-major
    assert torch.equal(qg.dequantize_channel_fused(strided, s, dtype), got)
    with pytest.raises(ValueError, match="scales for"):
        qg.dequantize_channel_fused(q, s[:-1], dtype)
    with pytest.raises(ValueError, match="int8 or float8_e4m3fn"):
        qg.dequantize_channel_fused(q.view(torch.uint8), s, dtype)
