#pragma once
// Flow matching (stochastic interpolants) as SiT trains and samples it (willisma/SiT, transport/path.py and
// transport.py; Ma et al. 2024): x_t = α_t·x1 + σ_t·x0 with x1 the data, x0 ~ N(0, I) and t from 0 (noise) to 1
// (data); the network predicts the velocity u_t = α̇_t·x1 + σ̇_t·x0, the noise x0, or the score ∇log p_t(x_t), and the
// other two follow from it. Paths: linear (α = t, σ = 1 − t) and GVP (α = sin(πt/2), σ = cos(πt/2)). The training
// timestep is uniform on the path's interval or logit-normal (LightningDiT's use_lognorm), and LightningDiT's
// cosine term 1 − cos(v̂, u_t) over channels can join the MSE. The network sees t itself (SiT's t_embedder input).
#include <ATen/ATen.h>

#include <utility>

#include "diffusion/diffusion_config.h"

namespace moh::diffusion {

/// α_t, α̇_t, σ_t, σ̇_t of a path at t, shaped like t.
struct PathCoefficients {
  at::Tensor alpha, d_alpha, sigma, d_sigma;
};

/// One flow-matching process: the path, what the network predicts and how training draws t.
class FlowProcess {
 public:
  FlowProcess() = default;
  explicit FlowProcess(const FlowConfig& config);
  const FlowConfig& config() const { return c_; }

  /// The path's coefficients at t (any shape).
  PathCoefficients coefficients(const at::Tensor& t) const;

  /// [t0, t1] training draws t from (SiT check_interval): [0, 1] for velocity, [ε, 1 − ε] (ε = 1e-3) for noise and
  /// score, whose conversions divide by α_t and σ_t.
  std::pair<double, double> train_interval() const;
  /// [t0, t1] of the ODE samplers (the same rule with SiT's sample_eps) and of the SDE sampler (t1 = 1 − the last
  /// step's size, SiT's "Mean" last step).
  std::pair<double, double> sample_interval(bool sde) const;

  /// Training times (G) in the train interval from uniform draws u (G) or standard-normal draws n (G): uniform
  /// t0 + u·(t1 − t0); lognormal t0 + sigmoid(m + s·n)·(t1 − t0).
  at::Tensor training_times(const at::Tensor& draws) const;
  /// Whether training_times wants normal draws (lognormal) or uniform ones.
  bool normal_draws() const { return c_.t_sampling == TimeSampling::lognormal; }

  /// x_t (N, ...) and the target velocity u_t from data x1, noise x0 and times t (N).
  std::pair<at::Tensor, at::Tensor> interpolate(const at::Tensor& x1, const at::Tensor& x0, const at::Tensor& t) const;

  /// Per-sample loss terms (N) of the prediction `out` (N, C, H, W; fp32): mse = mean_flat((v̂ − u_t)²) (velocity),
  /// mean_flat((x̂0 − x0)²) (noise) or mean_flat((ŝ·σ_t + x0)²) (score); cosine = mean_flat(1 − cos over C of
  /// (out, u_t)) with loss: mse+cosine (velocity), else zeros; loss = mse + cosine.
  struct Losses {
    at::Tensor loss, mse, cosine;
  };
  Losses training_losses(const at::Tensor& out, const at::Tensor& x1, const at::Tensor& x0, const at::Tensor& t) const;

  /// The probability-flow velocity at x (N, ...) and times t (N) from the network's prediction `out`
  /// (SiT get_drift: velocity as is; score s: α̇/α·x + (α̇/α·σ² − σσ̇)·s; noise: s = −out/σ).
  at::Tensor velocity(const at::Tensor& out, const at::Tensor& x, const at::Tensor& t) const;
  /// The score ∇log p_t(x) from the prediction (SiT get_score; velocity: (α/α̇·v − x) / (σ² − α/α̇·σ̇σ)).
  at::Tensor score(const at::Tensor& out, const at::Tensor& x, const at::Tensor& t) const;

 private:
  FlowConfig c_;
};

/// SiT's sample_eps / train_eps of the noise and score predictions.
constexpr double kFlowEps = 1e-3;
/// SiT's SDE default last step ("Mean", size 0.04: the stride of 250 steps over [0, 1]).
constexpr double kSdeLastStep = 0.04;

}  // namespace moh::diffusion
