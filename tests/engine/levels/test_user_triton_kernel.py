"""A user's Triton kernel as a "yours" level: tests/engine/levels/user_kernels/user_triton_attention.py, causal flash
attention in the formulation of Triton's tutorial python/tutorials/06-fused-attention.py (exp2 online softmax, the
causal split into an unmasked off-diagonal stage and a masked diagonal one, a small autotune).

On the CPU it runs in Triton's interpreter: this module sets TRITON_INTERPRET=1 before triton is imported (as
tests/engine/kernels/conftest.py and tests/engine/modes/test_mlp_modes.py do) and skips, saying why, where triton or the
kernel was imported earlier without it. engine.kernels.triton._common is imported for its fix of Triton 3.6's
interpreter under numpy >= 2.4 (a loop bound built from tl.program_id). There the kernel matches the lab's fp32
reference at the small shape (S=80: the last query block and the diagonal's key tiles are partial), and on D = 32, 64,
128, tiny and sharp value ranges and ragged S against a float64 reference; through the harness it passes every guard.
bf16 is checked on the GPU only (Triton 3.6's interpreter multiplies bf16 dot operands as raw bits). On the GPU: bf16
and fp32 (tf32x3 dots) against the reference, and the harness at S=1024 — every guard, faster than L1-naive.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton and the kernel are imported

triton = pytest.importorskip("triton")

import triton.language.standard as tl_standard  # noqa: E402

from engine.kernels.triton._common import is_interpreted  # noqa: E402 - also fixes the interpreter's loop bounds
from engine.levels import get_component  # noqa: E402
from engine.levels.run import LevelsConfig, _naive_module, reference_output, run_level  # noqa: E402
from engine.levels.yours import level_key, load_impl  # noqa: E402
from engine.store.db import Metric, RunResult, Store  # noqa: E402
from engine.workloads.component import rel_l2_error  # noqa: E402

KERNELS = str(Path(__file__).resolve().parent / "user_kernels")
IMPL = "user_triton_attention:attention"
DEVICE = "cuda" if CUDA else "cpu"
pytestmark = pytest.mark.gpu  # compiled on a GPU, under the interpreter without one
ATTN = get_component("causal_attention")
SMALL = ATTN.shape("small")

attention = load_impl(IMPL, KERNELS)  # puts KERNELS on sys.path, as the harness's build does
kernel = sys.modules["user_triton_attention"]
if not CUDA and not (is_interpreted(kernel._attn_fwd) and is_interpreted(tl_standard.zeros)):
    pytest.skip("triton or user_triton_attention was imported before TRITON_INTERPRET=1 was set; CPU runs need the "
                "interpreter", allow_module_level=True)


def _ref64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention in float64 (plain math, like the harness's precision guard)."""
    s = q.shape[-2]
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def _store_ceilings(store: Store) -> None:
    """A ceilings run for this CPU that no kernel comes near (as in test_yours.py): the roofline guard gets a floor."""
    from engine.store.envinfo import capture_env

    run_id = store.create_run("ceilings", "ceilings", "measure", "cpu", {"device": "cpu"})
    store.start_run(run_id)
    store.record_result(run_id, RunResult(env=capture_env("cpu"), metrics=[
        Metric("copy_bw", 1e15, "B/s"), Metric("matmul_fp32", 1e18, "FLOP/s"), Metric("launch_us", 1e-3, "us")]))


def _guards(result: RunResult) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics if m.name.startswith("guard_")}


def test_it_matches_the_lab_reference_at_the_small_shape() -> None:
    naive = _naive_module(ATTN, SMALL, DEVICE, 0)
    tol = ATTN.tolerance(SMALL)
    for seed in (0, 1):
        inputs = ATTN.make_inputs(SMALL, DEVICE, seed)
        out = attention(*inputs)
        assert out.shape == inputs[0].shape and out.dtype == inputs[0].dtype
        err = rel_l2_error(out, reference_output(ATTN, SMALL, naive, inputs))
        assert err <= tol, f"seed {seed}: relative L2 error {err:.3g} > {tol:g}"


@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("s", [1, 63, 130])
def test_it_is_fp32_accurate_on_every_head_dim_ragged_s_and_value_range(d: int, s: int) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(1000 * d + s)
    for scale in (1.0, 1e-6, 10.0):  # the precision guard's tiny and sharp ranges
        q, k, v = (torch.randn(1, 2, s, d, device=DEVICE, generator=gen) * scale for _ in range(3))
        ref = _ref64(q, k, v)
        err = float((attention(q, k, v).double() - ref).norm() / ref.norm())
        assert err < 1e-4, f"D={d} S={s} scale {scale}: relative L2 error {err:.3g}"


@pytest.mark.skipif(CUDA, reason="interpreted on the CPU only; with a GPU the kernel runs compiled and the "
                                 "harness test on CUDA below covers it")
def test_through_the_harness_it_passes_every_guard(store: Store) -> None:
    _store_ceilings(store)
    result = run_level(LevelsConfig(component="causal_attention", shape="small", level=level_key(IMPL), iters=2,
                                    warmup=1, impl_path=KERNELS, db=str(store.path), quick_ceilings=True))
    figures = {m.name: m.value for m in result.metrics if m.phase in ("forward", None)}
    assert figures["rel_l2_err"] <= figures["tolerance"] and figures["median"] > 0
    guards = _guards(result)
    assert set(guards) >= {"guard_threads", "guard_inputs", "guard_aliasing", "guard_input_sets", "guard_precision",
                           "guard_background_cpu", "guard_timed_outputs", "guard_roofline"}
    assert [k for k, v in guards.items() if v != 1.0] == [], result.notes
    assert any(n.startswith(f"your kernel {IMPL} from ") and n.endswith("user_triton_attention.py")
               for n in result.notes), result.notes


@pytest.mark.skipif(not CUDA, reason="bf16 needs a GPU (Triton 3.6's interpreter multiplies bf16 dot operands as raw "
                                     "bits); fp32 with tf32x3 dots is a GPU path")
@pytest.mark.parametrize("d", [64, 128])
def test_on_cuda_bf16_and_fp32_match_the_reference(d: int) -> None:
    # each (S, D, dtype) autotunes its configs afresh (~20 s of compiling): two head widths, a ragged S in bf16
    gen = torch.Generator(device="cuda").manual_seed(d)
    for dtype, s, tol in ((torch.bfloat16, 1041, 2e-2), (torch.float32, 80, 2e-3)):
        for scale in (1.0, 10.0):
            q, k, v = ((torch.randn(2, 3, s, d, device="cuda", generator=gen) * scale).to(dtype) for _ in range(3))
            ref = _ref64(q, k, v)
            err = float((attention(q, k, v).double() - ref).norm() / ref.norm())
            assert err <= tol, f"{dtype} D={d} S={s} scale {scale}: relative L2 error {err:.3g} > {tol:g}"


@pytest.mark.skipif(not CUDA, reason="the S=1024 bf16 shape and the CUDA guards (L2 flush, other stream) need a GPU")
def test_on_cuda_at_s1024_it_passes_every_guard_and_beats_l1_naive() -> None:
    def run(level: str) -> RunResult:
        return run_level(LevelsConfig(component="causal_attention", shape="S=1024", level=level, device="cuda",
                                      iters=10, warmup=2, impl_path=KERNELS, quick_ceilings=True))

    mine, naive = run(level_key(IMPL)), run("L1-naive")
    guards = _guards(mine)
    assert guards.get("guard_other_stream") == 1.0 and [k for k, v in guards.items() if v != 1.0] == [], mine.notes
    assert any(n.startswith("guard l2_flush: PASS — ") for n in mine.notes), mine.notes
    median = {r: {m.name: m.value for m in x.metrics if m.phase == "forward"}["median"]
              for r, x in (("mine", mine), ("naive", naive))}
    assert median["mine"] < median["naive"], median
