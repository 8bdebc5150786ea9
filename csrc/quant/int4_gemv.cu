// y = x · dequant(W)ᵀ for one row x, W symmetric int4 in groups of 64 (value = (code − 8) · scale), its codes packed
// as engine/kernels/int4_layout.py packs each row and then re-ordered into tiles of 16 rows (Args below), products
// on the tensor cores (mma.sync m16n8k16, fp32 accumulation). Built and called by engine/kernels/cuda_quant.py; the
// decode step's fused int4 products (engine/kernels/triton/gemv.py, FusedDecodeOps) take it where
// $MODELAB_INT4_GEMV says (by default on sm_90 for K >= 2048: cuda_quant.takes, docs/quantization.md).
// sm_80+ (bulk copies on sm_90).
//
// Why tensor cores at batch 1: the Triton kernel beside it multiplies on the CUDA cores, one FMA per weight after
// unpacking, 4.3–5.3 instructions per weight in its loop (offline SASS). Here a warp's mma takes 16 rows × 16 k =
// 256 weights (8 per lane) in one instruction, x broadcast to all 8 columns, and unpacking is a PRMT, a shift and two
// LOP3s per 4 weights per lane:
//   - the layout: nibble j of word t of a row's group holds k = 64g + 8j + t. The lane of a warp holding
//     fragment column pair 2c, 2c+1 (c = lane % 4) reads words 2c and 2c+1 of its two rows' group (8 bytes each);
//     byte s of those words holds nibbles 2s and 2s+1, i.e. k = 16s + 2c (+1) and 16s + 8 + 2c (+1): exactly the
//     A fragment of the group's k-step s (k 16s .. 16s+15) — the packed order is already the fragment order.
//   - a PRMT puts byte s of the even word in bits 0–7 and byte s of the odd word in bits 16–23; a LOP3 masks the low
//     nibbles in place and ORs them into the mantissa of bf16 128.0 (0x4300): the pair (128 + code) exactly; the
//     same after a shift by 4 gives the high nibbles.
//   - the mma multiplies 128 + code, not code − 8: per group and row, Σ (code − 8)·x = Σ (128 + code)·x − 136·Σx,
//     and Σx over the group (the same for every row) is taken once per block. The products of bf16 values are exact
//     in fp32; the subtraction cancels ~136·Σx, leaving an error ~1e-5 of the result's scale (tested on the GPU).
//   - each group's partial sums (4 mmas) are scaled by the group's scale into the fp32 accumulator.
// A tile is 16 output rows; a block has KSLICES warps, each a contiguous slice of the groups, and walks tiles
// (persistent); the warps' sums meet in shared memory. x (with the RMSNorm weight, NORM) is staged once per warp
// slice in shared memory as bf16; the norm's 1/rms multiplies the row sums at the end, as the Triton kernel does.
// ADD: the residual added; GLU: the tile's rows are gate j..j+7 and up j..j+7 and silu(gate)·up is stored. Under
// PDL (sm_90) a block's first batches of codes are in flight before it waits for the kernel before it.
#include "common.cuh"

#include <algorithm>

namespace modelab_quant {

using modelab_levels::Mma;
using modelab_levels::pdl_launch_dependents;
using modelab_levels::pdl_wait;
using modelab_levels::cp_async_16;
using modelab_levels::cp_async_commit;
using modelab_levels::cp_async_wait;

constexpr int GROUP = 64;        // weights per scale along K (engine/kernels/int4_layout.py: GROUP)
constexpr int WORDS = GROUP / 8;  // 32-bit words per group and row
constexpr int ROWS = 16;          // output rows per block (one mma tile)
constexpr int DEPTH = 2;          // ring slots per warp: batches in flight ahead of the one being multiplied
// BATCH (a template parameter, 4 or 8: groups a warp takes per step, one ring slot, one bulk copy of BATCH × 16 rows
// × 32 bytes) × DEPTH: 4 × 2 is the fastest of the ring shapes timed on the fused 7B products (rotating copies in a
// graph); deeper rings and larger copies, more bytes in flight per warp, are slower (docs/quantization.md). Per
// product the batch is the one engine/kernels/cuda_quant.py's tune keeps.

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// (w & 0x000F000F) | 0x43004300 in one LOP3: two bf16 128 + nibble
__device__ __forceinline__ uint32_t nibbles_to_bf16x2(uint32_t w) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(w), "n"(0x000F000F), "n"(0x43004300));
  return d;
}

// sm_90: a batch of codes (contiguous in tile order) arrives by one bulk copy (TMA) per warp and batch, issued by
// lane 0 and counted on the slot's mbarrier; before sm_90, by 16-byte cp.async per lane.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MODELAB_INT4_BULK 1
#endif

#if defined(MODELAB_INT4_BULK)
// `bytes` (a multiple of 16) from global src to shared dst, completing on bar (which this arrival also counts).
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the slot's earlier generic reads come first
  modelab_levels::mbar_expect_tx(bar, bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
#endif

// The weights in tile order (engine/kernels/cuda_quant.py, tile_major): q as [tile][group][16 rows][8 words] and the
// scales as [tile][group][8][2] bf16 (the pair of rows quad and quad + 8 in one 32-bit word), a tile's rows being
// output rows 16·tile … 16·tile + 15, or with GLU gate rows 8·tile … + 7 then the matching up rows. So a warp's
// batch of 4 groups is 2 KB contiguous (one bulk copy) and each lane's scales one 4-byte load a group, where the
// row-major packing gives a 128-byte run per row and batch, fetched by 16-byte cp.async per lane.
struct Args {
  const __nv_bfloat16* x;  // (K,)
  const uint32_t* q;       // [tiles][groups][16][8] words
  const uint32_t* s;       // [tiles][groups][8] bf16 pairs
  const __nv_bfloat16* g;  // (K,) RMSNorm weight (NORM)
  const __nv_bfloat16* r;  // (N,) residual (ADD)
  __nv_bfloat16* y;        // (N,) or (N / 2,) with GLU
  int n, k, groups;
  float eps;
};

// Where x[i] sits in shared memory: within each group, the bf16 pair p = (i mod 64) / 2 (p = 8·step + 4·h + c:
// k = 16·step + 8·h + 2c) goes to pair slot 8c + 2·step + h, so that lane c's eight pairs for a group's four mmas
// are 32 contiguous bytes (two 16-byte loads, where in k order they are eight 4-byte loads).
__device__ __forceinline__ int x_slot(int i) {
  const int p = (i & (GROUP - 1)) >> 1;
  return (i & ~(GROUP - 1)) + 2 * (8 * (p & 3) + 2 * (p >> 3) + ((p >> 2) & 1)) + (i & 1);
}

// Persistent: a block walks tiles blockIdx.x, + gridDim.x, ... (the grid is what fits on the GPU at once), so each
// warp stages its slice of x once. Codes stream into shared memory through a ring of DEPTH batches per warp (sm_90: a
// bulk copy per batch; before sm_90, cp.async), issued DEPTH batches ahead across tile boundaries: what is in flight
// costs no registers (a register double buffer would hold one batch, 2 KB a warp, at most), and no ramp or drain per
// tile. The scales (2 bytes a row and group) are loaded into registers when their
// batch is issued, so they too arrive DEPTH batches early.
template <int KSLICES, int BATCH, bool NORM, bool ADD, bool GLU>
__global__ void __launch_bounds__(KSLICES * 32, 16 / KSLICES) int4_gemv_kernel(const Args a, const int tiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int quad = lane >> 2, c = lane & 3;  // fragment row (and row + 8), column pair 2c, 2c + 1
  // [warp][DEPTH slots][BATCH groups][16 rows][32 bytes], then x (· g) as bf16 and Σx per group, each with a batch
  // of groups past the end (read, never used: see the loop), then the warps' row sums
  unsigned char* ring = smem_raw + warp * (DEPTH * BATCH * ROWS * 32);
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw + KSLICES * DEPTH * BATCH * ROWS * 32);
  float* group_sum = reinterpret_cast<float*>(xs + (a.groups + BATCH) * GROUP);
  float* partial = group_sum + a.groups + BATCH;  // [2 tiles][KSLICES][ROWS]
  __shared__ float sumsq_warp[KSLICES];
  __shared__ __align__(8) uint64_t slot_full[KSLICES][DEPTH];  // sm_90: one mbarrier per ring slot
  const uint32_t bars = modelab_levels::smem_addr(&slot_full[warp][0]);
  const uint32_t ring_addr = modelab_levels::smem_addr(ring);
#if defined(MODELAB_INT4_BULK)
  if (lane == 0) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) modelab_levels::mbar_init(bars + d * 8, 1);
    modelab_levels::fence_mbar_init();
  }
  __syncwarp();
#endif
  uint32_t phase = 0;  // sm_90: the parity each slot's mbarrier completes next, flipped after each pass of the ring

  const int per_warp = (a.groups + KSLICES - 1) / KSLICES;
  const int g_begin = min(warp * per_warp, a.groups), g_end = min(g_begin + per_warp, a.groups);
  const int steps = (per_warp + BATCH - 1) / BATCH;  // batches per tile, the same in every warp (barriers match)
  const size_t tile_words = static_cast<size_t>(a.groups) * ROWS * WORDS;

  // Issue batch `step` of tile `t` into ring slot `slot` (a batch is the warp's next BATCH groups of the tile's 16
  // rows: 2 KB contiguous in tile order), and the lane's own scales (rows quad, quad + 8: one word a group) into sc.
  // sm_90: one bulk copy of the batch's groups in the slice, or past the slice or the last tile a bare arrival, so
  // every slot completes once per issue. Before: lane l copies 16 bytes of each group (half l % 2 of row l / 2),
  // one cp.async group per batch, empty past the last tile, so the wait below always counts DEPTH groups.
  auto issue = [&](int t, int step, int slot, uint32_t (&sc)[BATCH]) {
    const bool live = t < tiles;
    const int tt = min(t, tiles - 1);
    const int first = g_begin + step * BATCH;
    const uint32_t* src_s = a.s + static_cast<size_t>(tt) * a.groups * 8 + quad;
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const bool in = live && first + b < g_end;
      sc[b] = in ? __ldg(src_s + (first + b) * 8) : 0u;
    }
#if defined(MODELAB_INT4_BULK)
    if (lane == 0) {
      const int n_in = live ? max(0, min(BATCH, g_end - first)) : 0;
      const uint32_t bar = bars + slot * 8;
      if (n_in > 0)
        bulk_copy(ring_addr + slot * (BATCH * ROWS * 32), a.q + tt * tile_words + first * (ROWS * WORDS),
                  n_in * ROWS * 32, bar);
      else
        modelab_levels::mbar_arrive(bar);
    }
#else
    const uint32_t* src = a.q + tt * tile_words + lane * 4;
    unsigned char* dst = ring + slot * (BATCH * ROWS * 32) + lane * 16;
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      if (live && first + b < g_end) cp_async_16(dst + b * ROWS * 32, src + (first + b) * (ROWS * WORDS), true);
    }
    cp_async_commit();
#endif
  };
  auto advance = [&](int& t, int& step) {
    if (++step == steps) {
      step = 0;
      t += gridDim.x;
    }
  };

  pdl_launch_dependents();
  // the first DEPTH batches do not depend on the kernel before: issued before waiting for it
  uint32_t ring_s[DEPTH][BATCH];
  int issue_tile = blockIdx.x, issue_step = 0;
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    issue(issue_tile, issue_step, d, ring_s[d]);
    advance(issue_tile, issue_step);
  }
  pdl_wait();

  // ---- stage the warp's own slice of x (· g) as bf16, Σx per group, and the slice's sum of squares -----------
  // The warps' slices cover K once, so a block reads x (and g) once, and the slices' sums of squares add up to the
  // norm's in the epilogue; each warp reads back only what it wrote (no block barrier before the products). A lane
  // takes 8 consecutive inputs (one 16-byte load of x, one of g), 8 lanes a group: Σx by 3 shuffles.
  const bool vec = (((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.g)) & 15) == 0) &&
                   (a.k % 8 == 0);
  float sq = 0.f;
#pragma unroll 2
  for (int base = g_begin * GROUP; base < g_end * GROUP; base += 32 * 8) {
    const int i0 = base + lane * 8;
    const bool mine = i0 < g_end * GROUP;  // a last pass may reach past the slice: those inputs are another warp's
    float v[8];
    if (vec && mine && i0 + 8 <= a.k) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(a.x + i0));
      const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(x2[e]);
        v[2 * e] = f.x;
        v[2 * e + 1] = f.y;
      }
      if (NORM) {
        const uint4 gv = __ldg(reinterpret_cast<const uint4*>(a.g + i0));
        const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(g2[e]);
          sq += v[2 * e] * v[2 * e] + v[2 * e + 1] * v[2 * e + 1];
          v[2 * e] *= f.x;
          v[2 * e + 1] *= f.y;
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int i = i0 + e;
        const bool in = mine && i < a.k;
        v[e] = in ? __bfloat162float(a.x[i]) : 0.f;
        if (NORM) {
          sq += v[e] * v[e];
          v[e] *= in ? __bfloat162float(a.g[i]) : 0.f;
        }
      }
    }
    float sum = 0.f;
    if (mine) {
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v[e], v[e + 1]);
        const float2 rounded = __bfloat1622float2(pair);
        sum += rounded.x + rounded.y;  // Σx of the values the products see
        *reinterpret_cast<__nv_bfloat162*>(xs + x_slot(i0 + e)) = pair;
      }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    if ((lane & 7) == 0 && mine) group_sum[i0 / GROUP] = sum;
  }
  if (NORM) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    if (lane == 0) sumsq_warp[warp] = sq;
  }
  __syncwarp();

  // ---- tiles: per batch, 4 mmas per group scaled into acc; per tile, the warps' sums meet ----------------------
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(xs);  // bf16 pairs
  float acc_lo = 0.f, acc_hi = 0.f;  // rows quad, quad + 8 (column 2c; all columns hold the same sums)
  const float inv_k = 1.f / static_cast<float>(a.k);
  int tile = blockIdx.x, step = 0, buf = 0;
  while (tile < tiles) {  // the same tile in every warp of the block
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      if (tile < tiles) {
#if defined(MODELAB_INT4_BULK)
        modelab_levels::mbar_wait(bars + d * 8, phase);  // slot d's bytes have landed
#else
        cp_async_wait<DEPTH - 1>();  // this lane's copies of slot d have landed
        __syncwarp();                // and every lane's
#endif
        const unsigned char* slot = ring + d * (BATCH * ROWS * 32);
        const int g0 = g_begin + step * BATCH;
        // Branch-free over the batch (a group past the slice reads codes, x and Σx it did not load — shared memory
        // is padded by a batch for x — and its sum is not added), so the shared-memory reads of all four groups
        // issue ahead of their mmas.
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
          const int gg = g0 + b;
          const uint2 w_lo = *reinterpret_cast<const uint2*>(slot + b * ROWS * 32 + quad * 32 + c * 8);
          const uint2 w_hi = *reinterpret_cast<const uint2*>(slot + b * ROWS * 32 + (quad + 8) * 32 + c * 8);
          const float scale_lo = __uint_as_float(ring_s[d][b] << 16);
          const float scale_hi = __uint_as_float(ring_s[d][b] & 0xFFFF0000u);
          float part[4] = {0.f, 0.f, 0.f, 0.f};
          // lane c's 8 x pairs of the group (x_slot's order): k = 16·ks + 2c and 16·ks + 8 + 2c, ks 0..3
          const uint4 xa = reinterpret_cast<const uint4*>(xw + gg * (GROUP / 2) + c * 8)[0];
          const uint4 xb = reinterpret_cast<const uint4*>(xw + gg * (GROUP / 2) + c * 8)[1];
          const uint32_t xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            // byte ks of the even word to bits 0-7, of the odd word to bits 16-23
            const uint32_t sel = ks * 0x1111u + 0x4400u;
            const uint32_t p_lo = prmt(w_lo.x, w_lo.y, sel);
            const uint32_t p_hi = prmt(w_hi.x, w_hi.y, sel);
            const uint32_t frag[4] = {nibbles_to_bf16x2(p_lo), nibbles_to_bf16x2(p_hi),
                                      nibbles_to_bf16x2(p_lo >> 4), nibbles_to_bf16x2(p_hi >> 4)};
            Mma<__nv_bfloat16>::run(part, frag, xv[2 * ks], xv[2 * ks + 1]);
          }
          const float bias = 136.f * group_sum[gg];
          const bool in = gg < g_end;  // a select, not a branch
          acc_lo = in ? fmaf(scale_lo, part[0] - bias, acc_lo) : acc_lo;
          acc_hi = in ? fmaf(scale_hi, part[2] - bias, acc_hi) : acc_hi;
        }
        __syncwarp();  // every lane has read slot d: it may be refilled
        issue(issue_tile, issue_step, d, ring_s[d]);
        advance(issue_tile, issue_step);
        if (step + 1 == steps) {  // the tile is done in this warp: sum over the warps, then the epilogue
          float* sums = partial + buf * KSLICES * ROWS;
          if (c == 0) {
            sums[warp * ROWS + quad] = acc_lo;
            sums[warp * ROWS + quad + 8] = acc_hi;
          }
          __syncthreads();  // (two buffers: a tile's sums are read before the warps can reach them again)
          if (threadIdx.x < ROWS) {
            const int i = threadIdx.x;
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < KSLICES; ++w) v += sums[w * ROWS + i];
            if (NORM) {
              float total = 0.f;
#pragma unroll
              for (int w = 0; w < KSLICES; ++w) total += sumsq_warp[w];
              v *= rsqrtf(total * inv_k + a.eps);
            }
            if (GLU) {
              sums[i] = v;  // this thread's own slot of warp 0, read below by the gate row's thread only
              __syncwarp(0xffffu);
              const int j = tile * (ROWS / 2) + i;
              if (i < 8 && j < a.n / 2) {
                const float gate = v, up = sums[i + 8];
                a.y[j] = __float2bfloat16_rn(gate / (1.f + __expf(-gate)) * up);
              }
            } else {
              const int row = tile * ROWS + i;
              if (row < a.n) {
                if (ADD) v += __bfloat162float(a.r[row]);
                a.y[row] = __float2bfloat16_rn(v);
              }
            }
          }
          buf ^= 1;
          acc_lo = acc_hi = 0.f;
        }
        advance(tile, step);
      }
    }
    phase ^= 1;
  }
#if !defined(MODELAB_INT4_BULK)
  cp_async_wait<0>();  // nothing left in flight when the block exits (the groups past the last tile are empty)
#endif
}

template <int KSLICES, int BATCH, bool NORM, bool ADD, bool GLU>
void launch(const Args& args, int tiles, bool pdl, cudaStream_t stream) {
  auto kernel = int4_gemv_kernel<KSLICES, BATCH, NORM, ADD, GLU>;
  const int smem = KSLICES * DEPTH * BATCH * ROWS * 32 + (args.groups + BATCH) * (GROUP * 2 + 4) +
                   2 * KSLICES * ROWS * 4;
  modelab_levels::allow_dynamic_smem(kernel, smem);
  // persistent: as many blocks as fit on the GPU at once (never more than there are tiles). Fewer, to leave each SM
  // room for the next kernel's blocks to start early under PDL, makes the decode step slower (one block per SM: the
  // 1B int4 step ~15 % slower, the 7B's ~40 %).
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, KSLICES * 32, smem));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(std::max(1, std::min(tiles, sms * std::max(per_sm, 1))));
  config.blockDim = dim3(KSLICES * 32);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args, tiles));
}

template <int KSLICES, int BATCH>
void dispatch(const Args& args, int tiles, bool norm, bool add, bool glu, bool pdl, cudaStream_t stream) {
  if (glu) {
    launch<KSLICES, BATCH, true, false, true>(args, tiles, pdl, stream);
  } else if (norm) {
    launch<KSLICES, BATCH, true, false, false>(args, tiles, pdl, stream);
  } else if (add) {
    launch<KSLICES, BATCH, false, true, false>(args, tiles, pdl, stream);
  } else {
    launch<KSLICES, BATCH, false, false, false>(args, tiles, pdl, stream);
  }
}

template <int KSLICES>
void dispatch_batch(const Args& args, int tiles, bool norm, bool add, bool glu, int64_t batch, bool pdl,
                    cudaStream_t stream) {
  switch (batch) {
    case 4: dispatch<KSLICES, 4>(args, tiles, norm, add, glu, pdl, stream); break;
    case 8: dispatch<KSLICES, 8>(args, tiles, norm, add, glu, pdl, stream); break;
    default: TORCH_CHECK(false, "int4_gemv: batch must be 4 or 8, got ", batch);
  }
}

at::Tensor int4_gemv_cuda(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, int64_t n,
                          const c10::optional<at::Tensor>& norm_weight, double eps,
                          const c10::optional<at::Tensor>& residual, bool glu, int64_t kslices, int64_t batch,
                          bool pdl) {
  TORCH_CHECK(x.is_cuda() && q.is_cuda() && s.is_cuda(), "int4_gemv: CUDA tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "int4_gemv: x must be contiguous bfloat16");
  const int64_t k = x.numel(), groups = (k + GROUP - 1) / GROUP;
  TORCH_CHECK(n > 0 && k > 0 && (!glu || n % 2 == 0), "int4_gemv: empty, or an odd N with glu");
  const int64_t tiles = glu ? (n / 2 + ROWS / 2 - 1) / (ROWS / 2) : (n + ROWS - 1) / ROWS;
  TORCH_CHECK(q.scalar_type() == at::kInt && q.is_contiguous() && q.dim() == 4 && q.size(0) == tiles &&
              q.size(1) == groups && q.size(2) == ROWS && q.size(3) == WORDS,
              "int4_gemv: q must be contiguous int32 (", tiles, ", ", groups, ", 16, 8) in tile order for N = ", n,
              " and K = ", k);
  TORCH_CHECK(s.scalar_type() == at::kBFloat16 && s.is_contiguous() && s.dim() == 4 && s.size(0) == tiles &&
              s.size(1) == groups && s.size(2) == ROWS / 2 && s.size(3) == 2,
              "int4_gemv: s must be contiguous bfloat16 (", tiles, ", ", groups, ", 8, 2) in tile order");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(s.data_ptr()) % 4 == 0,
              "int4_gemv: q must be 16-byte aligned, s 4-byte aligned");
  const bool norm = norm_weight.has_value(), add = residual.has_value();
  TORCH_CHECK(!(add && (norm || glu)), "int4_gemv: the residual fuses alone");
  if (norm) TORCH_CHECK(norm_weight->numel() == k && norm_weight->scalar_type() == at::kBFloat16 &&
                        norm_weight->is_contiguous(), "int4_gemv: norm weight must be (K,) contiguous bfloat16");
  if (add) TORCH_CHECK(residual->numel() == n && residual->scalar_type() == at::kBFloat16 &&
                       residual->is_contiguous(), "int4_gemv: residual must be (N,) contiguous bfloat16");
  TORCH_CHECK(norm || !glu, "int4_gemv: glu is the gate_up product: it comes with the norm");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({glu ? n / 2 : n}, x.options());
  Args args{reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), reinterpret_cast<const uint32_t*>(q.data_ptr()),
            reinterpret_cast<const uint32_t*>(s.data_ptr()),
            norm ? reinterpret_cast<const __nv_bfloat16*>(norm_weight->data_ptr()) : nullptr,
            add ? reinterpret_cast<const __nv_bfloat16*>(residual->data_ptr()) : nullptr,
            reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), static_cast<int>(n), static_cast<int>(k),
            static_cast<int>(groups), static_cast<float>(eps)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device()));
  pdl = pdl && major >= 9;
  switch (kslices) {
    case 4: dispatch_batch<4>(args, static_cast<int>(tiles), norm, add, glu, batch, pdl, stream); break;
    case 8: dispatch_batch<8>(args, static_cast<int>(tiles), norm, add, glu, batch, pdl, stream); break;
    case 16: dispatch_batch<16>(args, static_cast<int>(tiles), norm, add, glu, batch, pdl, stream); break;
    default: TORCH_CHECK(false, "int4_gemv: kslices must be 4, 8 or 16, got ", kslices);
  }
  return y;
}

}  // namespace modelab_quant
