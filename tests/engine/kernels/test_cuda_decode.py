"""The cluster decode attention (csrc/decode/decode_attention.cu, engine/kernels/cuda_decode.py): without a GPU, its
sm_90a build read back as SASS (no spills; the cluster barrier, the PDL wait); with an sm_90 GPU, RoPE, the cache
write and the attention against the model's ops in float64 at positions that leave CTAs of a cluster empty, fill a
split exactly or take two tiles, at cluster sizes 1–8, with and without PDL, in a CUDA graph replayed across
positions, and inside the lab's fused decode step."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from test_cuda_levels import _kernel_sass, offline_build  # this folder is on sys.path (no __init__.py)

from engine.kernels import cuda_decode

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def test_it_builds_for_sm90a_with_the_combine_behind_a_cluster_barrier(tmp_path) -> None:
    """No GPU needed: every instantiation (head dim 64 and 128 × 1, 2, 4, 8 query heads per kv head) through nvcc
    and ptxas for sm_90a without spills; in the 1B's (64, 4): the PDL wait (ACQBULK) after the launch of the next
    kernel (PREEXIT) and after the first tile's loads, two cluster barriers (UCGABAR), the peers' shared memory read
    between them, and the cache write after the first (whose release would otherwise wait for it)."""
    report, sass = offline_build("decode_attention.cu", tmp_path, cuda_decode.SOURCE_DIR)
    kernels = re.findall(r"Compiling entry function '(\S*decode_attention_kernel\S*)'.*?(\d+) bytes spill stores",
                         report, re.S)
    assert len(kernels) == len(cuda_decode.HEAD_DIMS) * len(cuda_decode.REPS), report[-4000:]
    assert all(s == "0" for _, s in kernels), report[-4000:]
    code = _kernel_sass(sass, "decode_attention_kernelILi64ELi4E")
    names = [op.split()[1] if op.startswith("@") else op.split()[0] for op in code]  # without the predicate
    at = {name: [i for i, op in enumerate(names) if op.startswith(name)] for name in
          ("PREEXIT", "ACQBULK", "UCGABAR_ARV", "LDGSTS", "LD.E", "STG.E.U16")}
    assert at["PREEXIT"][0] < at["LDGSTS"][0] < at["ACQBULK"][0]  # the first value tile in flight before the wait
    first, second = at["UCGABAR_ARV"]
    # the combine reads the peers' splits between the barriers, all at once: 3 values from each of up to 8 CTAs
    peer_reads = [i for i in at["LD.E"] if first < i < second]
    assert len(peer_reads) == 3 * cuda_decode.MAX_CLUSTER, peer_reads
    assert not any(names[i].startswith("MUFU") for i in range(first, peer_reads[-1])), "a read waits on an exp"
    assert sum(i > second for i in at["STG.E.U16"]) >= 2  # the new k and v stored after the second


def test_bad_choices_in_the_environment_are_refused_with_the_choices(monkeypatch) -> None:
    monkeypatch.setenv(cuda_decode.IMPL_ENV, "fast")
    with pytest.raises(ValueError, match="choose one of auto, cuda, triton"):
        cuda_decode.impl()
    for raw in ("0", "9", "two"):
        monkeypatch.setenv(cuda_decode.CLUSTER_ENV, raw)
        with pytest.raises(ValueError, match="from 1 to 8"):
            cuda_decode.cluster_size()
    monkeypatch.setenv(cuda_decode.CLUSTER_ENV, "4")
    assert cuda_decode.cluster_size() == 4


def _tensors(b: int, h: int, kvh: int, d: int, s: int, dtype=torch.bfloat16, device="cpu", seed: int = 0):
    from engine.workloads.llama import preset, rope_tables

    gen = torch.Generator().manual_seed(seed)
    cos, sin = rope_tables(replace(preset("tiny"), dim=h * d, heads=h, kv_heads=kvh), s)
    qkv = torch.randn(b, 1, (h + 2 * kvh) * d, generator=gen)
    k, v = (torch.randn(b, kvh, s, d, generator=gen) for _ in range(2))
    return [t.to(device, dtype) for t in (qkv, cos, sin, k, v)]


def test_fits_only_what_its_instantiations_cover() -> None:
    pos = torch.tensor([3])
    qkv, cos, sin, k, v = _tensors(1, 8, 2, 64, 16)
    assert cuda_decode.fits(qkv, cos, sin, k, v, pos)
    assert not cuda_decode.fits(qkv, cos, sin, k, v, pos.int())  # the kernel reads an int64 position
    assert not cuda_decode.fits(*_tensors(1, 8, 2, 64, 16, torch.float16), pos)
    assert not cuda_decode.fits(*_tensors(1, 8, 2, 32, 16), pos)  # head dim 32
    assert not cuda_decode.fits(*_tensors(1, 6, 2, 64, 16), pos)  # 3 query heads per kv head
    assert not cuda_decode.fits(*_tensors(1, 32, 2, 128, 16), pos)  # 16
    with pytest.raises(ValueError, match="want bf16, head dim in"):
        cuda_decode.attend_qkv(*_tensors(1, 8, 2, 32, 16), pos)


def test_without_a_gpu_that_takes_it_the_step_keeps_the_triton_kernels(monkeypatch) -> None:
    if SM90:
        pytest.skip("this machine's GPU takes it")
    assert not cuda_decode.takes("cuda") and not cuda_decode.wanted(torch.device("cuda"))
    assert cuda_decode.ensure("cuda").startswith("decode attention: the Triton split and combine kernels")
    monkeypatch.setenv(cuda_decode.IMPL_ENV, "triton")
    assert "MODELAB_DECODE_ATTENTION=triton" in cuda_decode.ensure("cuda")


needs_sm90 = pytest.mark.skipif(not SM90, reason="needs a GPU with thread-block clusters (sm_90)")


@pytest.fixture(scope="module")
def built() -> None:
    if not SM90:
        pytest.skip("needs a GPU with thread-block clusters (sm_90)")
    reason = cuda_decode.available()
    if reason:
        pytest.fail(f"the cluster kernel should build on this GPU: {reason}")


def _reference(qkv, cos_t, sin_t, k_cache, v_cache, pos: int):
    """The model's ops in float64: RoPE on q and the new k, the cache with position pos written, masked softmax."""
    from engine.kernels.triton.decode_attention import _reference
    from engine.workloads.llama import _rotate_half

    b, kvh, _, d = k_cache.shape
    h = qkv.shape[-1] // d - 2 * kvh
    cos, sin = cos_t[pos:pos + 1].double(), sin_t[pos:pos + 1].double()
    q, k, v = qkv.double().split([h * d, kvh * d, kvh * d], dim=-1)
    q = q.view(b, 1, h, d).transpose(1, 2)
    k = k.view(b, 1, kvh, d).transpose(1, 2)
    q, k = (x * cos + _rotate_half(x) * sin for x in (q, k))
    k_ref, v_ref = k_cache.double().clone(), v_cache.double().clone()
    k_ref[:, :, pos], v_ref[:, :, pos] = k[:, :, 0], v.view(b, kvh, d)
    return _reference(q, k_ref, v_ref, torch.tensor([pos], device=qkv.device)), k_ref, v_ref


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.double() - ref).norm() / ref.norm())


# (b, heads, kv heads, head dim, cache length): the 1B (GQA 4, D 64), the 7B (one query row, D 128), groups of 2 and 8,
# batch 2, and a 2048-position cache (1500 positions over 8 CTAs: two tiles of 128 in each).
SHAPES = [(1, 32, 8, 64, 640), (1, 32, 32, 128, 640), (2, 8, 4, 64, 2048), (1, 16, 2, 128, 300), (2, 4, 4, 64, 40)]


@needs_sm90
@pytest.mark.parametrize("cluster", [8, 3, 1])
@pytest.mark.parametrize("b,h,kvh,d,s", SHAPES)
def test_rope_the_cache_write_and_attention_match_float64(built, b, h, kvh, d, s, cluster) -> None:
    qkv, cos, sin, k_cache, v_cache = _tensors(b, h, kvh, d, s, device="cuda", seed=b + h + d + s)
    for pos in sorted({0, 1, 7, s // 2, s - 1, min(1500, s - 1)}):
        k_before, v_before = k_cache.clone(), v_cache.clone()
        out = cuda_decode.attend_qkv(qkv, cos, sin, k_cache, v_cache, torch.tensor([pos], device="cuda"), cluster)
        want, k_ref, v_ref = _reference(qkv, cos, sin, k_before, v_before, pos)
        others = torch.arange(s, device="cuda") != pos
        assert torch.equal(k_cache[:, :, others], k_before[:, :, others])
        assert torch.equal(v_cache[:, :, others], v_before[:, :, others])
        assert _rel(k_cache[:, :, pos], k_ref[:, :, pos]) < 8e-3
        assert torch.equal(v_cache[:, :, pos], v_ref[:, :, pos].to(torch.bfloat16))
        assert out.shape == (b, h, 1, d) and _rel(out, want) < 1.6e-2, (pos, _rel(out, want))


@needs_sm90
def test_with_and_without_pdl_and_against_the_triton_kernels(built, monkeypatch) -> None:
    from engine.kernels.triton import decode_attention as da

    qkv, cos, sin, k_cache, v_cache = _tensors(1, 32, 8, 64, 640, device="cuda", seed=4)
    pos = torch.tensor([575], device="cuda")
    outs = []
    for pdl in (True, False):
        outs.append(cuda_decode.attend_qkv(qkv, cos, sin, k_cache.clone(), v_cache.clone(), pos, pdl=pdl))
    monkeypatch.setenv(cuda_decode.IMPL_ENV, "triton")
    triton_out = da.decode_attention_qkv_fwd(qkv, cos, sin, k_cache.clone(), v_cache.clone(), pos)
    assert torch.equal(outs[0], outs[1])
    assert torch.allclose(outs[0].float(), triton_out.float(), rtol=2e-2, atol=2e-2)
    monkeypatch.setenv(cuda_decode.IMPL_ENV, "auto")  # and the qkv variant's calls go here once it is loaded
    assert torch.equal(da.decode_attention_qkv_fwd(qkv, cos, sin, k_cache.clone(), v_cache.clone(), pos), outs[0])


@needs_sm90
def test_a_cuda_graph_replays_it_at_every_position(built) -> None:
    qkv, cos, sin, k_cache, v_cache = _tensors(1, 32, 8, 64, 640, device="cuda", seed=9)
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    k_g, v_g = k_cache.clone(), v_cache.clone()
    cuda_decode.attend_qkv(qkv, cos, sin, k_g.clone(), v_g.clone(), pos)  # loads the library before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cuda_decode.attend_qkv(qkv, cos, sin, k_g, v_g, pos)
    for at in (0, 63, 64, 300, 639):
        pos.fill_(at)
        graph.replay()
        want = cuda_decode.attend_qkv(qkv, cos, sin, k_cache, v_cache, pos)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(k_g, k_cache) and torch.equal(v_g, v_cache), at


_BAD_CALLS = """
import sys, torch
from engine.kernels import cuda_decode
cuda_decode.load()
op = torch.ops.modelab_decode.decode_attention
t = lambda *s, dt=torch.bfloat16: torch.zeros(*s, device="cuda", dtype=dt)
qkv, cos, k, pos = t(1, 1, 768), t(16, 64), t(1, 2, 16, 64), torch.tensor([3], device="cuda")
calls = {"cluster": (qkv, cos, cos, k, k.clone(), pos, 9, True),
         "tables": (qkv, cos[:8], cos[:8], k, k.clone(), pos, 8, True),
         "dtype": (qkv.half(), cos, cos, k, k.clone(), pos, 8, True)}
try:
    op(*calls[sys.argv[1]])
except RuntimeError as exc:
    print(str(exc).splitlines()[0])
"""


@needs_sm90
@pytest.mark.parametrize("case,message", [("cluster", "cluster must be 1 .. 8"), ("tables", "rotary tables must be"),
                                          ("dtype", "must be contiguous bfloat16")])
def test_the_op_refuses_bad_input_itself(built, case: str, message: str) -> None:
    """Called directly, bypassing attend_qkv's checks: a RuntimeError with the reason — in a child process, so a
    crash fails this test rather than the session."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _BAD_CALLS, case], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0 and message in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])


@needs_sm90
def test_the_fused_decode_step_runs_it_and_decodes_like_the_triton_kernels(built, monkeypatch) -> None:
    """The 1B's attention shape (8 kv heads, GQA 4, D 64) in a 2-layer bf16 model: triton-fused's prepare notes the
    cluster kernel; its decode step (fused GEMVs, decode_attention_qkv) on the cluster kernel gives the tokens of
    the same step on the Triton kernels, with logits within bf16 rounding."""
    from engine.kernels.triton import decode_attention as da
    from engine.kernels.triton.gemv import FusedDecodeOps
    from engine.llm.generate import Decoder, generate, step_fn
    from engine.llm.modes import get_mode, prepare
    from engine.workloads.llama import build_model, preset

    cfg = preset("1B", layers=2)
    model = build_model(cfg, "cuda", torch.bfloat16, seed=5).eval()
    model.setup_cache(1, 64)
    notes = " ".join(prepare(get_mode("triton-fused"), model, "cuda").notes)  # compiles nothing until called
    assert "the splits of each kv head the 8 CTAs of a cluster" in notes, notes
    torch._dynamo.reset()
    prompt = torch.randint(0, cfg.vocab, (1, 24), generator=torch.Generator().manual_seed(2)).cuda()
    calls = []
    real = cuda_decode.attend_qkv
    monkeypatch.setattr(cuda_decode, "attend_qkv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    runs = {}
    with torch.no_grad():
        model.set_fused_ops(FusedDecodeOps)
        for layer in model.layers:
            layer.self_attn.decode_attn_qkv = da.decode_attention_qkv
        for choice in ("triton", "auto"):
            monkeypatch.setenv(cuda_decode.IMPL_ENV, choice)
            runs[choice] = generate(step_fn(model), Decoder(step_fn(model)), prompt, 6)
    assert len(calls) == 2 * 6  # two layers, six decode steps: every one on the cluster kernel under auto
    assert torch.equal(runs["auto"].tokens, runs["triton"].tokens)
    for a, b in zip(runs["auto"].logits, runs["triton"].logits):
        assert float((a.double() - b.double()).norm() / b.double().norm()) < 2e-2
