"""Kernel Levels L5 (engine/kernels/cuda_levels.py, csrc/levels/): availability reasons and input checks everywhere;
with a GPU, every kernel against a float64 torch reference on fresh random inputs, with poisoned outputs.

On a machine without CUDA the GPU tests are skipped with the reason `available()` gives; the reason itself, the
input validation and the build key are tested here without a GPU.
"""

from __future__ import annotations

import itertools
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

from engine.kernels import cuda_levels as cl
from engine.native import build as native

_REASON = cl.available()


def needs_cuda(test):
    """A GPU test: marked gpu, skipped where the L5 kernels cannot run."""
    unavailable = pytest.mark.skipif(_REASON is not None, reason=f"L5 CUDA kernels unavailable: {_REASON}")
    return pytest.mark.gpu(unavailable(test))

# rel L2 error bounds per dtype of the inputs / outputs (fp32 accumulation everywhere)
ATTN_TOL = cl.ATTN_TOL
PATCH_TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
MP_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


@pytest.fixture(autouse=True)
def _fresh_capability_cache():
    """cl._arch caches each device's capability; tests that fake the capability must not leave a fake behind."""
    cl._arch.cache_clear()
    yield
    cl._arch.cache_clear()


# ---- without a GPU ------------------------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_available_says_why_without_cuda():
    assert cl.available() == "needs a CUDA device"
    with pytest.raises(native.NativeBuildError, match="needs a CUDA device"):
        cl.load()


def test_available_reports_missing_nvcc(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(native, "compiler_missing", lambda: None)
    monkeypatch.setattr(native, "_ensure_ninja_on_path", lambda: "/usr/bin/ninja")
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(cl, "_loaded", None)
    assert cl.available() == "nvcc not found (CUDA_HOME unset)"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    cl._arch.cache_clear()  # another GPU, as far as this process can tell
    assert "compute capability 8.0" in cl.available()


def test_available_reports_the_first_compiler_error_and_never_raises(monkeypatch):
    monkeypatch.setattr(cl, "_missing_tools", lambda: None)
    log = ("[1/4] nvcc ... attention.cu\nFAILED: attention.cuda.o\n"
           "csrc/levels/attention.cu(42): error: identifier \"foo\" is undefined\n1 error detected\n")

    def failing_load(verbose: bool = False) -> str:
        raise native.NativeBuildError(f"build failed: {cl._first_error_line(log)}\n(in /x)\n{log}")

    monkeypatch.setattr(cl, "load", failing_load)
    assert cl.available() == 'build failed: csrc/levels/attention.cu(42): error: identifier "foo" is undefined'
    # what cpp_extension raises: its own "Error building extension" line comes first, the compiler's error later
    wrapped = ("Error building extension 'modelab_cuda_levels_x': [1/2] c++ -c bindings.cpp\nFAILED: bindings.o\n"
               "bindings.cpp:3:10: fatal error: torch/library.h: No such file or directory\n")
    assert cl._first_error_line(wrapped) == "bindings.cpp:3:10: fatal error: torch/library.h: No such file or directory"

    def crashing_load(verbose: bool = False) -> str:
        raise KeyError("surprise")

    monkeypatch.setattr(cl, "load", crashing_load)
    reason = cl.available()
    assert reason.startswith("build failed: KeyError")


def test_build_key_changes_with_every_input():
    base = dict(sources={"a.cu": b"int x;", "common.cuh": b"#pragma once"}, torch_version="2.11.0",
                cuda_version="13.0", nvcc_version="V13.0.88", arch=(9, 0), flags=["-O3"])
    key = cl.build_key(**base)
    assert len(key) == 16 and key == cl.build_key(**base)
    changed = [
        {**base, "sources": {**base["sources"], "common.cuh": b"#pragma once\n"}},  # a header edit
        {**base, "torch_version": "2.12.0"},
        {**base, "cuda_version": "12.8"},
        {**base, "nvcc_version": "V13.1.0"},
        {**base, "arch": (8, 0)},
        {**base, "flags": ["-O3", "--use_fast_math"]},
    ]
    assert len({cl.build_key(**c) for c in changed} | {key}) == len(changed) + 1


def test_every_source_file_exists_and_every_launch_is_checked():
    for name in cl.SOURCES + cl.HEADERS:
        assert (cl.SOURCE_DIR / name).is_file(), name
    for name in ("attention.cu", "attention_ws.cu", "patch_embed.cu", "message_passing.cu"):
        text = (cl.SOURCE_DIR / name).read_text()
        launches = text.count(">>>(")
        assert launches > 0 and text.count("CUDA_CHECK_LAUNCH();") >= launches, name


def test_hopper_builds_sm90a_with_the_wgmma_variants_and_other_gpus_do_not(monkeypatch):
    assert cl.arch_flags(9, 0) == ["-gencode=arch=compute_90a,code=sm_90a", "-DMODELAB_SM90A"]
    assert cl.arch_flags(8, 0) == ["-gencode=arch=compute_80,code=sm_80"]
    assert cl.arch_flags(12, 0) == ["-gencode=arch=compute_120,code=sm_120"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cl, "_arch", lambda device=None: (9, 0))
    assert cl.attention_variants(torch.bfloat16, 128) == (0, 2, 7, 8)
    assert cl.attention_variants(torch.float16, 128) == (0, 7, 8)
    assert cl.attention_variants(torch.bfloat16, 64) == cl.attention_variants(torch.float16, 64) == (0, 7, 8)
    defaults = [cl.default_variant(t, d) for t, d in ((torch.bfloat16, 128), (torch.float16, 128),
                                                      (torch.bfloat16, 64), (torch.float16, 64))]
    assert defaults == [8, 8, 8, 8]
    # a build listed as not yet run on a GPU (cl.UNVERIFIED) is never the default
    monkeypatch.setattr(cl, "UNVERIFIED", ((8, 64),))
    assert cl.default_variant(torch.bfloat16, 64) == cl.default_variant(torch.float16, 64) == 7
    assert cl.default_variant(torch.bfloat16, 128) == 8
    monkeypatch.setattr(cl, "UNVERIFIED", ((8, 64), (7, 64)))
    assert cl.default_variant(torch.bfloat16, 64) == cl.default_variant(torch.float16, 64) == 0
    assert "-DMODELAB_SM90A" in cl.cuda_flags()
    assert "mma.sync" in cl.describe_variant(2) and "attention.cu" in cl.describe_variant(2)
    assert "TMA" in cl.describe_variant(7) and "attention_ws.cu" in cl.describe_variant(7)
    assert "TMA-stored output" in cl.describe_variant(8) and "attention_ws.cu" in cl.describe_variant(8)
    assert cl.attention_variants(torch.float32, 64) == (0,)  # the wgmma kernels are 16-bit only
    # more heads than the grid of variants 7 and 8 takes: the fastest mma.sync tile built for that dtype and head dim
    bf16, fp16 = torch.bfloat16, torch.float16
    assert [cl.fit_grid(v, cl.V7_MAX_HEADS + 1, t, d) for v in (7, 8) for t, d in ((bf16, 128), (fp16, 128),
                                                                                    (bf16, 64))] == [2, 0, 0] * 2
    assert cl.fit_grid(7, cl.V7_MAX_HEADS, bf16, 64) == 7 and cl.fit_grid(2, 10**6, bf16, 128) == 2
    monkeypatch.setattr(cl, "_arch", lambda device=None: (8, 9))
    assert cl.attention_variants(torch.bfloat16, 128) == (0, 2)
    assert [cl.default_variant(torch.bfloat16, 128), cl.default_variant(torch.float16, 128)] == [2, 0]
    assert not any("90a" in f or "SM90A" in f for f in cl.cuda_flags())


def _cpu(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(q=_cpu(1, 2, 8, 64), k=_cpu(1, 2, 9, 64), v=_cpu(1, 2, 8, 64)), "one shape"),
    (dict(q=_cpu(1, 2, 8, 32), k=_cpu(1, 2, 8, 32), v=_cpu(1, 2, 8, 32)), "64 or 128"),
    (dict(q=_cpu(2, 8, 64), k=_cpu(2, 8, 64), v=_cpu(2, 8, 64)), r"\(B, H, S, D\)"),
    (dict(q=_cpu(1, 1, 8, 64, dtype=torch.float32), k=_cpu(1, 1, 8, 64, dtype=torch.float32),
          v=_cpu(1, 1, 8, 64, dtype=torch.float32)), "bfloat16 or all float16"),
    (dict(q=_cpu(1, 1, 8, 64), k=_cpu(1, 1, 8, 64), v=_cpu(1, 1, 8, 64), scale=float("nan")), "finite"),
    (dict(q=_cpu(1, 1, 8, 64), k=_cpu(1, 1, 8, 64), v=_cpu(1, 1, 8, 64), scale=-0.125), "positive"),
    (dict(q=_cpu(1, 1, 8, 64), k=_cpu(1, 1, 8, 64), v=_cpu(1, 1, 8, 64), scale=0.0), "positive"),
    (dict(q=_cpu(1, 1, 8, 64), k=_cpu(1, 1, 8, 64), v=_cpu(1, 1, 8, 64), causal=1), "bool"),
    (dict(q=_cpu(1, 1, 8, 64), k=_cpu(1, 1, 8, 64), v=_cpu(1, 1, 8, 64)), "CUDA tensors"),
])
def test_attention_rejects_bad_input(kwargs, message):
    kwargs.setdefault("causal", False)
    with pytest.raises(ValueError, match=message):
        cl.attention(**kwargs)


def _patch_args(B=1, C=3, H=32, W=32, P=16, E=64, dtype=torch.bfloat16) -> dict:
    n = (H // P) * (W // P)
    return dict(images=_cpu(B, C, H, W, dtype=dtype), weight=_cpu(E, C, P, P, dtype=dtype), bias=_cpu(E, dtype=dtype),
                cls=_cpu(E, dtype=dtype), pos=_cpu(1 + n, E, dtype=dtype), patch=P)


@pytest.mark.parametrize(("change", "message"), [
    (dict(patch=12), "multiple of 8"),
    (dict(patch=24), "multiple of 8 that divides"),
    (dict(weight=_cpu(64, 3, 8, 8)), r"weight must be \(E, 3, 16, 16\)"),
    (dict(weight=_cpu(60, 3, 16, 16)), "multiple of 8"),
    (dict(pos=_cpu(4, 64)), r"pos must be \(5, 64\)"),
    (dict(cls=_cpu(2, 64)), r"cls must be \(64,\)"),
    (dict(bias=_cpu(64, dtype=torch.float32)), "all inputs must be bfloat16"),
    ({}, "CUDA tensors"),
])
def test_patch_embed_rejects_bad_input(change, message):
    args = {**_patch_args(), **change}
    with pytest.raises(ValueError, match=message):
        cl.patch_embed(**args)


def test_patch_embed_accepts_leading_unit_dims_until_the_device_check():
    args = _patch_args()
    args["cls"] = args["cls"].reshape(1, 1, -1)
    args["pos"] = args["pos"].unsqueeze(0)
    with pytest.raises(ValueError, match="CUDA tensors"):  # shapes passed; only the device is wrong
        cl.patch_embed(**args)


def _mp_args(N=10, E=30, F=8, dtype=torch.float32, idx=torch.int64) -> dict:
    return dict(x=torch.randn(N, F).to(dtype), src=torch.randint(0, N, (E,), dtype=idx),
                dst=torch.randint(0, N, (E,), dtype=idx), w=torch.rand(E), num_nodes=N)


@pytest.mark.parametrize(("change", "message"), [
    (dict(x=torch.randn(10)), r"x must be \(N, F\)"),
    (dict(x=torch.randn(10, 8, dtype=torch.float64)), "float32 or bfloat16"),
    (dict(w=torch.rand(30, dtype=torch.float64)), "w must be"),
    (dict(src=torch.randint(0, 10, (30,), dtype=torch.int16)), "int32 or int64"),
    (dict(dst=torch.randint(0, 10, (30,), dtype=torch.int32)), "of one dtype"),
    (dict(w=torch.rand(29)), "1-D of one length"),
    (dict(num_nodes=-1), "num_nodes"),
    (dict(aggr="max"), "aggr"),
    (dict(unsorted="sort"), "unsorted must be one of"),
    (dict(rowptr=torch.zeros(10, dtype=torch.int64)), r"rowptr must be int32/int64 of shape \(11,\)"),
    ({}, "CUDA tensors"),
])
def test_message_passing_rejects_bad_input(change, message):
    args = {**_mp_args(), **change}
    with pytest.raises(ValueError, match=message):
        cl.message_passing(**args)


def test_references_agree_with_plain_torch():
    """The float64 references the GPU tests trust, checked against independent formulations on CPU."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 64) for _ in range(3))
    for causal in (False, True):
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert cl._rel_l2(cl._ref_attention(q, k, v, causal), ref) < 1e-12
    args = _patch_args(B=2, H=32, W=48, dtype=torch.float32)
    out = cl._ref_patch_embed(**args)
    img, wt = args["images"].double(), args["weight"].double()
    # patch (row 1, col 2) of image 1 by hand: grid is 2 x 3, so it is patch 1 * 3 + 2 = 5, token 6
    manual = (img[1, :, 16:32, 32:48] * wt).sum(dim=(1, 2, 3)) + args["bias"].double() + args["pos"].double()[6]
    assert torch.allclose(out[1, 6], manual)
    assert torch.allclose(out[0, 0], args["cls"].double() + args["pos"].double()[0])
    mp = _mp_args()
    ref = cl._ref_message_passing(**mp, aggr="mean")
    d = int(mp["dst"][0])
    into = mp["dst"] == d
    manual = (mp["x"].double()[mp["src"][into]] * mp["w"].double()[into, None]).sum(0) / int(into.sum())
    assert torch.allclose(ref[d], manual)
    isolated = torch.ones(mp["num_nodes"], dtype=torch.bool)
    isolated[mp["dst"]] = False
    assert (ref[isolated] == 0).all()
    assert cl._rel_l2(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])) == math.inf


# ---- without a GPU: the sm_90a build of variant 7, read back as SASS ------------------------------------------------

def _nvdisasm() -> str | None:
    """nvdisasm from PATH, /usr/local/cuda, or the nvidia-cuda-nvdisasm wheel (requirements-dev.txt)."""
    import importlib.util
    import shutil

    found = shutil.which("nvdisasm")
    places = [Path("/usr/local/cuda/bin")]
    spec = importlib.util.find_spec("nvidia")
    if spec and spec.submodule_search_locations:
        places += [Path(p) / cu / "bin" for p in spec.submodule_search_locations for cu in ("cu13", "cu12")]
    return found or next((str(p / "nvdisasm") for p in places if (p / "nvdisasm").exists()), None)


def _kernel_sass(sass: str, name: str) -> list[str]:
    """The instructions of the one function whose mangled name contains `name`, in order."""
    body = sass.split("//--------------------- .text.")[1:]
    code = [part for part in body if name in part.splitlines()[0]]
    assert len(code) == 1, f"{len(code)} functions named like {name}"
    return [line.split("*/", 1)[1].split(";")[0].strip() for line in code[0].splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]  # 5+ digits past 64 KB of code


def offline_build(name: str, tmp_path: Path, source_dir: Path = cl.SOURCE_DIR) -> tuple[str, str]:
    """`source_dir`/`name` through nvcc and ptxas for sm_90a without a GPU: (ptxas's report, the cubin's SASS from
    nvdisasm). Skips where nvcc or nvdisasm is missing; fails on a compile error."""
    cmd = cl.offline_nvcc(name, tmp_path / "out.cubin", cubin=True, source_dir=source_dir)
    if isinstance(cmd, str):
        pytest.skip(cmd)
    nvdisasm = _nvdisasm()
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm, in requirements-dev.txt)")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    sass = subprocess.run([nvdisasm, str(tmp_path / "out.cubin")], capture_output=True, text=True,
                          timeout=300, check=True).stdout
    return report, sass


@pytest.mark.sm90_offline
def test_variants_7_and_8_build_for_sm90a_and_their_softmax_runs_while_p_v_is_on_the_tensor_cores(tmp_path):
    """No GPU needed: csrc/levels/attention_ws.cu through nvcc and ptxas for sm_90a, then its SASS. ptxas's report:
    no spills, no wgmma serialisation advisory, in each of the eight builds (bf16 and fp16, D = 128 and 64, variant 7
    and variant 8 — O stored by TMA). The SASS, per build: in the main loop the softmax's exponentials (64 per tile)
    sit between the wait for the scores (DEPBAR.LE 1) and the wait for P V (DEPBAR.LE 0), the overlap the kernel
    exists for — ptxas had hoisted the second wait above them until the row sums were stored before it
    (keep_before_wait); variant 8 stores O with one TMA store per 64-column half and no global stores."""
    report, sass = offline_build("attention_ws.cu", tmp_path)
    kernels = re.findall(r"Compiling entry function '(\S*attention_ws_kernel\S*)'.*?(\d+) bytes spill stores", report,
                         re.S)
    assert len(kernels) == 8 and all(spills == "0" for _, spills in kernels), report[-4000:]
    # any "wgmma.mma_async instructions are serialized" advisory (C7510-C7520: registers, a branch ptxas cannot
    # prove warp-uniform, ...): a wait after every wgmma, no overlap left
    assert "serialized" not in report, report[-4000:]
    for dtype, d, tma in itertools.product(("I13__nv_bfloat16", "I6__half"), (128, 64), (0, 1)):
        code = _kernel_sass(sass, f"attention_ws_kernel{dtype}Li{d}ELb{tma}E")
        # variant 7: each thread's 4-byte pairs of O to global memory (2 rows x D/8); 8: none, one TMA store a half
        stores = sum(op.startswith("STG") for op in code), sum("UTMASTG" in op for op in code)
        assert stores == ((0, d // 64) if tma else (d // 4, 0)), f"{dtype} D={d} variant {7 + tma}: {stores}"
        qk = sum(op.startswith("HGMMA.64x128x16.F32") for op in code)
        pv = sum(op.startswith("HGMMA.64x64x16.F32") for op in code)
        if d == 128:
            # 8 k-steps each: first q k^T, loop q k^T and P V, last P V; + 4 for the last P V of a causal
            # diagonal tile's lower rows (its first 64 keys). (ptxas adds one 64x8 HGMMA on zero registers where
            # it injects a warpgroup arrive before that branch's products: not counted.)
            assert (qk, pv) == (36, 0)
            assert sum("UTMALDG" in op for op in code) == 8  # q, the first K, the loop's K and V: two boxes each
        else:
            # q k^T in 4 k-steps (first, loop); P V as n64 products: 8 k-steps (loop, last) + 4 (the half tile)
            assert (qk, pv) == (8, 20)
            assert sum("UTMALDG" in op for op in code) == 4  # one box per tile
        (first,) = [i for i, op in enumerate(code) if "DEPBAR.LE gsb0, 0x1" in op]  # the main loop's one
        second = next(i for i in range(first, len(code)) if "DEPBAR.LE gsb0, 0x0" in code[i])
        between = sum("MUFU.EX2" in op for op in code[first:second])
        assert between >= 64, f"{dtype} D={d}: {between} exponentials between the two waits (softmax after P V)"


# ---- with a GPU ---------------------------------------------------------------------------------------------------

def _poison_allocator(nbytes: int) -> None:
    """Fill a block of the caching allocator with NaN and free it, so an output the kernel allocates next likely
    reuses NaN bytes: any element the kernel does not write shows up as non-finite."""
    junk = torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    del junk


def _attn_inputs(B, H, S, D, dtype):
    return [torch.randn(B, H, S, D, device="cuda", dtype=torch.float32).to(dtype) for _ in range(3)]


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S", [1, 17, 64, 197, 300])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64(dtype, D, S, causal):
    q, k, v = _attn_inputs(2, 3, S, D, dtype)
    # a variant not yet run on a GPU is checked in its own process first (the test below): a hang there must not stop
    # this one
    variants = [v_ for v_ in cl.attention_variants(dtype, D) if (v_, D) not in cl.UNVERIFIED]
    ref = cl._ref_attention(q, k, v, causal)
    for variant in variants:
        _poison_allocator(q.numel() * q.element_size())
        out = cl._attention_variant(q, k, v, causal, None, variant)
        torch.cuda.synchronize()
        assert out.shape == q.shape and out.dtype == dtype
        err = cl._rel_l2(out, ref)
        assert err < ATTN_TOL[dtype], f"variant {variant}: rel L2 {err:.2e}"


@needs_cuda
@pytest.mark.parametrize(("variant", "head_dim"), cl.UNVERIFIED)
def test_an_unverified_variant_matches_float64_in_its_own_process(variant, head_dim):
    if variant not in cl.attention_variants(torch.bfloat16, head_dim):
        pytest.skip(f"variant {variant} is not built for D={head_dim} on this GPU")
    passed, report = cl.check_variant_in_child(variant, timeout_s=300, head_dim=head_dim)
    assert passed, report


@pytest.mark.gpu
def test_a_variant_checked_in_a_child_fails_with_the_reason_and_leaves_this_process_alone():
    """The hang path (no answer in time: the child is killed) and a check that could not run (no Hopper GPU here)
    both come back as a failed check with the reason, never as an exception or a pass."""
    passed, report = cl.check_variant_in_child(7, timeout_s=0.05)
    assert not passed and "no answer within 0.05 s" in report and "killed" in report
    if 7 not in cl.attention_variants(torch.bfloat16, 128):
        passed, report = cl.check_variant_in_child(7, timeout_s=300)
        assert not passed and "variant 7 is not built here for D = 128" in report


@needs_cuda
def test_attention_default_and_explicit_scale():
    q, k, v = _attn_inputs(1, 2, 129, 128, torch.bfloat16)
    out = cl.attention(q, k, v, causal=True, scale=0.3)
    assert cl._rel_l2(out, cl._ref_attention(q, k, v, True, 0.3)) < ATTN_TOL[torch.bfloat16]
    # a different scale must change the answer (the argument reaches the kernel)
    assert cl._rel_l2(cl.attention(q, k, v, causal=True), out) > 1e-2


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("B", "C", "H", "W", "P", "E"), [
    (2, 3, 32, 48, 16, 64),     # one tile, ragged M and N
    (3, 3, 64, 64, 16, 136),    # E not a multiple of the 128-wide tile
    (2, 4, 40, 24, 8, 256),     # P = 8, K = 256
    (5, 3, 224, 224, 16, 768),  # ViT-B/16 at a small batch: several M tiles, K = 768
])
def test_patch_embed_matches_float64(dtype, B, C, H, W, P, E):
    n = (H // P) * (W // P)
    dev = dict(device="cuda")
    args = dict(images=torch.randn(B, C, H, W, **dev).to(dtype),
                weight=(torch.randn(E, C, P, P, **dev) / math.sqrt(C * P * P)).to(dtype),
                bias=torch.randn(E, **dev).to(dtype), cls=torch.randn(E, **dev).to(dtype),
                pos=torch.randn(1 + n, E, **dev).to(dtype), patch=P)
    _poison_allocator(B * (1 + n) * E * 2)
    out = cl.patch_embed(**args)
    torch.cuda.synchronize()
    assert out.shape == (B, 1 + n, E) and out.dtype == dtype
    err = cl._rel_l2(out, cl._ref_patch_embed(**args))
    assert err < PATCH_TOL[dtype], f"rel L2 {err:.2e}"


def _graph(N, E, F, dtype, idx, isolated_every=7):
    """Random edges whose destinations skip every `isolated_every`-th node (isolated nodes must come out 0)."""
    dev = "cuda"
    allowed = torch.tensor([i for i in range(N) if i % isolated_every], device=dev)
    dst = allowed[torch.randint(0, len(allowed), (E,), device=dev)].to(idx)
    src = torch.randint(0, N, (E,), device=dev, dtype=idx)
    w = torch.rand(E, device=dev)
    x = torch.randn(N, F, device=dev).to(dtype)
    return x, src, dst, w


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
@pytest.mark.parametrize("F", [128, 64, 37, 300])
@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("sorted_edges", [True, "linked", "atomic"])
def test_message_passing_matches_float64(dtype, idx, F, aggr, sorted_edges):
    N, E = 300, 2500
    x, src, dst, w = _graph(N, E, F, dtype, idx)
    if dtype == torch.bfloat16:
        w = w.to(torch.bfloat16)
    ref = cl._ref_message_passing(x, src, dst, w, N, aggr)
    _poison_allocator(N * F * 4)
    if sorted_edges:
        order = torch.argsort(dst, stable=True)
        rowptr = torch.zeros(N + 1, dtype=torch.int64, device="cuda")
        rowptr[1:] = torch.cumsum(torch.bincount(dst.long(), minlength=N), 0)
        out = cl.message_passing(x, src[order], dst[order], w[order], N, aggr, rowptr=rowptr.to(idx))
    else:
        out = cl.message_passing(x, src, dst, w, N, aggr, unsorted=sorted_edges)
    torch.cuda.synchronize()
    assert out.shape == (N, F) and out.dtype == dtype
    err = cl._rel_l2(out, ref)
    assert err < MP_TOL[dtype], f"rel L2 {err:.2e}"
    assert (out[::7] == 0).all(), "isolated nodes must be exactly 0"


@needs_cuda
def test_message_passing_float32_weights_with_bfloat16_features_and_no_edges():
    x, src, dst, w = _graph(50, 400, 128, torch.bfloat16, torch.int64)
    for way in cl.UNSORTED:
        out = cl.message_passing(x, src, dst, w, 50, "sum", unsorted=way)  # w stays float32
        assert cl._rel_l2(out, cl._ref_message_passing(x, src, dst, w, 50)) < MP_TOL[torch.bfloat16], way
    empty = torch.empty(0, dtype=torch.int64, device="cuda")
    for rowptr, way in ((None, "linked"), (None, "atomic"), (torch.zeros(51, dtype=torch.int64, device="cuda"), None)):
        out = cl.message_passing(x, empty, empty, torch.empty(0, device="cuda"), 50, "mean", rowptr=rowptr,
                                 unsorted=way or "linked")
        assert out.shape == (50, 128) and (out == 0).all()


AGGRS_UNDER_TEST = ("sum", "mean")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_message_passing_walks_long_lists_as_the_sorted_kernel_sums_them(dtype):
    """A hub with 3000 in-edges (750 per list) beside nodes of degree 1: the walk covers every list to its end."""
    N, F = 200, 128
    hub_src = torch.randint(0, N, (3000,), device="cuda")
    src = torch.cat([hub_src, torch.arange(1, N, device="cuda")])
    dst = torch.cat([torch.zeros(3000, dtype=torch.int64, device="cuda"), torch.arange(1, N, device="cuda")])
    w = torch.rand(src.numel(), device="cuda")
    x = torch.randn(N, F, device="cuda").to(dtype)
    for aggr in AGGRS_UNDER_TEST:
        ref = cl._ref_message_passing(x, src, dst, w, N, aggr)
        for way in cl.UNSORTED:
            out = cl.message_passing(x, src, dst, w, N, aggr, unsorted=way)
            assert cl._rel_l2(out, ref) < MP_TOL[dtype], (aggr, way)


_DIRECT_CALL = """
import torch
from engine.kernels import cuda_levels as cl
q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.float16)
try:
    cl._ops().attention(q, q, q, False, 0.125, 9)
except RuntimeError as e:
    print("RAISED", str(e).splitlines()[0])
"""


@needs_cuda
def test_cuda_errors_surface_as_exceptions():
    """The C++ side checks too: a variant the library does not have fails with a clear error, not a crash.

    Run as a worker runs: in a child with libstdc++ preloaded. On the GPU image a C++ exception thrown from an
    extension can crash a process that did not preload it (the interposition docs/aoti.md describes), which is why
    every worker preloads it (engine.native.toolchain).
    """
    import os
    import subprocess
    import sys

    from engine.native.toolchain import with_libstdcxx_preloaded

    env = with_libstdcxx_preloaded(dict(os.environ))
    done = subprocess.run([sys.executable, "-c", _DIRECT_CALL], env=env, capture_output=True, text=True, timeout=600,
                          cwd=str(native.REPO_ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RAISED" in done.stdout and "variant 9" in done.stdout, done.stdout
