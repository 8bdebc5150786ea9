// Registers the cluster decode attention as the torch operator `modelab_decode::decode_attention` (CUDA dispatch key
// only). engine/kernels/cuda_decode.py builds this library, loads it, validates inputs and calls the op;
// decode_attention.cu checks them again (TORCH_CHECK), so a direct call with bad input also fails cleanly.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace modelab_decode {

at::Tensor decode_attention_cuda(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& input_pos,
                                 int64_t cluster, bool pdl);

}  // namespace modelab_decode

TORCH_LIBRARY(modelab_decode, m) {
  m.def("decode_attention(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor input_pos, int cluster, bool pdl) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelab_decode, CUDA, m) { m.impl("decode_attention", &modelab_decode::decode_attention_cuda); }
