"""The L4 Triton kernels against their float64 torch references (under Triton's interpreter on CPU; see conftest).

Each check draws fresh random inputs, poisons the kernel's output allocation with NaN (so an element the kernel
never writes fails the check), and compares by relative L2 error ||out - ref|| / ||ref|| under a per-dtype tolerance:
float32 (1e-5: the interpreter multiplies in full fp32; on the GPU the kernels use 3xTF32 dots, about as accurate);
float16 / bfloat16 store rounded outputs (a few 1e-4 .. 1e-3).
bfloat16 is not used with tl.dot here: Triton 3.6's interpreter multiplies bfloat16 dot operands as raw uint16 bits.
"""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

import engine.kernels.triton.attention as attn_mod  # noqa: E402
import engine.kernels.triton.message_passing as mp_mod  # noqa: E402
import engine.kernels.triton.patch_embed as pe_mod  # noqa: E402
from engine.kernels.triton import interpreted  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # every test runs on DEVICE: compiled on a GPU, under the interpreter without one
if DEVICE == "cpu" and not interpreted():
    pytest.skip("the Triton kernels were imported before TRITON_INTERPRET=1 was set; CPU runs need the interpreter",
                allow_module_level=True)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "output has NaN/inf: an element was not written (outputs are NaN-poisoned)"
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    return float((out64 - ref64).norm() / ref64.norm())


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor the wrappers allocate with torch.empty / empty_like starts as NaN (ints as -7), not zeros."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-7)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))


def randn(*shape: int, dtype: torch.dtype = torch.float32, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype).to(DEVICE)


# ---------------------------------------------------------------------------------------------------- attention

ATTN_CASES = [  # B, H, S, D, causal, dtype, use_desc, config
    (1, 2, 197, 32, True, torch.float32, None, None),  # ragged S, default (descriptor) path
    (1, 2, 197, 32, False, torch.float32, None, None),
    (2, 1, 100, 64, True, torch.float16, False, {"BLOCK_M": 64, "BLOCK_N": 16}),  # several diagonal sub-blocks
    (1, 1, 96, 64, False, torch.float16, True, {"BLOCK_M": 64, "BLOCK_N": 32}),  # S % BLOCK_N == 0, S % BLOCK_M != 0
    (1, 1, 96, 64, True, torch.float16, True, {"BLOCK_M": 64, "BLOCK_N": 32}),  # diagonal through descriptors
    # Q (and O where S % BLOCK_M == 0) go through descriptors over all heads' rows: a ragged last query block must
    # not store into the next head's first rows
    (2, 2, 96, 64, False, torch.float16, True, {"BLOCK_M": 64, "BLOCK_N": 32}),
    (2, 2, 128, 64, True, torch.float16, True, {"BLOCK_M": 64, "BLOCK_N": 32}),  # O stored through its descriptor
    (1, 1, 64, 128, False, torch.float32, True, {"BLOCK_M": 32, "BLOCK_N": 32}),  # no tail at all
    (1, 1, 64, 128, True, torch.float32, False, {"BLOCK_M": 32, "BLOCK_N": 32}),
    (2, 2, 5, 32, True, torch.float32, False, None),  # S smaller than one block
    (1, 1, 1, 32, False, torch.float32, True, None),  # S = 1
]


@pytest.mark.parametrize("B,H,S,D,causal,dtype,use_desc,config", ATTN_CASES)
def test_attention_matches_reference(B: int, H: int, S: int, D: int, causal: bool, dtype: torch.dtype,
                                     use_desc: bool | None, config: dict | None, poison: None) -> None:
    gen = torch.Generator().manual_seed(1000 * S + D + causal)
    q, k, v = (randn(B, H, S, D, dtype=dtype, gen=gen) for _ in range(3))
    out = attn_mod._attention(q, k, v, causal, use_desc=use_desc, config=config)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, attn_mod._reference(q, k, v, causal)) < TOL[dtype]


def test_attention_public_signature_and_scale() -> None:
    gen = torch.Generator().manual_seed(7)
    q, k, v = (randn(1, 2, 40, 32, gen=gen) for _ in range(3))
    out = attn_mod.attention(q, k, v, causal=True, scale=0.3)
    assert rel_err(out, attn_mod._reference(q, k, v, True, scale=0.3)) < 1e-5
    # the default scale is D**-0.5, and it matters: a different scale gives a different result
    default = attn_mod.attention(q, k, v, True)
    assert rel_err(default, attn_mod._reference(q, k, v, True, scale=32 ** -0.5)) < 1e-5
    assert rel_err(default, out) > 1e-3


def test_attention_causal_ignores_future_keys() -> None:
    gen = torch.Generator().manual_seed(8)
    q, k, v = (randn(1, 1, 70, 32, gen=gen) for _ in range(3))
    out = attn_mod.attention(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 40:] = 100.0  # only rows >= 40 may see these
    v2[:, :, 40:] = -50.0
    out2 = attn_mod.attention(q, k2, v2, causal=True)
    assert torch.equal(out[:, :, :40], out2[:, :, :40])
    assert not torch.allclose(out[:, :, 40:], out2[:, :, 40:])


def test_attention_unaligned_view_falls_back_to_pointer_loads() -> None:
    gen = torch.Generator().manual_seed(10)
    base = randn(1 * 1 * 33 * 32 + 1, gen=gen)
    q = base[1:].view(1, 1, 33, 32)  # contiguous, but 4 bytes past a 16-byte boundary: no tensor descriptor
    assert q.data_ptr() % 16 != 0
    out = attn_mod._attention(q, q, q, True, use_desc=True)
    assert rel_err(out, attn_mod._reference(q, q, q, True)) < 1e-5


def test_tuned_tile_names_the_autotuners_choice_for_that_shape_only(monkeypatch) -> None:
    """What the Kernel Levels run shows: the tile kept in the autotuner's cache under (S, D, causal, ...)."""
    chosen = next(c for c in attn_mod._gpu_configs() if c.kwargs["BLOCK_M"] == 64 and c.kwargs["BLOCK_N"] == 64)
    monkeypatch.setattr(attn_mod._attn_fwd_tuned, "cache", {(4096, 128, True, True, "torch.bfloat16"): chosen})
    kept = len(attn_mod._prune(attn_mod._gpu_configs(), {"S": 4096}, HEAD_DIM=128, USE_DESC=True))
    assert attn_mod.tuned_tile(4096, 128, True) == (
        f"autotuned tile for S=4096, D=128, causal: BLOCK_M=64, BLOCK_N=64, {chosen.num_warps} warps, "
        f"{chosen.num_stages} stages (fastest of {kept} candidates, Q/K/V/O through TMA descriptors)")
    assert attn_mod.tuned_tile(1024, 128, True) is None and attn_mod.tuned_tile(4096, 128, False) is None
    monkeypatch.setattr(attn_mod._attn_fwd_tuned, "cache", {(197, 64, False, True, "torch.bfloat16"): chosen})
    assert attn_mod.tuned_tile(197, 64, False).endswith(
        "(fastest of 6 candidates, Q/K/V through TMA descriptors, the blocks crossing S and O through pointers)")


@pytest.mark.skipif(DEVICE != "cuda", reason="the autotuner runs on a GPU only")
def test_on_cuda_tuned_tile_is_the_tile_the_launch_kept() -> None:
    gen = torch.Generator().manual_seed(12)
    q, k, v = (randn(1, 2, 512, 64, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    attn_mod.attention(q, k, v, causal=True)
    meta = next(m for key, m in attn_mod._LAUNCH.entries.items() if key[0] == (1, 2, 512, 64) and m)[1]
    assert f"BLOCK_M={meta['BLOCK_M']}, BLOCK_N={meta['BLOCK_N']}," in attn_mod.tuned_tile(512, 64, True)


def test_attention_bad_inputs() -> None:
    gen = torch.Generator().manual_seed(9)
    q = randn(1, 1, 8, 32, gen=gen)
    with pytest.raises(ValueError, match="head dim"):
        attn_mod.attention(*(randn(1, 1, 8, 48, gen=gen) for _ in range(3)), causal=False)
    with pytest.raises(ValueError, match="shapes differ"):
        attn_mod.attention(q, q, randn(1, 1, 9, 32, gen=gen), causal=False)
    with pytest.raises(ValueError, match="dtypes differ"):
        attn_mod.attention(q, q, q.half(), causal=False)
    with pytest.raises(ValueError, match="dtype must be"):
        attn_mod.attention(*(torch.zeros(1, 1, 8, 32, dtype=torch.float64),) * 3, causal=False)
    with pytest.raises(ValueError, match=r"\(B, H, S, D\)"):
        attn_mod.attention(q[0], q[0], q[0], causal=False)
    with pytest.raises(ValueError, match="contiguous"):
        t = randn(1, 1, 32, 8, gen=gen).transpose(-1, -2)
        attn_mod.attention(t, t, t, causal=False)
    with pytest.raises(ValueError, match="causal must be a bool"):
        attn_mod.attention(q, q, q, causal=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="S must be >= 1"):
        e = torch.zeros(1, 1, 0, 32, device=DEVICE)
        attn_mod.attention(e, e, e, causal=False)
    with pytest.raises(ValueError, match="scale"):
        attn_mod.attention(q, q, q, causal=False, scale=math.nan)


# -------------------------------------------------------------------------------------------------- patch embed

PE_CASES = [  # B, C, Hi, Wi, P, E, dtype, config
    (2, 3, 32, 32, 8, 64, torch.float32, None),
    (2, 3, 48, 32, 16, 48, torch.float32, None),  # P = 16, non-square image, E not a multiple of BLOCK_N
    (3, 2, 24, 40, 8, 40, torch.float16, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64}),  # M = 45: ragged rows
    (1, 3, 8, 12, 4, 32, torch.float32, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}),  # K = 48: ragged K
]


@pytest.mark.parametrize("B,C,Hi,Wi,P,E,dtype,config", PE_CASES)
def test_patch_embed_matches_reference(B: int, C: int, Hi: int, Wi: int, P: int, E: int, dtype: torch.dtype,
                                       config: dict | None, poison: None) -> None:
    gen = torch.Generator().manual_seed(B * 100 + Hi + P)
    images = randn(B, C, Hi, Wi, dtype=dtype, gen=gen)
    weight = (randn(E, C, P, P, gen=gen) * (C * P * P) ** -0.5).to(dtype)
    bias, cls = randn(E, dtype=dtype, gen=gen), randn(E, dtype=dtype, gen=gen)
    pos = randn(1 + (Hi // P) * (Wi // P), E, dtype=dtype, gen=gen)
    out = pe_mod._patch_embed_impl(images, weight, bias, cls, pos, P, config=config)
    ref = pe_mod._reference(images, weight, bias, cls, pos, P)
    assert out.shape == ref.shape == (B, 1 + (Hi // P) * (Wi // P), E)
    assert rel_err(out, ref) < TOL[dtype]
    # the cls row is exactly cls + pos[0] for every image (no GEMM involved)
    expected_cls = (cls.double() + pos[0].double()).to(dtype)
    assert torch.equal(out[:, 0].cpu(), expected_cls.expand(B, -1).cpu())


def test_patch_embed_public_signature() -> None:
    gen = torch.Generator().manual_seed(11)
    args = (randn(1, 3, 16, 16, gen=gen), randn(32, 3, 8, 8, gen=gen) * 0.1, randn(32, gen=gen),
            randn(32, gen=gen), randn(5, 32, gen=gen))
    assert rel_err(pe_mod.patch_embed(*args, patch=8), pe_mod._reference(*args, patch=8)) < 1e-5
    # fp16 GEMM operands with fp32 epilogue terms (a module whose cls/pos stay fp32): output in fp16
    img, w = args[0].half(), args[1].half()
    out = pe_mod.patch_embed(img, w, *args[2:], patch=8)
    assert out.dtype == torch.float16
    assert rel_err(out, pe_mod._reference(img, w, *args[2:], patch=8)) < TOL[torch.float16]


def test_patch_embed_bad_inputs() -> None:
    gen = torch.Generator().manual_seed(12)
    img, w = randn(1, 3, 16, 16, gen=gen), randn(32, 3, 8, 8, gen=gen)
    b, cls, pos = randn(32, gen=gen), randn(32, gen=gen), randn(5, 32, gen=gen)
    with pytest.raises(ValueError, match="not a positive multiple of patch"):
        pe_mod.patch_embed(randn(1, 3, 20, 16, gen=gen), w, b, cls, pos, 8)
    with pytest.raises(ValueError, match="weight must be"):
        pe_mod.patch_embed(img, randn(32, 3, 4, 4, gen=gen), b, cls, pos, 8)
    with pytest.raises(ValueError, match="pos must be"):
        pe_mod.patch_embed(img, w, b, cls, randn(4, 32, gen=gen), 8)
    with pytest.raises(ValueError, match="bias and cls"):
        pe_mod.patch_embed(img, w, randn(31, gen=gen), cls, pos, 8)
    with pytest.raises(ValueError, match="differs from images dtype"):
        pe_mod.patch_embed(img, w.half(), b, cls, pos, 8)
    with pytest.raises(ValueError, match="pos dtype must be"):
        pe_mod.patch_embed(img, w, b, cls, pos.long(), 8)
    with pytest.raises(ValueError, match="images dtype"):
        pe_mod.patch_embed(img.long(), w, b, cls, pos, 8)
    with pytest.raises(ValueError, match="patch must be a positive int"):
        pe_mod.patch_embed(img, w, b, cls, pos, 0)
    with pytest.raises(ValueError, match=r"\(B, C, Hi, Wi\)"):
        pe_mod.patch_embed(img[0], w, b, cls, pos, 8)


# ---------------------------------------------------------------------------------------------- message passing


def make_graph(n: int, e: int, f: int, dtype: torch.dtype, idx: torch.dtype, gen: torch.Generator):
    """Random edges whose destinations avoid the upper third of the nodes (isolated: no in-edges)."""
    x = randn(n, f, dtype=dtype, gen=gen)
    src = torch.randint(0, n, (e,), generator=gen).to(idx).to(DEVICE)
    dst = torch.randint(0, (2 * n) // 3, (e,), generator=gen).to(idx).to(DEVICE)
    w = torch.rand(e, generator=gen).to(dtype).to(DEVICE)
    return x, src, dst, w


MP_CASES = [  # N, E, F, dtype, index dtype, aggr, sorted, config
    (101, 500, 48, torch.float32, torch.int64, "sum", True, None),  # N, F not multiples of the blocks
    (101, 500, 48, torch.float32, torch.int32, "mean", True, {"ROWS": 8, "BLOCK_F": 64}),
    (90, 400, 64, torch.bfloat16, torch.int64, "mean", True, None),
    (90, 400, 32, torch.float16, torch.int32, "sum", True, None),
    (101, 500, 48, torch.float32, torch.int32, "sum", False, None),  # unsorted: the default way (linked lists)
    (101, 500, 48, torch.float32, torch.int64, "mean", False, None),
    (90, 400, 64, torch.bfloat16, torch.int32, "sum", False, None),
    (90, 400, 64, torch.bfloat16, torch.int64, "mean", False, None),
]


@pytest.mark.parametrize("N,E,F,dtype,idx,aggr,is_sorted,config", MP_CASES)
def test_message_passing_matches_reference(N: int, E: int, F: int, dtype: torch.dtype, idx: torch.dtype, aggr: str,
                                           is_sorted: bool, config: dict | None, poison: None) -> None:
    gen = torch.Generator().manual_seed(N + E + F + is_sorted)
    x, src, dst, w = make_graph(N, E, F, dtype, idx, gen)
    ref = mp_mod._reference(x, src, dst, w, N, aggr)
    if is_sorted:
        src_s, w_s, rowptr = mp_mod.csr_from_edges(src, dst, w, N)
        out = mp_mod._message_passing_impl(x, src_s, dst, w_s, N, aggr, rowptr, config=config)
    else:
        out = mp_mod._message_passing_impl(x, src, dst, w, N, aggr, config=config)
    assert out.shape == (N, F) and out.dtype == dtype
    assert rel_err(out, ref) < TOL[dtype]
    isolated = torch.ones(N, dtype=torch.bool)
    isolated[dst.long().cpu()] = False
    assert isolated.sum() > 0 and (out.cpu()[isolated] == 0).all()


@pytest.mark.parametrize("N,E,F,dtype,idx,aggr", [c[:6] for c in MP_CASES if not c[6]])
def test_unsorted_message_passing_every_way_matches_reference(N: int, E: int, F: int, dtype: torch.dtype,
                                                              idx: torch.dtype, aggr: str, poison: None) -> None:
    """Linked lists (the default), a CSR bucketed on the device, and fp32 atomics: one function."""
    gen = torch.Generator().manual_seed(N + E + F + 7)
    x, src, dst, w = make_graph(N, E, F, dtype, idx, gen)
    ref = mp_mod._reference(x, src, dst, w, N, aggr)
    for way in mp_mod.UNSORTED:
        out = mp_mod.message_passing(x, src, dst, w, N, aggr, unsorted=way)
        assert out.dtype == dtype and rel_err(out, ref) < TOL[dtype], way
    with pytest.raises(ValueError, match="unsorted must be one of"):
        mp_mod.message_passing(x, src, dst, w, N, aggr, unsorted="sort")


@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_bucketing_groups_every_edge_under_its_destination(idx: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(23)
    N, E = 57, 400
    x, src, dst, w = make_graph(N, E, 8, torch.float32, idx, gen)
    records, rowptr = mp_mod.bucket_by_destination(src, dst, w, N)
    src_b, w_b = mp_mod.unpack_records(records)
    src_s, w_s, rowptr_s = mp_mod.csr_from_edges(src, dst, w, N)
    assert torch.equal(rowptr.long().cpu(), rowptr_s.cpu())  # the same row pointer as a full sort
    for d in range(N):  # the same edges in every bucket, in some order
        lo, hi = int(rowptr_s[d]), int(rowptr_s[d + 1])
        got = sorted(zip(src_b[lo:hi].tolist(), w_b[lo:hi].tolist()))
        assert got == sorted(zip(src_s[lo:hi].long().tolist(), w_s[lo:hi].tolist())), d
    with pytest.raises(ValueError, match="bucket_by_destination: src and dst must be int32 or int64"):
        mp_mod.bucket_by_destination(src.float(), dst, w, N)


@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_linking_puts_every_edge_once_on_its_destination_list(idx: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(29)
    N, E = 61, 450  # some nodes with no in-edge: their list is empty (head -1)
    x, src, dst, w = make_graph(N, E, 8, torch.float32, idx, gen)
    head, records = mp_mod.link_by_destination(src, dst, w, N)
    assert head.shape == (N,) and head.dtype == torch.int32 and records.shape == (E, 2)
    lists = mp_mod.unlink(head, records)
    for d in range(N):
        mine = (dst == d).nonzero().flatten().tolist()
        expected = sorted((int(src[e]), float(w[e])) for e in mine)
        assert sorted(lists[d]) == expected, d  # each in-edge once, nothing else, the weight exact in fp32
    assert sum(len(items) for items in lists) == E
    with pytest.raises(ValueError, match="link_by_destination: src, dst, w must be 1-D of one length"):
        mp_mod.link_by_destination(src, dst[:-1], w, N)


def test_message_passing_sorted_is_deterministic_and_public() -> None:
    gen = torch.Generator().manual_seed(21)
    x, src, dst, w = make_graph(70, 300, 32, torch.float32, torch.int64, gen)
    src_s, w_s, rowptr = mp_mod.csr_from_edges(src, dst, w, 70)
    a = mp_mod.message_passing(x, src_s, dst, w_s, 70, aggr="sum", rowptr=rowptr)
    b = mp_mod.message_passing(x, src_s, dst, w_s, 70, aggr="sum", rowptr=rowptr)
    assert torch.equal(a, b)
    assert rel_err(a, mp_mod._reference(x, src, dst, w, 70, "sum")) < 1e-5
    # the unsorted path computes the same function
    assert rel_err(mp_mod.message_passing(x, src, dst, w, 70), mp_mod._reference(x, src, dst, w, 70)) < 1e-5


def test_message_passing_no_edges_gives_zeros(poison: None) -> None:
    gen = torch.Generator().manual_seed(22)
    x = randn(10, 16, gen=gen)
    empty_i = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    empty_w = torch.zeros(0, device=DEVICE)
    rowptr = torch.zeros(11, dtype=torch.int64, device=DEVICE)
    for aggr in ("sum", "mean"):
        assert (mp_mod.message_passing(x, empty_i, empty_i, empty_w, 10, aggr, rowptr=rowptr) == 0).all()
        assert (mp_mod.message_passing(x, empty_i, empty_i, empty_w, 10, aggr) == 0).all()


def test_csr_from_edges() -> None:
    src = torch.tensor([5, 6, 7, 8, 9], device=DEVICE)
    dst = torch.tensor([2, 0, 2, 0, 3], device=DEVICE)
    w = torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5], device=DEVICE)
    src_s, w_s, rowptr = mp_mod.csr_from_edges(src, dst, w, 5)
    assert src_s.tolist() == [6, 8, 5, 7, 9]  # stable: edge order kept within a destination
    assert w_s.tolist() == [1.0, 2.0, 0.5, 1.5, 2.5]
    assert rowptr.tolist() == [0, 2, 2, 4, 5, 5]  # nodes 1 and 4 have no in-edges
    with pytest.raises(ValueError, match="dst must lie in"):
        mp_mod.csr_from_edges(src, dst + 3, w, 5)
    with pytest.raises(ValueError, match="one length"):
        mp_mod.csr_from_edges(src[:4], dst, w, 5)


def test_message_passing_bad_inputs() -> None:
    gen = torch.Generator().manual_seed(23)
    x, src, dst, w = make_graph(20, 50, 8, torch.float32, torch.int64, gen)
    with pytest.raises(ValueError, match=r"x must be \(N, F\)"):
        mp_mod.message_passing(x[0], src, dst, w, 20)
    with pytest.raises(ValueError, match="x dtype"):
        mp_mod.message_passing(x.long(), src, dst, w, 20)
    with pytest.raises(ValueError, match="src must be int32 or int64"):
        mp_mod.message_passing(x, src.float(), dst, w, 20)
    with pytest.raises(ValueError, match="one length E"):
        mp_mod.message_passing(x, src, dst[:-1], w, 20)
    with pytest.raises(ValueError, match="aggr must be one of"):
        mp_mod.message_passing(x, src, dst, w, 20, aggr="max")
    with pytest.raises(ValueError, match="rowptr must be"):
        mp_mod.message_passing(x, src, dst, w, 20, rowptr=torch.zeros(20, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="num_nodes must be"):
        mp_mod.message_passing(x, src, dst, w, -1)
    with pytest.raises(ValueError, match="w dtype"):
        mp_mod.message_passing(x, src, dst, w.long(), 20)


@pytest.fixture(scope="module")
def sm90_rows(module_aot_check_rows) -> dict[str, list[str]]:
    """The L4 kernels below compiled for sm_90 in one run of benchmarks/triton_aot_check.py --kernels mp,attn,gluon
    (one interpreter start and Triton import instead of one per test), its rows by their first word: the family."""
    by_family: dict[str, list[str]] = {"mp": [], "attention": [], "gluon": []}
    for row in module_aot_check_rows("--kernels", "mp,attn,gluon"):
        by_family[row.split()[0]].append(row)
    return by_family


@pytest.mark.sm90_offline
def test_the_message_passing_kernels_compile_for_the_h100_without_one(sm90_rows) -> None:
    """The interpreter never lowers to the GPU: the grouping kernels (link; count+rank, place), both reduces at every
    tuned tile (the segment reduce plain and over packed records) and the atomic scatter compile for sm_90 with
    Triton's own ptxas (benchmarks/triton_aot_check.py --kernels mp), in a process without TRITON_INTERPRET, cache
    empty."""
    rows = sm90_rows["mp"]
    per_dtype = 2 * len(mp_mod._segment_reduce_tuned.configs) + len(mp_mod._linked_reduce_tuned.configs) + 1
    assert len(rows) == 2 * (1 + 2 * 2) + 2 * per_dtype and all(r.endswith("ok") for r in rows), rows


@pytest.mark.sm90_offline
def test_the_attention_compiles_for_the_h100_at_every_tile_without_spilling_its_wide_tiles(sm90_rows) -> None:
    """Every autotune tile of the L4 attention compiles for sm_90 through descriptors (benchmarks/triton_aot_check.py
    --kernels attn); the 8-warp tiles at D=128 keep everything in registers (no stack frame) -- what loading Q and
    storing O through descriptors bought (with pointers the 128x128 tile spilled)."""
    rows = sm90_rows["attention"]
    assert len(rows) == 2 * len(attn_mod._gpu_configs()) and all(r.endswith("ok") for r in rows), rows
    wide = [r.split() for r in rows if r.startswith("attention D128") and " w8 " in r]
    assert wide and all(cols[-3] == "0" for cols in wide), rows  # columns: ... regs stack seconds result


# ---- the Gluon attention (engine/kernels/triton/attention_ws.py, Hopper) -------------------------------------------

@pytest.mark.sm90_offline
def test_the_gluon_attention_compiles_for_the_h100_without_one(sm90_rows) -> None:
    """Gluon is never interpreted: each build (bf16 and fp16, D 128 and 64, causal or not) compiles for sm_90 with
    Triton's own ptxas (benchmarks/triton_aot_check.py --kernels gluon), three partitions in 168 registers a thread on
    average, nothing spilled."""
    rows = sm90_rows["gluon"]
    assert len(rows) == 8 and all(r.endswith("ok") for r in rows), rows
    assert all(r.split()[-4:-2] == ["168", "0"] for r in rows), rows  # columns: ... regs stack seconds result


_GLUON_SASS = """
import re, subprocess, sys
from pathlib import Path
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
import triton.backends.nvidia as nvidia
from engine.kernels.triton import attention_ws as aw
t = torch.empty(1, 1, 256, 128, dtype=torch.bfloat16)
descs = dict(zip(("q_desc", "k_desc", "v_desc"), (mangle_type(d) for d in aw.descriptors(t, t, t))))
consts = {"HEAD_DIM": 128, "BLOCK_N": aw.BLOCK_N, "STAGES": aw.STAGES, "CAUSAL": True}
sig = {**descs, "o_ptr": "*bf16", "S": "i32", "qk_scale": "fp32", **{k: "constexpr" for k in consts}}
kernel = triton.compile(GluonASTSource(fn=aw._attn_ws_kernel, signature=sig, constexprs=consts),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
cubin = Path(sys.argv[1])
cubin.write_bytes(kernel.asm["cubin"])
sass = subprocess.run([str(Path(nvidia.__file__).parent / "bin" / "nvdisasm"), str(cubin)], capture_output=True,
                      text=True, check=True).stdout
ops = [line.split("*/", 1)[1] for line in sass.splitlines() if re.match(r"\\s+/\\*[0-9a-f]{4,}\\*/", line)]
print("HGMMA", sum(o.strip().startswith("HGMMA.64x128x16") for o in ops))
for i in [i for i, o in enumerate(ops) if "DEPBAR.LE gsb0, 0x1" in o]:
    j = next(k for k in range(i, len(ops)) if "DEPBAR.LE gsb0, 0x0" in ops[k])
    print("between", sum("MUFU.EX2" in o for o in ops[i:j]))
"""


@pytest.mark.sm90_offline
def test_the_gluon_attention_runs_its_softmax_while_p_v_is_on_the_tensor_cores(tmp_path) -> None:
    """No GPU needed: the bf16 build for sm_90, read back as SASS. 96 wgmmas (each consumer: q kᵀ of the
    first tile, q kᵀ and P v in the loop of unmasked tiles and again for the masked last tile, the last P v; 8
    k-steps each), and in each consumer's two overlapped steps all 66 exponentials of a tile (64 probabilities, 2
    row rescales) between the wait for the scores (DEPBAR.LE 1) and the wait for P v (DEPBAR.LE 0) — the overlap;
    without the row sums stored before the second wait, 5-16 were."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"], env["PYTHONPATH"] = str(tmp_path / "cache"), str(repo)
    done = subprocess.run([sys.executable, "-c", _GLUON_SASS, str(tmp_path / "k.cubin")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    lines = done.stdout.split("\n")
    assert "HGMMA 96" in lines, done.stdout
    assert [line for line in lines if line.startswith("between")] == ["between 66"] * 4, done.stdout


_GLUON_CHILD = """
import sys, torch
from engine.kernels.triton import attention as tl_attn, attention_ws
if attention_ws.unsupported(torch.empty(1, 1, 1, 128, device="cuda", dtype=torch.bfloat16)):
    print("SKIP not a Hopper GPU"); sys.exit(0)
bad = 0
for dtype, tol in ((torch.bfloat16, 1.5e-2), (torch.float16, 4e-3)):
    for d in (128, 64):
        for s in (1, 17, 128, 200, 300, 1024):
            for causal in (True, False):
                q, k, v = (torch.randn(2, 3, s, d, device="cuda").to(dtype) for _ in range(3))
                ref = tl_attn._reference(q, k, v, causal)
                out = attention_ws.attention_ws(q, k, v, causal)
                err = float((out.double() - ref).norm() / ref.norm()) if torch.isfinite(out).all() else 1e9
                bad += err >= tol
                print(f"{dtype} D={d} S={s} causal={causal} rel L2 {err:.2e} {'ok' if err < tol else 'FAIL'}",
                      flush=True)
sys.exit(1 if bad else 0)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_the_gluon_attention_matches_float64_in_its_own_process() -> None:
    """Ragged S, causal and not, both dtypes and head dims, against float64 — in a child process with a timeout,
    since a wrong mbarrier phase would hang rather than fail."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    try:
        done = subprocess.run([sys.executable, "-c", _GLUON_CHILD], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"no answer in 300 s (a hang): {exc.stdout!r}")
    if "SKIP" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_inputs_the_gluon_kernel_does_not_take_run_the_tl_kernel(monkeypatch) -> None:
    """D = 32 (and on CPU: not CUDA) is not what the Gluon kernel takes: the tl kernel runs, nothing is timed."""
    monkeypatch.setattr(attn_mod, "_CHOICES", {})
    q = torch.randn(1, 2, 5, 32).to(DEVICE)
    assert torch.allclose(attn_mod.attention(q, q, q, True).double(), attn_mod._reference(q, q, q, True), atol=1e-4)
    assert attn_mod._CHOICES == {} and attn_mod.l4_choice(5, 32, True) is None


def test_the_l4_choice_never_takes_a_kernel_whose_output_differs(monkeypatch) -> None:
    """The per-shape choice checks the two kernels' outputs against each other before it times anything: a Gluon
    kernel that is wrong for a shape is never chosen, and the level's note says why."""
    monkeypatch.setattr(attn_mod, "_CHOICES", {})
    q = torch.randn(1, 2, 40, 32).to(DEVICE)

    def wrong(q, k, v, causal, scale):  # type: ignore[no-untyped-def]
        return attn_mod._attention(q, k, v, causal, scale).flip(-2)

    assert attn_mod._choose(q, q, q, True, None, wrong) == "triton"
    note = attn_mod.l4_choice(40, 32, True)
    assert note is not None and "the Gluon kernel's output differs" in note and "not used" in note
    assert attn_mod.l4_choice(40, 32, False) is None  # another shape: not chosen yet


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_the_l4_attention_times_both_kernels_once_per_shape_and_keeps_the_faster(monkeypatch) -> None:
    from engine.kernels.triton import attention_ws

    q, k, v = (torch.randn(2, 4, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if attention_ws.unsupported(q):
        pytest.skip(attention_ws.unsupported(q))
    monkeypatch.setattr(attn_mod, "_CHOICES", {})
    out = attn_mod.attention(q, k, v, True)
    ref = attn_mod._reference(q, k, v, True)
    assert float((out.double() - ref).norm() / ref.norm()) < 1.5e-2
    (choice,) = attn_mod._CHOICES.values()
    assert choice["impl"] == min(("triton", "gluon"), key=lambda name: choice[name + "_us"])
    assert 0 < choice["triton_us"] < 1e4 and 0 < choice["gluon_us"] < 1e4
    note = attn_mod.l4_choice(1024, 128, True)
    assert note is not None and f"{choice['gluon_us']:.1f} µs" in note
    attn_mod.attention(q, k, v, True)
    assert len(attn_mod._CHOICES) == 1  # timed once per shape
