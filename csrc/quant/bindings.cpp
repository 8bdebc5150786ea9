// Registers the tensor-core int4 GEMV as the torch operators `modelab_quant::int4_gemv` and `int4_gemv_combine` (its
// x formed from the decode attention's splits), CUDA dispatch key only.
// engine/kernels/cuda_quant.py builds this library, loads it, validates inputs and calls the op; int4_gemv.cu checks
// them again (TORCH_CHECK), so a direct call with bad input also fails cleanly.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace modelab_quant {

at::Tensor int4_gemv_cuda(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, int64_t n,
                          const c10::optional<at::Tensor>& norm_weight, double eps,
                          const c10::optional<at::Tensor>& residual, bool glu, int64_t kslices, int64_t batch,
                          bool pdl);
at::Tensor int4_gemv_combine_cuda(const at::Tensor& m, const at::Tensor& l, const at::Tensor& o, int64_t rep,
                                  const at::Tensor& q, const at::Tensor& s, int64_t n, const at::Tensor& residual,
                                  int64_t kslices, int64_t batch, bool pdl);

}  // namespace modelab_quant

TORCH_LIBRARY(modelab_quant, m) {
  m.def("int4_gemv(Tensor x, Tensor q, Tensor s, int n, Tensor? norm_weight, float eps, Tensor? residual, bool glu, "
        "int kslices, int batch, bool pdl) -> Tensor");
  m.def("int4_gemv_combine(Tensor m, Tensor l, Tensor o, int rep, Tensor q, Tensor s, int n, Tensor residual, "
        "int kslices, int batch, bool pdl) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelab_quant, CUDA, m) {
  m.impl("int4_gemv", &modelab_quant::int4_gemv_cuda);
  m.impl("int4_gemv_combine", &modelab_quant::int4_gemv_combine_cuda);
}
