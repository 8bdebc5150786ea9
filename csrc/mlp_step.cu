// The `cuda` mode's kernels: the whole house-price MLP training step (forward, MSE, backward, Adam) in ONE cooperative
// launch, and the forward (inference) in one ordinary launch (mlp_forward_kernel, below). Arguments: mlp_step.h.
//
// Work split (kBlocks = 64 blocks, U = 4): block c owns units J = [c*U, c*U + U) of layer 2 (rows J of W2, b2[J],
// w3[J]) and the same unit numbers of layer 1 (rows J of W1, b1[J], columns J of W2 for the backward pass).
//   Phase A  every block recomputes h1 = relu(x W1ᵀ + b1) for a chunk of rows in shared memory (F multiply-adds per
//            element: cheaper than sharing it), then z2[:, J] = h1 W2[J]ᵀ + b2[J] and its share of the output,
//            ypart[c] = relu(z2[:, J]) · w3[J].                                                       grid sync
//   Phase B  every block sums the 64 shares into y (same order everywhere, so all blocks agree), dy = 2 (y - t) / B;
//            block 0 writes the loss. Own columns: dz2[:, J] (ReLU mask), the gradients of W2[J], b2[J], w3[J] (and
//            b3 in block 0) — all local, so Adam updates them right away.                             grid sync
//   Phase C  block c computes dh1[:, J] = dz2 · W2[:, J] (the OLD columns, copied to shared memory before any
//            update), the ReLU mask (h1 recomputed bit-identically), the gradients of W1[J] and b1[J], and Adam.
//            Block 0 then advances Adam's step counter (every block read it before the first barrier).
// No atomics: every sum has a fixed order, so a step is deterministic run to run. No serial chain per thread: F = 5 is
// a template constant (W1's row in registers) and row sums are warp shuffles, where a run-time feature count and one
// thread summing 64 rows would cost most of the step's device time.

#include <cooperative_groups.h>

#include "mlp_step.h"

namespace cg = cooperative_groups;

namespace modelab_mlp {
namespace {

constexpr int H = kHidden;
constexpr int U = kHidden / kBlocks;
constexpr int RC = kRowChunk;
constexpr int PAD = H + 4;  // row stride of shared tiles: 16-byte rows that start in different banks
constexpr int WARPS = kThreads / 32;
static_assert(H == kThreads, "one thread per hidden unit");
static_assert(RC * U == kThreads, "one thread per (row, unit) pair of a chunk");
static_assert(H % kBlocks == 0 && U == 4, "the float4 paths assume four units per block");
static_assert(U * kMaxFeatures + U <= kThreads, "phase C gives one thread to each W1 and b1 element of a block");
static_assert(WARPS * U * (kMaxFeatures + 1) <= RC * PAD, "phase C's reduction scratch fits in the tile");

// kF > 0: the number of input features, known at compile time (the house-price MLP's 5), so the per-thread W1 row
// and the feature loops live in registers; kF == 0: any F ≤ kMaxFeatures, read from the arguments.
template <int kF>
__device__ __forceinline__ int features(const MlpArgs& a) {
  return kF > 0 ? kF : a.features;
}

struct Shared {
  float* w1;    // [H, F]      all of W1
  float* b1;    // [H]
  float* w2r;   // [U, PAD]    rows J of W2
  float* w2c;   // [U, PAD]    columns J of W2, transposed (w2c[u][j] = W2[j][c*U + u]), copied before any update
  float* tile;  // [RC, PAD]   h1 of a chunk (phases A, B) or dz2 of a chunk (phase C); then reduction scratch
  float* xs;    // [RC, F]     x of a chunk
  float* dy;    // [RC]        d loss / d y of a chunk
  float* dz;    // [RC, U]     dz2 of own columns (phase B)
  float* red;   // [kThreads]  reduction scratch
};

__host__ __device__ constexpr size_t shared_floats(int features) {
  // Every part is a multiple of 4 floats, so every part starts 16-byte aligned.
  return static_cast<size_t>(H) * features + H + 2 * U * PAD + RC * PAD + RC * kMaxFeatures + RC + RC * U + kThreads;
}

__device__ Shared carve(float* base, int features) {
  Shared s;
  float* p = base;
  s.w1 = p;   p += H * features;
  s.b1 = p;   p += H;
  s.w2r = p;  p += U * PAD;
  s.w2c = p;  p += U * PAD;
  s.tile = p; p += RC * PAD;
  s.xs = p;   p += RC * kMaxFeatures;
  s.dy = p;   p += RC;
  s.dz = p;   p += RC * U;
  s.red = p;
  return s;
}

// relu(b + Σ_f x[f] w[f]). The one definition used everywhere, so recomputed values are bit-identical.
template <int kF>
__device__ __forceinline__ float h1_value(const float* x, const float* w, float b, int F) {
  float acc = b;
  if constexpr (kF > 0) {
#pragma unroll
    for (int f = 0; f < kF; ++f) acc = fmaf(x[f], w[f], acc);
  } else {
    for (int f = 0; f < F; ++f) acc = fmaf(x[f], w[f], acc);
  }
  return fmaxf(acc, 0.f);
}

// Σ_k a[k] b[k] over H for two 16-byte aligned shared rows; four accumulators for instruction-level parallelism.
__device__ __forceinline__ float dot_hidden(const float* a, const float* b) {
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll 8
  for (int i = 0; i < H / 4; ++i) {
    const float4 p = a4[i];
    const float4 q = b4[i];
    s0 = fmaf(p.x, q.x, s0);
    s1 = fmaf(p.y, q.y, s1);
    s2 = fmaf(p.z, q.z, s2);
    s3 = fmaf(p.w, q.w, s3);
  }
  return (s0 + s1) + (s2 + s3);
}

// Sum over the lanes of a warp that hold the same unit u (lanes u, u + U, u + 2U, …).
__device__ __forceinline__ float sum_over_rows_in_warp(float v) {
#pragma unroll
  for (int off = U; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Adam's hyper-parameters and this step's bias corrections (computed on the device from the step counter, in fp32,
// as Adam(capturable=True) does).
struct AdamStep {
  float lr, beta1, beta2, eps, bias_correction1, bias_correction2_sqrt;
};

__device__ __forceinline__ AdamStep adam_step(const MlpArgs& a, float step) {
  return AdamStep{a.lr, a.beta1, a.beta2, a.eps, 1.f - powf(a.beta1, step), sqrtf(1.f - powf(a.beta2, step))};
}

// torch.optim.Adam's update (foreach path): m ← lerp(m, g, 1-β1); v ← β2 v + (1-β2) g²;
// p ← p - lr / bc1 · m / (sqrt(v) / sqrt(bc2) + eps).
__device__ __forceinline__ void adam(float* p, float* m, float* v, float g, const AdamStep& h) {
  const float mm = *m + (1.f - h.beta1) * (g - *m);
  const float vv = *v * h.beta2 + (1.f - h.beta2) * g * g;
  *m = mm;
  *v = vv;
  const float denom = sqrtf(vv) / h.bias_correction2_sqrt + h.eps;
  *p = *p + (-h.lr / h.bias_correction1) * (mm / denom);
}

template <int kF>
__device__ void load_x_chunk(const MlpArgs& a, const Shared& s, int r0, int rows) {
  const int F = features<kF>(a);
  const float* src = a.x + static_cast<size_t>(r0) * F;
  for (int i = threadIdx.x; i < rows * F; i += kThreads) s.xs[i] = src[i];
}

// tile[r][k] = h1[r0 + r][k]; thread k computes unit k for every row of the chunk, its W1 row in registers when F
// is known at compile time (rows unrolled by 4: independent chains in flight).
template <int kF>
__device__ void h1_chunk(const MlpArgs& a, const Shared& s, int rows) {
  const int k = threadIdx.x, F = features<kF>(a);
  const float b = s.b1[k];
  if constexpr (kF > 0) {
    float w[kF];
#pragma unroll
    for (int f = 0; f < kF; ++f) w[f] = s.w1[k * kF + f];
#pragma unroll 4
    for (int r = 0; r < rows; ++r) s.tile[r * PAD + k] = h1_value<kF>(s.xs + r * kF, w, b, kF);
  } else {
    const float* w = s.w1 + k * F;
    for (int r = 0; r < rows; ++r) s.tile[r * PAD + k] = h1_value<0>(s.xs + r * F, w, b, F);
  }
}

template <int kF>
__device__ void load_weights(const MlpArgs& a, const Shared& s, int c, bool columns) {
  const int tid = threadIdx.x, F = features<kF>(a);
  if constexpr (kF > 0) {
#pragma unroll
    for (int i = 0; i < kF; ++i) s.w1[tid + i * kThreads] = a.w1[tid + i * kThreads];
  } else {
    for (int i = tid; i < H * F; i += kThreads) s.w1[i] = a.w1[i];
  }
  s.b1[tid] = a.b1[tid];
#pragma unroll
  for (int i = 0; i < U; ++i) {  // U rows of W2 x H columns, H == kThreads: one element per thread per row
    s.w2r[i * PAD + tid] = a.w2[static_cast<size_t>(c * U + i) * H + tid];
  }
  if (columns) {
    const int j = tid;  // one W2 row per thread: its U = 4 columns of this block are one 16-byte load
    const float4 q = *reinterpret_cast<const float4*>(a.w2 + static_cast<size_t>(j) * H + c * U);
    s.w2c[0 * PAD + j] = q.x;
    s.w2c[1 * PAD + j] = q.y;
    s.w2c[2 * PAD + j] = q.z;
    s.w2c[3 * PAD + j] = q.w;
  }
  __syncthreads();
}

// Phase A: z2 of own columns and ypart[c][row] = Σ_{j in J} relu(z2[row][j]) w3[j].
template <int kF>
__device__ void forward_shares(const MlpArgs& a, const Shared& s, int c) {
  const int tid = threadIdx.x, r = tid / U, u = tid % U, j = c * U + u;
  const float b2 = a.b2[j], w3 = a.w3[j];
  for (int r0 = 0; r0 < a.batch; r0 += RC) {
    const int rows = min(RC, a.batch - r0);
    load_x_chunk<kF>(a, s, r0, rows);
    __syncthreads();
    h1_chunk<kF>(a, s, rows);
    __syncthreads();
    float share = 0.f;
    if (r < rows) {
      const float z = b2 + dot_hidden(s.tile + r * PAD, s.w2r + u * PAD);
      a.z2[static_cast<size_t>(r0 + r) * H + j] = z;
      share = fmaxf(z, 0.f) * w3;
    }
    // The U units of one row sit in U consecutive lanes.
#pragma unroll
    for (int off = U / 2; off > 0; off >>= 1) share += __shfl_down_sync(0xffffffffu, share, off, U);
    if (u == 0 && r < rows) a.ypart[static_cast<size_t>(c) * a.batch + r0 + r] = share;
    __syncthreads();  // the next chunk overwrites xs and tile
  }
}

// y[row] = b3 + Σ_c ypart[c][row], in block order (every caller gets the same bits).
__device__ __forceinline__ float output_of(const MlpArgs& a, float b3, int row) {
  float y = b3;
#pragma unroll  // 64 independent loads in flight
  for (int c = 0; c < kBlocks; ++c) y += a.ypart[static_cast<size_t>(c) * a.batch + row];
  return y;
}

// The forward pass needs no grid-wide barrier: block (rb, g) takes kInferRows rows and the IU units of group g;
// h1 of its rows is recomputed per block (F multiply-adds per element); each unit's 256-long dot product is split
// over SLICES threads — slice sl takes float4 columns sl, sl + SLICES, … so that a warp's shared-memory and W2 loads
// are consecutive 16-byte words (no bank conflicts, coalesced) — and summed with shuffles; the group's share of each
// output goes to ypart[g], and the last group of a row block to finish (threadfence-reduction pattern, a
// self-resetting counter) adds the shares in group order, so the result does not depend on which block was last.
constexpr int IU = H / kInferGroups;     // 32 units per block
constexpr int SLICES = kThreads / IU;    // 8 threads per unit
constexpr int Q = H / 4 / SLICES;        // float4 columns per thread
static_assert(SLICES * IU == kThreads && SLICES <= 32 && 32 % SLICES == 0 && Q * SLICES * 4 == H, "forward tiling");

template <int kF>
__global__ void __launch_bounds__(kThreads) mlp_forward_kernel(MlpArgs a) {
  __shared__ __align__(16) float h1s[kInferRows][H];
  __shared__ float xs[kInferRows * kMaxFeatures];
  __shared__ float warp_sums[WARPS][kInferRows];
  __shared__ bool last;
  const int rb = blockIdx.x, g = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int F = features<kF>(a), r0 = rb * kInferRows, rows = min(kInferRows, a.batch - r0);
  for (int i = tid; i < rows * F; i += kThreads) xs[i] = a.x[static_cast<size_t>(r0) * F + i];
  {
    const int k = tid;
    const float b = a.b1[k];
    if constexpr (kF > 0) {
      float w[kF];
#pragma unroll
      for (int f = 0; f < kF; ++f) w[f] = a.w1[k * kF + f];
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kInferRows; ++r) h1s[r][k] = r < rows ? h1_value<kF>(xs + r * kF, w, b, kF) : 0.f;
    } else {
      __syncthreads();
      for (int r = 0; r < kInferRows; ++r) h1s[r][k] = r < rows ? h1_value<0>(xs + r * F, a.w1 + k * F, b, F) : 0.f;
    }
  }
  __syncthreads();
  const int sl = tid % SLICES, j = g * IU + tid / SLICES;
  const float4* wrow = reinterpret_cast<const float4*>(a.w2 + static_cast<size_t>(j) * H);
  float4 w[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) w[i] = __ldg(wrow + sl + i * SLICES);
  const float b2 = a.b2[j], w3 = a.w3[j];
#pragma unroll
  for (int r = 0; r < kInferRows; ++r) {
    const float4* hrow = reinterpret_cast<const float4*>(h1s[r]);
    float z = 0.f;
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      const float4 h = hrow[sl + i * SLICES];
      z = fmaf(h.x, w[i].x, fmaf(h.y, w[i].y, fmaf(h.z, w[i].z, fmaf(h.w, w[i].w, z))));
    }
#pragma unroll
    for (int off = SLICES / 2; off > 0; off >>= 1) z += __shfl_xor_sync(0xffffffffu, z, off);  // the unit's slices
    float v = sl == 0 ? fmaxf(z + b2, 0.f) * w3 : 0.f;
#pragma unroll
    for (int off = 16; off >= SLICES; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);  // the warp's units
    if (lane == 0) warp_sums[warp][r] = v;
  }
  __syncthreads();
  if (tid < rows) {
    float share = 0.f;
#pragma unroll
    for (int ww = 0; ww < WARPS; ++ww) share += warp_sums[ww][tid];
    a.ypart[static_cast<size_t>(g) * a.batch + r0 + tid] = share;
    __threadfence();  // the share is visible device-wide before this block counts itself done
  }
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.done + rb, 1u) == kInferGroups - 1;
  __syncthreads();
  if (last) {
    if (tid < rows) {
      float y = a.b3[0];
#pragma unroll
      for (int gg = 0; gg < kInferGroups; ++gg) y += __ldcg(a.ypart + static_cast<size_t>(gg) * a.batch + r0 + tid);
      a.y[r0 + tid] = y;
    }
    if (tid == 0) a.done[rb] = 0;  // ready for the next call (the next launch on the stream starts after this one)
  }
}

template <int kF>
__global__ void __launch_bounds__(kThreads) mlp_train_kernel(MlpArgs a) {
  extern __shared__ __align__(16) float smem[];
  const int F = features<kF>(a);
  const Shared s = carve(smem, F);
  cg::grid_group grid = cg::this_grid();
  const int c = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r = tid / U, u = tid % U, j = c * U + u;
  const int B = a.batch;
  const float b3 = a.b3[0];  // read now: block 0 updates b3 in phase B while others still read it
  const float step = *a.step + 1.f;  // every block reads it here; block 0 writes it back after the last barrier
  const AdamStep hp = adam_step(a, step);
  const float w3j = a.w3[j];
  const float two_over_b = 2.f / static_cast<float>(B);  // d mean((y - t)²) / dy = 2 (y - t) / B
  const size_t off_b1 = static_cast<size_t>(H) * F, off_w2 = off_b1 + H, off_b2 = off_w2 + static_cast<size_t>(H) * H;
  const size_t off_w3 = off_b2 + H, off_b3 = off_w3 + H;

  // ---- Phase A: forward.
  load_weights<kF>(a, s, c, true);
  forward_shares<kF>(a, s, c);
  grid.sync();

  // ---- Phase B: output, loss, layer-3 and layer-2 gradients of own columns, their Adam updates.
  const bool one_chunk = B <= RC;  // then tile still holds h1 of the whole batch from phase A
  float sq = 0.f, dy_sum = 0.f;    // thread tid < rows: Σ (y - t)², Σ dy over its rows
  float gb2 = 0.f, gw3 = 0.f;      // thread (r, u): its rows' share of d loss / d b2[j], d loss / d w3[j]
  float gw2[U] = {0.f, 0.f, 0.f, 0.f};  // d loss / d W2[c*U + uu][tid]
  for (int r0 = 0; r0 < B; r0 += RC) {
    const int rows = min(RC, B - r0);
    if (!one_chunk) {
      load_x_chunk<kF>(a, s, r0, rows);
      __syncthreads();
      h1_chunk<kF>(a, s, rows);
    }
    if (tid < rows) {
      const float d = output_of(a, b3, r0 + tid) - a.t[r0 + tid];
      sq = fmaf(d, d, sq);
      const float dy = two_over_b * d;
      dy_sum += dy;
      s.dy[tid] = dy;
    }
    __syncthreads();
    if (r < rows) {
      const float z = a.z2[static_cast<size_t>(r0 + r) * H + j];
      const float dz = z > 0.f ? s.dy[r] * w3j : 0.f;
      a.dz2[static_cast<size_t>(r0 + r) * H + j] = dz;
      s.dz[r * U + u] = dz;
      gb2 += dz;
      gw3 = fmaf(s.dy[r], fmaxf(z, 0.f), gw3);
    }
    __syncthreads();
#pragma unroll 4
    for (int rr = 0; rr < rows; ++rr) {
      const float h = s.tile[rr * PAD + tid];
      const float4 dz4 = *reinterpret_cast<const float4*>(s.dz + rr * U);
      gw2[0] = fmaf(dz4.x, h, gw2[0]);
      gw2[1] = fmaf(dz4.y, h, gw2[1]);
      gw2[2] = fmaf(dz4.z, h, gw2[2]);
      gw2[3] = fmaf(dz4.w, h, gw2[3]);
    }
    __syncthreads();  // the next chunk overwrites tile, dy and dz
  }
  // Block-wide sums: per warp with shuffles, then over the warps in shared memory.
  gb2 = sum_over_rows_in_warp(gb2);
  gw3 = sum_over_rows_in_warp(gw3);
  sq = warp_sum(sq);
  dy_sum = warp_sum(dy_sum);
  if (lane < U) {
    s.red[warp * 2 * U + lane] = gb2;
    s.red[warp * 2 * U + U + lane] = gw3;
  }
  if (lane == 0) {
    s.red[WARPS * 2 * U + 2 * warp] = sq;
    s.red[WARPS * 2 * U + 2 * warp + 1] = dy_sum;
  }
  __syncthreads();
#pragma unroll
  for (int uu = 0; uu < U; ++uu) {
    const size_t i = static_cast<size_t>(c * U + uu) * H + tid;
    adam(a.w2 + i, a.m + off_w2 + i, a.v + off_w2 + i, gw2[uu], hp);
  }
  if (tid < U) {
    float g_b2 = 0.f, g_w3 = 0.f;
#pragma unroll
    for (int ww = 0; ww < WARPS; ++ww) {
      g_b2 += s.red[ww * 2 * U + tid];
      g_w3 += s.red[ww * 2 * U + U + tid];
    }
    const int unit = c * U + tid;
    adam(a.b2 + unit, a.m + off_b2 + unit, a.v + off_b2 + unit, g_b2, hp);
    adam(a.w3 + unit, a.m + off_w3 + unit, a.v + off_w3 + unit, g_w3, hp);
  }
  if (c == 0 && tid == kThreads - 1) {
    float loss = 0.f, g_b3 = 0.f;
#pragma unroll
    for (int ww = 0; ww < WARPS; ++ww) {
      loss += s.red[WARPS * 2 * U + 2 * ww];
      g_b3 += s.red[WARPS * 2 * U + 2 * ww + 1];
    }
    a.loss[0] = loss / static_cast<float>(B);
    adam(a.b3, a.m + off_b3, a.v + off_b3, g_b3, hp);
  }
  grid.sync();

  // ---- Phase C: dh1 of own units (old W2 columns from shared memory), ReLU mask, W1 / b1 gradients, Adam.
  constexpr int NF = kF > 0 ? kF : kMaxFeatures;
  float gw1[NF];  // thread (r, u): its rows' share of d loss / d W1[j][f]
#pragma unroll
  for (int f = 0; f < NF; ++f) gw1[f] = 0.f;
  float gb1 = 0.f;
  for (int r0 = 0; r0 < B; r0 += RC) {
    const int rows = min(RC, B - r0);
    // dz2 rows → tile, 16-byte loads, all in flight at once
#pragma unroll
    for (int i = 0; i < RC * H / 4 / kThreads; ++i) {
      const int idx = tid + i * kThreads, rr = idx / (H / 4), q = idx % (H / 4);
      if (rr < rows) {
        *reinterpret_cast<float4*>(s.tile + rr * PAD + 4 * q) =
            *reinterpret_cast<const float4*>(a.dz2 + static_cast<size_t>(r0 + rr) * H + 4 * q);
      }
    }
    load_x_chunk<kF>(a, s, r0, rows);
    __syncthreads();
    if (r < rows) {
      const float dh = dot_hidden(s.tile + r * PAD, s.w2c + u * PAD);
      const float h1 = h1_value<kF>(s.xs + r * F, s.w1 + j * F, s.b1[j], F);
      const float dz1 = h1 > 0.f ? dh : 0.f;
      gb1 += dz1;
#pragma unroll
      for (int f = 0; f < NF; ++f) {
        if (kF > 0 || f < F) gw1[f] = fmaf(dz1, s.xs[r * F + f], gw1[f]);
      }
    }
    __syncthreads();  // the next chunk overwrites tile and xs
  }
  // Sum over rows: shuffles within each warp, then the warps' partials (scratch: the tile) summed per element.
  float* scratch = s.tile;  // [WARPS][U][NF + 1]
  gb1 = sum_over_rows_in_warp(gb1);
#pragma unroll
  for (int f = 0; f < NF; ++f) gw1[f] = sum_over_rows_in_warp(gw1[f]);
  if (lane < U) {
    float* out = scratch + (warp * U + lane) * (NF + 1);
#pragma unroll
    for (int f = 0; f < NF; ++f) out[f] = gw1[f];
    out[NF] = gb1;
  }
  __syncthreads();
  if (tid < U * F) {  // W1 rows c*U.. are contiguous: element tid is (unit c*U + tid / F, feature tid % F)
    const int uu = tid / F, f = tid % F;
    float g = 0.f;
#pragma unroll
    for (int ww = 0; ww < WARPS; ++ww) g += scratch[(ww * U + uu) * (NF + 1) + f];
    const size_t i = static_cast<size_t>(c * U) * F + tid;
    adam(a.w1 + i, a.m + i, a.v + i, g, hp);
  } else if (tid < U * F + U) {
    const int uu = tid - U * F, unit = c * U + uu;
    float g = 0.f;
#pragma unroll
    for (int ww = 0; ww < WARPS; ++ww) g += scratch[(ww * U + uu) * (NF + 1) + NF];
    adam(a.b1 + unit, a.m + off_b1 + unit, a.v + off_b1 + unit, g, hp);
  }
  if (c == 0 && tid == 0) *a.step = step;
}

constexpr int kSpecialFeatures = 5;  // the house-price MLP: its kernels are specialised (registers, unrolled loops)

template <int kF>
cudaError_t launch_train(const MlpArgs& args, cudaStream_t stream) {
  MlpArgs copy = args;
  void* params[] = {&copy};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(mlp_train_kernel<kF>), dim3(kBlocks),
                                     dim3(kThreads), params, shared_floats(args.features) * sizeof(float), stream);
}

template <int kF>
cudaError_t prepare_train(int bytes, int* fit) {
  cudaError_t err = cudaFuncSetAttribute(mlp_train_kernel<kF>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(fit, mlp_train_kernel<kF>, kThreads, bytes);
  return err;
}

}  // namespace

size_t shared_bytes(int features) { return shared_floats(features) * sizeof(float); }

cudaError_t prepare_kernels(int features, int device, int* resident_blocks) {
  const int bytes = static_cast<int>(shared_bytes(features));
  int fit = 0, sms = 0;
  cudaError_t err = features == kSpecialFeatures ? prepare_train<kSpecialFeatures>(bytes, &fit)
                                                 : prepare_train<0>(bytes, &fit);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  *resident_blocks = fit * sms;
  return err;
}

cudaError_t launch_forward(const MlpArgs& args, cudaStream_t stream) {
  const dim3 grid((args.batch + kInferRows - 1) / kInferRows, kInferGroups);
  if (args.features == kSpecialFeatures) {
    mlp_forward_kernel<kSpecialFeatures><<<grid, kThreads, 0, stream>>>(args);
  } else {
    mlp_forward_kernel<0><<<grid, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_train_step(const MlpArgs& args, cudaStream_t stream) {
  return args.features == kSpecialFeatures ? launch_train<kSpecialFeatures>(args, stream) : launch_train<0>(args, stream);
}

}  // namespace modelab_mlp
