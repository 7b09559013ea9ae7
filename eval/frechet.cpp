#include "eval/frechet.h"

#include <cmath>

#include "core/error.h"

namespace moh::eval {

GaussianStats compute_stats(const at::Tensor& features) {
  TORCH_CHECK(features.dim() == 2, "compute_stats: features must be (N, D)");
  const int64_t N = features.size(0);
  if (N < 2) throw UserError("feature statistics", "need at least 2 samples, got " + std::to_string(N), "");
  at::Tensor x = features.to(at::kDouble);
  GaussianStats s;
  s.mu = x.mean(0);
  at::Tensor xc = x - s.mu;
  s.sigma = at::matmul(xc.t(), xc) / static_cast<double>(N - 1);
  return s;
}

// tr √(Σ1 Σ2) = Σ √λ(Σ1Σ2). Σ1Σ2 is not symmetric, but it is similar to a symmetric PSD matrix whose eigenvalues
// a symmetric solver gets stably:
//   fast route (Σ1 positive definite): Σ1 = L Lᵀ  →  λ(Σ1Σ2) = λ(Lᵀ Σ2 L)   (Cholesky + 2 products + eigvalsh)
//   general route (singular Σ1, e.g. N ≤ D):  λ(Σ1Σ2) = λ(Σ1^{½} Σ2 Σ1^{½})  (eigh with vectors, ~2x slower)
// Both equal scipy's sqrtm trace to ~1e-10 (spec §2.2); negative rounding noise is clamped to 0.
double trace_sqrt_product_reference(const at::Tensor& s1, const at::Tensor& s2) {
  auto [w, V] = at::linalg_eigh(s1);
  at::Tensor root = at::matmul(V * w.clamp_min(0).sqrt().unsqueeze(0), V.t());  // Σ1^{½}
  at::Tensor m = at::matmul(at::matmul(root, s2), root);
  m = (m + m.t()) * 0.5;  // symmetrise rounding noise
  return at::linalg_eigvalsh(m).clamp_min(0).sqrt().sum().item<double>();
}

double trace_sqrt_product(const at::Tensor& s1, const at::Tensor& s2) {
  auto [L, info] = at::linalg_cholesky_ex(s1);
  if (info.item<int64_t>() != 0) return trace_sqrt_product_reference(s1, s2);
  at::Tensor m = at::matmul(L.t(), at::matmul(s2, L));  // (D, D) Lᵀ Σ2 L
  m = (m + m.t()) * 0.5;
  return at::linalg_eigvalsh(m).clamp_min(0).sqrt().sum().item<double>();
}

double frechet_distance(const GaussianStats& a, const GaussianStats& b) {
  if (a.mu.sizes() != b.mu.sizes() || a.sigma.sizes() != b.sigma.sizes())
    throw UserError("Fréchet distance",
                    "statistics have different dimensions (" + std::to_string(a.mu.numel()) + " vs " +
                        std::to_string(b.mu.numel()) + ")",
                    "compute both with the same feature network");
  at::Tensor s1 = a.sigma.to(at::kDouble), s2 = b.sigma.to(at::kDouble);
  at::Tensor diff = a.mu.to(at::kDouble) - b.mu.to(at::kDouble);
  double tr = trace_sqrt_product(s1, s2);
  if (!std::isfinite(tr)) {
    at::Tensor offset = at::eye(s1.size(0), s1.options()) * kFrechetEps;
    tr = trace_sqrt_product(s1 + offset, s2 + offset);
  }
  return diff.dot(diff).item<double>() + s1.trace().item<double>() + s2.trace().item<double>() - 2.0 * tr;
}

}  // namespace moh::eval
