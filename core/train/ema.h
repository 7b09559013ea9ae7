#pragma once
// Exponential moving average of a model's weights (DiT's update_ema, timm's ModelEmaV2): the EMA copy starts equal
// to the model and follows ema ← d·ema + (1 − d)·model after every optimizer step; buffers are copied.
#include <torch/nn/module.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/train_config.h"

namespace moh {

/// ema ← decay·ema + (1 − decay)·model over every named parameter (same names and shapes); buffers ← model's.
/// for_loop updates tensor by tensor (DiT's update_ema, the reference); foreach/fused as two multi-tensor kernels
/// over all parameters (the same ops in the same order: equal results).
void ema_update(torch::nn::Module& ema, const torch::nn::Module& model, double decay,
                OptimImpl impl = OptimImpl::for_loop);

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
  ModelEma(std::shared_ptr<torch::nn::Module> copy, double decay, bool warmup, OptimImpl impl = OptimImpl::for_loop);
  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<torch::nn::Module>& ptr() const { return module_; }
  /// ema ← model (DiT and timm start the average as a copy).
  void copy_from(const torch::nn::Module& model) { ema_update(*module_, model, 0.0); }
  /// The update after optimizer step `step` (0-based). `taken` (a 0-dim float on the device, 1 or 0): the update
  /// is masked there — a step skipped on the device leaves the EMA as it was.
  void update(const torch::nn::Module& model, int64_t step, const at::Tensor& taken = {});

 private:
  std::shared_ptr<torch::nn::Module> module_;
  double decay_;
  bool warmup_;
  OptimImpl impl_;
  // The multi-tensor update's lists, paired by name once (a step does not rebuild name maps).
  const torch::nn::Module* paired_with_ = nullptr;
  std::vector<at::Tensor> ema_params_, model_params_, ema_buffers_, model_buffers_;
};

}  // namespace moh
