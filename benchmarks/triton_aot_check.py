"""Compile the LLM lab's Triton kernels for a GPU target offline, without a GPU (Triton's bundled ptxas).

    python benchmarks/triton_aot_check.py [--arch 90] [--kernels bf16|quant|mp|attn|gluon|all, or a comma list]

A check, not a timing: tests/engine/kernels/test_decode_attention.py runs it on every `make test` (10-20 s on a
2-core CPU), and `benchmarks/gpu_check.sh decode` on the GPU machine.

Why: the `triton-gemv`, `triton-decode`, `triton-fused` and `triton-int8-wo` / `-fp8-wo` / `-int4-wo` kernels
(engine/kernels/triton/quant_gemv.py: every tile of its AOT_TILES_*, int8 and fp8 codes per channel, int4 in groups
of 64) are checked for correctness under Triton's
interpreter on CPU, but the interpreter does not lower anything to the GPU, so a construct the compiler rejects (a
shape, a layout, an op) would first show on the GPU machine. This compiles every tile configuration they can use, at
the 1B and 7B shapes, for sm_ARCH and prints one row per kernel (shared memory, compile seconds). Exit 1 on any
failure. Run with TRITON_INTERPRET unset (the interpreter's jit functions cannot be compiled).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


FUSIONS = ((True, False, False), (False, True, False), (True, False, True))  # norm_linear; linear_add; norm_swiglu


def _fusion_tag(norm: bool, add: bool, glu: bool) -> str:
    return " +norm +swiglu" if glu else " +norm" if norm else " +residual" if add else ""


def quant_jobs(arch: int):
    """The weight-only quantized GEMVs (the triton-*-wo LLM modes): every tile they may use, each code type, plain;
    the fused variants of the triton-fused step (norm, residual, norm + SwiGLU) at the tiles the modes launch."""
    from engine.kernels.triton import quant_gemv as qg

    pdl = arch >= 90
    sig = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*bf16", "y_ptr": "*bf16", "g_ptr": "*bf16", "r_ptr": "*bf16",
           "N": "i32", "K": "i32", "stride_qn": "i32"}
    codes = (("int8", False),) + ((("fp8", True),) if arch >= 89 else ())  # e4m3 conversions need sm_89+
    for code, fp8 in codes:  # read as words (K % 4 == 0: every LLM shape)
        for n, k, warps in qg.AOT_TILES_WORDS:
            fusions = ((False, False, False),) + (FUSIONS if (n, k, warps) in qg.LAUNCHED_TILES_WORDS else ())
            for norm, add, glu in fusions:
                yield (f"quant_gemv {code} words {n}x{k} w{warps}{_fusion_tag(norm, add, glu)}",
                       qg._wo_word_kernel, {**sig, "q_ptr": "*i32", "eps": "fp32"},
                       {"BLOCK_N": n, "BLOCK_K": k, "NORM": norm, "ADD": add, "GLU": glu, "PDL": pdl,
                        "ASM": True, "FP8": fp8}, warps)
    for code, fp8 in codes:  # byte by byte (K % 4 != 0)
        n, k, warps = qg.TILE_BYTES
        yield (f"quant_gemv {code} bytes {n}x{k} w{warps}", qg._wo_channel_kernel, {**sig, "eps": "fp32"},
               {"BLOCK_N": n, "BLOCK_K": k, "FP8": fp8, "NORM": False, "ADD": False, "PDL": pdl},
               warps)
    for n, groups, warps in qg.AOT_TILES_INT4:
        fusions = ((False, False, False),) + (FUSIONS if (n, groups, warps) in qg.LAUNCHED_TILES_INT4 else ())
        for norm, add, glu in fusions:
            yield (f"quant_gemv int4 {n}x{groups}g w{warps}{_fusion_tag(norm, add, glu)}", qg._wo_int4_kernel,
                   {**sig, "q_ptr": "*i32", "stride_sn": "i32", "eps": "fp32"},
                   {"BLOCK_N": n, "GROUPS": groups, "NORM": norm, "ADD": add, "GLU": glu, "PDL": pdl,
                    "ASM": True}, warps)
    n, groups, warps = qg.TILE_DEQUANT  # the several-row products' (prefill's) int4 dequantization, one kernel
    yield (f"dequant int4 {n}x{groups}g w{warps}", qg._dequant_int4_kernel,
           {"q_ptr": "*i32", "s_ptr": "*bf16", "w_ptr": "*bf16", "N": "i32", "K": "i32", "stride_qn": "i32",
            "stride_sn": "i32", "stride_wn": "i32"}, {"BLOCK_N": n, "GROUPS": groups}, warps)
    n, k, warps = qg.TILE_DEQUANT_CHANNEL  # and the int8 / fp8 one
    for code, fp8 in codes:
        yield (f"dequant {code} {n}x{k} w{warps}", qg._dequant_channel_kernel,
               {"q_ptr": "*u8", "s_ptr": "*bf16", "w_ptr": "*bf16", "N": "i32", "K": "i32", "stride_qn": "i32",
                "stride_wn": "i32"}, {"BLOCK_N": n, "BLOCK_K": k, "FP8": fp8}, warps)


def rows_jobs(arch: int):
    """The int4 rows kernel (engine/kernels/triton/quant_rows.py: a few rows, codes dequantized in the loads, a
    bf16 tensor-core dot) at the tiles it launches or the benchmark times."""
    from engine.kernels.triton import quant_rows as qr

    sig = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32",
           "K": "i32", "stride_xm": "i32", "stride_qn": "i32", "stride_sn": "i32", "stride_ym": "i32"}
    for block_m in qr.AOT_ROWS:
        for n, groups, warps in qr.AOT_TILES:
            yield (f"quant_rows int4 {block_m}x{n}x{groups}g w{warps}", qr._int4_rows_kernel, sig,
                   {"BLOCK_M": block_m, "BLOCK_N": n, "GROUPS": groups, "ASM": True, "IEEE": False}, warps)
    for block_m in qr.FMA_AOT_ROWS:  # the multiply-add form the benchmark times beside it
        for n, groups, warps in qr.FMA_TILES:
            yield (f"quant_rows int4 fma {block_m}x{n}x{groups}g w{warps}", qr._int4_rows_fma_kernel, sig,
                   {"BLOCK_M": block_m, "BLOCK_N": n, "GROUPS": groups, "ASM": True}, warps)


def gemv_rows_jobs(arch: int):
    """The split-K rows kernel (engine/kernels/triton/gemv_rows.py, a candidate rows_gemm_bench.py times) at every
    tile, for 16 and 32 rows, and its reduce."""
    from engine.kernels.triton import gemv_rows as gr

    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "K_PER": "i32",
           "stride_xm": "i32", "stride_wn": "i32"}
    for block_m in (16, 32):
        for n, k, warps, stages in gr.TILES:
            yield (f"gemv_rows {block_m}x{n}x{k} s{stages} w{warps}", gr._split_kernel, sig,
                   {"BLOCK_M": block_m, "BLOCK_N": n, "BLOCK_K": k, "STAGES": stages}, warps)
    yield ("gemv_rows reduce", gr._reduce_kernel, {"ws_ptr": "*fp32", "y_ptr": "*bf16", "MN": "i32", "SPLIT_K": "i32"},
           {"BLOCK": gr.REDUCE_BLOCK}, 4)


def quant_job_count(arch: int = 90) -> int:
    return sum(1 for _ in quant_jobs(arch))


def jobs(arch: int):
    from engine.kernels.triton import decode_attention as da
    from engine.kernels.triton import gemv as gm

    pdl = arch >= 90  # what the GPU runs: programmatic dependent launch on Hopper and later (_common.pdl_enabled)
    split_sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "pos_ptr": "*i64", "m_ptr": "*fp32",
                 "l_ptr": "*fp32", "o_ptr": "*fp32", "scale": "fp32", "KVH": "i32", "S_MAX": "i32",
                 "NUM_SPLITS": "i32"}
    combine_sig = {"m_ptr": "*fp32", "l_ptr": "*fp32", "o_ptr": "*fp32", "out_ptr": "*bf16", "NUM_SPLITS": "i32"}
    for preset, rep, d in (("1B", 4, 64), ("7B", 1, 128)):
        dot = True  # the GPU's bf16 path: tl.dot on the query rows padded to 16 (_attend's use_dot)
        rep_pad = max(16, 1 << (rep - 1).bit_length())
        split, block_s, split_warps = da.TILE_DOT if rep >= 2 else da.TILE_ROWS
        yield (f"decode_attention split {preset}", da._split_kernel, split_sig,
               {"REP": rep, "REP_PAD": rep_pad, "D": d, "SPLIT": split, "BLOCK_S": block_s, "PDL": pdl,
                "USE_DOT": dot}, split_warps)
        yield (f"decode_attention split+rope {preset}", da._split_kernel,
               {**split_sig, "cos_ptr": "*bf16", "sin_ptr": "*bf16", "QKV_ROW": "i32"},
               {"REP": rep, "REP_PAD": rep_pad, "D": d, "SPLIT": split, "BLOCK_S": block_s, "PDL": pdl,
                "FROM_QKV": True, "USE_DOT": dot}, split_warps)
        # one split over the whole cache (a cache of at most SPLIT positions): the split kernel writes the output
        final_sig = {k: v for k, v in split_sig.items() if k not in ("m_ptr", "l_ptr", "o_ptr")}
        yield (f"decode_attention one split+rope {preset}", da._split_kernel,
               {**final_sig, "cos_ptr": "*bf16", "sin_ptr": "*bf16", "QKV_ROW": "i32", "out_ptr": "*bf16"},
               {"m_ptr": None, "l_ptr": None, "o_ptr": None, "REP": rep, "REP_PAD": rep_pad, "D": d, "SPLIT": split,
                "BLOCK_S": block_s, "PDL": pdl, "FROM_QKV": True, "USE_DOT": dot, "FINAL": True}, split_warps)
        yield (f"decode_attention combine {preset}", da._combine_kernel, combine_sig,
               {"REP": rep, "REP_PAD": rep_pad, "D": d, "SPLITS_PAD": 1 << (640 // split - 1).bit_length(),
                "PDL": pdl}, 4)  # the splits of the lab's P + N = 640 cached positions
    # the next token's argmax: a short row in one program, a longer one in chunks
    from engine.kernels.triton import argmax as am

    chunk_sig = {"x_ptr": "*bf16", "out_ptr": "*i64", "part_val_ptr": "*fp32", "part_at_ptr": "*i32",
                 "part_nan_ptr": "*i32", "N": "i32", "stride_row": "i32", "CHUNKS": "i32"}
    yield ("argmax one row", am._chunk_kernel, chunk_sig, {"BLOCK": am.ONE_PROGRAM_MAX, "WHOLE_ROW": True, "PDL": pdl},
           am._warps(am.ONE_PROGRAM_MAX))
    yield ("argmax chunks", am._chunk_kernel, chunk_sig, {"BLOCK": am.CHUNK, "WHOLE_ROW": False, "PDL": pdl},
           am._warps(am.CHUNK))
    final_sig = {"part_val_ptr": "*fp32", "part_at_ptr": "*i32", "part_nan_ptr": "*i32", "out_ptr": "*i64",
                 "CHUNKS": "i32"}
    yield ("argmax final", am._final_kernel, final_sig, {"CHUNKS_PAD": 16, "PDL": pdl}, 1)  # 128256 values: 16 chunks
    # in place (the graph-decoded step: the token into the decoder's buffer, the position one on)
    yield ("argmax one row in place", am._chunk_kernel, {**chunk_sig, "pos_ptr": "*i64"},
           {"BLOCK": am.ONE_PROGRAM_MAX, "WHOLE_ROW": True, "PDL": pdl, "ADVANCE": True}, am._warps(am.ONE_PROGRAM_MAX))
    yield ("argmax final in place", am._final_kernel, {**final_sig, "pos_ptr": "*i64"},
           {"CHUNKS_PAD": 4, "PDL": pdl, "ADVANCE": True}, 1)  # 32000 values: 4 chunks
    gemv_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "g_ptr": "*bf16", "r_ptr": "*bf16", "N": "i32",
                "K": "i32", "stride_wn": "i32", "eps": "fp32"}
    for n, k, warps in gm.TILES:
        # plain; norm_linear; linear_add; norm_swiglu
        for norm, add, glu in ((False, False, False), *FUSIONS):
            yield (f"gemv {n}x{k} w{warps}{_fusion_tag(norm, add, glu)}", gm._gemv_kernel, gemv_sig,
                   {"BLOCK_N": n, "BLOCK_K": k, "NORM": norm, "ADD": add, "GLU": glu, "PDL": pdl}, warps)


def message_passing_jobs(arch: int):
    """Kernel Levels' L4 message passing (engine/kernels/triton/message_passing.py): the unsorted paths' device-side
    grouping kernels (link; count+rank, place) for both index widths and the weight dtypes, the two reduces (linked
    lists; segments, plain and over packed records) at their tuned tiles, the atomic scatter."""
    from engine.kernels.triton import message_passing as mp

    for idx in ("i32", "i64"):
        yield (f"mp count+rank dst {idx}", mp._count_rank_kernel,
               {"dst": f"*{idx}", "counts": "*i32", "rank": "*i32", "E": "i32"}, {"BLOCK": mp.BUCKET_BLOCK}, 4)
        for wt in ("fp32", "bf16"):
            yield (f"mp link {idx} w {wt}", mp._link_kernel,
                   {"src": f"*{idx}", "dst": f"*{idx}", "w": f"*{wt}", "head": "*i32", "records": "*i64", "E": "i32"},
                   {"BLOCK": mp.BUCKET_BLOCK}, 4)
            yield (f"mp place {idx} w {wt}", mp._place_kernel,
                   {"src": f"*{idx}", "dst": f"*{idx}", "w": f"*{wt}", "rank": "*i32", "rowptr": "*i32",
                    "records": "*i64", "E": "i32"}, {"BLOCK": mp.BUCKET_BLOCK}, 4)
    for xt in ("fp32", "bf16"):
        for cfg in mp._segment_reduce_tuned.configs:
            rows, warps = cfg.kwargs["ROWS"], cfg.num_warps
            for packed in (False, True):
                yield (f"mp segment reduce {xt}{' packed' if packed else ''} rows {rows} w{warps}",
                       mp._segment_reduce_kernel,
                       {"x": f"*{xt}", "src": "*i64" if packed else "*i32", "w": "*i64" if packed else f"*{xt}",
                        "rowptr": "*i32", "out": f"*{xt}", "N": "i32", "F": "i32"},
                       {"MEAN": False, "ROWS": rows, "BLOCK_F": 128, "EVEN_F": True, "IDX64": False,
                        "PACKED": packed}, warps)
        for cfg in mp._linked_reduce_tuned.configs:
            rows, warps = cfg.kwargs["ROWS"], cfg.num_warps
            yield (f"mp linked reduce {xt} rows {rows} w{warps}", mp._linked_reduce_kernel,
                   {"x": f"*{xt}", "records": "*i64", "head": "*i32", "out": f"*{xt}", "N": "i32", "F": "i32"},
                   {"MEAN": True, "ROWS": rows, "BLOCK_F": 128, "EVEN_F": True, "IDX64": False}, warps)
        yield (f"mp atomic scatter {xt}", mp._scatter_add_kernel,
               {"x": f"*{xt}", "src": "*i64", "dst": "*i64", "w": f"*{xt}", "buf": "*fp32", "deg": "*i32", "E": "i32",
                "F": "i32"}, {"MEAN": True, "BLOCK_E": 32, "BLOCK_F": 128, "IDX64": False}, 4)


def attention_jobs(arch: int):
    """Kernel Levels' L4 attention (engine/kernels/triton/attention.py) at every autotune tile, bf16, through tensor
    descriptors as Hopper runs it: D=128 causal with S a multiple of every tile (O stored through its descriptor),
    D=64 non-causal with a ragged S (ViT's 197: O through pointers, the K/V tail masked)."""
    from engine.kernels.triton import attention as at

    for d, causal, even in ((128, True, True), (64, False, False)):
        for cfg in at._gpu_configs():
            bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
            sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16",
                   "q_desc": f"tensordesc<bf16[{bm}, {d}]>", "k_desc": f"tensordesc<bf16[{bn}, {d}]>",
                   "v_desc": f"tensordesc<bf16[{bn}, {d}]>", "o_desc": f"tensordesc<bf16[{bm}, {d}]>",
                   "S": "i32", "H": "i32", "qk_scale": "fp32"}
            yield (f"attention D{d} {'causal' if causal else 'full'} {bm}x{bn} w{cfg.num_warps} s{cfg.num_stages}",
                   at._attn_fwd_kernel, sig,
                   {"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn, "CAUSAL": causal, "EVEN_M": even, "EVEN_N": even,
                    "USE_DESC": True, "DOT_PREC": None}, (cfg.num_warps, cfg.num_stages))


def gluon_jobs(arch: int):
    """Kernel Levels' L4 attention in Gluon (engine/kernels/triton/attention_ws.py, Hopper only): bf16 and fp16,
    D 128 and 64, causal and not. Its descriptors' signatures come from descriptors over CPU tensors."""
    if arch != 90:
        return
    import torch
    from triton.runtime.jit import mangle_type

    from engine.kernels.triton import attention_ws as aw

    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for d in aw.HEAD_DIMS[::-1]:
            t = torch.empty(1, 1, 256, d, dtype=dtype)
            q_desc, k_desc, v_desc = aw.descriptors(t, t, t)
            sig = {"q_desc": mangle_type(q_desc), "k_desc": mangle_type(k_desc), "v_desc": mangle_type(v_desc),
                   "o_ptr": f"*{name}", "S": "i32", "qk_scale": "fp32"}
            for causal in (True, False):
                yield (f"gluon attn {name} D{d} {'causal' if causal else 'full'}", aw._attn_ws_kernel, sig,
                       {"HEAD_DIM": d, "BLOCK_N": aw.BLOCK_N, "STAGES": aw.STAGES, "CAUSAL": causal}, 4)


def resource_usage(cubin: bytes) -> tuple[str, str]:
    """(registers, stack bytes) per thread from the cubin (Triton's bundled cuobjdump), '?' where it cannot say. A
    stack frame in a kernel without calls is spilled registers."""
    import re
    import subprocess
    import tempfile

    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    if not tool.exists():
        return "?", "?"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return (found.group(1), found.group(2)) if found else ("?", "?")


FAMILIES = ("bf16", "quant", "rows", "gemv_rows", "mp", "attn", "gluon")


def selected_jobs(arch: int, kernels: str):
    """The jobs of `kernels`: one family, `all`, or a comma list of families (in FAMILIES' order)."""
    wanted = set(FAMILIES) if kernels == "all" else set(kernels.split(","))
    if "bf16" in wanted:
        yield from jobs(arch)
    if "quant" in wanted:
        yield from quant_jobs(arch)
    if "rows" in wanted:
        yield from rows_jobs(arch)
    if "gemv_rows" in wanted:
        yield from gemv_rows_jobs(arch)
    if "mp" in wanted:
        yield from message_passing_jobs(arch)
    if "attn" in wanted:
        yield from attention_jobs(arch)
    if "gluon" in wanted:
        yield from gluon_jobs(arch)


def families(value: str) -> str:
    """--kernels: `all`, or one or more of FAMILIES, comma-separated."""
    names = [v.strip() for v in value.split(",")]
    if value != "all" and (not all(names) or not set(names) <= set(FAMILIES)):
        raise argparse.ArgumentTypeError(f"{value!r}: use all, or a comma list of {', '.join(FAMILIES)}")
    return value if value == "all" else ",".join(names)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability × 10 (default 90: H100/H200)")
    # default bf16: the set tests/engine/kernels/test_decode_attention.py counts; the quantized GEMVs are checked by
    # tests/engine/kernels/test_quant_gemv.py (--kernels quant); `all` is both
    parser.add_argument("--kernels", type=families, default="bf16",
                        help="bf16 (default): decode attention and the bf16 GEMVs; quant: the weight-only quantized "
                             "GEMVs; rows: the int4 rows kernel (a few rows × int4 codes); mp: Kernel Levels' L4 "
                             "message passing (bucketing, segment reduce, scatter); "
                             "attn: Kernel Levels' L4 attention at every autotune tile; gluon: its Gluon kernel "
                             "(sm_90); all: every one; or several, comma-separated (one process, one Triton import)")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: interpreted kernels cannot be compiled; unset it", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    target = GPUTarget("cuda", args.arch, 32)
    failed = 0
    rows = []
    for name, fn, signature, constants, launch in selected_jobs(args.arch, args.kernels):
        warps, stages = launch if isinstance(launch, tuple) else (launch, None)  # (num_warps, num_stages) or warps
        options = {"num_warps": warps, "launch_pdl": bool(constants.get("PDL"))}
        if stages is not None:
            options["num_stages"] = stages
        start = time.perf_counter()
        try:
            source = GluonASTSource if fn.is_gluon() else ASTSource  # a Gluon kernel brings its own layouts
            src = source(fn=fn, signature={**signature, **{k: "constexpr" for k in constants}}, constexprs=constants)
            kernel = triton.compile(src, target=target, options=options)
            regs, stack = resource_usage(kernel.asm["cubin"])
            rows.append((name, "ok", kernel.metadata.shared, regs, stack, time.perf_counter() - start))
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            rows.append((name, f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", 0, "-", "-",
                         time.perf_counter() - start))
    print(f"{'kernel':44} {'sm':>3} {'shared B':>8} {'regs':>4} {'stack':>5} {'s':>5}  result")
    for name, result, shared, regs, stack, seconds in rows:
        print(f"{name:44} {args.arch:3d} {shared:8d} {regs:>4} {stack:>5} {seconds:5.1f}  {result}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
