"""Check and time the L4 Triton kernels at their real shapes on a CUDA GPU, against torch.

Each kernel is checked against torch in fp32/fp64 on upcast inputs (rel L2 error ||out - ref|| / ||ref||), then timed
with triton.testing.do_bench (median; it warms up and flushes L2 before every run) beside its torch baseline.
The last lines are a short table: us, TFLOP/s or TB/s, ratio to the baseline.

    python benchmarks/triton_kernels_gpu.py                       # everything, autotuned, on CUDA
    python benchmarks/triton_kernels_gpu.py --only attn --sweep   # also time each attention config on its own
    python benchmarks/triton_kernels_gpu.py --only attn --gluon   # also the Gluon kernel (attention_ws.py) (Hopper;
                                                               # check it first: gpu_check.sh gluon-l4 does)
    python benchmarks/triton_kernels_gpu.py --only mp             # message passing: sorted; unsorted bucketed
                                                               # (bucketing timed alone too) and atomic; torch
                                                               # index_add_; PyG's scatter where installed
    python benchmarks/triton_kernels_gpu.py --smoke               # tiny shapes on CPU, interpreted: checks this script
    python benchmarks/triton_kernels_gpu.py --aot                 # no GPU needed: compile every tuned config for
                                                               # sm_90 and print registers / spills / smem / wgmma / TMA

Counting: causal attention FLOPs = 2*B*H*S*S*D (half of 4*B*H*S^2*D), non-causal 4*B*H*S^2*D; patch embed
2*M*E*K; message passing bytes = E*F*itemsize + N*F*itemsize + E*(2*idx_itemsize + w_itemsize).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

if "--smoke" in sys.argv:  # must precede the first triton import
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import triton  # noqa: E402

import engine.kernels.triton.attention as attn_mod  # noqa: E402
import engine.kernels.triton.message_passing as mp_mod  # noqa: E402
import engine.kernels.triton.patch_embed as pe_mod  # noqa: E402

ROWS: list[tuple[str, float, str, float, str]] = []  # (name, us, rate, baseline us, verdict)
DEV = "cpu" if "--smoke" in sys.argv else "cuda"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("nan")
    return float((out64 - ref64).norm() / ref64.norm())


def bench_us(fn: Callable[[], object]) -> float:
    if DEV == "cpu":  # smoke mode: one interpreted call, a check of the script rather than a timing
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def report_timings(kernel: object, label: str) -> None:
    timings = getattr(kernel, "configs_timings", None) or {}
    for cfg, t in sorted(timings.items(), key=lambda kv: kv[1][0] if isinstance(kv[1], list) else kv[1]):
        ms = t[0] if isinstance(t, list) else t
        print(f"    [{label}] {cfg.kwargs} w={cfg.num_warps} s={cfg.num_stages}: {ms * 1e3:.1f} us")
    best = getattr(kernel, "best_config", None)
    if best is not None:
        print(f"    [{label}] best: {best}")


def run_gluon(name: str, q: torch.Tensor, causal: bool, ref: torch.Tensor, flops: int, t_sdpa: float) -> None:
    """The Gluon attention (engine/kernels/triton/attention_ws.py), checked, timed."""
    from engine.kernels.triton import attention_ws

    why = attention_ws.unsupported(q)
    if why:
        print(f"{name} gluon: {why}")
        return
    out = attention_ws.attention_ws(q, q, q, causal)
    err = rel_err(out, ref)
    if err >= 1e-2:
        print(f"{name} gluon: err={err:.1e} FAIL, not timed")
        return
    t = bench_us(lambda: attention_ws.attention_ws(q, q, q, causal))
    print(f"{name} gluon: {t:.1f} us {flops / t / 1e6:.0f} TFLOP/s | ratio {t_sdpa / t:.2f} to SDPA", flush=True)
    ROWS.append((f"{name} gluon", t, f"{flops / t / 1e6:.0f} TFLOP/s", t_sdpa,
                 f"{t_sdpa / t:.2f}x SDPA; err={err:.1e}"))


def run_attention(small: bool, sweep: bool, gluon: bool = False) -> None:
    cases = [  # name, B, H, S, D, causal, target ratio vs SDPA
        ("attn causal S=4096", 4, 16, 4096, 128, True, 0.8),
        ("attn causal S=1024", 4, 16, 1024, 128, True, None),
        ("attn vit S=197", 64, 12, 197, 64, False, None),
    ]
    if small:
        cases = [("attn causal S=100", 1, 2, 100, 64, True, 0.8), ("attn vit S=37", 2, 2, 37, 64, False, None)]
    for name, B, H, S, D, causal, target in cases:
        torch.manual_seed(0)
        dt = torch.float16 if small else torch.bfloat16  # the interpreter's dot cannot take bfloat16
        q, k, v = (torch.randn(B, H, S, D, device=DEV, dtype=dt) for _ in range(3))
        out = attn_mod.attention(q, k, v, causal)  # first call autotunes
        report_timings(attn_mod._attn_fwd_tuned, name)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        err = rel_err(out, ref)
        flops = (2 if causal else 4) * B * H * S * S * D
        t_tri = bench_us(lambda: attn_mod.attention(q, k, v, causal))
        t_sdpa = bench_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        tf_tri, tf_sdpa = flops / t_tri / 1e6, flops / t_sdpa / 1e6
        ratio = tf_tri / tf_sdpa
        verdict = f"err={err:.1e}{'' if err < 1e-2 else ' FAIL'}"
        if target is not None:
            verdict += f"; target >={target}x: {'met' if ratio >= target else 'NOT met'}"
        print(f"{name}: triton {t_tri:.1f} us {tf_tri:.0f} TFLOP/s | SDPA {t_sdpa:.1f} us {tf_sdpa:.0f} TFLOP/s | "
              f"ratio {ratio:.2f} | {verdict}", flush=True)
        ROWS.append((name, t_tri, f"{tf_tri:.0f} TFLOP/s", t_sdpa, f"{ratio:.2f}x SDPA; {verdict}"))
        if gluon and not small:  # q as k and v too: the reference above was computed on three different tensors
            ref_self = F.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=causal)
            run_gluon(name, q, causal, ref_self, flops, t_sdpa)
        if target is not None:  # the target shape: also the pointer (no TMA) path, and each config on its own
            out_p = attn_mod._attention(q, k, v, causal, use_desc=False)
            err_p = rel_err(out_p, ref)
            t_ptr = bench_us(lambda: attn_mod._attention(q, k, v, causal, use_desc=False))
            report_timings(attn_mod._attn_fwd_tuned, name + " no-TMA")
            print(f"{name} pointer path: {t_ptr:.1f} us {flops / t_ptr / 1e6:.0f} TFLOP/s err={err_p:.1e}", flush=True)
            ROWS.append((name + " (no TMA)", t_ptr, f"{flops / t_ptr / 1e6:.0f} TFLOP/s", t_sdpa,
                         f"{t_sdpa / t_ptr:.2f}x SDPA; err={err_p:.1e}"))
            for bm, bn, w, s in ([(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4),
                                  (64, 64, 4, 3)] if sweep else []):
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
                try:
                    t = bench_us(lambda: attn_mod._attention(q, k, v, causal, config=cfg))
                    print(f"    sweep {cfg}: {t:.1f} us {flops / t / 1e6:.0f} TFLOP/s", flush=True)
                except Exception as exc:  # a config that does not compile is reported, not fatal
                    print(f"    sweep {cfg}: failed {type(exc).__name__}: {str(exc)[:120]}")


def run_patch_embed(small: bool) -> None:
    B, C, HW, P, E = (2, 3, 32, 16, 64) if small else (64, 3, 224, 16, 768)
    torch.manual_seed(0)
    dt = torch.float16 if small else torch.bfloat16
    images = torch.randn(B, C, HW, HW, device=DEV, dtype=dt)
    weight = (torch.randn(E, C, P, P, device=DEV) * (C * P * P) ** -0.5).to(dt)
    bias, cls = torch.randn(E, device=DEV, dtype=dt), torch.randn(E, device=DEV, dtype=dt)
    n_patches = (HW // P) ** 2
    pos = torch.randn(1 + n_patches, E, device=DEV, dtype=dt)
    out = pe_mod.patch_embed(images, weight, bias, cls, pos, P)
    report_timings(pe_mod._patch_embed_tuned, "patch_embed")

    def torch_path(img: torch.Tensor, wt: torch.Tensor, bs: torch.Tensor, cl: torch.Tensor,
                   ps: torch.Tensor) -> torch.Tensor:
        x = F.conv2d(img, wt, bs, stride=P).flatten(2).transpose(1, 2)
        return torch.cat([cl.expand(img.shape[0], 1, -1), x], dim=1) + ps

    ref = torch_path(images.float(), weight.float(), bias.float(), cls.float(), pos.float())
    err = rel_err(out, ref)
    flops = 2 * B * n_patches * E * C * P * P
    t_tri = bench_us(lambda: pe_mod.patch_embed(images, weight, bias, cls, pos, P))
    t_torch = bench_us(lambda: torch_path(images, weight, bias, cls, pos))
    t_conv = bench_us(lambda: F.conv2d(images, weight, bias, stride=P))
    verdict = f"err={err:.1e}{'' if err < 1e-2 else ' FAIL'}; target <=60 us: {'met' if t_tri <= 60 else 'NOT met'}"
    print(f"patch_embed: triton {t_tri:.1f} us {flops / t_tri / 1e6:.0f} TFLOP/s | torch conv+cat+pos {t_torch:.1f} us"
          f" | conv alone {t_conv:.1f} us | {verdict}", flush=True)
    ROWS.append((f"patch_embed B={B}", t_tri, f"{flops / t_tri / 1e6:.0f} TFLOP/s", t_torch,
                 f"{t_torch / t_tri:.1f}x torch conv+cat+pos (conv alone {t_conv:.0f} us); {verdict}"))


def _pyg_scatters() -> dict[str, Callable[..., torch.Tensor]]:
    """PyTorch Geometric's scatter (and torch_scatter's, which PyG uses where it is installed), where importable:
    the peers for unsorted edges. {} where neither is installed (the dev machine)."""
    found: dict[str, Callable[..., torch.Tensor]] = {}
    try:
        from torch_geometric.utils import scatter

        found["PyG scatter"] = lambda msg, index, n: scatter(msg, index, dim=0, dim_size=n, reduce="sum")
    except ImportError:
        pass
    try:
        import torch_scatter

        found["torch_scatter"] = lambda msg, index, n: torch_scatter.scatter(msg, index, dim=0, dim_size=n,
                                                                             reduce="sum")
    except ImportError:
        pass
    return found


def run_message_passing(small: bool) -> None:
    """Sorted (CSR) and unsorted edges; unsorted every way — linked lists per destination built on the device then
    a walk (the default), a CSR bucketed on the device then the segment reduce (the grouping inside the timed call for
    both, and timed alone too), fp32 atomics — beside torch's index_add_ and, where installed, PyTorch Geometric's
    scatter on the same graph (each gathers x[src] * w first, as a user of those calls does). Every path is checked
    against the float64 reference before it is timed."""
    N, E, Fd = (300, 3000, 64) if small else (100_000, 1_000_000, 128)
    torch.manual_seed(0)
    src = torch.randint(0, N, (E,), device=DEV)
    dst = torch.randint(0, N, (E,), device=DEV)
    peers = _pyg_scatters()
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(N, Fd, device=DEV, dtype=dt)
        w = torch.rand(E, device=DEV, dtype=dt)
        src_s, w_s, rowptr = mp_mod.csr_from_edges(src, dst, w, N)
        item = x.element_size()
        nbytes = E * Fd * item + N * Fd * item + E * (2 * src.element_size() + w.element_size())
        tag = "fp32" if dt == torch.float32 else "bf16"
        tol = 1e-5 if dt == torch.float32 else 1e-2
        for aggr in ("sum", "mean"):
            ref = mp_mod._reference(x, src, dst, w, N, aggr)
            out_s = mp_mod.message_passing(x, src_s, dst, w_s, N, aggr, rowptr=rowptr)
            errs = {"sorted": rel_err(out_s, ref)}
            for way in mp_mod.UNSORTED:
                errs[f"unsorted {way}"] = rel_err(mp_mod.message_passing(x, src, dst, w, N, aggr, unsorted=way), ref)
            if aggr == "sum":
                report_timings(mp_mod._segment_reduce_tuned, f"mp {tag} segment")
                report_timings(mp_mod._linked_reduce_tuned, f"mp {tag} linked")
            print(f"mp {tag} {aggr}: err " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) + f" (tol {tol:.0e})"
                  f"{'' if max(errs.values()) < tol else ' FAIL'}", flush=True)

        def naive() -> torch.Tensor:
            return torch.zeros(N, Fd, device=DEV, dtype=dt).index_add_(0, dst, x[src] * w[:, None])

        ref = mp_mod._reference(x, src, dst, w, N, "sum")
        for name, peer in list(peers.items()):
            err = rel_err(peer(x[src] * w[:, None], dst, N), ref)
            if not err < tol:
                print(f"mp {tag}: {name} err {err:.1e} (tol {tol:.0e}) FAIL: not timed", flush=True)
                peers.pop(name)
        t_sorted = bench_us(lambda: mp_mod.message_passing(x, src_s, dst, w_s, N, "sum", rowptr=rowptr))
        t_way = {way: bench_us(lambda way=way: mp_mod.message_passing(x, src, dst, w, N, "sum", unsorted=way))
                 for way in mp_mod.UNSORTED}
        t_group = {"linked": bench_us(lambda: mp_mod.link_by_destination(src, dst, w, N)),
                   "bucket": bench_us(lambda: mp_mod.bucket_by_destination(src, dst, w, N))}
        t_naive = bench_us(naive)
        t_peers = {name: bench_us(lambda peer=peer: peer(x[src] * w[:, None], dst, N)) for name, peer in peers.items()}
        tbs = nbytes / t_sorted / 1e6
        best = t_way["linked"]
        print(f"mp {tag}: sorted {t_sorted:.1f} us {tbs:.2f} TB/s | "
              + " | ".join(f"unsorted {way} {us:.1f} us {nbytes / us / 1e6:.2f} TB/s"
                           + (f" (of which grouping alone {t_group[way]:.1f} us)" if way in t_group else "")
                           for way, us in t_way.items())
              + f" | torch index_add_ {t_naive:.1f} us"
              + "".join(f" | {k} {v:.1f} us" for k, v in t_peers.items())
              + ("" if peers else " | PyG not installed"), flush=True)
        ROWS.append((f"mp {tag} sorted", t_sorted, f"{tbs:.2f} TB/s", t_naive,
                     f"{t_naive / t_sorted:.1f}x index_add_; target >=2.0 TB/s: {'met' if tbs >= 2.0 else 'NOT met'}"))
        for way, us in t_way.items():
            tb = nbytes / us / 1e6
            note = f"{t_naive / us:.1f}x index_add_"
            if way in t_group:
                note += f"; grouping {t_group[way]:.1f} us; target >=2.5 TB/s: {'met' if tb >= 2.5 else 'NOT met'}"
            ROWS.append((f"mp {tag} unsorted {way}", us, f"{tb:.2f} TB/s", t_naive, note))
        for name, us in t_peers.items():
            ROWS.append((f"mp {tag} {name}", us, f"{nbytes / us / 1e6:.2f} TB/s", t_naive,
                         f"{t_naive / us:.1f}x index_add_; {us / best:.2f}x the linked time"))


def aot_report() -> int:
    """Compile the tuned configs for sm_90 through a stand-in driver (no GPU, nothing launched) and print what
    ptxas says: registers, spill stores, shared memory, and whether wgmma / TMA / cp.async / 16-byte loads appear."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.tools.tensor_descriptor import TensorDescriptor

    class _Sm90:
        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

    driver.set_active(_Sm90())  # type: ignore[arg-type]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"

    def show(name: str, kernel: object) -> None:
        ptx = kernel.asm["ptx"]  # type: ignore[attr-defined]
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as fh:
            fh.write(ptx)
        res = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", fh.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr
        os.unlink(fh.name)
        regs = re.search(r"Used (\d+) registers", res)
        spills = re.search(r"(\d+) bytes spill stores", res)
        print(f"{name}: regs={regs.group(1) if regs else '?'} spill_stores={spills.group(1) if spills else '?'} "
              f"smem={kernel.metadata.shared} wgmma={'wgmma' in ptx} "  # type: ignore[attr-defined]
              f"tma={'cp.async.bulk.tensor' in ptx} cp.async={'cp.async.cg' in ptx or 'cp.async.ca' in ptx} "
              f"ld.v4={len(re.findall(r'ld[.]global[.a-z0-9]*[.]v4', ptx))}", flush=True)

    bf16 = torch.bfloat16
    for causal, S, D in ((True, 4096, 128), (False, 197, 64)):
        q = torch.empty(4, 16, S, D, dtype=bf16)
        for cfg in attn_mod._prune(attn_mod._gpu_configs(), {"S": S}, HEAD_DIM=D):
            bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
            desc = TensorDescriptor(q, shape=[q.numel() // D, D], strides=[D, 1], block_shape=[bn, D])
            kern = attn_mod._attn_fwd_kernel.warmup(
                q, q, q, q, desc, desc, S, 16, 0.1, HEAD_DIM=D, CAUSAL=causal, USE_DESC=True, DOT_PREC=None,
                BLOCK_M=bm, BLOCK_N=bn, EVEN_N=S % bn == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                grid=(1,))
            show(f"attn S={S} D={D} causal={causal} {bm}x{bn} w={cfg.num_warps} s={cfg.num_stages}", kern)
    img, w = torch.empty(64, 3, 224, 224, dtype=bf16), torch.empty(768, 3, 16, 16, dtype=bf16)
    vec, pos = torch.empty(768, dtype=bf16), torch.empty(197, 768, dtype=bf16)
    out = torch.empty(64, 197, 768, dtype=bf16)
    for cfg in pe_mod._gpu_configs():
        kern = pe_mod._patch_embed_kernel.warmup(
            img, w, vec, vec, pos, out, 64 * 196, 768, 768, 196, 14, 224, 3 * 224 * 224, 224 * 224, P=16,
            **cfg.kwargs, EVEN_M=True, EVEN_N=True, EVEN_K=True, IDX64=False, DOT_PREC=None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, grid=(1,))
        show(f"patch_embed {cfg.kwargs} w={cfg.num_warps} s={cfg.num_stages}", kern)
    for dt in (torch.float32, bf16):
        x, o = torch.empty(100_000, 128, dtype=dt), torch.empty(100_000, 128, dtype=dt)
        idx, wt = torch.empty(1_000_000, dtype=torch.int64), torch.empty(1_000_000, dtype=dt)
        for cfg in mp_mod._gpu_configs():
            kern = mp_mod._segment_reduce_kernel.warmup(
                x, idx, wt, idx, o, 100_000, 128, MEAN=False, BLOCK_F=128, EVEN_F=True, IDX64=False, **cfg.kwargs,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, grid=(1,))
            show(f"segment_reduce {dt} {cfg.kwargs} w={cfg.num_warps}", kern)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="attn,pe,mp", help="comma list of attn, pe, mp")
    parser.add_argument("--sweep", action="store_true", help="also time fixed attention configs one by one")
    parser.add_argument("--gluon", action="store_true", help="also the Gluon attention in each consumer order")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under the interpreter")
    parser.add_argument("--aot", action="store_true", help="compile for sm_90 without a GPU; print resource usage")
    args = parser.parse_args()
    if args.aot:
        return aot_report()
    if not args.smoke and not torch.cuda.is_available():
        print("needs CUDA (or --smoke / --aot)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreted)"
    print(f"device {name} torch {torch.__version__} triton {triton.__version__}", flush=True)
    sections = {"attn": lambda: run_attention(args.smoke, args.sweep, args.gluon),
                "pe": lambda: run_patch_embed(args.smoke), "mp": lambda: run_message_passing(args.smoke)}
    failed = False
    for key in args.only.split(","):
        try:
            sections[key]()
        except Exception:  # report and go on with the next kernel
            failed = True
            traceback.print_exc()
    print("\n| kernel | us | rate | torch baseline us | vs baseline / check |")
    print("|---|---|---|---|---|")
    for row_name, us, rate, base, verdict in ROWS:
        print(f"| {row_name} | {us:.1f} | {rate} | {base:.1f} | {verdict} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
