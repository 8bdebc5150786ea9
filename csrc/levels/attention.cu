// L5 attention: a flash-attention-2 style forward, out = softmax(scale * q k^T [+ causal mask]) v, for q, k, v of
// shape (B, H, S, D), bf16 or fp16, D in {64, 128}, any S.
//
// One block owns BM query rows of one (batch, head); each warp owns 16 * MW of them. K and V stream through shared
// memory in tiles of BN keys (cp.async, swizzled rows so ldmatrix is conflict-free); S = q k^T and O += P V run on
// the tensor cores (mma.sync m16n8k16, fp32 accumulate); the softmax is online (running max and sum per row, fp32,
// exp2 form). K(j+1) is fetched while P V(j) runs and V(j) while q K(j)^T runs, so one buffer each is enough.
// Causal: key tiles past the block's last row are never loaded; only tiles crossing the diagonal (or the ragged
// tail S % BN) pay for masking.
#include "common.cuh"

#include <cmath>
#include <type_traits>

namespace modelab_levels {

// attention_ws.cu: variants 7 and 8, TMA loads by a producer warpgroup, two consumer warpgroups taking turns
// (sm_90a); 8 also stores O by TMA from shared memory (tma_store).
void attention_ws(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal,
                  double scale, bool tma_store, cudaStream_t stream);

namespace {

// Loads ROWS rows (starting at row0, D elements each) of a (S, D) matrix into a swizzled shared tile; rows >= S
// are zero-filled so padded keys give finite scores (then masked) and padded values add exactly 0.
template <typename T, int D, int ROWS, int NTHREADS>
__device__ __forceinline__ void load_rows(T* tile, const T* __restrict__ g, int row0, int S, int tid) {
  constexpr int CPR = D / 8;
  static_assert((ROWS * CPR) % NTHREADS == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < ROWS * CPR / NTHREADS; ++it) {
    const int i = tid + it * NTHREADS;
    const int r = i / CPR, c = i % CPR;
    const int gr = row0 + r;
    const bool ok = gr < S;
    cp_async_16(tile + swz<CPR>(r, c), g + static_cast<int64_t>(ok ? gr : 0) * D + c * 8, ok);
  }
}

template <typename T, int D, int BM, int BN, int NWARPS, bool QREG>
__global__ void __launch_bounds__(NWARPS * 32)
    attention_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ o, int S, float scale_log2, bool causal) {
  constexpr int NTHREADS = NWARPS * 32;
  constexpr int MW = BM / (16 * NWARPS);  // 16-row MMA tiles per warp
  constexpr int CPR = D / 8;               // 16-byte chunks per row
  constexpr int KS = D / 16;               // k-steps of q k^T
  constexpr int NT8 = BN / 8;              // n8 tiles of a score tile
  constexpr int DT8 = D / 8;               // n8 tiles of the output
  static_assert(MW >= 1 && BM == MW * 16 * NWARPS, "BM must be a multiple of 16 * NWARPS");
  static_assert(BN % 16 == 0 && D % 16 == 0, "tile sizes");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;
  T* sV = sK + BN * D;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int m_block = gridDim.y - 1 - blockIdx.y;  // causal: the longest rows are dispatched first
  const int m0 = m_block * BM;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * S * D;
  const T* qb = q + base;
  const T* kb = k + base;
  const T* vb = v + base;
  T* ob = o + base;

  const int n_end = causal ? min(S, m0 + BM) : S;
  const int num_n = (n_end + BN - 1) / BN;

  load_rows<T, D, BM, NTHREADS>(sQ, qb, m0, S, tid);
  load_rows<T, D, BN, NTHREADS>(sK, kb, 0, S, tid);
  cp_async_commit();

  const int warp_row0 = warp * 16 * MW;
  uint32_t qf[QREG ? MW : 1][QREG ? KS : 1][4];
  float acc[MW][DT8][4];
  float row_max[MW][2], row_sum[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int j = 0; j < DT8; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.f;
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.f;
  }

  for (int nb = 0; nb < num_n; ++nb) {
    // K(nb) has landed; and every warp is past P V(nb-1), so the V buffer may be refilled.
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (QREG) {
      if (nb == 0) {  // q fragments stay in registers for the whole key loop
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
          for (int ks = 0; ks < KS; ++ks)
            ldmatrix_x4(qf[mi][ks][0], qf[mi][ks][1], qf[mi][ks][2], qf[mi][ks][3],
                        sQ + swz<CPR>(warp_row0 + mi * 16 + (lane & 15), ks * 2 + (lane >> 4)));
      }
    }
    load_rows<T, D, BN, NTHREADS>(sV, vb, nb * BN, S, tid);
    cp_async_commit();

    // ---- S = q K^T ----
    float s[MW][NT8][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
      for (int j = 0; j < NT8; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        if constexpr (QREG) {
          a[mi][0] = qf[mi][ks][0]; a[mi][1] = qf[mi][ks][1]; a[mi][2] = qf[mi][ks][2]; a[mi][3] = qf[mi][ks][3];
        } else {
          ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3],
                      sQ + swz<CPR>(warp_row0 + mi * 16 + (lane & 15), ks * 2 + (lane >> 4)));
        }
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b0, b1, b2, b3;  // b0,b1: keys np*16..+7; b2,b3: keys np*16+8..+15
        ldmatrix_x4(b0, b1, b2, b3, sK + swz<CPR>(np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          Mma<T>::run(s[mi][2 * np], a[mi], b0, b1);
          Mma<T>::run(s[mi][2 * np + 1], a[mi], b2, b3);
        }
      }
    }

    // ---- mask, online softmax (fp32, log2 domain) ----
    const bool need_mask = (nb + 1) * BN > S || (causal && (nb + 1) * BN - 1 > m0);
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_row0 + mi * 16 + (lane >> 2) + h * 8;
        float mx = row_max[mi][h];
#pragma unroll
        for (int j = 0; j < NT8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[mi][j][2 * h + e] * scale_log2;
            if (need_mask) {
              const int col = nb * BN + j * 8 + 2 * (lane & 3) + e;
              if (col >= S || (causal && col > row)) x = -INFINITY;
            }
            s[mi][j][2 * h + e] = x;
            mx = fmaxf(mx, x);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 threads of a quad share a row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_use = mx == -INFINITY ? 0.f : mx;  // a fully masked row so far: keep exp2 finite
        const float alpha = fast_exp2(row_max[mi][h] - m_use);
        row_max[mi][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NT8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(s[mi][j][2 * h + e] - m_use);
            s[mi][j][2 * h + e] = p;
            sum += p;
          }
        }
        row_sum[mi][h] = row_sum[mi][h] * alpha + sum;  // per-thread partial; the quad is summed at the end
#pragma unroll
        for (int j = 0; j < DT8; ++j) {
          acc[mi][j][2 * h] *= alpha;
          acc[mi][j][2 * h + 1] *= alpha;
        }
      }
    }

    // V(nb) has landed; and every warp is past q K(nb)^T, so the K buffer may be refilled with the next tile.
    cp_async_wait<0>();
    __syncthreads();
    if (nb + 1 < num_n) load_rows<T, D, BN, NTHREADS>(sK, kb, (nb + 1) * BN, S, tid);
    cp_async_commit();

    // ---- O += P V (P from registers: the score accumulators re-packed as A fragments) ----
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
      uint32_t a[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        a[mi][0] = Elem<T>::pack2(s[mi][2 * kt][0], s[mi][2 * kt][1]);
        a[mi][1] = Elem<T>::pack2(s[mi][2 * kt][2], s[mi][2 * kt][3]);
        a[mi][2] = Elem<T>::pack2(s[mi][2 * kt + 1][0], s[mi][2 * kt + 1][1]);
        a[mi][3] = Elem<T>::pack2(s[mi][2 * kt + 1][2], s[mi][2 * kt + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b0, b1, b2, b3;  // b0,b1: dims dp*16..+7; b2,b3: dims dp*16+8..+15
        ldmatrix_x4_trans(b0, b1, b2, b3, sV + swz<CPR>(kt * 16 + (lane & 15), dp * 2 + (lane >> 4)));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          Mma<T>::run(acc[mi][2 * dp], a[mi], b0, b1);
          Mma<T>::run(acc[mi][2 * dp + 1], a[mi], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits

  // ---- out = O / rowsum ----
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[mi][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = m0 + warp_row0 + mi * 16 + (lane >> 2) + h * 8;
      if (row < S) {
        T* orow = ob + static_cast<int64_t>(row) * D + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < DT8; ++j) {
          *reinterpret_cast<uint32_t*>(orow + j * 8) =
              Elem<T>::pack2(acc[mi][j][2 * h] * inv, acc[mi][j][2 * h + 1] * inv);
        }
      }
    }
  }
}

template <typename T, int D, int BM, int BN, int NWARPS, bool QREG>
void launch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o, bool causal, double scale,
            cudaStream_t stream) {
  const int64_t S = q.size(2);
  const int64_t BH = q.size(0) * q.size(1);
  const int64_t num_m = (S + BM - 1) / BM;
  TORCH_CHECK(num_m <= 65535, "modelab_levels::attention: S = ", S, " is too long for the grid");
  TORCH_CHECK(S * D * BH < (int64_t(1) << 62), "modelab_levels::attention: tensors too large");
  const int smem = (BM + 2 * BN) * D * static_cast<int>(sizeof(T));
  auto kernel = attention_fwd_kernel<T, D, BM, BN, NWARPS, QREG>;
  allow_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>(BH), static_cast<unsigned>(num_m));
  kernel<<<grid, NWARPS * 32, smem, stream>>>(
      reinterpret_cast<const T*>(q.const_data_ptr()), reinterpret_cast<const T*>(k.const_data_ptr()),
      reinterpret_cast<const T*>(v.const_data_ptr()), reinterpret_cast<T*>(o.mutable_data_ptr()),
      static_cast<int>(S), static_cast<float>(scale * 1.4426950408889634), causal);
  CUDA_CHECK_LAUNCH();
}

// Variants, timed against each other by benchmarks/cuda_levels_gpu.py (ptxas registers for bf16, D=128, sm_90):
//   0: BM=128, BN=64, 8 warps x 16 rows, q fragments in registers (201 regs, 1 block/SM)
//   2: BM=128, BN=64, 4 warps x 32 rows, q re-read from shared memory: each K/V fragment feeds two MMAs; built for
//      bf16 with D=128 only (the benchmark shape), to keep the build short
//   7: attention_ws.cu (sm_90a, D=128 or 64, bf16 and fp16): FlashAttention-3's design, a TMA producer warpgroup
//      and two consumer warpgroups ping-ponging their matrix products, registers moved from producer to consumers
//   8: 7 with O written through shared memory and stored by TMA (FlashAttention-3's epilogue)

template <typename T, int D>
void dispatch_variant(int64_t variant, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o,
                      bool causal, double scale, cudaStream_t stream) {
  constexpr bool kAll = std::is_same_v<T, __nv_bfloat16> && D == 128;
  switch (variant) {
    case 0: launch<T, D, 128, 64, 8, true>(q, k, v, o, causal, scale, stream); return;
    case 2:
      if constexpr (kAll) { launch<T, D, 128, 64, 4, false>(q, k, v, o, causal, scale, stream); return; }
      break;
    case 7: case 8: attention_ws(q, k, v, o, causal, scale, variant == 8, stream); return;
    default: break;
  }
  TORCH_CHECK(false, "modelab_levels::attention: variant ", variant, " is not built for this dtype / head dim ",
              "(0; 2: bfloat16 with D=128 only; 7, 8: sm_90a)");
}

}  // namespace

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                          int64_t variant) {
  TORCH_CHECK(q.is_cuda() && k.device() == q.device() && v.device() == q.device(),
              "modelab_levels::attention: q, k, v must be on one CUDA device");
  TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(),
              "modelab_levels::attention: q, k, v must be (B, H, S, D) of one shape");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "modelab_levels::attention: q, k, v must share a dtype");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(),
              "modelab_levels::attention: q, k, v must be contiguous");
  const int64_t D = q.size(3);
  TORCH_CHECK(D == 64 || D == 128, "modelab_levels::attention: head dim must be 64 or 128, got ", D);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor o = at::empty_like(q);
  if (q.numel() == 0) return o;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  if (q.scalar_type() == at::kBFloat16) {
    if (D == 64) dispatch_variant<__nv_bfloat16, 64>(variant, q, k, v, o, causal, scale, stream);
    else dispatch_variant<__nv_bfloat16, 128>(variant, q, k, v, o, causal, scale, stream);
  } else if (q.scalar_type() == at::kHalf) {
    if (D == 64) dispatch_variant<__half, 64>(variant, q, k, v, o, causal, scale, stream);
    else dispatch_variant<__half, 128>(variant, q, k, v, o, causal, scale, stream);
  } else {
    TORCH_CHECK(false, "modelab_levels::attention: dtype must be bfloat16 or float16, got ", q.scalar_type());
  }
  return o;
}

}  // namespace modelab_levels
