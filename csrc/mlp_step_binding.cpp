// Python binding of the `cuda` mode's kernels (mlp_step.cu): an MlpStep object holds the model's own parameter
// tensors, Adam's moments and step counter and the workspace, so a call passes only the batch — one argument check and
// one launch per call, each checked (C10_CUDA_CHECK on the launch, C10_CUDA_KERNEL_LAUNCH_CHECK after it).

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "mlp_step.h"

namespace modelab_mlp {

namespace {

void check_float_cuda(const at::Tensor& t, const char* what, const c10::Device& device) {
  TORCH_CHECK(t.is_cuda(), "modelab mlp_step: ", what, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.device() == device, "modelab mlp_step: ", what, " is on ", t.device(), ", the model on ", device);
  TORCH_CHECK(t.scalar_type() == at::kFloat, "modelab mlp_step: ", what, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "modelab mlp_step: ", what, " must be contiguous");
}

}  // namespace

class MlpStep {
 public:
  // params: the model's w1 [H, F], b1 [H], w2 [H, H], b2 [H], w3 [1, H], b3 [1]; updated in place by train_step.
  MlpStep(std::vector<at::Tensor> params, double lr, double beta1, double beta2, double eps)
      : params_(std::move(params)), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps) {
    TORCH_CHECK(params_.size() == 6, "modelab mlp_step: expected 6 parameter tensors (w1 b1 w2 b2 w3 b3), got ",
                params_.size());
    device_ = params_[0].device();
    const char* names[] = {"w1", "b1", "w2", "b2", "w3", "b3"};
    for (size_t i = 0; i < params_.size(); ++i) {
      check_float_cuda(params_[i], names[i], device_);
      TORCH_CHECK(reinterpret_cast<uintptr_t>(params_[i].data_ptr()) % 16 == 0, "modelab mlp_step: ", names[i],
                  " is not 16-byte aligned (the kernels load rows as float4)");
    }
    const auto& w1 = params_[0];
    TORCH_CHECK(w1.dim() == 2 && w1.size(0) == kHidden, "modelab mlp_step: w1 must be [", kHidden, ", F], got ",
                w1.sizes());
    features_ = static_cast<int>(w1.size(1));
    TORCH_CHECK(features_ >= 1 && features_ <= kMaxFeatures, "modelab mlp_step: 1 to ", kMaxFeatures,
                " input features are supported, got ", features_);
    TORCH_CHECK(params_[1].sizes() == at::IntArrayRef({kHidden}), "modelab mlp_step: b1 must be [", kHidden, "]");
    TORCH_CHECK(params_[2].sizes() == at::IntArrayRef({kHidden, kHidden}), "modelab mlp_step: w2 must be [", kHidden,
                ", ", kHidden, "], got ", params_[2].sizes());
    TORCH_CHECK(params_[3].sizes() == at::IntArrayRef({kHidden}), "modelab mlp_step: b2 must be [", kHidden, "]");
    TORCH_CHECK(params_[4].sizes() == at::IntArrayRef({1, kHidden}), "modelab mlp_step: w3 must be [1, ", kHidden,
                "], got ", params_[4].sizes());
    TORCH_CHECK(params_[5].numel() == 1, "modelab mlp_step: b3 must have one element");
    const auto opts = w1.options();
    int64_t total = 0;
    for (const auto& p : params_) total += p.numel();
    m_ = at::zeros({total}, opts);
    v_ = at::zeros({total}, opts);
    loss_ = at::empty({}, opts);
    step_ = at::zeros({}, opts);  // on the device, so a captured launch (CUDA graph) still counts steps
    const c10::cuda::CUDAGuard guard(device_);
    int resident = 0;
    C10_CUDA_CHECK(prepare_kernels(features_, device_.index(), &resident));
    TORCH_CHECK(resident >= kBlocks, "modelab mlp_step: the cooperative kernels need ", kBlocks,
                " resident blocks of ", kThreads, " threads and ", shared_bytes(features_),
                " bytes of shared memory; this device fits ", resident);
  }

  // zero_grad → forward → MSE → backward → Adam, one launch; returns the loss (a buffer the next step overwrites).
  at::Tensor train_step(const at::Tensor& x, const at::Tensor& target) {
    const int batch = check_input(x);
    check_float_cuda(target, "target", device_);
    TORCH_CHECK(target.numel() == batch, "modelab mlp_step: target has ", target.numel(), " elements for a batch of ",
                batch);
    const c10::cuda::CUDAGuard guard(device_);
    ensure_workspace(batch);
    ++launches_;
    MlpArgs a = args_for(x, batch);
    a.t = target.data_ptr<float>();
    a.loss = loss_.data_ptr<float>();
    a.step = step_.data_ptr<float>();
    C10_CUDA_CHECK(launch_train_step(a, c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return loss_;
  }

  // The forward pass, one ordinary launch; returns a new [batch, 1] tensor.
  at::Tensor forward(const at::Tensor& x) {
    const int batch = check_input(x);
    const c10::cuda::CUDAGuard guard(device_);
    ensure_workspace(batch);
    at::Tensor y = at::empty({batch, 1}, x.options());
    MlpArgs a = args_for(x, batch);
    a.y = y.data_ptr<float>();
    C10_CUDA_CHECK(launch_forward(a, c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
  }

  int64_t launches() const { return launches_; }

 private:
  int check_input(const at::Tensor& x) const {
    check_float_cuda(x, "x", device_);
    TORCH_CHECK(x.dim() == 2 && x.size(1) == features_, "modelab mlp_step: x must be [batch, ", features_,
                "], got ", x.sizes());
    TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= (1 << 24), "modelab mlp_step: batch size ", x.size(0),
                " is out of range (1 to 16777216)");
    return static_cast<int>(x.size(0));
  }

  void ensure_workspace(int batch) {
    if (batch <= capacity_) return;
    const auto opts = params_[0].options();
    z2_ = at::empty({batch, kHidden}, opts);
    dz2_ = at::empty({batch, kHidden}, opts);
    ypart_ = at::empty({kBlocks, batch}, opts);  // kBlocks >= kInferGroups: serves both kernels
    done_ = at::zeros({(batch + kInferRows - 1) / kInferRows}, opts.dtype(at::kInt));
    capacity_ = batch;
  }

  MlpArgs args_for(const at::Tensor& x, int batch) {
    MlpArgs a{};
    a.x = x.data_ptr<float>();
    a.batch = batch;
    a.features = features_;
    a.w1 = params_[0].data_ptr<float>();
    a.b1 = params_[1].data_ptr<float>();
    a.w2 = params_[2].data_ptr<float>();
    a.b2 = params_[3].data_ptr<float>();
    a.w3 = params_[4].data_ptr<float>();
    a.b3 = params_[5].data_ptr<float>();
    a.m = m_.data_ptr<float>();
    a.v = v_.data_ptr<float>();
    a.z2 = z2_.data_ptr<float>();
    a.dz2 = dz2_.data_ptr<float>();
    a.ypart = ypart_.data_ptr<float>();
    a.done = reinterpret_cast<unsigned int*>(done_.data_ptr<int>());
    a.lr = static_cast<float>(lr_);
    a.beta1 = static_cast<float>(beta1_);
    a.beta2 = static_cast<float>(beta2_);
    a.eps = static_cast<float>(eps_);
    return a;
  }

  std::vector<at::Tensor> params_;
  double lr_, beta1_, beta2_, eps_;
  c10::Device device_{c10::kCUDA};
  int features_ = 0;
  int64_t launches_ = 0;
  int capacity_ = 0;
  at::Tensor m_, v_, loss_, step_, z2_, dz2_, ypart_, done_;
};

}  // namespace modelab_mlp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Mode Lab's cuda mode: the house-price MLP's training step and forward as persistent CUDA kernels";
  m.attr("HIDDEN") = modelab_mlp::kHidden;
  m.attr("BLOCKS") = modelab_mlp::kBlocks;
  m.attr("MAX_FEATURES") = modelab_mlp::kMaxFeatures;
  pybind11::class_<modelab_mlp::MlpStep>(m, "MlpStep")
      .def(pybind11::init<std::vector<at::Tensor>, double, double, double, double>(), pybind11::arg("params"),
           pybind11::arg("lr"), pybind11::arg("beta1"), pybind11::arg("beta2"), pybind11::arg("eps"))
      .def("train_step", &modelab_mlp::MlpStep::train_step, pybind11::arg("x"), pybind11::arg("target"))
      .def("forward", &modelab_mlp::MlpStep::forward, pybind11::arg("x"))
      .def_property_readonly("launches", &modelab_mlp::MlpStep::launches);
}
