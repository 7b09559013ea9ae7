#pragma once
// Post-hoc EMA (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models", §3 and
// App. C): power-function EMA profiles tracked during training, and the least-squares combination of their snapshots
// that best matches the profile of an EMA of any other length, chosen after training.
//
// A power-function EMA with exponent γ averages the weights θ_τ of steps τ ≤ t with the profile
//   p_{γ,t}(τ) = (γ + 1) τ^γ / t^(γ+1)   on [0, t];
// its relative standard deviation σ_rel (the profile's std over its support / t) is
//   σ_rel² = (γ + 1) / ((γ + 2)² (γ + 3)),
// and it is tracked by ema ← β_t ema + (1 − β_t) θ_t with β_t = (1 − 1/t)^(γ+1), t = 1, 2, … (t = 1 copies θ_1),
// which gives θ_τ the weight (τ^(γ+1) − (τ − 1)^(γ+1)) / t^(γ+1): the profile's integral over [τ − 1, τ].
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/train_config.h"

namespace moh::phema {

/// Refuses a train.phema section that cannot run (`what`: "config FILE: train.phema"): each σ_rel in
/// [min_sigma_rel(), max_sigma_rel()], none twice, snapshot_every ≥ 1 when profiles are tracked.
void check_config(const PhemaConfig& c, const std::string& what);

/// σ_rel of the exponent γ (γ > −1).
double sigma_rel_of(double gamma);

/// The exponent γ of σ_rel: the largest real root of γ³ + 7γ² + (16 − σ⁻²)γ + (12 − σ⁻²) = 0 (σ_rel² above, solved
/// for γ). Taken for min_sigma_rel() ≤ σ_rel ≤ max_sigma_rel(); a value outside is a UserError naming `what`.
double gamma_of(double sigma_rel, const std::string& what = "sigma_rel");

/// The largest σ_rel a power-function profile has (at γ = (√5 − 3)/2).
double max_sigma_rel();
/// The smallest σ_rel taken: γ ≈ 1/σ_rel reaches 1000 there; far below it (1e-154 and less) σ⁻² overflows and the
/// reconstruction's weights come out NaN.
constexpr double kMinSigmaRel = 1e-3;
double min_sigma_rel();

/// β_t of the tracking update after the t-th step (t ≥ 1).
double beta(double gamma, int64_t t);

/// ∫ p_{γa,ta}(τ) p_{γb,tb}(τ) dτ, in closed form.
double profile_dot(double t_a, double gamma_a, double t_b, double gamma_b);

/// One stored profile: the EMA of exponent `gamma` at step `t`.
struct Profile {
  double t = 0, gamma = 0;
};

/// The least-squares coefficients x that make Σ x_i p_i closest (in L2 over τ) to the target profile: the solution of
/// A x = b with A_ij = <p_i, p_j>, b_i = <p_i, p_target>, in fp64 by Gaussian elimination with partial pivoting.
/// A singular A (e.g. one profile given twice) is a UserError.
std::vector<double> least_squares(const std::vector<Profile>& snapshots, const Profile& target);

/// least_squares() scaled to sum to 1, as EDM2 applies them (each profile integrates to 1, so the combination is an
/// average of weights).
std::vector<double> coefficients(const std::vector<Profile>& snapshots, const Profile& target);

/// Σ c_i · maps[i] tensor by tensor, accumulated in fp64 and returned in each tensor's own dtype; every map must hold
/// the same names and shapes (a difference is a UserError naming the tensor).
std::map<std::string, at::Tensor> combine(const std::vector<std::map<std::string, at::Tensor>>& maps,
                                          const std::vector<double>& c);

/// The power-function EMAs of one set of tensors for several exponents, updated on the tensors' device without host
/// synchronisation (β_t depends only on the step count).
class Tracker {
 public:
  /// Starts every profile as a copy of `tensors` (the copies are what update() averages into).
  Tracker(const std::vector<at::Tensor>& tensors, std::vector<double> gammas);
  /// The update after the t-th optimizer step (t ≥ 1) with the model's current `tensors` (same order and shapes).
  /// `taken` (optional, a 0-dim float on the device, 1 or 0): a step skipped on the device leaves every profile as
  /// it was.
  void update(const std::vector<at::Tensor>& tensors, int64_t t, const at::Tensor& taken = {});
  const std::vector<at::Tensor>& profile(size_t k) const { return emas_.at(k); }
  std::vector<at::Tensor>& profile(size_t k) { return emas_.at(k); }
  const std::vector<double>& gammas() const { return gammas_; }

 private:
  std::vector<double> gammas_;
  std::vector<std::vector<at::Tensor>> emas_;
};

}  // namespace moh::phema
