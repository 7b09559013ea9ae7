#pragma once
// Gaussian feature statistics and the Fréchet distance as the ADM evaluator / pytorch-fid compute them
// (float64 mean, unbiased N−1 covariance; FD = ‖μ1−μ2‖² + tr Σ1 + tr Σ2 − 2 tr √(Σ1Σ2)), with the trace term
// taken by the symmetric route tr √(Σ1^{½} Σ2 Σ1^{½}) instead of scipy's sqrtm, and ADM's eps retry.
#include <ATen/ATen.h>

namespace moh::eval {

/// Mean and covariance of a feature set.
struct GaussianStats {
  at::Tensor mu;     ///< (D) float64
  at::Tensor sigma;  ///< (D, D) float64
};

/// np.mean(axis=0), np.cov(rowvar=False) of features (N, D), computed in float64 (N ≥ 2).
GaussianStats compute_stats(const at::Tensor& features);

/// Offset added to both covariances when the first attempt is not finite (ADM / pytorch-fid).
constexpr double kFrechetEps = 1e-6;

/// tr √(Σ1 Σ2) (fast Cholesky route, falling back to the general route when Σ1 is not positive definite).
double trace_sqrt_product(const at::Tensor& s1, const at::Tensor& s2);
/// The general eigh route, kept as the reference for the fast one.
double trace_sqrt_product_reference(const at::Tensor& s1, const at::Tensor& s2);

/// Fréchet distance between two Gaussians (may be slightly negative for identical inputs, ~1e-12).
double frechet_distance(const GaussianStats& a, const GaussianStats& b);

}  // namespace moh::eval
