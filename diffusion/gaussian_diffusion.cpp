#include "diffusion/gaussian_diffusion.h"

#include <cmath>

namespace moh::diffusion {

namespace {

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLogClamp = 1e-12;   // diffusion_utils: every log argument clamped at 1e-12
constexpr double kBin = 1.0 / 255.0;  // half-width of a uint8 bin on [−1, 1]

at::Tensor mean_flat(const at::Tensor& x) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < x.dim(); ++d) dims.push_back(d);
  return x.mean(dims);
}

}  // namespace

at::Tensor approx_standard_normal_cdf(const at::Tensor& x) {
  return 0.5 * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}

at::Tensor normal_kl(const at::Tensor& mean1, const at::Tensor& logvar1, const at::Tensor& mean2,
                     const at::Tensor& logvar2) {
  return 0.5 * (-1.0 + logvar2 - logvar1 + at::exp(logvar1 - logvar2) + (mean1 - mean2).pow(2) * at::exp(-logvar2));
}

at::Tensor discretized_gaussian_log_likelihood(const at::Tensor& x, const at::Tensor& means,
                                               const at::Tensor& log_scales) {
  const at::Tensor centered = x - means, inv_stdv = at::exp(-log_scales);
  const at::Tensor cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + kBin));
  const at::Tensor cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - kBin));
  const at::Tensor log_cdf_plus = cdf_plus.clamp_min(kLogClamp).log();
  const at::Tensor log_one_minus_cdf_min = (1.0 - cdf_min).clamp_min(kLogClamp).log();
  const at::Tensor log_cdf_delta = (cdf_plus - cdf_min).clamp_min(kLogClamp).log();
  return at::where(x < -0.999, log_cdf_plus, at::where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta));
}

GaussianDiffusion::GaussianDiffusion(DiffusionSchedule schedule) : s_(std::move(schedule)) {
  for (double b : s_.betas) log_betas_.push_back(std::log(b));
}

GaussianDiffusion GaussianDiffusion::base(int64_t T) {
  return GaussianDiffusion(make_schedule(linear_betas(T)));
}

GaussianDiffusion GaussianDiffusion::respaced(int64_t T, const std::string& spec) {
  return GaussianDiffusion(respace(linear_betas(T), space_timesteps(T, spec)));
}

at::Tensor GaussianDiffusion::extract(const std::vector<double>& table, const at::Tensor& t,
                                      const at::Tensor& like) const {
  const at::Tensor values = at::tensor(table, at::kDouble).to(like.device());
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[0] = t.size(0);
  return values.index_select(0, t.to(like.device(), at::kLong)).to(like.scalar_type()).view(shape);
}

at::Tensor GaussianDiffusion::model_timesteps(const at::Tensor& t) const {
  return at::tensor(s_.timestep_map, at::kLong).to(t.device()).index_select(0, t.to(at::kLong));
}

at::Tensor GaussianDiffusion::q_sample(const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise) const {
  return extract(s_.sqrt_alphas_cumprod, t, x0) * x0 + extract(s_.sqrt_one_minus_alphas_cumprod, t, x0) * noise;
}

GaussianDiffusion::Posterior GaussianDiffusion::q_posterior(const at::Tensor& x0, const at::Tensor& xt,
                                                            const at::Tensor& t) const {
  return {extract(s_.posterior_mean_coef1, t, xt) * x0 + extract(s_.posterior_mean_coef2, t, xt) * xt,
          extract(s_.posterior_log_variance_clipped, t, xt)};
}

GaussianDiffusion::MeanVariance GaussianDiffusion::p_mean_variance(const at::Tensor& model_out, const at::Tensor& xt,
                                                                   const at::Tensor& t, bool clip_denoised) const {
  const int64_t C = xt.size(1);
  MeanVariance r;
  at::Tensor log_var;
  if (model_out.size(1) == 2 * C) {  // LEARNED_RANGE
    r.eps = model_out.narrow(1, 0, C);
    const at::Tensor frac = (model_out.narrow(1, C, C) + 1.0) / 2.0;  // v ∈ [−1, 1] → [0, 1]
    const at::Tensor min_log = extract(s_.posterior_log_variance_clipped, t, xt), max_log = extract(log_betas_, t, xt);
    r.log_variance = frac * max_log + (1.0 - frac) * min_log;
  } else {  // FIXED_LARGE (learn_sigma = false): σ² = β_t, with the posterior variance at t = 0
    TORCH_CHECK(model_out.size(1) == C, "p_mean_variance: model output has ", model_out.size(1), " channels for ", C);
    r.eps = model_out;
    std::vector<double> large = s_.betas;
    if (large.size() > 1) large[0] = s_.posterior_variance[1];
    for (double& v : large) v = std::log(v);
    r.log_variance = extract(large, t, xt).expand_as(xt);
  }
  r.pred_xstart =
      extract(s_.sqrt_recip_alphas_cumprod, t, xt) * xt - extract(s_.sqrt_recipm1_alphas_cumprod, t, xt) * r.eps;
  if (clip_denoised) r.pred_xstart = r.pred_xstart.clamp(-1.0, 1.0);
  r.mean = q_posterior(r.pred_xstart, xt, t).mean;
  return r;
}

GaussianDiffusion::Losses GaussianDiffusion::training_losses(const at::Tensor& model_out, const at::Tensor& x0,
                                                             const at::Tensor& xt, const at::Tensor& t,
                                                             const at::Tensor& noise) const {
  const int64_t C = x0.size(1);
  Losses r;
  r.mse = mean_flat((noise - model_out.narrow(1, 0, C)).pow(2));  // (N)
  if (model_out.size(1) == 2 * C) {
    // Detached-mean trick: the VLB term trains only the variance channels.
    const at::Tensor frozen = at::cat({model_out.narrow(1, 0, C).detach(), model_out.narrow(1, C, C)}, 1);
    const MeanVariance p = p_mean_variance(frozen, xt, t, false);
    const Posterior q = q_posterior(x0, xt, t);
    const at::Tensor kl = mean_flat(normal_kl(q.mean, q.log_variance, p.mean, p.log_variance)) / kLn2;
    const at::Tensor nll = -mean_flat(discretized_gaussian_log_likelihood(x0, p.mean, 0.5 * p.log_variance)) / kLn2;
    r.vb = at::where(t.to(kl.device()) == 0, nll, kl);
    r.loss = r.mse + r.vb;
  } else {
    r.vb = at::zeros_like(r.mse);
    r.loss = r.mse;
  }
  return r;
}

}  // namespace moh::diffusion
