// Hopper warpgroup-MMA pieces of the L5 attention kernel built for sm_90a (attention_ws.cu: TMA loads by a producer
// warpgroup, variants 7 and 8); everything here is inline device code.
//
// Tiles: 128 rows x D = 128 columns of 16-bit elements, stored in the layout wgmma reads: two 64-column halves of
// 128 rows x 128 bytes, the 16-byte chunk index XOR (row & 7) (the 128-byte swizzle), every half 1024-byte aligned.
// This is also the layout a TMA load with CU_TENSOR_MAP_SWIZZLE_128B and a 64 x 128 box writes. With D = 64
// (variant 7's other build) a tile is one such half. The pieces below take D as a template parameter where it
// matters (default 128): a thread's O accumulators are D / 2 floats.
#pragma once

#include "common.cuh"

#include <cmath>
#include <type_traits>

namespace modelab_levels {

namespace {

constexpr int kRows = 128;                 // query rows per block; also keys per tile
constexpr int kHead = 128;                 // D
constexpr int kHalfBytes = kRows * 128;    // one 64-column half of a tile: 128 rows x 128 bytes
constexpr int kTileBytes = 2 * kHalfBytes; // 32 KB
template <int D>
constexpr int tile_bytes() { return D / 64 * kHalfBytes; }  // a tile of 128 rows x D columns

// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` inside a tile, in the 128B-swizzled layout above.
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return (chunk >> 3) * kHalfBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// wgmma shared-memory matrix descriptor: start address, leading / stride byte offsets (all >> 4), 128B swizzle.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lead_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// ---- wgmma wrappers (operand lists written out: PTX takes every accumulator register by name) -------------------
// Accumulator operands of one wgmma: PTX names every register ("%0".."%63"); OFF picks where in a 64-float array.
#define WGMMA_ACC64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_ACC32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_OUT64(OFF) \
  "+f"(d[OFF + 0]), "+f"(d[OFF + 1]), "+f"(d[OFF + 2]), "+f"(d[OFF + 3]), "+f"(d[OFF + 4]), "+f"(d[OFF + 5]), \
  "+f"(d[OFF + 6]), "+f"(d[OFF + 7]), "+f"(d[OFF + 8]), "+f"(d[OFF + 9]), "+f"(d[OFF + 10]), "+f"(d[OFF + 11]), \
  "+f"(d[OFF + 12]), "+f"(d[OFF + 13]), "+f"(d[OFF + 14]), "+f"(d[OFF + 15]), "+f"(d[OFF + 16]), "+f"(d[OFF + 17]), \
  "+f"(d[OFF + 18]), "+f"(d[OFF + 19]), "+f"(d[OFF + 20]), "+f"(d[OFF + 21]), "+f"(d[OFF + 22]), "+f"(d[OFF + 23]), \
  "+f"(d[OFF + 24]), "+f"(d[OFF + 25]), "+f"(d[OFF + 26]), "+f"(d[OFF + 27]), "+f"(d[OFF + 28]), "+f"(d[OFF + 29]), \
  "+f"(d[OFF + 30]), "+f"(d[OFF + 31]), "+f"(d[OFF + 32]), "+f"(d[OFF + 33]), "+f"(d[OFF + 34]), "+f"(d[OFF + 35]), \
  "+f"(d[OFF + 36]), "+f"(d[OFF + 37]), "+f"(d[OFF + 38]), "+f"(d[OFF + 39]), "+f"(d[OFF + 40]), "+f"(d[OFF + 41]), \
  "+f"(d[OFF + 42]), "+f"(d[OFF + 43]), "+f"(d[OFF + 44]), "+f"(d[OFF + 45]), "+f"(d[OFF + 46]), "+f"(d[OFF + 47]), \
  "+f"(d[OFF + 48]), "+f"(d[OFF + 49]), "+f"(d[OFF + 50]), "+f"(d[OFF + 51]), "+f"(d[OFF + 52]), "+f"(d[OFF + 53]), \
  "+f"(d[OFF + 54]), "+f"(d[OFF + 55]), "+f"(d[OFF + 56]), "+f"(d[OFF + 57]), "+f"(d[OFF + 58]), "+f"(d[OFF + 59]), \
  "+f"(d[OFF + 60]), "+f"(d[OFF + 61]), "+f"(d[OFF + 62]), "+f"(d[OFF + 63])
#define WGMMA_OUT32(OFF) \
  "+f"(d[OFF + 0]), "+f"(d[OFF + 1]), "+f"(d[OFF + 2]), "+f"(d[OFF + 3]), "+f"(d[OFF + 4]), "+f"(d[OFF + 5]), \
  "+f"(d[OFF + 6]), "+f"(d[OFF + 7]), "+f"(d[OFF + 8]), "+f"(d[OFF + 9]), "+f"(d[OFF + 10]), "+f"(d[OFF + 11]), \
  "+f"(d[OFF + 12]), "+f"(d[OFF + 13]), "+f"(d[OFF + 14]), "+f"(d[OFF + 15]), "+f"(d[OFF + 16]), "+f"(d[OFF + 17]), \
  "+f"(d[OFF + 18]), "+f"(d[OFF + 19]), "+f"(d[OFF + 20]), "+f"(d[OFF + 21]), "+f"(d[OFF + 22]), "+f"(d[OFF + 23]), \
  "+f"(d[OFF + 24]), "+f"(d[OFF + 25]), "+f"(d[OFF + 26]), "+f"(d[OFF + 27]), "+f"(d[OFF + 28]), "+f"(d[OFF + 29]), \
  "+f"(d[OFF + 30]), "+f"(d[OFF + 31])

// One wgmma per element type: TY is the type's name in the instruction ("bf16" or "f16").
#define WGMMA_SS_M64N128(TY)                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                            \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WGMMA_ACC64 "}, "       \
               "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                        \
               : WGMMA_OUT64(0) : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define WGMMA_RS_M64N128(TY)                                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                            \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WGMMA_ACC64 "}, "       \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                          \
               : WGMMA_OUT64(OFF) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))
#define WGMMA_RS_M64N64(TY)                                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                            \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" WGMMA_ACC32 "}, "        \
               "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                          \
               : WGMMA_OUT32(OFF) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

// D(64 x 128, fp32) (+)= A(64 x 16) B(16 x 128)^T, both from shared memory (K-major); scale_d = 0 overwrites D.
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) WGMMA_SS_M64N128("bf16");
  else WGMMA_SS_M64N128("f16");
}

// D[OFF..] (64 x N, fp32) += A(64 x 16, registers) B(16 x N), B N-major in shared memory (imm-trans-b = 1).
template <typename T, int OFF>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) WGMMA_RS_M64N128("bf16");
  else WGMMA_RS_M64N128("f16");
}

template <typename T, int OFF, int N>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[N], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(OFF + 32 <= N, "the n64 product writes 32 accumulators per thread");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) WGMMA_RS_M64N64("bf16");
  else WGMMA_RS_M64N64("f16");
}

// ---- the pieces of one key tile ---------------------------------------------------------------------------------

// S = q K^T for this warpgroup's 64 rows: D / 16 k-steps of 16 over D (4 per 64-column half; +32 bytes inside a
// half).
template <typename T, int D = kHead>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint32_t step = (ks >> 2) * kHalfBytes + (ks & 3) * 32;
    // K-major, 128B swizzle: the stride byte offset steps 8 rows (1024 bytes); the leading one is unused.
    wgmma_m64n128k16_ss<T>(s, smem_desc(q_rows + step, 16, 1024), smem_desc(k_tile + step, 16, 1024), ks > 0);
  }
}

// O += P V: 8 k-steps of 16 keys (16 rows of V = 2048 bytes each). V is N-major (D contiguous): the leading byte
// offset steps from columns 0..63 to 64..127 (one half), the stride byte offset 8 keys (1024 bytes).
// KEY_STEPS < 8: only the first 16 · KEY_STEPS keys (the rest of P is zero: masked keys).
// D = 64: one n64 product per k-step into 32 accumulators (a tile is one half).
template <typename T, int KEY_STEPS = kRows / 16, int D = kHead>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[8][4], uint32_t v_tile) {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
#pragma unroll
  for (int kt = 0; kt < KEY_STEPS; ++kt) {
    const uint32_t rows = v_tile + kt * 16 * 128;
    if constexpr (D == 64) {
      wgmma_m64n64k16_rs<T, 0>(o, p[kt], smem_desc(rows, kHalfBytes, 1024));
    } else {
      wgmma_m64n128k16_rs<T, 0>(o, p[kt], smem_desc(rows, kHalfBytes, 1024));
    }
  }
}

// Online softmax of one 64 x 128 score tile, in place (scores become unnormalised probabilities). alpha[h] is the
// factor O's row h must be multiplied by before this tile's P V is added (exp2 of the old max minus the new).
// A thread holds rows r_lo (h = 0) and r_lo + 8 (h = 1); s[4j + 2h + e] is column col0 + 8j + 2(lane & 3) + e:
// the accumulator layout of wgmma m64nN, the same per warp as mma.sync's, so a quad of lanes shares each row.
// MASK: kMaskIf masks when need_mask says so (one code path, the mask computed and selected for every tile);
// kMask always masks, kNoMask never: a caller that branches on need_mask keeps the mask out of most tiles.
enum MaskMode { kMaskIf, kMask, kNoMask };
template <MaskMode MASK = kMaskIf>
__device__ __forceinline__ void softmax_scores(float (&s)[64], float (&alpha)[2], float (&row_max)[2],
                                               float (&row_sum)[2], int r_lo, int col0, int S, bool causal,
                                               bool need_mask, float scale_log2, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r_lo + 8 * h;
    float mx = row_max[h];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = s[4 * j + 2 * h + e];
        if (MASK == kMask || (MASK == kMaskIf && need_mask)) {
          const int col = col0 + 8 * j + 2 * (lane & 3) + e;
          if (col >= S || (causal && col > row)) x = -INFINITY;
          s[4 * j + 2 * h + e] = x;
        }
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_use = mx == -INFINITY ? 0.f : mx * scale_log2;  // a row masked so far: keep exp2 finite
    alpha[h] = fast_exp2(row_max[h] * scale_log2 - m_use);
    row_max[h] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(s[4 * j + 2 * h + e], scale_log2, -m_use));
        s[4 * j + 2 * h + e] = p;
        sum += p;
      }
    }
    row_sum[h] = row_sum[h] * alpha[h] + sum;  // per-thread partial; the quad is summed at the end
  }
}

// O's rows times the softmax's alpha (after the previous tile's P V has landed in O); N = D / 2 accumulators.
template <int N>
__device__ __forceinline__ void rescale_o(float (&o)[N], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * j + 2 * h] *= alpha[h];
      o[4 * j + 2 * h + 1] *= alpha[h];
    }
  }
}

// P as wgmma A fragments (k-step kt = keys 16kt..16kt+15): the score accumulators of columns 16kt.. re-packed.
template <typename T>
__device__ __forceinline__ void pack_p(const float (&s)[64], uint32_t (&p)[8][4]) {
#pragma unroll
  for (int kt = 0; kt < 8; ++kt) {
    p[kt][0] = Elem<T>::pack2(s[8 * kt + 0], s[8 * kt + 1]);  // row r_lo,     keys 16kt + 2q, +1
    p[kt][1] = Elem<T>::pack2(s[8 * kt + 2], s[8 * kt + 3]);  // row r_lo + 8
    p[kt][2] = Elem<T>::pack2(s[8 * kt + 4], s[8 * kt + 5]);  // row r_lo,     keys 16kt + 8 + 2q, +1
    p[kt][3] = Elem<T>::pack2(s[8 * kt + 6], s[8 * kt + 7]);  // row r_lo + 8
  }
}

// 1 / the sum of one of this thread's rows, from its partial sum (the four lanes of a quad hold one row's columns);
// 0 for a row with nothing in it.
__device__ __forceinline__ float inv_row_sum(float partial) {
  partial += __shfl_xor_sync(0xffffffffu, partial, 1);
  partial += __shfl_xor_sync(0xffffffffu, partial, 2);
  return partial > 0.f ? 1.f / partial : 0.f;
}

// out = O / rowsum for this thread's two rows of one (batch, head) (ob: its first row); rows >= S are not written.
// N = D / 2 accumulators: rows of D = 2N elements.
template <typename T, int N>
__device__ __forceinline__ void store_o(T* __restrict__ ob, const float (&acc)[N], const float (&row_sum)[2],
                                        int r_lo, int S, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = inv_row_sum(row_sum[h]);
    const int row = r_lo + 8 * h;
    if (row < S) {
      T* orow = ob + static_cast<int64_t>(row) * (2 * N) + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < N / 4; ++j)
        *reinterpret_cast<uint32_t*>(orow + 8 * j) =
            Elem<T>::pack2(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
    }
  }
}

}  // namespace

}  // namespace modelab_levels
