// CUDA kernels for Mode Lab's custom operators (schemas and CPU kernels: modelab_ops.cpp).
// Built only when torch sees CUDA and nvcc is found (engine/native/build.py decides).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>

namespace modelab {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t numel, c10::DeviceIndex device) {
  // A grid-stride loop covers the rest; a few waves per SM is plenty for an elementwise kernel.
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted = (numel + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 8)));
}

template <typename scalar_t>
__global__ void bias_relu_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                 scalar_t* __restrict__ out, int64_t numel, int64_t n) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const opmath_t v = static_cast<opmath_t>(x[i]) + static_cast<opmath_t>(bias[i % n]);
    out[i] = static_cast<scalar_t>(v < opmath_t(0) ? opmath_t(0) : v);  // NaN stays NaN, like relu
  }
}

template <typename scalar_t>
__global__ void add_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                           scalar_t* __restrict__ out, int64_t numel) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    out[i] = static_cast<scalar_t>(a[i] + b[i]);
  }
}

at::Tensor bias_relu_cuda(const at::Tensor& x, const at::Tensor& bias) {
  RECORD_FUNCTION("modelab::bias_relu_cuda_kernel", std::vector<c10::IValue>({x, bias}));
  TORCH_CHECK(x.dim() >= 1, "modelab::bias_relu: x must have at least one dimension");
  TORCH_CHECK(bias.dim() == 1, "modelab::bias_relu: bias must be 1-D, got ", bias.dim(), "-D");
  TORCH_CHECK(bias.size(0) == x.size(-1), "modelab::bias_relu: bias has ", bias.size(0),
              " elements but x's last dimension is ", x.size(-1));
  TORCH_CHECK(x.scalar_type() == bias.scalar_type(), "modelab::bias_relu: x is ", x.scalar_type(),
              " but bias is ", bias.scalar_type());
  TORCH_CHECK(x.is_cuda() && bias.device() == x.device(), "modelab::bias_relu (CUDA kernel): x is on ", x.device(),
              " and bias on ", bias.device());
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor bc = bias.contiguous();
  at::Tensor out = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t numel = xc.numel();
  const int64_t n = xc.size(-1);
  if (numel == 0 || n == 0) {
    return out;
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "modelab_bias_relu_cuda", [&] {
    bias_relu_kernel<scalar_t><<<blocks_for(numel, x.get_device()), kThreads, 0, stream>>>(
        xc.const_data_ptr<scalar_t>(), bc.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), numel, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor custom_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  RECORD_FUNCTION("modelab::custom_add_cuda_kernel", std::vector<c10::IValue>({a, b}));
  TORCH_CHECK(a.sizes() == b.sizes(), "modelab::custom_add: shapes differ: ", a.sizes(), " vs ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "modelab::custom_add: dtypes differ: ", a.scalar_type(), " vs ",
              b.scalar_type());
  TORCH_CHECK(a.is_cuda() && b.device() == a.device(), "modelab::custom_add (CUDA kernel): a is on ", a.device(),
              " and b on ", b.device());
  const c10::cuda::CUDAGuard device_guard(a.device());
  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = b.contiguous();
  at::Tensor out = at::empty_like(ac, at::MemoryFormat::Contiguous);
  const int64_t numel = ac.numel();
  if (numel == 0) {
    return out;
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, ac.scalar_type(), "modelab_custom_add_cuda", [&] {
    add_kernel<scalar_t><<<blocks_for(numel, a.get_device()), kThreads, 0, stream>>>(
        ac.const_data_ptr<scalar_t>(), bc.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), numel);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

}  // namespace modelab

TORCH_LIBRARY_IMPL(modelab, CUDA, m) {
  m.impl("bias_relu", &modelab::bias_relu_cuda);
  m.impl("custom_add", &modelab::custom_add_cuda);
}
