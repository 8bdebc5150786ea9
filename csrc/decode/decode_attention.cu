// The decode step's attention from the qkv projection's output, one kernel per layer, the splits combined inside a
// thread-block cluster (sm_90): RoPE on the query rows and the new key, the new key and value written into the
// cache, flash-decoding over the cache, and the splits' combine — which the Triton kernel beside it
// (engine/kernels/triton/decode_attention.py) leaves to a second kernel.
//
// Why: in the 1B int4 decode step the attention is two short kernels per layer, the split (3.0 µs on the critical
// path) and the combine (1.8 µs), for ~1.3 MB of cache (H100, the decode profile, docs/quantization.md); each kernel
// boundary costs the wait for the whole grid before it. Folding the combine into the split kernel's last program per
// kv head (an arrival count in global memory) was slower on the H100 (the fence, the atomic's round trip). Here the
// splits of one (sequence, kv head) are the CTAs of one cluster: each writes its running max m, sum l and
// unnormalised output o into its own shared memory, the cluster's barrier makes them visible, and every CTA combines
// a share of the outputs reading its peers' shared memory (distributed shared memory) — no global round trip, no
// second kernel.
//
// Layout: grid (cluster size C, B · KVH), 128 threads; CTA r of the cluster takes positions [r·⌈L/C⌉, (r+1)·⌈L/C⌉)
// of the L = input_pos + 1 valid ones, in tiles of 128 positions, one position per thread for q·k (its key row in
// registers) and the warps over the tile's positions for P·V (the value rows in shared memory). Under programmatic
// dependent launch the first tile of the cache (written before this step began) is loaded before waiting for the
// qkv product; the new position's key and value come from the qkv row afterwards. fp32 throughout (scores, softmax,
// accumulation); q and the new key are rounded to the model's dtype after RoPE, as the eager model rounds them.
// Built and called by engine/kernels/cuda_decode.py; the cache and the tables are bf16.
#include "common.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

namespace modelab_decode {

namespace cg = cooperative_groups;
using modelab_levels::pdl_launch_dependents;
using modelab_levels::pdl_wait;

constexpr int THREADS = 128;  // one position of a tile per thread (q·k)
constexpr int TILE = THREADS;
constexpr int WARPS = THREADS / 32;
constexpr int MAX_CLUSTER = 8;  // the portable cluster size

struct Args {
  const __nv_bfloat16* qkv;  // (B, row): [q heads | k heads | v heads] of D values, before RoPE
  const __nv_bfloat16* cos;  // (>= S_max, D) rotary tables
  const __nv_bfloat16* sin;
  __nv_bfloat16* k;  // (B, KVH, S_max, D) caches, written at position input_pos
  __nv_bfloat16* v;
  const int64_t* pos;  // input_pos (the last element)
  __nv_bfloat16* out;  // (B, KVH · REP, D)
  int kvh, s_max, row;
  float scale;
};

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

template <int D, int REP>
__global__ void __launch_bounds__(THREADS, 1) decode_attention_kernel(const Args a) {
  constexpr int VEC = D / 8;  // 16-byte pieces of a row
  constexpr int DL = D / 32;  // dims per lane in P·V
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static_assert(WARPS * REP * D * 4 <= TILE * D * 2, "the warps' partial outputs reuse the value tile");
  __shared__ __align__(16) __nv_bfloat16 v_tile[TILE * D];  // the tile's value rows; at the end the warps' outputs
  __shared__ __align__(16) float q_s[REP][D];               // q after RoPE, rounded to bf16
  __shared__ __align__(16) __nv_bfloat16 kv_new[2][D];      // the new position's key (after RoPE) and value
  __shared__ float rope_s[2][D];                            // cos, sin of the new position
  __shared__ float p_s[REP][TILE];                          // the tile's probabilities (unnormalised)
  __shared__ float red[WARPS][REP];
  // what the cluster's combine reads from this CTA
  __shared__ __align__(16) float o_part[REP][D];
  __shared__ float m_part[REP], l_part[REP];

  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int ranks = static_cast<int>(cluster.num_blocks());
  const int bk = blockIdx.y;  // b · KVH + kv head
  const int b = bk / a.kvh, head = bk % a.kvh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  pdl_launch_dependents();  // the o product after this may start loading its weights
  // The position and the cache below it were written before this step's first kernel (which PDL never overlaps):
  // read before waiting for the qkv product.
  const int length = static_cast<int>(*a.pos) + 1;
  const int newest = length - 1;
  const int chunk = (length + ranks - 1) / ranks;
  const int lo = min(rank * chunk, length), hi = min(lo + chunk, length);
  const size_t kv_base = static_cast<size_t>(bk) * a.s_max * D;

  uint4 krow[VEC];
  // One tile: this thread's key row into registers, the value rows into shared memory by 16-byte copies spread over
  // the threads (coalesced). The newest position is skipped (this kernel writes it); rows past hi are not copied.
  auto load_tile = [&](int t0) {
    const int p = t0 + tid;
    const bool in = p < hi && p != newest;
    const uint4* src = reinterpret_cast<const uint4*>(a.k + kv_base + static_cast<size_t>(in ? p : lo) * D);
#pragma unroll
    for (int j = 0; j < VEC; ++j) krow[j] = in ? __ldg(src + j) : make_uint4(0u, 0u, 0u, 0u);
    const int rows = min(TILE, hi - t0);
    for (int i = tid; i < rows * VEC; i += THREADS) {
      const int r = i / VEC, piece = i % VEC;
      if (t0 + r != newest)
        modelab_levels::cp_async_16(v_tile + r * D + piece * 8,
                                    a.v + kv_base + static_cast<size_t>(t0 + r) * D + piece * 8, true);
    }
    modelab_levels::cp_async_commit();
  };
  if (lo < hi) load_tile(lo);
  for (int d = tid; d < D; d += THREADS) {  // the rotary tables are static
    rope_s[0][d] = __bfloat162float(a.cos[static_cast<size_t>(newest) * D + d]);
    rope_s[1][d] = __bfloat162float(a.sin[static_cast<size_t>(newest) * D + d]);
  }
  __syncthreads();
  pdl_wait();  // the qkv row is the kernel before's output

  // ---- RoPE: q rows head·REP .. + REP-1, the new key; the new value as it is --------------------------------------
  const __nv_bfloat16* row = a.qkv + static_cast<size_t>(b) * a.row;
  // Unrolled, every load first: the qkv row is one round trip to L2, not one per pass.
  constexpr int ROPE_VALUES = (REP + 2) * D, PASSES = (ROPE_VALUES + THREADS - 1) / THREADS;
  float x[PASSES], x_rot[PASSES];
#pragma unroll
  for (int it = 0; it < PASSES; ++it) {
    const int i = tid + it * THREADS, r = i / D, d = i % D;
    const int col = r < REP ? (head * REP + r) : r == REP ? (a.kvh * REP + head) : (a.kvh * REP + a.kvh + head);
    const __nv_bfloat16* src = row + static_cast<size_t>(col) * D;
    const bool in = i < ROPE_VALUES;
    x[it] = in ? __bfloat162float(src[d]) : 0.f;
    x_rot[it] = in && r <= REP ? __bfloat162float(src[(d + D / 2) % D]) : 0.f;  // rotate_half's partner
  }
#pragma unroll
  for (int it = 0; it < PASSES; ++it) {
    const int i = tid + it * THREADS, r = i / D, d = i % D;
    if (i >= ROPE_VALUES) continue;
    if (r == REP + 1) {  // the new value, as it is
      kv_new[1][d] = __float2bfloat16_rn(x[it]);
      continue;
    }
    // rotate_half: -x[d + D/2] below D/2, x[d - D/2] above
    const float sign = d < D / 2 ? -1.f : 1.f;
    const float y = x[it] * rope_s[0][d] + x_rot[it] * sign * rope_s[1][d];
    if (r < REP) {
      q_s[r][d] = bf16_round(y);
    } else {
      kv_new[0][d] = __float2bfloat16_rn(y);
    }
  }
  __syncthreads();

  // ---- the tiles: online softmax over this CTA's positions --------------------------------------------------------
  float m_run[REP], lw[REP], acc[REP][DL];  // m uniform in the block; l and acc this warp's share
#pragma unroll
  for (int r = 0; r < REP; ++r) {
    m_run[r] = -INFINITY;
    lw[r] = 0.f;
#pragma unroll
    for (int e = 0; e < DL; ++e) acc[r][e] = 0.f;
  }
  for (int t0 = lo; t0 < hi; t0 += TILE) {
    if (t0 != lo) load_tile(t0);
    const int p = t0 + tid;
    const bool valid = p < hi;
    if (p == newest) {  // the new position from the qkv row (not from the cache: this kernel just wrote it)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        krow[j] = reinterpret_cast<const uint4*>(kv_new[0])[j];
        reinterpret_cast<uint4*>(v_tile + tid * D)[j] = reinterpret_cast<const uint4*>(kv_new[1])[j];
      }
    }
    float s[REP];
#pragma unroll
    for (int r = 0; r < REP; ++r) s[r] = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&krow[j]);
      float kf[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(k2[e]);
        kf[2 * e] = f.x;
        kf[2 * e + 1] = f.y;
      }
#pragma unroll
      for (int r = 0; r < REP; ++r) {
        const float4 qa = reinterpret_cast<const float4*>(&q_s[r][8 * j])[0];
        const float4 qb = reinterpret_cast<const float4*>(&q_s[r][8 * j])[1];
        s[r] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                qb.z * kf[6] + qb.w * kf[7];
      }
    }
#pragma unroll
    for (int r = 0; r < REP; ++r) {
      s[r] = valid ? s[r] * a.scale : -INFINITY;
      const float mx = warp_max(s[r]);
      if (lane == 0) red[warp][r] = mx;
    }
    modelab_levels::cp_async_wait<0>();
    __syncthreads();  // the tile maxima, and every value row (copies landed, the new one patched in)
    float alpha[REP];
#pragma unroll
    for (int r = 0; r < REP; ++r) {
      float m_new = m_run[r];
#pragma unroll
      for (int w = 0; w < WARPS; ++w) m_new = fmaxf(m_new, red[w][r]);  // finite: position t0 is valid
      alpha[r] = __expf(m_run[r] - m_new);                               // 0 on the first tile (m_run = -inf)
      p_s[r][tid] = valid ? __expf(s[r] - m_new) : 0.f;
      m_run[r] = m_new;
    }
    __syncthreads();  // the probabilities
    const int rows = min(TILE, hi - t0);
#pragma unroll
    for (int r = 0; r < REP; ++r) {
      lw[r] *= alpha[r];
#pragma unroll
      for (int e = 0; e < DL; ++e) acc[r][e] *= alpha[r];
    }
#pragma unroll 4
    for (int j = warp; j < rows; j += WARPS) {  // P·V: warp w takes positions w, w + 4, ...; lane dims lane·DL ..
      float vf[DL];
      if constexpr (DL == 2) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_tile + j * D + lane * 2));
        vf[0] = f.x;
        vf[1] = f.y;
      } else {
        const uint2 w2 = *reinterpret_cast<const uint2*>(v_tile + j * D + lane * 4);
        const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w2.x));
        const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w2.y));
        vf[0] = f0.x;
        vf[1] = f0.y;
        vf[2] = f1.x;
        vf[3] = f1.y;
      }
#pragma unroll
      for (int r = 0; r < REP; ++r) {
        const float pr = p_s[r][j];
        lw[r] += pr;
#pragma unroll
        for (int e = 0; e < DL; ++e) acc[r][e] = fmaf(pr, vf[e], acc[r][e]);
      }
    }
    __syncthreads();  // the value tile and the probabilities may be overwritten by the next tile
  }

  // ---- this CTA's split: the warps' shares summed into o_part, m_part, l_part -----------------------------------
  float* warp_o = reinterpret_cast<float*>(v_tile);  // [WARPS][REP][D]
#pragma unroll
  for (int r = 0; r < REP; ++r) {
#pragma unroll
    for (int e = 0; e < DL; ++e) warp_o[(warp * REP + r) * D + lane * DL + e] = acc[r][e];
    if (lane == 0) red[warp][r] = lw[r];
  }
  __syncthreads();
  for (int i = tid; i < REP * D; i += THREADS) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += warp_o[w * REP * D + i];
    o_part[i / D][i % D] = sum;
  }
#pragma unroll
  for (int r = 0; r < REP; ++r) {  // (unrolled: m_run stays in registers)
    if (tid == r) {
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) l += red[w][r];
      m_part[r] = m_run[r];  // -inf for a CTA with no positions (its l and o are 0)
      l_part[r] = l;
    }
  }
  cluster.sync();  // every CTA's split in its shared memory, visible to the cluster

  // ---- the combine: each CTA a share of the REP × D outputs, reading every split from its CTA's shared memory ----
  for (int i = rank * THREADS + tid; i < REP * D; i += ranks * THREADS) {
    const int r = i / D, d = i % D;
    // Every peer's m, l and o read at once (unrolled over the largest cluster, predicated): one round trip to the
    // peers' shared memory, not one per peer.
    float m[MAX_CLUSTER], l[MAX_CLUSTER], o[MAX_CLUSTER];
#pragma unroll
    for (int c = 0; c < MAX_CLUSTER; ++c) {
      const bool in = c < ranks;
      m[c] = in ? *cluster.map_shared_rank(&m_part[r], c) : -INFINITY;
      l[c] = in ? *cluster.map_shared_rank(&l_part[r], c) : 0.f;
      o[c] = in ? *cluster.map_shared_rank(&o_part[r][d], c) : 0.f;
    }
    float m_max = m[0];  // finite: CTA 0 holds position 0
#pragma unroll
    for (int c = 1; c < MAX_CLUSTER; ++c) m_max = fmaxf(m_max, m[c]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int c = 0; c < MAX_CLUSTER; ++c) {
      const float w = m[c] == -INFINITY ? 0.f : __expf(m[c] - m_max);  // a CTA without positions (or none) adds 0
      num = fmaf(w, o[c], num);
      den = fmaf(w, l[c], den);
    }
    a.out[(static_cast<size_t>(bk) * REP + r) * D + d] = __float2bfloat16_rn(num / den);
  }
  // No CTA leaves (freeing its shared memory) while a peer still reads it. Relaxed: the peers' reads are done once
  // their values were used, and nothing written here is for the peers (a release would wait for the stores).
  cluster_arrive_relaxed();
  if (lo <= newest && newest < hi) {  // this CTA's range holds the new position: write it into the cache (here, not
    // before the first cluster barrier, whose release would wait for these stores)
    for (int d = tid; d < D; d += THREADS) {
      a.k[kv_base + static_cast<size_t>(newest) * D + d] = kv_new[0][d];
      a.v[kv_base + static_cast<size_t>(newest) * D + d] = kv_new[1][d];
    }
  }
  cluster_wait();
}

template <int D, int REP>
void launch(const Args& args, int batch_heads, int cluster, bool pdl, cudaStream_t stream) {
  auto kernel = decode_attention_kernel<D, REP>;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster, batch_heads);
  config.blockDim = dim3(THREADS);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args));
}

template <int D>
void dispatch_rep(const Args& args, int rep, int batch_heads, int cluster, bool pdl, cudaStream_t stream) {
  switch (rep) {
    case 1: launch<D, 1>(args, batch_heads, cluster, pdl, stream); break;
    case 2: launch<D, 2>(args, batch_heads, cluster, pdl, stream); break;
    case 4: launch<D, 4>(args, batch_heads, cluster, pdl, stream); break;
    case 8: launch<D, 8>(args, batch_heads, cluster, pdl, stream); break;
    default: TORCH_CHECK(false, "decode_attention: query heads per kv head must be 1, 2, 4 or 8, got ", rep);
  }
}

at::Tensor decode_attention_cuda(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& input_pos,
                                 int64_t cluster, bool pdl) {
  for (const at::Tensor* t : {&qkv, &cos, &sin, &k_cache, &v_cache})
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kBFloat16 && t->is_contiguous(),
                "decode_attention: qkv, the rotary tables and the caches must be contiguous bfloat16 CUDA tensors");
  TORCH_CHECK(input_pos.is_cuda() && input_pos.scalar_type() == at::kLong && input_pos.numel() >= 1,
              "decode_attention: input_pos must be a non-empty int64 CUDA tensor");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "decode_attention: the caches must both be (B, KVH, S_max, D)");
  const int64_t b = k_cache.size(0), kvh = k_cache.size(1), s_max = k_cache.size(2), d = k_cache.size(3);
  TORCH_CHECK(d == 64 || d == 128, "decode_attention: head dim must be 64 or 128, got ", d);
  TORCH_CHECK(b > 0 && kvh > 0 && qkv.numel() % b == 0, "decode_attention: qkv is not B rows");
  const int64_t row = qkv.numel() / b;
  TORCH_CHECK(row % d == 0 && row / d > 2 * kvh && (row / d - 2 * kvh) % kvh == 0,
              "decode_attention: a qkv row of ", row, " values is not [q | k | v] heads for ", kvh, " kv heads of ", d);
  const int64_t rep = (row / d - 2 * kvh) / kvh;
  TORCH_CHECK(cos.dim() == 2 && sin.sizes() == cos.sizes() && cos.size(0) >= s_max && cos.size(1) == d,
              "decode_attention: the rotary tables must be (>= S_max, D)");
  TORCH_CHECK(cluster >= 1 && cluster <= MAX_CLUSTER, "decode_attention: cluster must be 1 .. ", MAX_CLUSTER);
  TORCH_CHECK(b * kvh <= 65535, "decode_attention: B · KVH above the grid's 65535");
  const c10::cuda::CUDAGuard guard(qkv.device());
  at::Tensor out = at::empty({b, kvh * rep, 1, d}, qkv.options());
  const at::Tensor pos = input_pos.reshape({-1}).slice(0, input_pos.numel() - 1);
  Args args{reinterpret_cast<const __nv_bfloat16*>(qkv.data_ptr()),
            reinterpret_cast<const __nv_bfloat16*>(cos.data_ptr()),
            reinterpret_cast<const __nv_bfloat16*>(sin.data_ptr()),
            reinterpret_cast<__nv_bfloat16*>(k_cache.data_ptr()),
            reinterpret_cast<__nv_bfloat16*>(v_cache.data_ptr()),
            pos.data_ptr<int64_t>(),
            reinterpret_cast<__nv_bfloat16*>(out.data_ptr()),
            static_cast<int>(kvh), static_cast<int>(s_max), static_cast<int>(row),
            static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(qkv.get_device()).stream();
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, qkv.get_device()));
  TORCH_CHECK(major >= 9, "decode_attention: thread-block clusters need compute capability 9.0 or newer");
  const int bh = static_cast<int>(b * kvh);
  if (d == 64) {
    dispatch_rep<64>(args, static_cast<int>(rep), bh, static_cast<int>(cluster), pdl, stream);
  } else {
    dispatch_rep<128>(args, static_cast<int>(rep), bh, static_cast<int>(cluster), pdl, stream);
  }
  return out;
}

}  // namespace modelab_decode
