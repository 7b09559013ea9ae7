#include "core/train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/version.h>

#include <cmath>
#include <map>

#include "core/error.h"

// _fused_adamw_ came with LibTorch 2.0 (CUDA), its CPU kernel with 2.4; the Tensor-scalar _foreach_mul_ with 2.1.
#if TORCH_VERSION_MAJOR >= 2
#define MOH_HAS_FUSED_ADAMW 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define MOH_HAS_FUSED_ADAMW_CPU 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define MOH_HAS_FOREACH_MUL_TENSOR 1
#endif

namespace moh {

bool fused_adamw_available(const c10::Device& device) {
#if defined(MOH_HAS_FUSED_ADAMW_CPU)
  return device.is_cuda() || device.is_cpu();
#elif defined(MOH_HAS_FUSED_ADAMW)
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

OptimImpl resolve_optim_impl(OptimImpl requested, const c10::Device& device) {
  if (requested == OptimImpl::automatic)
    return device.is_cuda() && fused_adamw_available(device) ? OptimImpl::fused : OptimImpl::foreach;
  if (requested == OptimImpl::fused && !fused_adamw_available(device))
    throw UserError("config: optim.impl", "fused AdamW is not in this LibTorch for " + device.str(),
                    "use foreach or auto (fused needs LibTorch >= 2.0 on CUDA, >= 2.4 on the CPU)");
  return requested;
}

namespace {

/// The parameters of one AdamW group that take this step, with their state, split by step count (a parameter
/// that had no gradient at some earlier step is behind the others; its bias corrections differ).
struct Bucket {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

// Creates missing state as torch::optim::AdamW does, advances each state's step and buckets by the new step.
std::map<int64_t, Bucket> gather(torch::optim::AdamW& optimizer, torch::optim::OptimizerParamGroup& group) {
  auto& state = optimizer.state();
  std::map<int64_t, Bucket> buckets;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    TORCH_CHECK(!p.grad().is_sparse(), "AdamW does not support sparse gradients");
    auto& slot = state[optimizer_state_key(state, p)];
    if (!slot) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(0);
      s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      slot = std::move(s);
    }
    auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
    s.step(s.step() + 1);
    Bucket& b = buckets[s.step()];
    b.params.push_back(p);
    b.grads.push_back(p.grad());
    b.exp_avgs.push_back(s.exp_avg());
    b.exp_avg_sqs.push_back(s.exp_avg_sq());
  }
  return buckets;
}

// torch::optim::AdamW::step's ops in its order, each as one multi-tensor op over the bucket.
void foreach_update(Bucket& b, const torch::optim::AdamWOptions& o, int64_t step) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bias1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1 - std::pow(beta2, static_cast<double>(step));
  if (o.weight_decay() != 0) at::_foreach_mul_(b.params, 1 - o.lr() * o.weight_decay());
  at::_foreach_mul_(b.exp_avgs, beta1);
  at::_foreach_add_(b.exp_avgs, b.grads, 1 - beta1);
  at::_foreach_mul_(b.exp_avg_sqs, beta2);
  at::_foreach_addcmul_(b.exp_avg_sqs, b.grads, b.grads, 1 - beta2);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(b.exp_avg_sqs);
  at::_foreach_div_(denom, std::sqrt(bias2));
  at::_foreach_add_(denom, o.eps());
  at::_foreach_addcdiv_(b.params, b.exp_avgs, denom, -o.lr() / bias1);
}

void fused_update(Bucket& b, const torch::optim::AdamWOptions& o, int64_t step, const at::Tensor& found_inf) {
#if defined(MOH_HAS_FUSED_ADAMW)
  // The kernel reads the step count from a tensor on the parameters' device: a fill, not a copy from the host.
  const at::Tensor t = at::full({}, static_cast<double>(step), b.params[0].options().dtype(at::kFloat));
  const std::vector<at::Tensor> steps(b.params.size(), t);
  at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, {}, steps, o.lr(), std::get<0>(o.betas()),
                    std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false,
                    c10::nullopt, found_inf.defined() ? c10::optional<at::Tensor>(found_inf) : c10::nullopt);
#else
  (void)b, (void)o, (void)step, (void)found_inf;
  throw std::logic_error("fused AdamW requested from a LibTorch without _fused_adamw_");
#endif
}

}  // namespace

void adamw_step(torch::optim::AdamW& optimizer, OptimImpl impl, const at::Tensor& found_inf) {
  RECORD_USER_SCOPE("moh::optimizer");
  TORCH_CHECK(!found_inf.defined() || impl == OptimImpl::fused, "adamw_step: a device-side skip needs fused AdamW");
  if (impl == OptimImpl::for_loop) {
    optimizer.step();
    return;
  }
  at::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "adamw_step: AMSGrad is not supported");
    for (auto& [step, bucket] : gather(optimizer, group)) {
      if (impl == OptimImpl::fused)
        fused_update(bucket, options, step, found_inf);
      else
        foreach_update(bucket, options, step);
    }
  }
}

void adamw_unstep(torch::optim::AdamW& optimizer, const std::vector<at::Tensor>& params) {
  auto& state = optimizer.state();
  for (const auto& p : params)
    if (auto it = state.find(optimizer_state_key(state, p)); it != state.end()) {
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      s.step(s.step() - 1);
    }
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, OptimImpl impl) {
  RECORD_USER_SCOPE("moh::clip_grad");
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return {};
  if (impl == OptimImpl::for_loop) {
    const double norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
    return at::scalar_tensor(norm, grads[0].options().dtype(at::kDouble));
  }
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  const at::Tensor total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);  // 0-dim, on the device
#if defined(MOH_HAS_FOREACH_MUL_TENSOR)
  at::_foreach_mul_(grads, coef);
#else
  for (auto& g : grads) g.mul_(coef);
#endif
  return total;
}

bool finish_optimizer_step(torch::optim::AdamW& optimizer, const std::vector<at::Tensor>& params, GradScaler& scaler,
                           double clip, OptimImpl impl) {
  const bool take = scaler.unscale_and_update(params);  // fp16: skip steps with inf/NaN gradients
  if (take) {
    if (clip > 0) clip_grad_norm(params, clip, impl);
    adamw_step(optimizer, impl);
  }
  optimizer.zero_grad();
  return take;
}

}  // namespace moh
