#pragma once
// Gaussian diffusion schedule arrays and timestep respacing, a port of the IDDPM/DiT `diffusion/` package
// (facebookresearch/DiT@ed81ce2: gaussian_diffusion.py, respace.py). Everything is float64, as in the official numpy
// code; values are gathered per step and cast to the model's dtype at use.
#include <cstdint>
#include <string>
#include <vector>

namespace moh::diffusion {

/// DiT's linear β schedule endpoints for T = 1000 (scaled by 1000 / T for other T).
constexpr double kLinearBetaStart = 1e-4;
constexpr double kLinearBetaEnd = 0.02;

/// Precomputed float64 arrays of one (possibly respaced) diffusion chain, indexed by chain step.
struct DiffusionSchedule {
  std::vector<double> betas, alphas_cumprod, alphas_cumprod_prev, alphas_cumprod_next;
  std::vector<double> sqrt_alphas_cumprod, sqrt_one_minus_alphas_cumprod, sqrt_recip_alphas_cumprod,
      sqrt_recipm1_alphas_cumprod;
  std::vector<double> posterior_variance, posterior_log_variance_clipped, posterior_mean_coef1, posterior_mean_coef2;
  std::vector<int64_t> timestep_map;  ///< chain step -> original timestep fed to the model
  int64_t num_steps() const { return static_cast<int64_t>(betas.size()); }
};

/// `get_named_beta_schedule("linear", T)`: linspace(scale·1e-4, scale·0.02, T), scale = 1000 / T.
std::vector<double> linear_betas(int64_t T);

/// Builds every derived array from betas (GaussianDiffusion.__init__); timestep_map = identity.
DiffusionSchedule make_schedule(const std::vector<double>& betas);

/// `space_timesteps(T, spec)`: "" (all steps), "250", "10,15,20" (per-section counts) or "ddimN" (integer
/// stride). Python's round-half-to-even is reproduced. Returns the kept original timesteps, ascending.
/// Impossible requests are UserErrors.
std::vector<int64_t> space_timesteps(int64_t T, const std::string& spec);

/// SpacedDiffusion: new β_i = 1 − ᾱ_{t_i} / ᾱ_{t_{i−1}} over the kept timesteps; timestep_map = kept timesteps.
DiffusionSchedule respace(const std::vector<double>& base_betas, const std::vector<int64_t>& use_timesteps);

}  // namespace moh::diffusion
