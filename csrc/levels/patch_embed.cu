// L5 patch embedding: a ViT's image -> tokens front as one implicit GEMM.
//   tokens[b, 0]     = cls + pos[0]
//   tokens[b, 1 + p] = sum_{c,ky,kx} images[b, c, py*P+ky, px*P+kx] * weight[e, c, ky, kx] + bias[e] + pos[1 + p]
// GEMM view: M = B * Np patches, N = E, K = C * P * P. The A tile is gathered straight from the image (im2col in the
// load: with P % 8 == 0 each 16-byte chunk is 8 contiguous pixels of one patch row), the B tile is weight rows
// (already K-contiguous). 3-stage cp.async pipeline, swizzled shared tiles, mma.sync m16n8k16 with fp32
// accumulation, bias + position embedding added in the epilogue and the result written straight into its token row.
#include "common.cuh"

namespace modelab_levels {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3;
constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = kWarpsM * kWarpsN * 32;
constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;  // 64 x 32 per warp
constexpr int kMT = kWM / 16, kNT = kWN / 8;             // 4 m16 tiles x 4 n8 tiles
constexpr int kCPR = kBK / 8;                            // 16-byte chunks per tile row
constexpr int kRowsPerPass = kThreads / kCPR;            // 32
constexpr int kAPasses = kBM / kRowsPerPass, kBPasses = kBN / kRowsPerPass;
constexpr int kStageElems = (kBM + kBN) * kBK;

struct PatchGeom {
  int B, C, Hi, Wi, P, Gw, Np, E, K, M;
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    patch_embed_kernel(const T* __restrict__ img, const T* __restrict__ weight, const T* __restrict__ bias,
                       const T* __restrict__ cls, const T* __restrict__ pos, T* __restrict__ out, PatchGeom g) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n_block = blockIdx.x, m_block = blockIdx.y;
  const int chunk = tid % kCPR;
  const int PP = g.P * g.P;

  // The class-token rows (one per image) belong to the first row of blocks.
  if (m_block == 0) {
    for (int i = tid; i < g.B * kBN; i += kThreads) {
      const int b = i / kBN, n = n_block * kBN + i % kBN;
      if (n < g.E) {
        out[static_cast<int64_t>(b) * (g.Np + 1) * g.E + n] =
            Elem<T>::from_float(Elem<T>::to_float(cls[n]) + Elem<T>::to_float(pos[n]));
      }
    }
  }

  // Per-thread A rows: the image offset of each row's patch origin (fixed over the K loop; the host checks that
  // every offset fits in 32 bits, which keeps the register count under the 2-blocks-per-SM budget).
  int a_base[kAPasses];
#pragma unroll
  for (int i = 0; i < kAPasses; ++i) {
    const int m = m_block * kBM + tid / kCPR + i * kRowsPerPass;
    const int mm = m < g.M ? m : 0;
    const int b = mm / g.Np, p = mm % g.Np;
    const int py = p / g.Gw, px = p % g.Gw;
    a_base[i] = m < g.M ? (b * g.C * g.Hi + py * g.P) * g.Wi + px * g.P : -1;  // -1: past the last patch
  }
  const int b_n0 = n_block * kBN + tid / kCPR;  // this thread's first weight row; the others follow every 32 rows

  auto load_stage = [&](int stage, int kt) {
    T* sA = smem + stage * kStageElems;
    T* sB = sA + kBM * kBK;
    const int k = kt * kBK + chunk * 8;
    const bool k_ok = k < g.K;
    const int kk = k_ok ? k : 0;
    const int c = kk / PP, rem = kk % PP;
    const int a_off = (c * g.Hi + rem / g.P) * g.Wi + rem % g.P;
#pragma unroll
    for (int i = 0; i < kAPasses; ++i) {
      const int r = tid / kCPR + i * kRowsPerPass;
      const bool ok = a_base[i] >= 0 && k_ok;
      cp_async_16(sA + swz<kCPR>(r, chunk), img + (ok ? a_base[i] + a_off : 0), ok);
    }
#pragma unroll
    for (int i = 0; i < kBPasses; ++i) {
      const int r = tid / kCPR + i * kRowsPerPass;
      const int n = b_n0 + i * kRowsPerPass;
      const bool ok = n < g.E && k_ok;
      cp_async_16(sB + swz<kCPR>(r, chunk), weight + (ok ? n * g.K + kk : 0), ok);
    }
  };

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  const int KT = (g.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }

  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (one group committed per iteration, maybe empty)
    __syncthreads();               // ... for every thread, and every warp is done with the stage refilled next
    if (kt + kStages - 1 < KT) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();

    const T* sA = smem + (kt % kStages) * kStageElems;
    const T* sB = sA + kBM * kBK;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int i = 0; i < kMT; ++i)
        ldmatrix_x4(a[i][0], a[i][1], a[i][2], a[i][3],
                    sA + swz<kCPR>(wm * kWM + i * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
      for (int jp = 0; jp < kNT / 2; ++jp) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(b0, b1, b2, b3,
                    sB + swz<kCPR>(wn * kWN + jp * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int i = 0; i < kMT; ++i) {
          Mma<T>::run(acc[i][2 * jp], a[i], b0, b1);
          Mma<T>::run(acc[i][2 * jp + 1], a[i], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: + bias + pos[1 + p], written into token row 1 + p of image b ----
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m_block * kBM + wm * kWM + i * 16 + (lane >> 2) + h * 8;
      if (m >= g.M) continue;
      const int b = m / g.Np, p = m % g.Np;
      T* orow = out + (static_cast<int64_t>(b) * (g.Np + 1) + 1 + p) * g.E;
      const T* prow = pos + static_cast<int64_t>(1 + p) * g.E;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const int n = n_block * kBN + wn * kWN + j * 8 + 2 * (lane & 3);
        if (n >= g.E) continue;  // E % 8 == 0, so n + 1 < E too
        const float v0 = acc[i][j][2 * h] + Elem<T>::to_float(bias[n]) + Elem<T>::to_float(prow[n]);
        const float v1 = acc[i][j][2 * h + 1] + Elem<T>::to_float(bias[n + 1]) + Elem<T>::to_float(prow[n + 1]);
        *reinterpret_cast<uint32_t*>(orow + n) = Elem<T>::pack2(v0, v1);
      }
    }
  }
}

template <typename T>
void launch(const at::Tensor& images, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& cls,
            const at::Tensor& pos, at::Tensor& out, const PatchGeom& g, cudaStream_t stream) {
  const int smem = kStages * kStageElems * static_cast<int>(sizeof(T));
  auto kernel = patch_embed_kernel<T>;
  allow_dynamic_smem(kernel, smem);
  const dim3 grid((g.E + kBN - 1) / kBN, (g.M + kBM - 1) / kBM);  // n fastest: neighbours share the image tile in L2
  kernel<<<grid, kThreads, smem, stream>>>(
      reinterpret_cast<const T*>(images.const_data_ptr()), reinterpret_cast<const T*>(weight.const_data_ptr()),
      reinterpret_cast<const T*>(bias.const_data_ptr()), reinterpret_cast<const T*>(cls.const_data_ptr()),
      reinterpret_cast<const T*>(pos.const_data_ptr()), reinterpret_cast<T*>(out.mutable_data_ptr()), g);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

at::Tensor patch_embed_cuda(const at::Tensor& images, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& cls, const at::Tensor& pos, int64_t patch) {
  TORCH_CHECK(images.is_cuda(), "modelab_levels::patch_embed: images must be on a CUDA device");
  for (const at::Tensor* t : {&weight, &bias, &cls, &pos}) {
    TORCH_CHECK(t->device() == images.device() && t->scalar_type() == images.scalar_type() && t->is_contiguous(),
                "modelab_levels::patch_embed: every input must be contiguous, on the images' device and dtype");
  }
  TORCH_CHECK(images.dim() == 4 && images.is_contiguous(), "modelab_levels::patch_embed: images must be contiguous (B, C, H, W)");
  PatchGeom g{};
  g.B = static_cast<int>(images.size(0));
  g.C = static_cast<int>(images.size(1));
  g.Hi = static_cast<int>(images.size(2));
  g.Wi = static_cast<int>(images.size(3));
  g.P = static_cast<int>(patch);
  g.E = static_cast<int>(weight.size(0));
  TORCH_CHECK(patch > 0 && patch % 8 == 0 && g.Hi % patch == 0 && g.Wi % patch == 0,
              "modelab_levels::patch_embed: patch must be a multiple of 8 dividing H and W");
  TORCH_CHECK(weight.dim() == 4 && weight.size(1) == g.C && weight.size(2) == patch && weight.size(3) == patch,
              "modelab_levels::patch_embed: weight must be (E, C, P, P)");
  TORCH_CHECK(g.E % 8 == 0, "modelab_levels::patch_embed: E must be a multiple of 8");
  g.Gw = g.Wi / g.P;
  g.Np = (g.Hi / g.P) * g.Gw;
  g.K = g.C * g.P * g.P;
  TORCH_CHECK(images.numel() < (int64_t(1) << 31) && weight.numel() < (int64_t(1) << 31),
              "modelab_levels::patch_embed: images and weight must have fewer than 2^31 elements (32-bit offsets)");
  g.M = g.B * g.Np;
  TORCH_CHECK((g.M + kBM - 1) / kBM <= 65535, "modelab_levels::patch_embed: too many patches for the grid");
  TORCH_CHECK(bias.numel() == g.E && cls.numel() == g.E && pos.numel() == static_cast<int64_t>(g.Np + 1) * g.E,
              "modelab_levels::patch_embed: bias, cls must have E elements and pos (1 + Np, E)");
  const c10::cuda::CUDAGuard guard(images.device());
  at::Tensor out = at::empty({g.B, g.Np + 1, g.E}, images.options());
  if (g.B == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(images.get_device()).stream();
  if (images.scalar_type() == at::kBFloat16) {
    launch<__nv_bfloat16>(images, weight, bias, cls, pos, out, g, stream);
  } else if (images.scalar_type() == at::kHalf) {
    launch<__half>(images, weight, bias, cls, pos, out, g, stream);
  } else {
    TORCH_CHECK(false, "modelab_levels::patch_embed: dtype must be bfloat16 or float16, got ", images.scalar_type());
  }
  return out;
}

}  // namespace modelab_levels
