#pragma once
// Exponential moving average of a model's weights (DiT's update_ema, timm's ModelEmaV2): the EMA copy starts equal
// to the model and follows ema ← d·ema + (1 − d)·model after every optimizer step; buffers are copied.
#include <torch/nn/module.h>

#include <algorithm>
#include <memory>

namespace moh {

/// ema ← decay·ema + (1 − decay)·model over every named parameter (same names and shapes); buffers ← model's.
inline void ema_update(torch::nn::Module& ema, const torch::nn::Module& model, double decay) {
  torch::NoGradGuard ng;
  auto src = model.named_parameters();
  for (auto& p : ema.named_parameters()) p.value().mul_(decay).add_(src[p.key()], 1.0 - decay);
  auto bufs = model.named_buffers();
  for (auto& b : ema.named_buffers()) b.value().copy_(bufs[b.key()]);
}

/// The decay used at optimizer step `step` (0-based): constant, or with warm-up min(decay, (1 + s)/(10 + s)) so that
/// short runs do not keep decay^t of the random initialisation.
inline double ema_decay_at(double decay, bool warmup, int64_t step) {
  const double s = static_cast<double>(step);
  return warmup ? std::min(decay, (1.0 + s) / (10.0 + s)) : decay;
}

/// The EMA of a training run; it exists only when train.ema_decay > 0. Holds a copy of the model (built by the
/// model's family, same names), kept in eval mode without gradients.
class ModelEma {
 public:
  ModelEma(std::shared_ptr<torch::nn::Module> copy, double decay, bool warmup)
      : module_(std::move(copy)), decay_(decay), warmup_(warmup) {
    module_->eval();
    for (auto& p : module_->parameters()) p.set_requires_grad(false);
  }
  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<torch::nn::Module>& ptr() const { return module_; }
  /// ema ← model (DiT and timm start the average as a copy).
  void copy_from(const torch::nn::Module& model) { ema_update(*module_, model, 0.0); }
  /// The update after optimizer step `step` (0-based).
  void update(const torch::nn::Module& model, int64_t step) {
    ema_update(*module_, model, ema_decay_at(decay_, warmup_, step));
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  double decay_;
  bool warmup_;
};

}  // namespace moh
