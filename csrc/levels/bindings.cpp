// Registers the L5 CUDA kernels as torch operators `modelab_levels::*` (CUDA dispatch key only).
// engine/kernels/cuda_levels.py builds this library, loads it, validates inputs and calls the ops; the kernels
// repeat the essential checks in C++ (TORCH_CHECK) so a direct call with bad input also fails cleanly.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace modelab_levels {

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale,
                          int64_t variant);
at::Tensor patch_embed_cuda(const at::Tensor& images, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& cls, const at::Tensor& pos, int64_t patch);
at::Tensor message_passing_csr_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& w,
                                    const at::Tensor& rowptr, int64_t num_nodes, bool mean);
at::Tensor message_passing_coo_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst,
                                    const at::Tensor& w, int64_t num_nodes, bool mean);
at::Tensor message_passing_linked_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst,
                                       const at::Tensor& w, int64_t num_nodes, bool mean);

}  // namespace modelab_levels

TORCH_LIBRARY(modelab_levels, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal, float scale, int variant) -> Tensor");
  m.def("patch_embed(Tensor images, Tensor weight, Tensor bias, Tensor cls, Tensor pos, int patch) -> Tensor");
  m.def("message_passing_csr(Tensor x, Tensor src, Tensor w, Tensor rowptr, int num_nodes, bool mean) -> Tensor");
  m.def("message_passing_coo(Tensor x, Tensor src, Tensor dst, Tensor w, int num_nodes, bool mean) -> Tensor");
  m.def("message_passing_linked(Tensor x, Tensor src, Tensor dst, Tensor w, int num_nodes, bool mean) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelab_levels, CUDA, m) {
  m.impl("attention", &modelab_levels::attention_cuda);
  m.impl("patch_embed", &modelab_levels::patch_embed_cuda);
  m.impl("message_passing_csr", &modelab_levels::message_passing_csr_cuda);
  m.impl("message_passing_coo", &modelab_levels::message_passing_coo_cuda);
  m.impl("message_passing_linked", &modelab_levels::message_passing_linked_cuda);
}
