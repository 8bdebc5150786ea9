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
#include "wgmma.cuh"

namespace modelab_levels {

namespace {

constexpr int kThreads = 256;              // two warpgroups
constexpr int kSmemBytes = 5 * kTileBytes + 1024;  // q, k x2, v x2, and slack to align the base to 1024 bytes

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

  store_o<T>(o + off, acc, row_sum, r_lo, S, lane);
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

// Variants (the variant table in attention.cu): 4 = OVERLAP (bf16, fp16), 5 = one tile at a time (bf16),
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
