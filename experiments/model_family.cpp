#include "experiments/model_family.h"

#include <algorithm>

#include "core/error.h"
#include "core/train/optimizer.h"
#include "core/train/retention.h"
#include "vision/nn/fused_ops.h"

namespace moh::experiments {

void count_parameters(const torch::nn::Module& module, ModelSummary& s) {
  for (const auto& p : module.parameters()) {
    s.params += p.numel();
    if (p.requires_grad()) s.trainable += p.numel();
  }
}

ModelSummary parameter_summary(const std::string& name, const std::string& family, const torch::nn::Module& net) {
  ModelSummary s;
  s.name = name;
  s.family = family;
  count_parameters(net, s);
  return s;
}

at::Tensor forward_input(const ForwardRequest& r, const std::string& name, at::ScalarType dtype, int64_t dim,
                         const std::string& needs) {
  auto it = r.inputs.find(name);
  if (it == r.inputs.end())
    throw UserError("--input " + r.inputs_origin, "has no tensor '" + name + "'", "this model needs " + needs);
  if (it->second.dim() != dim)
    throw UserError("--input " + r.inputs_origin, "tensor '" + name + "' has shape " + c10::str(it->second.sizes()),
                    std::to_string(dim) + " dimensions expected (" + needs + ")");
  return it->second.to(dtype).contiguous();
}

void check_forward_inputs(const ForwardRequest& r, const std::set<std::string>& inputs,
                          const std::set<std::string>& outputs, const std::string& needs) {
  for (const auto& [name, t] : r.inputs)
    if (!inputs.count(name) && !outputs.count(name))
      throw UserError("--input " + r.inputs_origin, "unexpected tensor '" + name + "'", "this model takes " + needs);
}

FamilyCheckpoint open_family_checkpoint(const std::string& path, const std::vector<std::string>& names,
                                        const std::string& family, const std::string& hint) {
  FamilyCheckpoint r;
  r.ckpt = load_checkpoint(path, /*tensors=*/false);  // the weights file used is read later, alone
  r.cfg = parse_experiment(r.ckpt.config_yaml, r.ckpt.dir + "/config.resolved.yaml");
  if (std::find(names.begin(), names.end(), r.cfg.model.name) == names.end())
    throw UserError("checkpoint " + r.ckpt.dir, "holds a " + r.cfg.model.name + " model, not a " + family, hint);
  hold_checkpoint(r.ckpt.dir);  // a run pruning its checkpoints leaves this one alone while we read it
  return r;
}

BenchOptimizer::BenchOptimizer(torch::nn::Module& model, const BenchRequest& r, double lr, double weight_decay,
                               double clip, const std::function<std::shared_ptr<torch::nn::Module>()>& copy)
    : impl_(resolve_optim_impl(r.optim, r.ctx.device)), clip_(clip) {
  adamw_ = std::make_unique<torch::optim::AdamW>(model.parameters(),
                                                 torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
  scaler_ = std::make_unique<GradScaler>(r.ctx.precision);
  if (nn::use_fused_ops(r.fused, r.ctx.device) && autocasts(r.ctx.precision))
    copies_ = std::make_unique<WorkingCopies>(model.parameters(), autocast_dtype(r.ctx.precision));
  if (r.ema_decay > 0) {
    ema_ = std::make_unique<ModelEma>(copy(), r.ema_decay, /*warmup=*/false, impl_);
    ema_->copy_from(model);
  }
}

void BenchOptimizer::step(torch::nn::Module& model) {
  if (finish_optimizer_step(*adamw_, model.parameters(), *scaler_, clip_, impl_) && ema_) ema_->update(model, steps_++);
  if (copies_) copies_->refresh();
}

}  // namespace moh::experiments
