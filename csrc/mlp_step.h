// The house-price MLP (F → 256 → ReLU → 256 → ReLU → 1) as one kernel per call: the `cuda` mode.
// Kernels: mlp_step.cu (no torch headers, so nvcc compiles it quickly); the design, phases and why are in its header
// comment. Python binding: mlp_step_binding.cpp. Build and cache: engine/native/mlp_step.py.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace modelab_mlp {

constexpr int kHidden = 256;     // both hidden layers; one thread per hidden unit in the per-unit loops
constexpr int kBlocks = 64;      // the cooperative grid: each block owns kHidden / kBlocks units of each hidden layer
constexpr int kThreads = 256;
constexpr int kRowChunk = 64;    // batch rows per pass through shared memory (any batch size works, in chunks)
constexpr int kMaxFeatures = 32;
constexpr int kInferRows = 8;    // forward kernel: batch rows per block
constexpr int kInferGroups = 8;  // forward kernel: blocks per row block, each 32 of the layer-2 units

struct MlpArgs {
  const float* x;   // [batch, features], contiguous
  const float* t;   // [batch] targets (training only)
  int batch;
  int features;
  // Parameters, updated in place by the training kernel (nn.Linear layouts: weight [out, in], bias [out]).
  float* w1;
  float* b1;
  float* w2;
  float* b2;
  float* w3;
  float* b3;
  // Adam moments, one flat buffer each, laid out [w1 | b1 | w2 | b2 | w3 | b3].
  float* m;
  float* v;
  // Workspace (global memory, L2-resident at these sizes).
  float* z2;     // [batch, kHidden] layer-2 pre-activations; each block writes and reads its own columns
  float* ypart;  // [kBlocks, batch] each block's share of the output sum
  float* dz2;    // [batch, kHidden] d loss / d layer-2 pre-activation
  float* y;      // [batch] output (inference)
  unsigned int* done;  // [ceil(batch / kInferRows)] forward kernel: groups finished per row block (self-resetting)
  float* loss;   // [1] mean squared error (training)
  float* step;   // [1] Adam's step counter on the device (like Adam(capturable=True)), advanced by the kernel
  float lr;
  float beta1;
  float beta2;
  float eps;
};

// Dynamic shared memory one block of the training kernel needs, in bytes.
size_t shared_bytes(int features);
// Raise the training kernel's dynamic shared-memory limit and check that kBlocks blocks fit on the device at once (a
// cooperative launch needs them all resident). Returns cudaSuccess or the first error; *resident gets the fit.
cudaError_t prepare_kernels(int features, int device, int* resident_blocks);
// The forward (inference): one ordinary launch of ceil(batch / kInferRows) x kInferGroups blocks.
cudaError_t launch_forward(const MlpArgs& args, cudaStream_t stream);
// The whole training step (forward, MSE, backward, Adam): one cooperative launch of kBlocks blocks.
cudaError_t launch_train_step(const MlpArgs& args, cudaStream_t stream);

}  // namespace modelab_mlp
