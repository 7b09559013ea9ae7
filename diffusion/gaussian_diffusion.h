#pragma once
// The tensor side of DiT's Gaussian diffusion (IDDPM code as used by facebookresearch/DiT, diffusion/
// gaussian_diffusion.py + diffusion_utils.py): forward noising, the true posterior, the learned-range variance
// parameterisation, the hybrid training loss (MSE on ε + VLB in bits with the detached-mean trick and the t = 0
// discretised decoder NLL) and the per-step quantities the samplers use. ε prediction, as in DiT.
#include <ATen/ATen.h>

#include "diffusion/diffusion_schedule.h"

namespace moh::diffusion {

/// Standard-normal CDF approximation of the official code: 0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
at::Tensor approx_standard_normal_cdf(const at::Tensor& x);
/// KL(N(m1, e^{lv1}) ‖ N(m2, e^{lv2})) elementwise, in nats.
at::Tensor normal_kl(const at::Tensor& mean1, const at::Tensor& logvar1, const at::Tensor& mean2,
                     const at::Tensor& logvar2);
/// log-likelihood of data x ∈ [−1, 1] discretised to 256 bins (±1/255) under N(means, e^{2·log_scales}), elementwise.
at::Tensor discretized_gaussian_log_likelihood(const at::Tensor& x, const at::Tensor& means,
                                               const at::Tensor& log_scales);

/// One diffusion chain (base or respaced) with its float64 coefficient tables, gathered per step on use.
class GaussianDiffusion {
 public:
  explicit GaussianDiffusion(DiffusionSchedule schedule);
  /// The base chain of T steps (DiT's create_diffusion(timestep_respacing="")).
  static GaussianDiffusion base(int64_t T);
  /// The chain respaced by `spec` ("250", "ddim50", ...) over a base chain of T steps.
  static GaussianDiffusion respaced(int64_t T, const std::string& spec);

  const DiffusionSchedule& schedule() const { return s_; }
  int64_t num_steps() const { return s_.num_steps(); }
  /// Chain indices (N) → the original timesteps the network is conditioned on (respace.py's _WrappedModel).
  at::Tensor model_timesteps(const at::Tensor& t) const;

  /// x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε.
  at::Tensor q_sample(const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise) const;

  /// Mean and (clipped) log-variance of q(x_{t−1} | x_t, x0).
  struct Posterior {
    at::Tensor mean, log_variance;
  };
  Posterior q_posterior(const at::Tensor& x0, const at::Tensor& xt, const at::Tensor& t) const;

  /// p(x_{t−1} | x_t) from the network output (N, 2C, H, W) = [ε, v] with LEARNED_RANGE variance
  /// (log σ² = frac·log β_t + (1 − frac)·log σ̃²_t, frac = (v + 1)/2); x0 = √(1/ᾱ)·x_t − √(1/ᾱ − 1)·ε, clamped to
  /// [−1, 1] only if clip_denoised (DiT: never).
  struct MeanVariance {
    at::Tensor mean, log_variance, pred_xstart, eps;
  };
  MeanVariance p_mean_variance(const at::Tensor& model_out, const at::Tensor& xt, const at::Tensor& t,
                               bool clip_denoised = false) const;

  /// Per-sample hybrid loss terms (N): mse = mean_flat((ε − ε̂)²), vb in bits with ε̂ detached (the VLB only trains
  /// the variance channels), decoder NLL at t = 0; loss = mse + vb.
  struct Losses {
    at::Tensor loss, mse, vb;
  };
  Losses training_losses(const at::Tensor& model_out, const at::Tensor& x0, const at::Tensor& xt, const at::Tensor& t,
                         const at::Tensor& noise) const;

  /// Coefficient `table` at chain indices t, shaped (N, 1, 1, 1) like x, in x's dtype/device.
  at::Tensor extract(const std::vector<double>& table, const at::Tensor& t, const at::Tensor& like) const;

 private:
  DiffusionSchedule s_;
  std::vector<double> log_betas_;
};

}  // namespace moh::diffusion
