#include "core/train/ema.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/version.h>

namespace moh {

namespace {
// Lists of `ema`'s parameters and buffers and the model's of the same names.
void pair_tensors(torch::nn::Module& ema, const torch::nn::Module& model, std::vector<at::Tensor>& ema_params,
                  std::vector<at::Tensor>& model_params, std::vector<at::Tensor>& ema_buffers,
                  std::vector<at::Tensor>& model_buffers) {
  auto params = model.named_parameters();
  auto buffers = model.named_buffers();
  ema_params.clear(), model_params.clear(), ema_buffers.clear(), model_buffers.clear();
  for (auto& p : ema.named_parameters()) ema_params.push_back(p.value()), model_params.push_back(params[p.key()]);
  for (auto& b : ema.named_buffers()) ema_buffers.push_back(b.value()), model_buffers.push_back(buffers[b.key()]);
}

void update_lists(std::vector<at::Tensor>& ema_params, const std::vector<at::Tensor>& model_params,
                  std::vector<at::Tensor>& ema_buffers, const std::vector<at::Tensor>& model_buffers, double decay,
                  OptimImpl impl) {
  RECORD_USER_SCOPE("moh::ema");
  torch::NoGradGuard ng;
  if (impl == OptimImpl::for_loop) {
    for (size_t i = 0; i < ema_params.size(); ++i) ema_params[i].mul_(decay).add_(model_params[i], 1.0 - decay);
  } else if (!ema_params.empty()) {
    at::_foreach_mul_(ema_params, decay);
    at::_foreach_add_(ema_params, model_params, 1.0 - decay);
  }
  for (size_t i = 0; i < ema_buffers.size(); ++i) ema_buffers[i].copy_(model_buffers[i]);
}
}  // namespace

void ema_update(torch::nn::Module& ema, const torch::nn::Module& model, double decay, OptimImpl impl) {
  std::vector<at::Tensor> ep, mp, eb, mb;
  pair_tensors(ema, model, ep, mp, eb, mb);
  update_lists(ep, mp, eb, mb, decay, impl);
}

ModelEma::ModelEma(std::shared_ptr<torch::nn::Module> copy, double decay, bool warmup, OptimImpl impl)
    : module_(std::move(copy)), decay_(decay), warmup_(warmup), impl_(impl) {
  module_->eval();
  for (auto& p : module_->parameters()) p.set_requires_grad(false);
}

void ModelEma::update(const torch::nn::Module& model, int64_t step, const at::Tensor& taken) {
  if (paired_with_ != &model) {
    pair_tensors(*module_, model, ema_params_, model_params_, ema_buffers_, model_buffers_);
    paired_with_ = &model;
  }
  const double d = ema_decay_at(decay_, warmup_, step);
  if (!taken.defined()) {
    update_lists(ema_params_, model_params_, ema_buffers_, model_buffers_, d, impl_);
    return;
  }
  // Masked on the device: decay d and weight 1 − d where the step was taken, 1 and 0 where it was skipped.
  RECORD_USER_SCOPE("moh::ema");
  torch::NoGradGuard ng;
  const at::Tensor decay = 1.0 - taken * (1.0 - d), weight = taken * (1.0 - d);        // 0-dim, on the device
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)  // Tensor-scalar foreach ops
  at::_foreach_mul_(ema_params_, decay);
  at::_foreach_add_(ema_params_, at::_foreach_mul(model_params_, weight));
#else
  for (size_t i = 0; i < ema_params_.size(); ++i) ema_params_[i].mul_(decay).add_(model_params_[i] * weight);
#endif
  for (size_t i = 0; i < ema_buffers_.size(); ++i)
    ema_buffers_[i].copy_(at::where(taken > 0, model_buffers_[i], ema_buffers_[i]));
}

}  // namespace moh
