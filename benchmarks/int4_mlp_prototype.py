"""One-off prototype (kept in history only): the 1B int4 MLP as ONE Triton kernel (norm, gate_up, SwiGLU, then this
program's 64 SwiGLU outputs times down's matching group of columns, added into an fp32 accumulator with atomics)
against the lab's two kernels, Triton and tensor-core. PYTHONPATH=. python benchmarks/int4_mlp_prototype.py check|bench."""
import sys, torch, triton, triton.language as tl
from engine.kernels import int4_layout
from engine.kernels.triton import quant_gemv as qg
from engine.kernels.triton._common import is_interpreted, load_fused_x, output_rows, pdl_enabled
from engine.kernels.triton.quant_gemv import _int4_words_to_f32


@triton.jit
def _split8(x, G: tl.constexpr):
    x = tl.reshape(tl.permute(tl.reshape(x, (G, 8, 8)), (0, 2, 1)), (G, 8, 2, 2, 2))
    xa, xb = tl.split(x)
    xa0, xa1 = tl.split(xa)
    xb0, xb1 = tl.split(xb)
    x0, x4 = tl.split(xa0)
    x2, x6 = tl.split(xa1)
    x1, x5 = tl.split(xb0)
    x3, x7 = tl.split(xb1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _dot8(w, x0, x1, x2, x3, x4, x5, x6, x7, ASM: tl.constexpr):
    f0, f1, f2, f3, f4, f5, f6, f7 = _int4_words_to_f32(w, ASM)
    part = (f0 - 8388616.0) * x0
    part += (f1 * 0.0625 - 524296.0) * x1
    part += (f2 * 0.00390625 - 32776.0) * x2
    part += (f3 * 0.000244140625 - 2056.0) * x3
    part += (f4 - 8388616.0) * x4
    part += (f5 * 0.0625 - 524296.0) * x5
    part += (f6 * 0.00390625 - 32776.0) * x6
    part += (f7 * 0.000244140625 - 2056.0) * x7
    return part


@triton.jit
def _mlp_kernel(x_ptr, g_ptr, qgu_ptr, sgu_ptr, qd_ptr, sd_ptr, acc_ptr, N, K, D_OUT, stride_qn, stride_sn,
                stride_dn, stride_dsn, eps, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, ROWS: tl.constexpr,
                PDL: tl.constexpr = False, ASM: tl.constexpr = False):
    pid_n = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_n, n_mask = output_rows(pid_n, N, BLOCK_N, True)
    groups = (K + 63) // 64
    offs_g = tl.arange(0, GROUPS)
    offs_t = tl.arange(0, 8)
    acc = tl.zeros((GROUPS, BLOCK_N, 8), dtype=tl.float32)
    sumsq = tl.zeros((GROUPS * 64,), dtype=tl.float32)
    words = qgu_ptr + offs_n[None, :, None] * stride_qn + offs_t[None, None, :]
    rows = n_mask[None, :, None]
    w = tl.load(words + offs_g[:, None, None] * 8, mask=rows & (offs_g < groups)[:, None, None], other=0,
                eviction_policy="evict_first")
    # down's first chunk of this program's column group: independent of the previous kernel too
    F: tl.constexpr = BLOCK_N // 2
    dg = pid_n * F // 64
    offs_r = tl.arange(0, ROWS)
    dwords = qd_ptr + offs_r[:, None] * stride_dn + dg * 8 + offs_t[None, :]
    dw = tl.load(dwords, mask=(offs_r < D_OUT)[:, None], other=0, eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    for g0 in range(0, groups, GROUPS):
        gs = g0 + offs_g
        g_mask = gs < groups
        g_next = gs + GROUPS
        w_next = tl.load(words + g_next[:, None, None] * 8, mask=rows & (g_next < groups)[:, None, None], other=0,
                         eviction_policy="evict_first")
        offs_k = g0 * 64 + tl.arange(0, GROUPS * 64)
        x, sumsq = load_fused_x(x_ptr, g_ptr, offs_k, offs_k < K, sumsq, True)
        x0, x1, x2, x3, x4, x5, x6, x7 = _split8(x, GROUPS)
        part = _dot8(w, x0[:, None, :], x1[:, None, :], x2[:, None, :], x3[:, None, :], x4[:, None, :],
                     x5[:, None, :], x6[:, None, :], x7[:, None, :], ASM)
        s = tl.load(sgu_ptr + offs_n[None, :] * stride_sn + gs[:, None], mask=n_mask[None, :] & g_mask[:, None],
                    other=0.0).to(tl.float32)
        acc += part * s[:, :, None]
        w = w_next
    y = tl.sum(tl.sum(acc, axis=2), axis=0)
    y = y * tl.rsqrt(tl.sum(sumsq, axis=0) / K + eps)
    gate, up = tl.split(tl.reshape(y, (F, 2)))
    act = (gate * tl.sigmoid(gate) * up).to(x_ptr.dtype.element_ty).to(tl.float32)  # the model's bf16 SwiGLU
    # this program's F features are columns pid·F .. of down (F = 64: one group of every down row)
    a0, a1, a2, a3, a4, a5, a6, a7 = _split8(act, 1)
    for r0 in range(0, D_OUT, ROWS):
        rr = r0 + offs_r
        r_next = rr + ROWS
        dw_next = tl.load(dwords + (r0 + ROWS) * stride_dn, mask=(r_next < D_OUT)[:, None], other=0,
                          eviction_policy="evict_first")
        part = _dot8(dw, a0, a1, a2, a3, a4, a5, a6, a7, ASM)  # (ROWS, 8)
        sc = tl.load(sd_ptr + rr * stride_dsn + dg, mask=rr < D_OUT, other=0.0).to(tl.float32)
        tl.atomic_add(acc_ptr + rr, tl.sum(part, axis=1) * sc, mask=rr < D_OUT, sem="relaxed")
        dw = dw_next


TILE = (128, 8, 256, 8)


def set_tile(t):
    global TILE
    TILE = t


def fused_mlp(x, gw, eps, q_gu, s_gu, q_d, s_d, acc, tile=None):
    tile = tile or TILE
    k = x.shape[-1]; n = q_gu.shape[0]; d_out = q_d.shape[0]
    wgu = q_gu.view(torch.int32); wd = q_d.view(torch.int32)
    bn, groups, rows, warps = tile
    assert bn // 2 == 64
    args = (x.reshape(-1), gw, wgu, s_gu, wd, s_d, acc, n, k, d_out, wgu.stride(0), s_gu.stride(0), wd.stride(0),
            s_d.stride(0), float(eps))
    if is_interpreted(_mlp_kernel):
        _mlp_kernel[(n // bn,)](*args, BLOCK_N=bn, GROUPS=2, ROWS=64)
    else:
        pdl = pdl_enabled(x.device)
        _mlp_kernel[(n // bn,)](*args, BLOCK_N=bn, GROUPS=groups, ROWS=rows, PDL=pdl, ASM=True, num_warps=warps,
                                num_stages=1, launch_pdl=pdl)


def make(dim, ffn, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    def q(n, k):
        codes = torch.randint(0, 16, (n, k), generator=g)
        return int4_layout.pack_int4(codes).to(device), (torch.rand(n, k // 64, generator=g) * 0.02 + 0.005).to(torch.bfloat16).to(device)
    q_gu, s_gu = q(2 * ffn, dim)
    q_d, s_d = q(dim, ffn)
    x = (torch.randn(dim, generator=g)).to(torch.bfloat16).to(device)
    h = (torch.randn(dim, generator=g)).to(torch.bfloat16).to(device)
    gw = (1 + 0.1 * torch.randn(dim, generator=g)).to(torch.bfloat16).to(device)
    return x, h, gw, q_gu, s_gu, q_d, s_d


def pair(x, h, gw, eps, q_gu, s_gu, q_d, s_d):
    act = qg.gemv_int4(x, q_gu, s_gu, norm_weight=gw, eps=eps, glu=True)
    return qg.gemv_int4(act, q_d, s_d, residual=h)


def check(dim=256, ffn=512, device="cpu"):
    x, h, gw, q_gu, s_gu, q_d, s_d = make(dim, ffn, device)
    want = pair(x, h, gw, 1e-5, q_gu, s_gu, q_d, s_d).float()
    acc = torch.zeros(dim, device=device, dtype=torch.float32)
    fused_mlp(x, gw, 1e-5, q_gu, s_gu, q_d, s_d, acc)
    got = (h.float() + acc).to(torch.bfloat16).float()
    err = ((got - want).norm() / want.norm()).item()
    print("rel err vs the pair", err)
    assert err < 1e-2, err


def bench(dim=2048, ffn=8192, copies=4, reps=20):
    dev = "cuda"
    sets = [make(dim, ffn, dev, seed=i) for i in range(copies)]
    acc = torch.zeros(dim, device=dev)
    x, h, gw, q_gu, s_gu, q_d, s_d = sets[0]
    want = pair(x, h, gw, 1e-5, q_gu, s_gu, q_d, s_d).float()
    acc.zero_(); fused_mlp(x, gw, 1e-5, q_gu, s_gu, q_d, s_d, acc)
    got = (h.float() + acc).to(torch.bfloat16).float()
    print("GPU rel err vs the pair", ((got - want).norm() / want.norm()).item())
    def run_pair():
        for s in sets:
            pair(s[0], s[1], s[2], 1e-5, *s[3:])
    def run_fused(zero):
        for s in sets:
            if zero:
                acc.zero_()
            fused_mlp(s[0], s[2], 1e-5, *s[3:], acc)
    out = {}
    from engine.kernels import cuda_quant as cq
    cq.load()
    tws = [(cq.tile_major(st[3], st[4], dim, glu=True), cq.tile_major(st[5], st[6], ffn)) for st in sets]
    print("tuned:", cq.tune([tws[0][0], tws[0][1]]))
    a = cq.int4_gemv(x, tws[0][0], norm_weight=gw, eps=1e-5)
    y = cq.int4_gemv(a, tws[0][1], residual=h).float()
    print("TC pair rel err vs the Triton pair", ((y - want).norm() / want.norm()).item())
    def run_tc():
        for st, (tg, td) in zip(sets, tws):
            cq.int4_gemv(cq.int4_gemv(st[0], tg, norm_weight=st[2], eps=1e-5), td, residual=st[1])
    def run_tc_gu():
        for st, (tg, td) in zip(sets, tws):
            cq.int4_gemv(st[0], tg, norm_weight=st[2], eps=1e-5)
    def run_tc_d():
        for st, (tg, td) in zip(sets, tws):
            cq.int4_gemv(a, td, residual=st[1])
    cases = [("pair", run_pair), ("tc pair", run_tc), ("tc gate_up", run_tc_gu), ("tc down", run_tc_d)]
    for t in ((128, 8, 256, 8), (128, 4, 256, 4), (128, 4, 128, 4), (128, 8, 512, 8), (128, 4, 512, 8), (128, 8, 128, 8)):
        cases += [(f"fused+zero {t}", lambda t=t: (set_tile(t), run_fused(True))), (f"fused {t}", lambda t=t: (set_tile(t), run_fused(False)))]
    for name, fn in cases:
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay(); torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
            e0.record(); g.replay(); e1.record(); e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3 / (reps * copies))
        out[name] = sorted(ts)[2]
        print(f"{name:28} {out[name]:.2f} us per MLP (median of 5 graph replays, {copies} weight sets rotating)", flush=True)


if __name__ == "__main__":
    check() if sys.argv[1] == "check" else bench()
