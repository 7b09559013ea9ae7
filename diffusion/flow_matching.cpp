#include "diffusion/flow_matching.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace moh::diffusion {

namespace {

// (N) → (N, 1, ..., 1) broadcasting against x (SiT expand_t_like_x).
at::Tensor like_x(const at::Tensor& t, const at::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = t.size(0);
  return t.reshape(shape);
}

// SiT mean_flat: the mean over every dimension but the first.
at::Tensor per_sample_mean(const at::Tensor& x) {
  return x.reshape({x.size(0), -1}).mean(1);
}

}  // namespace

FlowProcess::FlowProcess(const FlowConfig& config) : c_(config) {}

PathCoefficients FlowProcess::coefficients(const at::Tensor& t) const {
  if (c_.path == FlowPath::linear)  // SiT ICPlan
    return {t, at::ones_like(t), 1.0 - t, -at::ones_like(t)};
  const double h = M_PI / 2.0;  // SiT GVPCPlan
  return {at::sin(h * t), h * at::cos(h * t), at::cos(h * t), -h * at::sin(h * t)};
}

std::pair<double, double> FlowProcess::train_interval() const {
  if (c_.prediction == FlowPrediction::velocity) return {0.0, 1.0};  // stable everywhere (SiT create_transport)
  return {kFlowEps, 1.0 - kFlowEps};
}

std::pair<double, double> FlowProcess::sample_interval(bool sde) const {
  // SiT check_interval with sample_eps (0 for velocity, 1e-3 else); the SDE's diffusion form is "sigma" (SiT's
  // sample.py default), so its start follows the prediction alone, and it ends a last step short of 1.
  const double t0 = c_.prediction == FlowPrediction::velocity ? 0.0 : kFlowEps;
  if (sde) return {t0, 1.0 - kSdeLastStep};
  return {t0, c_.prediction == FlowPrediction::velocity ? 1.0 : 1.0 - kFlowEps};
}

at::Tensor FlowProcess::training_times(const at::Tensor& draws) const {
  const auto [t0, t1] = train_interval();
  at::Tensor u = draws;
  if (c_.t_sampling == TimeSampling::lognormal)
    u = at::sigmoid(c_.t_lognormal.at(0) + c_.t_lognormal.at(1) * draws);  // LightningDiT sample_logit_normal
  return t0 + u * (t1 - t0);
}

std::pair<at::Tensor, at::Tensor> FlowProcess::interpolate(const at::Tensor& x1, const at::Tensor& x0,
                                                           const at::Tensor& t) const {
  const PathCoefficients p = coefficients(like_x(t, x1));
  return {p.alpha * x1 + p.sigma * x0, p.d_alpha * x1 + p.d_sigma * x0};  // x_t, u_t (SiT plan)
}

FlowProcess::Losses FlowProcess::training_losses(const at::Tensor& out, const at::Tensor& x1, const at::Tensor& x0,
                                                 const at::Tensor& t) const {
  const auto [xt, ut] = interpolate(x1, x0, t);
  Losses l;
  switch (c_.prediction) {  // SiT training_losses with loss_weight None
    case FlowPrediction::velocity:
      l.mse = per_sample_mean((out - ut).pow(2));
      break;
    case FlowPrediction::noise:
      l.mse = per_sample_mean((out - x0).pow(2));
      break;
    case FlowPrediction::score: {
      const at::Tensor sigma = coefficients(like_x(t, x1)).sigma;
      l.mse = per_sample_mean((out * sigma + x0).pow(2));
      break;
    }
  }
  l.cosine = c_.loss == FlowLoss::mse_cosine
                 ? per_sample_mean(1.0 - at::cosine_similarity(out, ut, 1))  // LightningDiT: over channels, (N, H, W)
                 : at::zeros_like(l.mse);
  l.loss = l.mse + l.cosine;
  return l;
}

at::Tensor FlowProcess::velocity(const at::Tensor& out, const at::Tensor& x, const at::Tensor& t) const {
  if (c_.prediction == FlowPrediction::velocity) return out;
  const PathCoefficients p = coefficients(like_x(t, x).to(x.scalar_type()));
  const at::Tensor ratio = p.d_alpha / p.alpha;                         // α̇/α
  const at::Tensor var = ratio * p.sigma.pow(2) - p.sigma * p.d_sigma;  // SiT compute_drift's "diffusion"
  const at::Tensor s = c_.prediction == FlowPrediction::score ? out : out / -p.sigma;
  return ratio * x + var * s;
}

at::Tensor FlowProcess::score(const at::Tensor& out, const at::Tensor& x, const at::Tensor& t) const {
  const PathCoefficients p = coefficients(like_x(t, x).to(x.scalar_type()));
  switch (c_.prediction) {
    case FlowPrediction::score:
      return out;
    case FlowPrediction::noise:
      return out / -p.sigma;
    case FlowPrediction::velocity:
      break;
  }
  const at::Tensor reverse = p.alpha / p.d_alpha;  // α/α̇ (SiT get_score_from_velocity)
  const at::Tensor var = p.sigma.pow(2) - reverse * p.d_sigma * p.sigma;
  return (reverse * out - x) / var;
}

}  // namespace moh::diffusion
