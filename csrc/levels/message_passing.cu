// L5 message passing: out[d] = sum over edges e with dst[e] = d of w[e] * x[src[e]] ('mean': divided by the
// in-degree; isolated nodes get 0). x (N, F) float32 or bfloat16, src/dst int32 or int64, w float32 or x's dtype.
//
// Sorted edges (CSR, rowptr over edges sorted by dst): one warp per destination row and feature slice, no atomics.
// The warp splits into 32/G groups of G lanes; each lane owns VEC consecutive features (one 16-byte load), each group
// takes a different edge, and every lane keeps U edges in flight. The warp reads 32 (src, w) pairs at a time with one
// coalesced load and hands them out by shuffles; the groups' partial sums are combined by shuffles at the end, in
// fp32 registers, and written once.
// Unsorted edges, linked (the default): one pass links every edge into a list of its destination's in-edges — kSub
// lists per destination, an edge joining list (e mod kSub) by one atomicExch on that list's head — and writes its
// 16-byte record (src, next, w). Then a group of G lanes per destination row and feature slice (32/G rows per warp)
// walks the row's kSub lists together, loading each walk's next record before it uses the current one: no count, no
// scan, no placement. Edge and node ids in 32 bits.
// Unsorted edges, atomic: each group of lanes takes an edge and atomically adds w * x[src] into an fp32 buffer
// (16-byte vector atomics on sm_90), then one pass divides by the degree ('mean') and casts to x's dtype.
#include "common.cuh"

#include <algorithm>

namespace modelab_levels {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // edges in flight per lane

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&f)[VEC]) {
  if constexpr (VEC == 1) {
    f[0] = Elem<T>::to_float(p[0]);
  } else {
    static_assert(VEC * sizeof(T) == 16, "a vector is 16 bytes");
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    if constexpr (sizeof(T) == 4) {
      f[0] = __uint_as_float(raw.x); f[1] = __uint_as_float(raw.y);
      f[2] = __uint_as_float(raw.z); f[3] = __uint_as_float(raw.w);
    } else {
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const T lo = *reinterpret_cast<const T*>(&words[i]);
        const T hi = *(reinterpret_cast<const T*>(&words[i]) + 1);
        f[2 * i] = Elem<T>::to_float(lo);
        f[2 * i + 1] = Elem<T>::to_float(hi);
      }
    }
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const float (&f)[VEC], float scale) {
  if constexpr (VEC == 1) {
    p[0] = Elem<T>::from_float(f[0] * scale);
  } else if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0] * scale, f[1] * scale, f[2] * scale, f[3] * scale);
  } else {
    uint4 raw;
    raw.x = Elem<T>::pack2(f[0] * scale, f[1] * scale);
    raw.y = Elem<T>::pack2(f[2] * scale, f[3] * scale);
    raw.z = Elem<T>::pack2(f[4] * scale, f[5] * scale);
    raw.w = Elem<T>::pack2(f[6] * scale, f[7] * scale);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

template <typename T, typename W, typename I, int VEC>
__global__ void __launch_bounds__(kThreads)
    mp_csr_kernel(const T* __restrict__ x, const I* __restrict__ src, const W* __restrict__ w,
                  const I* __restrict__ rowptr, T* __restrict__ out, int64_t num_nodes, int F, int G, bool mean) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= num_nodes) return;  // warp-uniform
  const int groups = 32 / G;
  const int grp = lane / G;
  const int f0 = blockIdx.y * G * VEC + (lane % G) * VEC;
  const bool f_ok = f0 < F;  // F % VEC == 0: a vector is all in or all out
  const int64_t beg = static_cast<int64_t>(rowptr[row]), end = static_cast<int64_t>(rowptr[row + 1]);

  float acc[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) acc[v] = 0.f;

  for (int64_t base = beg; base < end; base += 32) {
    const int cnt = end - base < 32 ? static_cast<int>(end - base) : 32;
    int s_reg = 0;  // node ids fit in 32 bits (checked on the host): one shuffle instead of two
    float w_reg = 0.f;
    if (lane < cnt) {  // one coalesced read of up to 32 edges' (src, w)
      s_reg = static_cast<int>(src[base + lane]);
      w_reg = Elem<W>::to_float(w[base + lane]);
    }
    for (int j0 = 0; j0 < cnt; j0 += groups * kUnroll) {
      float xv[kUnroll][VEC];
      float wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * groups + grp;
        const int64_t s = __shfl_sync(0xffffffffu, s_reg, j & 31);
        const float ww = __shfl_sync(0xffffffffu, w_reg, j & 31);
        const bool ok = j < cnt;
        wv[u] = ok ? ww : 0.f;
        if (ok && f_ok) {
          load_vec<T, VEC>(x + s * F + f0, xv[u]);
        } else {
#pragma unroll
          for (int v = 0; v < VEC; ++v) xv[u][v] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = fmaf(wv[u], xv[u][v], acc[v]);
    }
  }
  for (int off = G; off < 32; off <<= 1) {  // combine the groups' partial sums
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] += __shfl_xor_sync(0xffffffffu, acc[v], off);
  }
  if (grp == 0 && f_ok) {
    const int64_t deg = end - beg;
    const float scale = (mean && deg > 0) ? 1.f / static_cast<float>(deg) : 1.f;
    store_vec<T, VEC>(out + row * F + f0, acc, scale);
  }
}

constexpr int kSub = 4;  // lists per destination: walks a warp keeps in flight

struct alignas(16) EdgeRecord {  // 16 bytes, aligned: one 16-byte load per step of a walk
  int src;
  int next;  // -1 ends the list
  float w;
  int pad;
};

template <typename W, typename I>
__global__ void __launch_bounds__(kThreads)
    mp_link_kernel(const I* __restrict__ src, const I* __restrict__ dst, const W* __restrict__ w,
                   int* __restrict__ head, EdgeRecord* __restrict__ records, int64_t num_edges) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= num_edges) return;
  const int64_t d = static_cast<int64_t>(dst[e]);
  const int old = atomicExch(head + d * kSub + (e % kSub), static_cast<int>(e));
  records[e] = EdgeRecord{static_cast<int>(src[e]), old, Elem<W>::to_float(w[e]), 0};
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    mp_linked_kernel(const T* __restrict__ x, const EdgeRecord* __restrict__ records, const int* __restrict__ head,
                     T* __restrict__ out, int64_t num_nodes, int F, int G, bool mean) {
  const int lane = threadIdx.x & 31;
  const int groups = 32 / G;  // rows per warp: each group of G lanes owns one row and walks all its lists
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5)) * groups + lane / G;
  if (row >= num_nodes) return;  // group-uniform; no warp-wide step follows
  const int f0 = blockIdx.y * G * VEC + (lane % G) * VEC;
  const bool f_ok = f0 < F;
  int e[kSub];
  EdgeRecord rec[kSub];  // read only while its walk is on (e >= 0)
#pragma unroll
  for (int c = 0; c < kSub; ++c) {
    e[c] = head[row * kSub + c];
    if (e[c] >= 0) rec[c] = records[e[c]];
  }
  float acc[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
  int deg = 0;
  while (true) {
    bool any = false;
    float xv[kSub][VEC];
    float wv[kSub];
#pragma unroll
    for (int c = 0; c < kSub; ++c) {  // this step's source rows, every walk at once
      wv[c] = 0.f;
      if (e[c] >= 0) {
        any = true;
        wv[c] = rec[c].w;
        if (f_ok) load_vec<T, VEC>(x + static_cast<int64_t>(rec[c].src) * F + f0, xv[c]);
      }
      if (e[c] < 0 || !f_ok) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) xv[c][v] = 0.f;
      }
    }
    if (!any) break;
#pragma unroll
    for (int c = 0; c < kSub; ++c) {  // the next records, before this step's sums need the rows
      if (e[c] >= 0) {
        ++deg;
        e[c] = rec[c].next;
        if (e[c] >= 0) rec[c] = records[e[c]];
      }
    }
#pragma unroll
    for (int c = 0; c < kSub; ++c)
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] = fmaf(wv[c], xv[c][v], acc[v]);
  }
  if (f_ok) {
    const float scale = (mean && deg > 0) ? 1.f / static_cast<float>(deg) : 1.f;
    store_vec<T, VEC>(out + row * F + f0, acc, scale);
  }
}

template <int VEC>
__device__ __forceinline__ void scalar_atomics(float* target, float ww, const float (&xv)[VEC]) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) atomicAdd(target + v, ww * xv[v]);
}

template <typename T, typename W, typename I, int VEC>
__global__ void __launch_bounds__(kThreads)
    mp_coo_kernel(const T* __restrict__ x, const I* __restrict__ src, const I* __restrict__ dst,
                  const W* __restrict__ w, float* __restrict__ acc, int* __restrict__ deg, int64_t num_edges, int F,
                  int G) {
  const int lane = threadIdx.x & 31;
  const int groups = 32 / G;
  const int f0 = blockIdx.y * G * VEC + (lane % G) * VEC;
  const bool f_ok = f0 < F;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5)) * groups + lane / G;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kThreads / 32) * groups;
  for (int64_t e = first; e < num_edges; e += stride) {
    const int64_t s = static_cast<int64_t>(src[e]);
    const int64_t d = static_cast<int64_t>(dst[e]);
    const float ww = Elem<W>::to_float(w[e]);
    if (deg != nullptr && blockIdx.y == 0 && lane % G == 0) atomicAdd(deg + d, 1);
    if (!f_ok) continue;
    float xv[VEC];
    load_vec<T, VEC>(x + s * F + f0, xv);
    float* target = acc + d * F + f0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (VEC % 4 == 0) {  // one 16-byte atomic instead of four
#pragma unroll
      for (int q = 0; q < VEC / 4; ++q)
        atomicAdd(reinterpret_cast<float4*>(target + 4 * q),
                  make_float4(ww * xv[4 * q], ww * xv[4 * q + 1], ww * xv[4 * q + 2], ww * xv[4 * q + 3]));
    } else {
      scalar_atomics<VEC>(target, ww, xv);
    }
#else
    scalar_atomics<VEC>(target, ww, xv);
#endif
  }
}

// out[i] = acc[i] / max(deg, 1) (mean) or acc[i] (sum), cast to T; out may alias acc when T is float.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    mp_finish_kernel(const float* acc, const int* __restrict__ deg, T* out, int64_t numel, int F) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < numel; i += stride) {
    float v = acc[i];
    if (deg != nullptr) {
      const int d = deg[i / F];
      v = d > 0 ? v / static_cast<float>(d) : 0.f;
    }
    out[i] = Elem<T>::from_float(v);
  }
}

// Lanes per feature slice: enough 16-byte vectors to cover F, capped at a warp (more F: grid.y slices).
int lanes_for(int F, int vec) {
  const int need = (F + vec - 1) / vec;
  return need <= 8 ? 8 : (need <= 16 ? 16 : 32);
}

int sm_count(const at::Tensor& t) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, t.get_device()));
  return sms;
}

template <typename T, typename W, typename I, int VEC>
void run_csr(const at::Tensor& x, const at::Tensor& src, const at::Tensor& w, const at::Tensor& rowptr,
             at::Tensor& out, bool mean, cudaStream_t stream) {
  const int64_t N = x.size(0);
  const int F = static_cast<int>(x.size(1));
  const int G = VEC == 1 ? 32 : lanes_for(F, VEC);
  const int64_t row_blocks = (N + kThreads / 32 - 1) / (kThreads / 32);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>((F + G * VEC - 1) / (G * VEC)));
  mp_csr_kernel<T, W, I, VEC><<<grid, kThreads, 0, stream>>>(
      reinterpret_cast<const T*>(x.const_data_ptr()), src.const_data_ptr<I>(),
      reinterpret_cast<const W*>(w.const_data_ptr()), rowptr.const_data_ptr<I>(),
      reinterpret_cast<T*>(out.mutable_data_ptr()), N, F, G, mean);
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename W, typename I, int VEC>
void run_coo(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst, const at::Tensor& w, at::Tensor& acc,
             at::Tensor* deg, cudaStream_t stream) {
  const int64_t E = src.numel();
  const int F = static_cast<int>(x.size(1));
  const int G = VEC == 1 ? 32 : lanes_for(F, VEC);
  const int64_t edges_per_block = static_cast<int64_t>(kThreads / 32) * (32 / G);
  const int64_t blocks = std::min<int64_t>((E + edges_per_block - 1) / edges_per_block, int64_t(sm_count(x)) * 16);
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(blocks, 1)),
                  static_cast<unsigned>((F + G * VEC - 1) / (G * VEC)));
  mp_coo_kernel<T, W, I, VEC><<<grid, kThreads, 0, stream>>>(
      reinterpret_cast<const T*>(x.const_data_ptr()), src.const_data_ptr<I>(), dst.const_data_ptr<I>(),
      reinterpret_cast<const W*>(w.const_data_ptr()), acc.mutable_data_ptr<float>(),
      deg ? deg->mutable_data_ptr<int>() : nullptr, E, F, G);
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename W, typename I, int VEC>
void run_linked(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst, const at::Tensor& w,
                at::Tensor& out, bool mean, cudaStream_t stream) {
  const int64_t N = out.size(0);
  const int64_t E = src.numel();
  const int F = static_cast<int>(x.size(1));
  at::Tensor head = at::full({N * kSub}, -1, x.options().dtype(at::kInt));
  at::Tensor records = at::empty({E * static_cast<int64_t>(sizeof(EdgeRecord) / sizeof(int))},
                                 x.options().dtype(at::kInt));
  auto* recs = reinterpret_cast<EdgeRecord*>(records.mutable_data_ptr<int>());
  if (E > 0) {
    mp_link_kernel<W, I><<<static_cast<unsigned>((E + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        src.const_data_ptr<I>(), dst.const_data_ptr<I>(), reinterpret_cast<const W*>(w.const_data_ptr()),
        head.mutable_data_ptr<int>(), recs, E);
    CUDA_CHECK_LAUNCH();
  }
  const int G = VEC == 1 ? 32 : lanes_for(F, VEC);
  const int64_t rows_per_block = static_cast<int64_t>(kThreads / 32) * (32 / G);
  const int64_t row_blocks = (N + rows_per_block - 1) / rows_per_block;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>((F + G * VEC - 1) / (G * VEC)));
  mp_linked_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(
      reinterpret_cast<const T*>(x.const_data_ptr()), recs, head.const_data_ptr<int>(),
      reinterpret_cast<T*>(out.mutable_data_ptr()), N, F, G, mean);
  CUDA_CHECK_LAUNCH();
}

// Calls fn.template call<T, W, I, VEC>() for the tensors' types (VEC: 16-byte vectors when F and the
// pointers allow, else one element per lane).
template <typename Fn>
void dispatch_types(const at::Tensor& x, const at::Tensor& w, const at::Tensor& src, bool vec_ok, const Fn& fn) {
  const bool idx64 = src.scalar_type() == at::kLong;
  TORCH_CHECK(idx64 || src.scalar_type() == at::kInt, "modelab_levels::message_passing: indices must be int32 or int64");
  auto with_index = [&](auto t_tag, auto w_tag) {
    using T = typename decltype(t_tag)::type;
    using W = typename decltype(w_tag)::type;
    constexpr int V = 16 / sizeof(T);
    if (idx64) {
      if (vec_ok) fn.template call<T, W, int64_t, V>(); else fn.template call<T, W, int64_t, 1>();
    } else {
      if (vec_ok) fn.template call<T, W, int32_t, V>(); else fn.template call<T, W, int32_t, 1>();
    }
  };
  struct F32 { using type = float; };
  struct BF16 { using type = __nv_bfloat16; };
  if (x.scalar_type() == at::kFloat) {
    TORCH_CHECK(w.scalar_type() == at::kFloat, "modelab_levels::message_passing: w must be float32 for float32 x");
    with_index(F32{}, F32{});
  } else if (x.scalar_type() == at::kBFloat16) {
    if (w.scalar_type() == at::kFloat) with_index(BF16{}, F32{});
    else if (w.scalar_type() == at::kBFloat16) with_index(BF16{}, BF16{});
    else TORCH_CHECK(false, "modelab_levels::message_passing: w must be float32 or bfloat16");
  } else {
    TORCH_CHECK(false, "modelab_levels::message_passing: x must be float32 or bfloat16, got ", x.scalar_type());
  }
}

struct CsrCall {
  const at::Tensor &x, &src, &w, &rowptr;
  at::Tensor& out;
  bool mean;
  cudaStream_t stream;
  template <typename T, typename W, typename I, int V>
  void call() const { run_csr<T, W, I, V>(x, src, w, rowptr, out, mean, stream); }
};

struct LinkedCall {
  const at::Tensor &x, &src, &dst, &w;
  at::Tensor& out;
  bool mean;
  cudaStream_t stream;
  template <typename T, typename W, typename I, int V>
  void call() const { run_linked<T, W, I, V>(x, src, dst, w, out, mean, stream); }
};

struct CooCall {
  const at::Tensor &x, &src, &dst, &w;
  at::Tensor& acc;
  at::Tensor* deg;
  cudaStream_t stream;
  template <typename T, typename W, typename I, int V>
  void call() const { run_coo<T, W, I, V>(x, src, dst, w, acc, deg, stream); }
};

bool vectorizable(const at::Tensor& x) {
  const int64_t vec = 16 / x.element_size();
  return x.size(1) % vec == 0 && reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0;
}

void check_common(const at::Tensor& x, const at::Tensor& src, const at::Tensor& w) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(),
              "modelab_levels::message_passing: x must be a contiguous (N, F) CUDA tensor");
  TORCH_CHECK(src.device() == x.device() && w.device() == x.device() && src.is_contiguous() && w.is_contiguous(),
              "modelab_levels::message_passing: src and w must be contiguous and on x's device");
  TORCH_CHECK(src.dim() == 1 && w.dim() == 1 && w.numel() == src.numel(),
              "modelab_levels::message_passing: src and w must be 1-D with one entry per edge");
  TORCH_CHECK((x.size(1) + 31) / 32 <= 65535, "modelab_levels::message_passing: F too large");
  TORCH_CHECK(x.size(0) < (int64_t(1) << 31), "modelab_levels::message_passing: at most 2^31 - 1 source nodes");
}

void check_dst(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK(dst.device() == x.device() && dst.is_contiguous() && dst.sizes() == src.sizes() &&
                  dst.scalar_type() == src.scalar_type(),
              "modelab_levels::message_passing: dst must match src (shape, dtype, device)");
}

}  // namespace

at::Tensor message_passing_csr_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& w,
                                    const at::Tensor& rowptr, int64_t num_nodes, bool mean) {
  check_common(x, src, w);
  TORCH_CHECK(rowptr.device() == x.device() && rowptr.is_contiguous() && rowptr.dim() == 1 &&
                  rowptr.numel() == num_nodes + 1 && rowptr.scalar_type() == src.scalar_type(),
              "modelab_levels::message_passing: rowptr must be (num_nodes + 1,) of src's dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({num_nodes, x.size(1)}, x.options());
  if (out.numel() == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const CsrCall call{x, src, w, rowptr, out, mean, stream};
  dispatch_types(x, w, src, vectorizable(x) && vectorizable(out), call);
  return out;
}

at::Tensor message_passing_linked_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst,
                                       const at::Tensor& w, int64_t num_nodes, bool mean) {
  check_common(x, src, w);
  check_dst(x, src, dst);
  TORCH_CHECK(src.numel() < (int64_t(1) << 31) && num_nodes < (int64_t(1) << 31) / kSub,
              "modelab_levels::message_passing: linked lists need E < 2^31 and num_nodes < 2^29");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({num_nodes, x.size(1)}, x.options());
  if (out.numel() == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const LinkedCall call{x, src, dst, w, out, mean, stream};
  dispatch_types(x, w, src, vectorizable(x) && vectorizable(out), call);
  return out;
}

at::Tensor message_passing_coo_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst,
                                    const at::Tensor& w, int64_t num_nodes, bool mean) {
  check_common(x, src, w);
  check_dst(x, src, dst);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t F = x.size(1);
  at::Tensor out = at::empty({num_nodes, F}, x.options());
  if (out.numel() == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  const bool direct = x.scalar_type() == at::kFloat;  // fp32: accumulate straight into the output
  at::Tensor acc = direct ? out.zero_() : at::zeros({num_nodes, F}, x.options().dtype(at::kFloat));
  at::Tensor deg = mean ? at::zeros({num_nodes}, x.options().dtype(at::kInt)) : at::Tensor();
  at::Tensor* deg_ptr = mean ? &deg : nullptr;
  if (src.numel() > 0) {
    const CooCall call{x, src, dst, w, acc, deg_ptr, stream};
    dispatch_types(x, w, src, vectorizable(x) && vectorizable(acc), call);
  }
  if (!direct || mean) {
    const int64_t numel = out.numel();
    const int blocks = static_cast<int>(std::min<int64_t>((numel + kThreads - 1) / kThreads, int64_t(sm_count(x)) * 8));
    const int* d = mean ? deg.const_data_ptr<int>() : nullptr;
    if (x.scalar_type() == at::kFloat) {
      mp_finish_kernel<float><<<blocks, kThreads, 0, stream>>>(acc.const_data_ptr<float>(), d,
                                                               out.mutable_data_ptr<float>(), numel, static_cast<int>(F));
      CUDA_CHECK_LAUNCH();
    } else {
      mp_finish_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          acc.const_data_ptr<float>(), d, reinterpret_cast<__nv_bfloat16*>(out.mutable_data_ptr()), numel,
          static_cast<int>(F));
      CUDA_CHECK_LAUNCH();
    }
  }
  return out;
}

}  // namespace modelab_levels
