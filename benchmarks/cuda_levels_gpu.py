"""Build the L5 CUDA kernels (csrc/levels/), check them against torch at small and real shapes, and time them.

    python3 benchmarks/cuda_levels_gpu.py [--out DIR] [--iters 50] [--only small,attn,patch,mp]
    CUDA_HOME=... python3 benchmarks/cuda_levels_gpu.py --compile-only [90]   # no GPU: nvcc + ptxas report only

1. Builds the extension (cached by source hash under $MODELAB_BUILD_DIR), capturing ninja's output, and prints ptxas's
   registers / stack / spills for every kernel (the full log: DIR/build.log).
   Attention builds not yet run on a GPU (cl.UNVERIFIED: variant, head dim) are checked first, each in a child
   process with a timeout; one that hangs, faults or is wrong is left out of the rest of the run.
2. Checks every kernel on fresh random inputs against a float64 reference at small shapes (ragged S, causal and not,
   sum/mean, sorted/unsorted, isolated nodes), then at the real shapes against torch in fp32/fp64.
3. Times each kernel and its torch baseline with CUDA events (warm-up, then the median of --iters calls; message
   passing and patch embedding rotate over several input sets so L2 does not hold the inputs between calls).
4. Prints a short table last: µs, TFLOP/s or TB/s, the baseline, and whether each target is met.

Counting: causal attention FLOPs = 2*B*H*S^2*D (half of 4*B*H*S^2*D), non-causal 4*B*H*S^2*D;
patch embed 2*M*E*K; message passing bytes = E*F*itemsize + N*F*itemsize + E*(2*idx_itemsize + w_itemsize).
Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.kernels import cuda_levels as cl  # noqa: E402

ROWS: list[dict] = []
FAILURES: list[str] = []
# attention builds (variant, head dim) that failed their check in a child process: never run in this one
SKIPPED: set[tuple[int, int]] = set()


def variants_for(dtype: torch.dtype, D: int) -> tuple[int, ...]:
    return tuple(v for v in cl.attention_variants(dtype, D) if (v, D) not in SKIPPED)


def check_unverified() -> None:
    """Builds not yet run on a GPU (cl.UNVERIFIED: variant, head dim) run first in a child process with a timeout:
    one that hangs, faults or is wrong is reported and left out of the rest of this run."""
    for var, head_dim in cl.UNVERIFIED:
        if var not in cl.attention_variants(torch.bfloat16, head_dim):
            continue
        start = time.perf_counter()
        passed, report = cl.check_variant_in_child(var, head_dim=head_dim)
        print(f"variant {var} at D={head_dim} (not yet run on a GPU), in a child process, "
              f"{time.perf_counter() - start:.0f} s: {'ok' if passed else 'FAILED'}\n"
              + "\n".join("  " + line for line in report.splitlines()))
        if not passed:
            SKIPPED.add((var, head_dim))
            FAILURES.append(f"variant {var} at D={head_dim} failed its check in a child process (left out of this run)")


def note_check(name: str, err: float, tol: float) -> None:
    ok = err < tol
    print(f"  check {name:<58} rel L2 {err:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}")
    if not ok:
        FAILURES.append(f"{name}: rel L2 {err:.2e} >= {tol:.0e}")


def time_us(fn: Callable[[int], object], iters: int, warmup: int = 10) -> tuple[float, float, float]:
    """Median, p10, p90 in µs of fn(i) (i picks the rotated input set), each call between its own CUDA events."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    samples = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return samples[len(samples) // 2], samples[len(samples) // 10], samples[(len(samples) * 9) // 10]


def add_row(name: str, us: tuple[float, float, float], rate: str, base_name: str = "",
            base_us: float | None = None, target: str = "", met: bool | None = None) -> None:
    ROWS.append(dict(name=name, us=us[0], p10=us[1], p90=us[2], rate=rate, base=base_name, base_us=base_us,
                     target=target, met=met))
    print(f"  time  {name:<44} {us[0]:9.1f} us (p10 {us[1]:.1f}, p90 {us[2]:.1f})  {rate}"
          + (f"   [{base_name} {base_us:.1f} us]" if base_us else ""))


# ---- build ------------------------------------------------------------------------------------------------------

def demangle(names: list[str]) -> list[str]:
    if not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def build(out_dir: Path) -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, "
          f"nvcc {cl._nvcc_version()}, flags {' '.join(cl.cuda_flags())}")
    print(f"build dir {cl.build_dir()}")
    log = out_dir / "build.log"
    start = time.perf_counter()
    with open(log, "w") as fh:  # ninja (a child process) writes to our fds 1 and 2: send them to the log
        sys.stdout.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            cl.load(verbose=True)
        finally:
            sys.stdout.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    print(f"built/loaded in {time.perf_counter() - start:.1f} s")
    print_ptxas_table(log.read_text(errors="replace"))


def print_ptxas_table(text: str) -> None:
    """One line per kernel from ptxas's --resource-usage output: registers, stack frame, spill stores/loads."""
    kernels: list[list] = []
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            kernels.append([m.group(1), "?", "?"])
        elif kernels and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                          line)):
            kernels[-1][2] = f"stack {m.group(1)} spill st {m.group(2)} ld {m.group(3)}"
        elif kernels and (m := re.search(r"Used (\d+) registers", line)):
            kernels[-1][1] = m.group(1)
    if not kernels:
        print("(no ptxas output: the library was cached)")
        return
    print("ptxas resource usage (registers, stack/spills):")
    for name, (_, regs, spill) in zip(demangle([k[0] for k in kernels]), kernels):
        short = re.sub(r"modelab_levels::\(anonymous namespace\)::", "", name)
        short = re.sub(r"\(.*\)$", "", short).replace("__nv_bfloat16", "bf16").replace("__half", "f16")
        print(f"  {regs:>4} regs  {spill:<34} {short[:110]}")


def compile_only(out_dir: Path, arch: str) -> int:
    """No GPU needed: compile every csrc/levels source for sm_<arch> with nvcc ($CUDA_HOME, e.g. pip's
    nvidia-cuda-nvcc; `cl.offline_nvcc`) against this torch's headers, print ptxas's registers/spills."""
    jobs = {}
    for name in cl.SOURCES:
        if name.endswith(".cu"):
            cmd = cl.offline_nvcc(name, out_dir / f"{name}.o", (int(arch[:-1]), int(arch[-1])))
            if isinstance(cmd, str):
                print(f"{cmd}; e.g. pip install --target DIR nvidia-cuda-nvcc==13.0.* nvidia-cuda-runtime==13.0.* "
                      "nvidia-cuda-cccl==13.0.* nvidia-nvvm==13.0.* nvidia-cuda-crt==13.0.* "
                      "and CUDA_HOME=DIR/nvidia/cu13")
                return 2
        else:
            from torch.utils.cpp_extension import include_paths

            cmd = [os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only",
                   *(f"-I{p}" for p in (out_dir / "stub_include", *include_paths(), cl.SOURCE_DIR)),
                   str(cl.SOURCE_DIR / name)]
        jobs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = 0
    for name, proc in jobs.items():
        text = proc.communicate()[0]
        (out_dir / f"{name}.log").write_text(text)
        errors = [line for line in text.splitlines() if re.search(r"\berror\b", line)]
        print(f"{name}: {'ok' if proc.returncode == 0 else 'FAILED'}" + "".join(f"\n  {e}" for e in errors[:10]))
        # ptxas's wgmma advisories (C75xx: products serialised, an arrive injected) cost overlap without failing
        for line in text.splitlines():
            if m := re.search(r"\((C75\d\d)\) (.*?) in (?:the )?function '(\S+)'", line):
                print(f"  ptxas {m.group(1)}: {m.group(2)} ({demangle([m.group(3)])[0][:90]})")
        failed += proc.returncode != 0
        if name.endswith(".cu"):
            print_ptxas_table(text)
    return 1 if failed else 0


# ---- inputs -------------------------------------------------------------------------------------------------------

def attn_inputs(B: int, H: int, S: int, D: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.randn(B, H, S, D, device="cuda").to(dtype) for _ in range(3)]


def patch_inputs(B: int, C: int, Hi: int, P: int, E: int, dtype: torch.dtype) -> dict:
    n = (Hi // P) ** 2
    return dict(images=torch.randn(B, C, Hi, Hi, device="cuda").to(dtype),
                weight=(torch.randn(E, C, P, P, device="cuda") / math.sqrt(C * P * P)).to(dtype),
                bias=torch.randn(E, device="cuda").to(dtype), cls=torch.randn(E, device="cuda").to(dtype),
                pos=torch.randn(1 + n, E, device="cuda").to(dtype), patch=P)


def graph(N: int, E: int, F_: int, dtype: torch.dtype, idx: torch.dtype, isolated_every: int = 0) -> dict:
    """Random edges (destinations skipping every isolated_every-th node when > 0), sorted by dst, with rowptr."""
    dst = torch.randint(0, N, (E,), device="cuda")
    if isolated_every:
        dst = torch.where(dst % isolated_every == 0, (dst + 1) % N, dst)
    dst = torch.sort(dst).values
    src = torch.randint(0, N, (E,), device="cuda")
    rowptr = torch.zeros(N + 1, dtype=torch.int64, device="cuda")
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=N), 0)
    perm = torch.randperm(E, device="cuda")  # the same edges, unsorted
    w = torch.rand(E, device="cuda").to(dtype)
    return dict(x=torch.randn(N, F_, device="cuda").to(dtype), src=src.to(idx), dst=dst.to(idx), w=w, rowptr=rowptr,
                src_u=src[perm].to(idx), dst_u=dst[perm].to(idx), w_u=w[perm], N=N)


# ---- sections -----------------------------------------------------------------------------------------------------

def small_checks() -> None:
    print("small shapes vs float64:")
    torch.manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        for D in (64, 128):
            variants = variants_for(dtype, D)
            for S in (1, 33, 197, 300):
                for causal in (False, True):
                    q, k, v = attn_inputs(2, 2, S, D, dtype)
                    ref = cl._ref_attention(q, k, v, causal)
                    for var in variants:
                        junk = torch.full((q.numel(),), float("nan"), device="cuda", dtype=dtype)
                        del junk  # poison: the output likely reuses this block
                        out = cl._attention_variant(q, k, v, causal, None, var)
                        note_check(f"attn {str(dtype)[6:]} D={D} S={S} causal={causal} v{var}", cl._rel_l2(out, ref),
                                   1.5e-2 if dtype == torch.bfloat16 else 4e-3)
    for dtype in (torch.bfloat16, torch.float16):
        for B, C, Hi, P, E in ((2, 3, 48, 16, 64), (3, 4, 40, 8, 136), (3, 3, 224, 16, 768)):
            args = patch_inputs(B, C, Hi, P, E, dtype)
            note_check(f"patch {str(dtype)[6:]} B={B} C={C} {Hi}px P={P} E={E}",
                       cl._rel_l2(cl.patch_embed(**args), cl._ref_patch_embed(**args)),
                       1e-2 if dtype == torch.bfloat16 else 3e-3)
    for dtype in (torch.float32, torch.bfloat16):
        for idx in (torch.int32, torch.int64):
            for F_ in (128, 37, 300):
                g = graph(500, 4000, F_, dtype, idx, isolated_every=5)
                for aggr in ("sum", "mean"):
                    ref = cl._ref_message_passing(g["x"], g["src"], g["dst"], g["w"], g["N"], aggr)
                    csr = cl.message_passing(g["x"], g["src"], g["dst"], g["w"], g["N"], aggr, rowptr=g["rowptr"])
                    coo = cl.message_passing(g["x"], g["src_u"], g["dst_u"], g["w_u"], g["N"], aggr)
                    tol = 1e-5 if dtype == torch.float32 else 8e-3
                    tag = f"mp {str(dtype)[6:]} {str(idx)[6:]} F={F_} {aggr}"
                    note_check(tag + " sorted", cl._rel_l2(csr, ref), tol)
                    note_check(tag + " unsorted", cl._rel_l2(coo, ref), tol)
                    if not ((csr[::5] == 0).all() and (coo[::5] == 0).all()):
                        FAILURES.append(tag + ": isolated nodes not 0")


def attention_real(iters: int) -> None:
    print("causal attention, B=4 H=16 D=128 bf16:")
    B, H, D = 4, 16, 128
    for S, causal in ((4096, True), (1024, True), (1024, False)):
        q, k, v = attn_inputs(B, H, S, D, torch.bfloat16)
        flops = (2 if causal else 4) * B * H * S * S * D
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        sdpa = time_us(lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=causal), iters)
        sdpa_tf = flops / sdpa[0] / 1e6
        add_row(f"attn SDPA S={S} causal={causal}", sdpa, f"{sdpa_tf:.0f} TFLOP/s")
        # every variant at S=4096; at S=1024 the default (8 where built) and 7
        variants = variants_for(torch.bfloat16, D)
        if S != 4096:
            variants = tuple(v for v in variants if v in (cl.default_variant(torch.bfloat16, D), 7))
        for var in variants:
            out = cl._attention_variant(q, k, v, causal, None, var)
            note_check(f"attn real S={S} causal={causal} v{var} vs SDPA fp32", cl._rel_l2(out, ref), 1.5e-2)
            t = time_us(lambda i: cl._attention_variant(q, k, v, causal, None, var), iters)
            tf = flops / t[0] / 1e6
            # the targets (causal): S=4096 at least SDPA's speed, S=1024 at least 0.9x
            ratio = 1.0 if S == 4096 else 0.9
            add_row(f"attn L5 v{var} S={S} causal={causal}", t, f"{tf:.0f} TFLOP/s", "SDPA", sdpa[0],
                    f">={ratio}x SDPA" if causal else "", (tf >= ratio * sdpa_tf) if causal else None)
        del q, k, v, ref
    print("ViT attention, B=64 H=12 S=197 D=64 bf16 (non-causal):")
    q, k, v = attn_inputs(64, 12, 197, 64, torch.bfloat16)
    flops = 4 * 64 * 12 * 197 * 197 * 64
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    vit_variants = variants_for(torch.bfloat16, 64)  # with 7 on Hopper (its D=64 build)
    for var in vit_variants:
        note_check(f"attn ViT v{var} vs SDPA fp32", cl._rel_l2(cl._attention_variant(q, k, v, False, None, var), ref),
                   1.5e-2)
    sdpa = time_us(lambda i: F.scaled_dot_product_attention(q, k, v), iters)
    add_row("attn SDPA ViT S=197 D=64", sdpa, f"{flops / sdpa[0] / 1e6:.0f} TFLOP/s")
    for var in vit_variants:
        t = time_us(lambda i: cl._attention_variant(q, k, v, False, None, var), iters)
        add_row(f"attn L5 v{var} ViT S=197 D=64", t, f"{flops / t[0] / 1e6:.0f} TFLOP/s", "SDPA", sdpa[0])


def patch_real(iters: int) -> None:
    print("patch embed, B=64 3x224x224 P=16 E=768 bf16:")
    sets = [patch_inputs(64, 3, 224, 16, 768, torch.bfloat16) for _ in range(4)]  # 4 x 19 MB of images: past L2
    a = sets[0]
    ref = cl._ref_patch_embed(**a)
    note_check("patch real vs float64", cl._rel_l2(cl.patch_embed(**a), ref), 1e-2)
    flops = 2 * (64 * 196) * 768 * 768

    def torch_patch(s: dict) -> torch.Tensor:
        conv = F.conv2d(s["images"], s["weight"], s["bias"], stride=16).flatten(2).transpose(1, 2)
        return torch.cat([s["cls"].reshape(1, 1, -1).expand(conv.shape[0], 1, -1), conv], 1) + s["pos"]

    note_check("patch torch formulation vs float64", cl._rel_l2(torch_patch(a), ref), 1e-2)
    conv = time_us(lambda i: F.conv2d(sets[i % 4]["images"], sets[i % 4]["weight"], sets[i % 4]["bias"], stride=16),
                   iters)
    add_row("patch conv2d alone (torch)", conv, f"{flops / conv[0] / 1e6:.0f} TFLOP/s")
    full = time_us(lambda i: torch_patch(sets[i % 4]), iters)
    add_row("patch torch conv+cat+pos", full, f"{flops / full[0] / 1e6:.0f} TFLOP/s")
    t = time_us(lambda i: cl.patch_embed(**sets[i % 4]), iters)
    add_row("patch L5 implicit GEMM", t, f"{flops / t[0] / 1e6:.0f} TFLOP/s", "conv", conv[0], "<=60 us",
            t[0] <= 60.0)


def mp_real(iters: int) -> None:
    N, E, F_ = 100_000, 1_000_000, 128
    for dtype in (torch.float32, torch.bfloat16):
        print(f"message passing N={N} E={E} F={F_} {dtype} int64:")
        sets = [graph(N, E, F_, dtype, torch.int64) for _ in range(3)]
        g = sets[0]
        item = torch.empty((), dtype=dtype).element_size()
        nbytes = E * F_ * item + N * F_ * item + E * (2 * 8 + item)
        ref = cl._ref_message_passing(g["x"], g["src"], g["dst"], g["w"], N, "sum")
        tol = 1e-5 if dtype == torch.float32 else 8e-3
        note_check(f"mp real {dtype} sorted", cl._rel_l2(
            cl.message_passing(g["x"], g["src"], g["dst"], g["w"], N, rowptr=g["rowptr"]), ref), tol)
        note_check(f"mp real {dtype} unsorted", cl._rel_l2(
            cl.message_passing(g["x"], g["src_u"], g["dst_u"], g["w_u"], N), ref), tol)
        note_check(f"mp real {dtype} mean sorted", cl._rel_l2(
            cl.message_passing(g["x"], g["src"], g["dst"], g["w"], N, "mean", rowptr=g["rowptr"]),
            cl._ref_message_passing(g["x"], g["src"], g["dst"], g["w"], N, "mean")), tol)
        del ref

        def index_add(s: dict) -> torch.Tensor:
            msg = s["x"][s["src_u"]] * s["w_u"][:, None]
            return torch.zeros(N, F_, device="cuda", dtype=dtype).index_add_(0, s["dst_u"], msg)

        base = time_us(lambda i: index_add(sets[i % 3]), iters)
        add_row(f"mp torch gather+index_add_ {str(dtype)[6:]}", base, f"{nbytes / base[0] / 1e6:.2f} TB/s")
        t = time_us(lambda i: cl.message_passing(sets[i % 3]["x"], sets[i % 3]["src"], sets[i % 3]["dst"],
                                                 sets[i % 3]["w"], N, rowptr=sets[i % 3]["rowptr"]), iters)
        tbs = nbytes / t[0] / 1e6
        add_row(f"mp L5 sorted (CSR) {str(dtype)[6:]}", t, f"{tbs:.2f} TB/s", "index_add", base[0], ">=2.0 TB/s",
                tbs >= 2.0)
        t = time_us(lambda i: cl.message_passing(sets[i % 3]["x"], sets[i % 3]["src_u"], sets[i % 3]["dst_u"],
                                                 sets[i % 3]["w_u"], N), iters)
        add_row(f"mp L5 unsorted (atomics) {str(dtype)[6:]}", t, f"{nbytes / t[0] / 1e6:.2f} TB/s", "index_add",
                base[0])
        sets = g = None  # free the inputs before the next dtype


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="cuda_levels_"))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--only", default="small,attn,patch,mp", help="comma list of sections")
    parser.add_argument("--compile-only", metavar="ARCH", nargs="?", const="90",
                        help="no GPU: only compile the sources for sm_ARCH (default 90) and print ptxas usage")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.compile_only:
        return compile_only(out_dir, args.compile_only)
    reason = cl._missing_tools()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    build(out_dir)
    check_unverified()
    sections = {"small": small_checks, "attn": lambda: attention_real(args.iters),
                "patch": lambda: patch_real(args.iters), "mp": lambda: mp_real(args.iters)}
    for name in args.only.split(","):
        try:
            sections[name]()
        except Exception as exc:  # noqa: BLE001 — report and go on to the next section
            traceback.print_exc()
            FAILURES.append(f"section {name}: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    (out_dir / "results.json").write_text(json.dumps({"rows": ROWS, "failures": FAILURES}, indent=1))
    print("\n" + "=" * 118)
    print(f"{'kernel':<40} {'median us':>10} {'p10-p90':>16} {'rate':>14} {'baseline':>18} {'target':>12} met")
    for r in ROWS:
        base = f"{r['base']} {r['base_us']:.1f}" if r["base_us"] else ""
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['name']:<40} {r['us']:>10.1f} {r['p10']:>7.1f}-{r['p90']:<8.1f} {r['rate']:>14} {base:>18} "
              f"{r['target']:>12} {met}")
    print(f"checks failed: {len(FAILURES)}" + "".join(f"\n  {f}" for f in FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
