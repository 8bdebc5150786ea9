// Registers the tensor-core int4 GEMV as the torch operator `modelab_quant::int4_gemv` (CUDA dispatch key only).
// engine/kernels/cuda_quant.py builds this library, loads it, validates inputs (ValueError) and calls the op;
// int4_gemv.cu checks them again (TORCH_CHECK) so a direct call stops before any launch. On the H200 machines
// (torch 2.11, nvcc 13; 2026-11-28) such a throw killed the process with SIGSEGV rather than raising (a direct
// torch.ops call with a mis-shaped q), so nothing in the engine relies on it: the Python checks come first.
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
