// Registers the tensor-core int4 GEMV as the torch operator `modelab_quant::int4_gemv` (CUDA dispatch key only).
// engine/kernels/cuda_quant.py builds this library, loads it, validates inputs (ValueError) and calls the op;
// int4_gemv.cu checks them again (TORCH_CHECK) so a direct call stops before any launch. Such a throw raises a
// RuntimeError because the library is linked without a libstdc++ of its own (engine.native.toolchain.library_cxx,
// docs/aoti.md); the Python checks come first, as ValueErrors.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace modelab_quant {

at::Tensor int4_gemv_cuda(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, int64_t n,
                          const c10::optional<at::Tensor>& norm_weight, double eps,
                          const c10::optional<at::Tensor>& residual, bool glu, int64_t kslices, int64_t batch,
                          bool pdl);

}  // namespace modelab_quant

TORCH_LIBRARY(modelab_quant, m) {
  m.def("int4_gemv(Tensor x, Tensor q, Tensor s, int n, Tensor? norm_weight, float eps, Tensor? residual, bool glu, "
        "int kslices, int batch, bool pdl) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelab_quant, CUDA, m) { m.impl("int4_gemv", &modelab_quant::int4_gemv_cuda); }
