// Mode Lab's custom operators, registered with the PyTorch dispatcher under the `modelab` namespace:
//
//   modelab::bias_relu(Tensor x, Tensor bias) -> Tensor    relu(x + bias), bias broadcast over x's last dimension
//   modelab::custom_add(Tensor a, Tensor b) -> Tensor      a + b, same shape and dtype
//
// This file holds the schemas, the CPU kernels and the autograd formulas (a C++ autograd::Function registered for the
// Autograd key, so a training step pays no Python on the way); modelab_ops_cuda.cu adds CUDA kernels when the
// extension is built with CUDA. The fake (meta) kernels are registered from Python (engine/native/ops.py), so
// torch.compile and torch.export can trace the ops on fake tensors without running them.
//
// Each kernel opens a RECORD_FUNCTION range, so the kernel itself is named in profiler traces (under the
// dispatcher's own `modelab::...` range).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>

namespace modelab {

namespace {

// Rows per parallel task: the MLP's rows are short (256 features), so give each thread a useful chunk.
constexpr int64_t kGrainElems = 32768;

void check_bias_relu_args(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 1, "modelab::bias_relu: x must have at least one dimension");
  TORCH_CHECK(bias.dim() == 1, "modelab::bias_relu: bias must be 1-D, got ", bias.dim(), "-D");
  TORCH_CHECK(bias.size(0) == x.size(-1), "modelab::bias_relu: bias has ", bias.size(0),
              " elements but x's last dimension is ", x.size(-1));
  TORCH_CHECK(x.scalar_type() == bias.scalar_type(), "modelab::bias_relu: x is ", x.scalar_type(),
              " but bias is ", bias.scalar_type());
  TORCH_CHECK(x.device() == bias.device(), "modelab::bias_relu: x is on ", x.device(), " but bias is on ",
              bias.device());
}

void check_add_args(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "modelab::custom_add: shapes differ: ", a.sizes(), " vs ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "modelab::custom_add: dtypes differ: ", a.scalar_type(), " vs ",
              b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "modelab::custom_add: devices differ: ", a.device(), " vs ", b.device());
}

at::Tensor bias_relu_cpu(const at::Tensor& x, const at::Tensor& bias) {
  RECORD_FUNCTION("modelab::bias_relu_cpu_kernel", std::vector<c10::IValue>({x, bias}));
  check_bias_relu_args(x, bias);
  TORCH_CHECK(x.device().is_cpu(), "modelab::bias_relu (CPU kernel) got a tensor on ", x.device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor bc = bias.contiguous();
  at::Tensor out = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t n = xc.size(-1);
  const int64_t rows = n == 0 ? 0 : xc.numel() / n;
  if (rows == 0) {
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "modelab_bias_relu_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = xc.const_data_ptr<scalar_t>();
    const scalar_t* bp = bc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, kGrainElems / n);
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = xp + r * n;
        scalar_t* orow = op + r * n;
        // A plain loop over contiguous rows: gcc -O3 vectorises it. `v < 0 ? 0 : v` keeps NaN as NaN, like relu.
        for (int64_t j = 0; j < n; ++j) {
          const opmath_t v = static_cast<opmath_t>(xr[j]) + static_cast<opmath_t>(bp[j]);
          orow[j] = static_cast<scalar_t>(v < opmath_t(0) ? opmath_t(0) : v);
        }
      }
    });
  });
  return out;
}

at::Tensor custom_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  RECORD_FUNCTION("modelab::custom_add_cpu_kernel", std::vector<c10::IValue>({a, b}));
  check_add_args(a, b);
  TORCH_CHECK(a.device().is_cpu(), "modelab::custom_add (CPU kernel) got a tensor on ", a.device());
  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = b.contiguous();
  at::Tensor out = at::empty_like(ac, at::MemoryFormat::Contiguous);
  const int64_t numel = ac.numel();
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, ac.scalar_type(), "modelab_custom_add_cpu", [&] {
    const scalar_t* ap = ac.const_data_ptr<scalar_t>();
    const scalar_t* bp = bc.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, numel, kGrainElems, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        op[i] = static_cast<scalar_t>(ap[i] + bp[i]);
      }
    });
  });
  return out;
}

// ---- autograd: relu's gradient as eager computes it (threshold_backward), bias's as the sum over rows --------------

at::Tensor call_bias_relu(const at::Tensor& x, const at::Tensor& bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("modelab::bias_relu", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(x, bias);
}

at::Tensor call_custom_add(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("modelab::custom_add", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

class BiasReluFunction : public torch::autograd::Function<BiasReluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor out = call_bias_relu(x, bias);
    ctx->save_for_backward({out});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const at::Tensor grad_x = at::threshold_backward(grads[0], out, 0);
    const at::Tensor grad_bias = grad_x.reshape({-1, grad_x.size(-1)}).sum(0);
    return {grad_x, grad_bias};
  }
};

class CustomAddFunction : public torch::autograd::Function<CustomAddFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_custom_add(a, b);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], grads[0]};
  }
};

at::Tensor bias_relu_autograd(const at::Tensor& x, const at::Tensor& bias) {
  return BiasReluFunction::apply(x, bias);
}

at::Tensor custom_add_autograd(const at::Tensor& a, const at::Tensor& b) {
  return CustomAddFunction::apply(a, b);
}

}  // namespace

}  // namespace modelab

TORCH_LIBRARY(modelab, m) {
  // The fake kernels and autograd formulas live in this Python module; torch imports it when it needs them.
  m.set_python_module("engine.native.ops");
  m.def("bias_relu(Tensor x, Tensor bias) -> Tensor");
  m.def("custom_add(Tensor a, Tensor b) -> Tensor");
}

// Autograd is an alias for every backend's autograd key (AutogradCPU, AutogradCUDA, ...).
TORCH_LIBRARY_IMPL(modelab, Autograd, m) {
  m.impl("bias_relu", &modelab::bias_relu_autograd);
  m.impl("custom_add", &modelab::custom_add_autograd);
}

TORCH_LIBRARY_IMPL(modelab, CPU, m) {
  m.impl("bias_relu", &modelab::bias_relu_cpu);
  m.impl("custom_add", &modelab::custom_add_cpu);
}
