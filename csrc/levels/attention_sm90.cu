// L5 attention on Hopper: the same flash-attention forward as attention.cu, with its two matrix products on the
// warpgroup tensor-core instructions (wgmma, sm_90a) instead of mma.sync. q, k, v (B, H, S, D), bf16 or fp16, D = 128.
//
// A block of 256 threads owns 128 query rows of one (batch, head): two warpgroups of 64 rows each. Keys stream
// through shared memory in tiles of 128 (cp.async, double-buffered, one tile ahead). Per key tile each warpgroup runs
//   S = q k^T   8 x wgmma m64n128k16, both operands read from shared memory by descriptor (K-major, 128B swizzle),
//   online softmax on S in registers (fp32, exp2 form), P packed to 16-bit A fragments in place,
//   O += P v    8 x wgmma m64n128k16, P from registers, v from shared memory (N-major: transposed by the hardware).
// Variant OVERLAP also issues the next tile's q k^T before this tile's softmax, so the tensor cores run it while
// the softmax runs (two score tiles live in registers: 64 + 64 + 64 for O). Shared-memory tiles are stored in the
// layout wgmma reads: each 128-row x 128-column tile as two 64-column halves of 128 rows x 128 bytes, the 16-byte
// chunk index XOR (row & 7) (the 128-byte swizzle), every half 1024-byte aligned.
// Causal: key tiles past the block's last row are never loaded; the diagonal tile and a ragged tail are masked.
//
// Built only when the extension targets sm_90a (engine/kernels/cuda_levels.py adds -DMODELAB_SM90A for an H100/H200);
// elsewhere attention_wgmma_cuda refuses with the reason and the mma.sync kernels of attention.cu remain.
#include "common.cuh"

#include <cmath>
#include <type_traits>

namespace modelab_levels {

namespace {

constexpr int kRows = 128;                 // query rows per block; also keys per tile
constexpr int kHead = 128;                 // D
constexpr int kHalfBytes = kRows * 128;    // one 64-column half of a tile: 128 rows x 128 bytes
constexpr int kTileBytes = 2 * kHalfBytes; // 32 KB
constexpr int kThreads = 256;              // two warpgroups
constexpr int kSmemBytes = 5 * kTileBytes + 1024;  // q, k x2, v x2, and slack to align the base to 1024 bytes

// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` inside a tile, in the 128B-swizzled layout above.
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return (chunk >> 3) * kHalfBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

__device__ __forceinline__ void cp_async_16_to(uint32_t saddr, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(gmem), "r"(pred ? 16 : 0));
}

// Rows row0.. row0+127 of a (S, 128) matrix into a tile; rows >= S become zeros (finite scores, then masked).
template <typename T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* __restrict__ g, int row0, int S, int tid) {
#pragma unroll
  for (int it = 0; it < kRows * 16 / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i >> 4, c = i & 15;  // 16 consecutive threads read one 256-byte row
    const bool ok = row0 + r < S;
    cp_async_16_to(tile + tile_offset(r, c), g + static_cast<int64_t>(ok ? row0 + r : 0) * kHead + c * 8, ok);
  }
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
// cp.async writes through the generic proxy; wgmma reads through the async proxy: order them (before the barrier).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
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

template <typename T, int OFF>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) WGMMA_RS_M64N64("bf16");
  else WGMMA_RS_M64N64("f16");
}

// ---- the pieces of one key tile ---------------------------------------------------------------------------------

// S = q K^T for this warpgroup's 64 rows: 8 k-steps of 16 over D (4 per 64-column half; +32 bytes inside a half).
template <typename T>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
  for (int ks = 0; ks < kHead / 16; ++ks) {
    const uint32_t step = (ks >> 2) * kHalfBytes + (ks & 3) * 32;
    // K-major, 128B swizzle: the stride byte offset steps 8 rows (1024 bytes); the leading one is unused.
    wgmma_m64n128k16_ss<T>(s, smem_desc(q_rows + step, 16, 1024), smem_desc(k_tile + step, 16, 1024), ks > 0);
  }
}

// O += P V: 8 k-steps of 16 keys (16 rows of V = 2048 bytes each). V is N-major (D contiguous): the leading byte
// offset steps from columns 0..63 to 64..127 (one half), the stride byte offset 8 keys (1024 bytes).
// SPLIT issues two n64 halves instead of one n128 (the same product; a check on the leading offset's meaning).
template <typename T, bool SPLIT>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&p)[8][4], uint32_t v_tile) {
#pragma unroll
  for (int kt = 0; kt < kRows / 16; ++kt) {
    const uint32_t rows = v_tile + kt * 16 * 128;
    if constexpr (SPLIT) {
      wgmma_m64n64k16_rs<T, 0>(o, p[kt], smem_desc(rows, kHalfBytes, 1024));
      wgmma_m64n64k16_rs<T, 32>(o, p[kt], smem_desc(rows + kHalfBytes, kHalfBytes, 1024));
    } else {
      wgmma_m64n128k16_rs<T, 0>(o, p[kt], smem_desc(rows, kHalfBytes, 1024));
    }
  }
}

// Online softmax of one 64 x 128 score tile, in place (scores become unnormalised probabilities), rescaling O.
// A thread holds rows r_lo (h = 0) and r_lo + 8 (h = 1); s[4j + 2h + e] is column col0 + 8j + 2(lane & 3) + e:
// the accumulator layout of wgmma m64nN, the same per warp as mma.sync's, so a quad of lanes shares each row.
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&o)[64], float (&row_max)[2], float (&row_sum)[2],
                                             int r_lo, int col0, int S, bool causal, bool need_mask, float scale_log2,
                                             int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r_lo + 8 * h;
    float mx = row_max[h];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = s[4 * j + 2 * h + e];
        if (need_mask) {
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
    const float alpha = fast_exp2(row_max[h] * scale_log2 - m_use);
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
    row_sum[h] = row_sum[h] * alpha + sum;  // per-thread partial; the quad is summed at the end
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j + 2 * h] *= alpha;
      o[4 * j + 2 * h + 1] *= alpha;
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

// Every thread's cp.async copies have landed and are visible to the tensor cores (async proxy), and every warpgroup
// is past the previous tile, so its buffers may be refilled.
__device__ __forceinline__ void tiles_landed() {
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
}

template <typename T, bool OVERLAP, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           T* __restrict__ o, int S, float scale_log2, bool causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle repeats every 1024 bytes
  const uint32_t sQ = base;
  const uint32_t sK = base + kTileBytes;      // K tile j in sK + (j & 1) * kTileBytes
  const uint32_t sV = base + 3 * kTileBytes;  // V tile j in sV + (j & 1) * kTileBytes

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  const int m_block = gridDim.y - 1 - blockIdx.y;  // causal: the longest rows are dispatched first
  const int m0 = m_block * kRows;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * S * kHead;
  const T* qb = q + off;
  const T* kb = k + off;
  const T* vb = v + off;
  const int n_end = causal ? min(S, m0 + kRows) : S;
  const int num_n = (n_end + kRows - 1) / kRows;
  const int wg_row0 = m0 + wg * 64;
  const int r_lo = wg_row0 + ((tid >> 5) & 3) * 16 + (lane >> 2);
  const uint32_t q_rows = sQ + wg * 64 * 128;  // this warpgroup's 64 rows of each half of q

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  float s[64];
  uint32_t p[8][4];

  if constexpr (OVERLAP) {
    // K runs one tile ahead of V: q k^T of tile nb+1 is issued while tile nb's softmax runs.
    load_tile(sQ, qb, m0, S, tid);
    load_tile(sK, kb, 0, S, tid);
    if (num_n > 1) load_tile(sK + kTileBytes, kb, kRows, S, tid);
    load_tile(sV, vb, 0, S, tid);
    cp_async_commit();
    tiles_landed();
    wgmma_fence();
    issue_qk<T>(s, q_rows, sK);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    for (int nb = 0; nb < num_n; ++nb) {
      // K(nb+1) and V(nb) have landed; every warpgroup is past q K(nb)^T and P V(nb-1), so K(nb)'s buffer takes
      // K(nb+2) and V(nb-1)'s takes V(nb+1)
      tiles_landed();
      if (nb + 2 < num_n) load_tile(sK + (nb & 1) * kTileBytes, kb, (nb + 2) * kRows, S, tid);
      if (nb + 1 < num_n) load_tile(sV + ((nb + 1) & 1) * kTileBytes, vb, (nb + 1) * kRows, S, tid);
      cp_async_commit();
      const bool more = nb + 1 < num_n;
      float s_next[64];
      if (more) {
        wgmma_fence();
        issue_qk<T>(s_next, q_rows, sK + ((nb + 1) & 1) * kTileBytes);
        wgmma_commit();
      }
      const bool need_mask = (nb + 1) * kRows > S || (causal && (nb + 1) * kRows - 1 > wg_row0);
      softmax_tile(s, acc, row_max, row_sum, r_lo, nb * kRows, S, causal, need_mask, scale_log2, lane);
      pack_p<T>(s, p);
      wgmma_fence();
      issue_pv<T, SPLIT>(acc, p, sV + (nb & 1) * kTileBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(acc);
      if (more) {
        fence_regs(s_next);
#pragma unroll
        for (int i = 0; i < 64; ++i) s[i] = s_next[i];
      }
    }
  } else {
    load_tile(sQ, qb, m0, S, tid);
    load_tile(sK, kb, 0, S, tid);
    load_tile(sV, vb, 0, S, tid);
    cp_async_commit();
    for (int nb = 0; nb < num_n; ++nb) {
      // tile nb has landed; every warpgroup is past tile nb-1, so its buffers may be refilled with tile nb+1
      tiles_landed();
      if (nb + 1 < num_n) {
        load_tile(sK + ((nb + 1) & 1) * kTileBytes, kb, (nb + 1) * kRows, S, tid);
        load_tile(sV + ((nb + 1) & 1) * kTileBytes, vb, (nb + 1) * kRows, S, tid);
      }
      cp_async_commit();
      wgmma_fence();
      issue_qk<T>(s, q_rows, sK + (nb & 1) * kTileBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      const bool need_mask = (nb + 1) * kRows > S || (causal && (nb + 1) * kRows - 1 > wg_row0);
      softmax_tile(s, acc, row_max, row_sum, r_lo, nb * kRows, S, causal, need_mask, scale_log2, lane);
      pack_p<T>(s, p);
      wgmma_fence();
      issue_pv<T, SPLIT>(acc, p, sV + (nb & 1) * kTileBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(acc);
    }
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits

  // ---- out = O / rowsum ----
  T* ob = o + off;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = r_lo + 8 * h;
    if (row < S) {
      T* orow = ob + static_cast<int64_t>(row) * kHead + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint32_t*>(orow + 8 * j) =
            Elem<T>::pack2(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
    }
  }
#else
  __trap();  // not reached: the host side launches this only from an sm_90a build
#endif
}

#if defined(MODELAB_SM90A)
template <typename T, bool OVERLAP, bool SPLIT>
void launch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal, double scale,
            cudaStream_t stream) {
  const int64_t S = q.size(2);
  const int64_t BH = q.size(0) * q.size(1);
  const int64_t num_m = (S + kRows - 1) / kRows;
  TORCH_CHECK(num_m <= 65535, "modelab_levels::attention: S = ", S, " is too long for the grid");
  TORCH_CHECK(BH <= 2147483647, "modelab_levels::attention: B * H too large for the grid");
  auto kernel = attention_wgmma_kernel<T, OVERLAP, SPLIT>;
  allow_dynamic_smem(kernel, kSmemBytes);
  const dim3 grid(static_cast<unsigned>(BH), static_cast<unsigned>(num_m));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(
      reinterpret_cast<const T*>(q.const_data_ptr()), reinterpret_cast<const T*>(k.const_data_ptr()),
      reinterpret_cast<const T*>(v.const_data_ptr()), reinterpret_cast<T*>(o.mutable_data_ptr()),
      static_cast<int>(S), static_cast<float>(scale * 1.4426950408889634), causal);
  CUDA_CHECK_LAUNCH();
}
#endif

}  // namespace

// Variants (see kWgmmaVariants in attention.cu): 4 = OVERLAP (bf16, fp16), 5 = one tile at a time (bf16),
// 6 = 5 with the P V product as two n64 halves (bf16). D = 128 only; the GPU must be compute capability 9.0.
void attention_wgmma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal,
                     double scale, int64_t variant, cudaStream_t stream) {
#if defined(MODELAB_SM90A)
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device()));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device()));
  TORCH_CHECK(major == 9 && minor == 0, "modelab_levels::attention: variant ", variant,
              " (wgmma) needs a compute capability 9.0 GPU; this one is ", major, ".", minor);
  TORCH_CHECK(q.size(3) == kHead, "modelab_levels::attention: variant ", variant, " (wgmma) needs D = 128");
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || (q.scalar_type() == at::kHalf && variant == 4), "modelab_levels::attention: variant ", variant,
              " is built for bfloat16", variant == 4 ? " and float16" : "", " only");
  if (bf16) {
    if (variant == 4) return launch<__nv_bfloat16, true, false>(q, k, v, o, causal, scale, stream);
    if (variant == 5) return launch<__nv_bfloat16, false, false>(q, k, v, o, causal, scale, stream);
    if (variant == 6) return launch<__nv_bfloat16, false, true>(q, k, v, o, causal, scale, stream);
  } else {
    return launch<__half, true, false>(q, k, v, o, causal, scale, stream);
  }
  TORCH_CHECK(false, "modelab_levels::attention: no wgmma variant ", variant);
#else
  (void)q, (void)k, (void)v, (void)o, (void)causal, (void)scale, (void)stream;
  TORCH_CHECK(false, "modelab_levels::attention: variant ", variant, " (wgmma) needs an sm_90a build: this library ",
              "was built for another GPU architecture");
#endif
}

}  // namespace modelab_levels
