// L5 attention on Hopper in the FlashAttention-3 manner (variant 7): q, k, v (B, H, S, D), bf16 or fp16, D = 128
// or 64 (the ViT's heads), causal or not, any S. Built only for sm_90a; its tile layout and wgmma pieces are in
// wgmma.cuh.
//
// A block of 384 threads owns 128 query rows of one (batch, head), as three warpgroups with separate jobs:
// - the producer (warpgroup 0) gives its registers back (setmaxnreg.dec to 24) and one of its threads issues every
//   load as a TMA copy: q once, then key and value tiles of 128 rows into a ring of 2 stages each. A stage's "full"
//   mbarrier completes when the copy's bytes have landed; its "empty" mbarrier when both consumers are done with it.
//   The tensor map's 128-byte swizzle writes the layout wgmma reads, and rows past S arrive as zeros.
// - two consumers (warpgroups 1 and 2, 64 query rows each, setmaxnreg.inc to 240) run the math. Within one consumer
//   the next tile's S = q k^T is issued together with this tile's O += P v, and the softmax of the next scores runs
//   while that P v is still on the tensor cores; O is rescaled to the new row maxima while the following q k^T runs,
//   just before its P v is issued (FlashAttention-3's order: after the wait for P v only P's conversion is left).
//   Between the consumers, two named barriers hand the tensor cores back and forth: one warpgroup issues its pair of
//   products, then lets the other issue, so one's softmax overlaps the other's matrix products (the ping-pong).
// Causal: key tiles past the block's last row are never loaded; the diagonal tile and a ragged tail are masked, and
// the P V of the diagonal tile for the block's lower 64 rows takes its first 64 keys only (they see no more of it).
//
// Variant 8 is the same kernel with FlashAttention-3's epilogue: each consumer writes O / rowsum into its own 64 rows
// of q's tile (q is dead after its last q k^T) in the 128-byte-swizzled layout, and one thread stores them with a
// TMA copy per 64-column half (rows past S clipped by the tensor map), instead of every thread storing 4-byte pairs.
// What FlashAttention-3 also does and this kernel does not: a persistent tile scheduler, 176-key tiles for the
// non-causal case, fp8.
// D = 64 is the same kernel on tiles of one 64-column half (16 KB): q k^T in 4 k-steps instead of 8, P V as n64
// products into 32 accumulators per thread, one TMA box per tile. (FlashAttention-3 takes 192 query rows per block
// at D = 64, three consumer warpgroups; this build keeps 128 and two.)
#include "wgmma.cuh"

#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (the driver API, reached through the runtime)

namespace modelab_levels {

namespace {

constexpr int kWsThreads = 384;   // a producer warpgroup and two consumer warpgroups
constexpr int kStages = 2;        // key tiles and value tiles in flight
constexpr int kConsumerWarps = 8; // one arrive per consumer warp releases a stage
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;  // 128 x 24 + 256 x 240 = 384 x 168, the launch's own count
// tiles, alignment slack, mbarriers (128 bytes), 8 bytes per consumer thread for keep_before_wait
template <int D>
constexpr int ws_smem_bytes() { return (1 + 2 * kStages) * tile_bytes<D>() + 1024 + 128 + 256 * 8; }
constexpr int kTurnBarrier = 1;   // named barriers 1 and 2: the consumers' turns (0 is __syncthreads)
constexpr int kOutBarrier = 3;    // 3 and 4: each consumer's epilogue (variant 8)

// ---- TMA, named barriers, register reallocation (the mbarriers are common.cuh's) ------------------------------------
// Box (c0.., c1.., c2) of a 3-d tensor map into shared memory; the barrier counts its bytes.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
// Box (c0.., c1.., c2) of a 3-d tensor map from shared memory (a bulk group: commit, then wait before the block's
// shared memory may go away).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int N>
__device__ __forceinline__ void regs_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void regs_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// The softmax of S(n) is meant to run while P(n-1) V(n-1) is on the tensor cores, but nothing ties it to the wait
// for that product, so ptxas (CUDA 13.0) schedules the wait (WARPGROUP.DEPBAR.LE 0) before the whole softmax, and an
// empty asm fence on the scores does not stop it. A shared-memory store of the row sums — which depend on every
// probability of the tile — stays in order with the wait, so the softmax must finish first.
__device__ __forceinline__ void keep_before_wait(uint32_t sink, const float (&row_sum)[2]) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sink), "f"(row_sum[0]), "f"(row_sum[1]) : "memory");
}

// The block's mbarriers, 8 bytes each after the tiles: q, then per stage k full / k empty / v full / v empty.
struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t k_full(int st) const { return base + 8u * (1 + st); }
  __device__ uint32_t k_empty(int st) const { return base + 8u * (1 + kStages + st); }
  __device__ uint32_t v_full(int st) const { return base + 8u * (1 + 2 * kStages + st); }
  __device__ uint32_t v_empty(int st) const { return base + 8u * (1 + 3 * kStages + st); }
};

// Rows row0.. row0+127 of one (batch, head) into a tile: one 64-column box per half.
template <int D>
__device__ __forceinline__ void tma_tile(uint32_t tile, const CUtensorMap* map, uint32_t bar, int row0, int bh) {
#pragma unroll
  for (int half = 0; half < D / 64; ++half) tma_load_3d(tile + half * kHalfBytes, map, bar, half * 64, row0, bh);
}

// The producer's step for tile n of K or V: wait until its stage is empty, then load it there.
template <int D>
__device__ __forceinline__ void produce(const CUtensorMap* map, uint32_t ring, uint32_t full, uint32_t empty, int n,
                                        int bh) {
  mbar_wait(empty, ((n / kStages) & 1) ^ 1);
  mbar_expect_tx(full, tile_bytes<D>());
  tma_tile<D>(ring + (n % kStages) * tile_bytes<D>(), map, full, n * kRows, bh);
}

// Variant 8's epilogue for one consumer: out = O / rowsum into its 64 rows of q's tile (q_rows: their first row of
// the first half; tile_offset's swizzle is the tensor map's), then its first thread stores them by TMA, one box of
// 64 columns x 64 rows per half. The map clips rows past S.
template <typename T, int D>
__device__ __forceinline__ void store_o_tma(const CUtensorMap* map, uint32_t q_rows, const float (&acc)[D / 2],
                                            const float (&row_sum)[2], int wg_row0, int bh, int S, int tid, int lane,
                                            int barrier) {
  const int rr0 = ((tid >> 5) & 3) * 16 + (lane >> 2);  // this thread's first row among the consumer's 64
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = inv_row_sum(row_sum[h]);
    const int rr = rr0 + 8 * h;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {  // columns 8j + 2 (lane & 3), +1: 16-byte chunk j of the row
      const uint32_t dst = q_rows + tile_offset(rr, j) + 4 * (lane & 3);
      const uint32_t pair = Elem<T>::pack2(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(pair) : "memory");
    }
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the generic stores, seen by the TMA's proxy
  named_sync(barrier, 128);
  if ((tid & 127) == 0 && wg_row0 < S) {
#pragma unroll
    for (int half = 0; half < D / 64; ++half) tma_store_3d(map, q_rows + half * kHalfBytes, half * 64, wg_row0, bh);
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // shared memory read: the block may end
  }
}

template <typename T, int D, bool kTmaStore>
__global__ void __launch_bounds__(kWsThreads, 1)
    attention_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                        T* __restrict__ o, int S, float scale_log2, bool causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // the 128B swizzle repeats every 1024 bytes
  constexpr int kTile = tile_bytes<D>();
  const uint32_t sQ = base;
  const uint32_t sK = base + kTile;                   // K tile n in sK + (n % kStages) * kTile
  const uint32_t sV = base + (1 + kStages) * kTile;   // V likewise
  const Barriers bar{base + (1 + 2 * kStages) * kTile};

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  // Head-major grid: the CTAs running at once are a few heads' row blocks, so those heads' K and V (2 MB each at
  // S=4096) are read from DRAM about once and then from L2. With the head index fastest, the ~132 CTAs in flight
  // would span 64 heads at the same row block, and each later row block would read its head's K and V from DRAM
  // again (several times cuDNN's DRAM traffic).
  const int bh = blockIdx.y;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // causal: within a head the longest rows are dispatched first
  const int m0 = m_block * kRows;
  const int n_end = causal ? min(S, m0 + kRows) : S;
  const int num_n = (n_end + kRows - 1) / kRows;

  if (tid == 0) {
    mbar_init(bar.q_full(), 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bar.k_full(st), 1);
      mbar_init(bar.v_full(st), 1);
      mbar_init(bar.k_empty(st), kConsumerWarps);
      mbar_init(bar.v_empty(st), kConsumerWarps);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- the producer ----
    regs_dealloc<kProducerRegs>();
    if (tid == 0) {
      mbar_expect_tx(bar.q_full(), kTile);
      tma_tile<D>(sQ, &tm_q, bar.q_full(), m0, bh);
      // K runs one tile ahead of V: the consumers need K(n) and V(n-1) together.
      produce<D>(&tm_k, sK, bar.k_full(0), bar.k_empty(0), 0, bh);
      for (int n = 1; n <= num_n; ++n) {
        if (n < num_n) produce<D>(&tm_k, sK, bar.k_full(n % kStages), bar.k_empty(n % kStages), n, bh);
        produce<D>(&tm_v, sV, bar.v_full((n - 1) % kStages), bar.v_empty((n - 1) % kStages), n - 1, bh);
      }
    }
    return;
  }

  // ---- the consumers ----
  regs_alloc<kConsumerRegs>();
  // 0 or 1; read through a shuffle so that ptxas knows it is the same in every lane of a warp: branching on a value
  // it cannot prove warp-uniform serialises every wgmma of the kernel (C7520)
  const int c = __shfl_sync(0xffffffffu, wg, 0) - 1;
  // Consumer 0 (the first to issue in each turn) takes the block's upper 64 rows, consumer 1 the lower 64, whose
  // P V on a causal diagonal tile is half the work (half_tile): the block ends with consumer 1's last P V, so the
  // shorter one is on the block's tail.
  const int half_idx = 1 - c;
  const int wg_row0 = m0 + half_idx * 64;
  const int r_lo = wg_row0 + ((tid >> 5) & 3) * 16 + (lane >> 2);
  const uint32_t q_rows = sQ + half_idx * 64 * 128;  // this warpgroup's 64 rows of each half of q (128 B a row)
  const bool releaser = lane == 0;            // one arrive per warp on an "empty" barrier
  const int my_turn = kTurnBarrier + c, their_turn = kTurnBarrier + (c ^ 1);
  const uint32_t sink = bar.base + 128 + (tid - 128) * 8;  // this thread's 8 bytes for keep_before_wait

  float acc[D / 2];  // O: this thread's two rows, D / 8 column pairs each
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
  float s[64];
  uint32_t p[8][4];
  auto need_mask = [&](int n) { return (n + 1) * kRows > S || (causal && (n + 1) * kRows - 1 > wg_row0); };
  // Causal: a key tile that starts at this warpgroup's first row (consumer 1's diagonal tile, always its last) has
  // keys 64..127 past all of its 64 rows, so their probabilities are zero and its P V takes the first 64 keys only.
  // Its q k^T stays whole: a branch between wgmma sequences inside the loop makes ptxas serialise every wgmma of the
  // kernel (C7511), and the diagonal's step peeled off the loop is no faster (docs/kernel-levels.md).
  auto half_tile = [&](int n) { return causal && n * kRows >= wg_row0; };

  // Turns: consumer 0 goes first. Each takes num_n turns and hands over after each but its last; consumer 1's
  // opening hand-over stands in for its last, so every bar.sync meets exactly one bar.arrive.
  if (c == 1) named_arrive(their_turn, 256);
  mbar_wait(bar.q_full(), 0);

  // tile 0: scores only
  mbar_wait(bar.k_full(0), 0);
  named_sync(my_turn, 256);
  wgmma_fence();
  issue_qk<T, D>(s, q_rows, sK);
  wgmma_commit();
  if (!(c == 1 && num_n == 1)) named_arrive(their_turn, 256);
  wgmma_wait<0>();
  fence_regs(s);
  if (releaser) mbar_arrive(bar.k_empty(0));
  softmax_scores(s, alpha, row_max, row_sum, r_lo, 0, S, causal, need_mask(0), scale_log2, lane);
  pack_p<T>(s, p);

  for (int n = 1; n < num_n; ++n) {
    const int st = n % kStages, prev = (n - 1) % kStages;
    mbar_wait(bar.k_full(st), (n / kStages) & 1);
    mbar_wait(bar.v_full(prev), ((n - 1) / kStages) & 1);
    named_sync(my_turn, 256);
    wgmma_fence();
    issue_qk<T, D>(s, q_rows, sK + st * kTile);  // S(n) = q K(n)^T
    wgmma_commit();
    rescale_o(acc, alpha);  // O to tile n-1's row max, while q K(n)^T runs (P(n-2) V(n-2) has landed)
    wgmma_fence();
    issue_pv<T, kRows / 16, D>(acc, p, sV + prev * kTile);  // O += P(n-1) V(n-1)
    wgmma_commit();
    if (!(c == 1 && n == num_n - 1)) named_arrive(their_turn, 256);
    wgmma_wait<1>();  // S(n) has landed; P V may still run
    fence_regs(s);
    if (releaser) mbar_arrive(bar.k_empty(st));
    // only the diagonal tile (causal) and a ragged tail need the mask: the other tiles skip its compares and selects
    if (need_mask(n))
      softmax_scores<kMask>(s, alpha, row_max, row_sum, r_lo, n * kRows, S, causal, true, scale_log2, lane);
    else
      softmax_scores<kNoMask>(s, alpha, row_max, row_sum, r_lo, n * kRows, S, causal, false, scale_log2, lane);
    keep_before_wait(sink, row_sum);
    wgmma_wait<0>();  // P(n-1) V(n-1) has landed: P's registers may be rewritten
    fence_regs(acc);
    if (releaser) mbar_arrive(bar.v_empty(prev));
    pack_p<T>(s, p);
  }

  const int last = (num_n - 1) % kStages;
  mbar_wait(bar.v_full(last), ((num_n - 1) / kStages) & 1);
  rescale_o(acc, alpha);
  wgmma_fence();
  if (half_tile(num_n - 1))
    issue_pv<T, kRows / 32, D>(acc, p, sV + last * kTile);  // P is zero past key 63
  else
    issue_pv<T, kRows / 16, D>(acc, p, sV + last * kTile);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(acc);

  if constexpr (kTmaStore)
    store_o_tma<T, D>(&tm_o, q_rows, acc, row_sum, wg_row0, bh, S, tid, lane, kOutBarrier + c);
  else
    store_o<T>(o + static_cast<int64_t>(bh) * S * D, acc, row_sum, r_lo, S, lane);
#else
  __trap();  // not reached: the host side launches this only from an sm_90a build
#endif
}

#if defined(MODELAB_SM90A)
using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled from the driver, found through the runtime (the extension does not link libcuda).
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found));
#else
    CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found));
#endif
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && ptr != nullptr,
                "modelab_levels::attention: variants 7 and 8 need cuTensorMapEncodeTiled, which this driver lacks");
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

// t (B, H, S, D) as a 3-d tensor (D, S, B * H) in 64 x box_rows x 1 boxes with the 128-byte swizzle; rows past S
// (of each head) read as zeros, and are not written by a store.
CUtensorMap tile_map(const at::Tensor& t, const char* name, int box_rows = kRows) {
  const int64_t D = t.size(3);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0, "modelab_levels::attention: variants 7 ",
              "and 8 need ", name, " 16-byte aligned (a TMA requirement)");
  const int64_t S = t.size(2), BH = t.size(0) * t.size(1);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(S), static_cast<cuuint64_t>(BH)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2, static_cast<cuuint64_t>(S) * D * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType dtype = t.scalar_type() == at::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  const CUresult r = encode_tiled()(&map, dtype, 3, const_cast<void*>(t.const_data_ptr()), dims, strides, box,
                                    elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "modelab_levels::attention: cuTensorMapEncodeTiled failed for ", name,
              " (CUresult ", static_cast<int>(r), ")");
  return map;
}

template <typename T, int D, bool kTmaStore>
void launch_ws(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal,
               double scale, cudaStream_t stream) {
  const int64_t S = q.size(2);
  const int64_t BH = q.size(0) * q.size(1);
  const int64_t num_m = (S + kRows - 1) / kRows;
  TORCH_CHECK(num_m <= 2147483647, "modelab_levels::attention: S = ", S, " is too long for the grid");
  TORCH_CHECK(BH <= 65535, "modelab_levels::attention: B * H = ", BH, " is too large for the grid (at most 65535)");
  const CUtensorMap tm_q = tile_map(q, "q"), tm_k = tile_map(k, "k"), tm_v = tile_map(v, "v");
  const CUtensorMap tm_o = kTmaStore ? tile_map(o, "o", 64) : tm_q;  // one consumer's 64 rows a box; unread by 7
  auto kernel = attention_ws_kernel<T, D, kTmaStore>;
  allow_dynamic_smem(kernel, ws_smem_bytes<D>());
  const dim3 grid(static_cast<unsigned>(num_m), static_cast<unsigned>(BH));
  kernel<<<grid, kWsThreads, ws_smem_bytes<D>(), stream>>>(tm_q, tm_k, tm_v, tm_o,
                                                            reinterpret_cast<T*>(o.mutable_data_ptr()),
                                                            static_cast<int>(S),
                                                            static_cast<float>(scale * 1.4426950408889634), causal);
  CUDA_CHECK_LAUNCH();
}
template <typename T>
void launch_ws_d(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal,
                 double scale, bool tma_store, cudaStream_t stream) {
  if (tma_store) {
    if (q.size(3) == 64) return launch_ws<T, 64, true>(q, k, v, o, causal, scale, stream);
    return launch_ws<T, 128, true>(q, k, v, o, causal, scale, stream);
  }
  if (q.size(3) == 64) return launch_ws<T, 64, false>(q, k, v, o, causal, scale, stream);
  return launch_ws<T, 128, false>(q, k, v, o, causal, scale, stream);
}
#endif

}  // namespace

// Variants 7 and 8 (tma_store; the variant table in attention.cu): bf16 or fp16, D = 128 or 64, compute
// capability 9.0 only.
void attention_ws(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal,
                  double scale, bool tma_store, cudaStream_t stream) {
#if defined(MODELAB_SM90A)
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device()));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device()));
  TORCH_CHECK(major == 9 && minor == 0, "modelab_levels::attention: variants 7 and 8 (TMA, warp-specialised) need a ",
              "compute capability 9.0 GPU; this one is ", major, ".", minor);
  TORCH_CHECK(q.size(3) == 128 || q.size(3) == 64, "modelab_levels::attention: variants 7 and 8 need D = 128 or ",
              "64, not ", q.size(3));
  if (q.scalar_type() == at::kBFloat16)
    return launch_ws_d<__nv_bfloat16>(q, k, v, o, causal, scale, tma_store, stream);
  TORCH_CHECK(q.scalar_type() == at::kHalf, "modelab_levels::attention: variants 7 and 8 are built for bfloat16 ",
              "and float16");
  return launch_ws_d<__half>(q, k, v, o, causal, scale, tma_store, stream);
#else
  (void)q, (void)k, (void)v, (void)o, (void)causal, (void)scale, (void)tma_store, (void)stream;
  TORCH_CHECK(false, "modelab_levels::attention: variants 7 and 8 (TMA, warp-specialised) need an sm_90a build: this ",
              "library was built for another GPU architecture");
#endif
}

}  // namespace modelab_levels
