// Post-hoc EMA (core/train/phema.h) against the EDM2 paper's definitions computed another way: γ from σ_rel against the
// paper's σ_rel formula and its quoted values, the tracking recursion against the profile's weights written out,
// the closed-form profile products against numerical integration of the profiles, the least-squares coefficients
// against LAPACK's least squares (torch.linalg.lstsq) on the same products, and reconstruction of an EMA that was
// tracked directly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/train/phema.h"

namespace moh {
namespace {

// The profile straight from its definition: (γ + 1) τ^γ / t^(γ+1) on [0, t], 0 after.
double profile(double tau, double t, double gamma) {
  return tau <= t ? (gamma + 1.0) / t * std::pow(tau / t, gamma) : 0.0;
}

// ∫ p_a p_b over [0, max(t_a, t_b)] by composite Simpson, split at both ends of support (the product is smooth on
// each piece).
double integrated_dot(const phema::Profile& a, const phema::Profile& b) {
  const double lo = std::min(a.t, b.t);
  auto piece = [&](double x0, double x1) {
    const int n = 20000;  // even
    const double h = (x1 - x0) / n;
    double s = 0;
    for (int i = 0; i <= n; ++i) {
      const double x = i == n ? x1 : x0 + i * h,
                   w = (i == 0 || i == n) ? 1 : (i % 2 ? 4 : 2);  // x1 exact: p is 0 past t
      s += w * profile(x, a.t, a.gamma) * profile(x, b.t, b.gamma);
    }
    return s * h / 3.0;
  };
  return piece(0.0, lo);  // past min(t_a, t_b) one of the two is 0
}

TEST(PostHocEma, GammaOfSigmaRelInvertsThePapersFormula) {
  // EDM2 quotes γ ≈ 16.97 for σ_rel 0.05 and γ ≈ 6.94 for σ_rel 0.10
  EXPECT_NEAR(phema::gamma_of(0.05), 16.97, 0.005);
  EXPECT_NEAR(phema::gamma_of(0.10), 6.94, 0.005);
  for (double s : {0.01, 0.03, 0.07, 0.15, 0.25, 0.29}) {
    const double g = phema::gamma_of(s);
    EXPECT_NEAR(phema::sigma_rel_of(g), s, 1e-12 * s) << s;
    const double r = 1.0 / (s * s);  // the cubic whose largest root γ is
    EXPECT_NEAR(((g + 7) * g + 16 - r) * g + 12 - r, 0.0, 1e-9 * r * (std::abs(g) + 1)) << s;
  }
  EXPECT_GT(phema::gamma_of(0.05), phema::gamma_of(0.10));  // a shorter EMA has the larger exponent
  EXPECT_THROW(phema::gamma_of(0.0), UserError);
  EXPECT_THROW(phema::gamma_of(0.31), UserError);
  EXPECT_THROW(phema::gamma_of(std::nan("")), UserError);
  EXPECT_NEAR(phema::max_sigma_rel(), 0.3003, 5e-4);
}

TEST(PostHocEma, TrackingGivesEachStepItsProfileWeight) {
  // θ_τ known for τ = 1..T; after T updates the tracked value must be Σ_τ θ_τ (τ^(γ+1) − (τ−1)^(γ+1)) / T^(γ+1).
  const std::vector<double> gammas{phema::gamma_of(0.05), phema::gamma_of(0.10), 0.0};
  const at::Tensor theta0 = at::zeros({3}, at::kDouble);
  phema::Tracker tracker({theta0}, gammas);
  const int64_t T = 300;
  auto value = [](int64_t tau) {
    return at::tensor({std::sin(tau / 7.0), std::cos(tau / 11.0) + 1e-3 * tau, 0.5 * tau}, at::kDouble);
  };
  for (int64_t tau = 1; tau <= T; ++tau) tracker.update({value(tau)}, tau);
  for (size_t k = 0; k < gammas.size(); ++k) {
    at::Tensor expect = at::zeros({3}, at::kDouble);
    const double g1 = gammas[k] + 1.0;
    for (int64_t tau = 1; tau <= T; ++tau)
      expect += value(tau) * ((std::pow(tau, g1) - std::pow(tau - 1, g1)) / std::pow(T, g1));
    EXPECT_TRUE(at::allclose(tracker.profile(k)[0], expect, 1e-12, 1e-12)) << k;
  }
  // γ = 0 is the plain running mean
  EXPECT_NEAR(tracker.profile(2)[0][2].item<double>(), 0.5 * (T + 1) / 2.0, 1e-9);
}

TEST(PostHocEma, ProfileProductsEqualTheIntegralOfTheProfiles) {
  const std::vector<phema::Profile> ps{
      {200, phema::gamma_of(0.05)}, {800, phema::gamma_of(0.10)}, {500, 0.5}, {800, phema::gamma_of(0.05)}};
  for (const auto& a : ps)
    for (const auto& b : ps) {
      const double closed = phema::profile_dot(a.t, a.gamma, b.t, b.gamma), numeric = integrated_dot(a, b);
      EXPECT_NEAR(closed, numeric, 1e-9 * std::abs(numeric)) << a.t << " " << b.t;
    }
}

TEST(PostHocEma, CoefficientsEqualADirectLeastSquaresSolve) {
  // snapshots every 200 steps of two tracked profiles; targets between and beyond them. The products are checked
  // against integration above; here the solve: Gaussian elimination against LAPACK's SVD least squares (gelsd) on
  // the same products, and the normal equations' residual against the numerically integrated products.
  std::vector<phema::Profile> snaps;
  for (double t : {200.0, 400.0, 600.0, 800.0})
    for (double s : {0.05, 0.10}) snaps.push_back({t, phema::gamma_of(s)});
  const int64_t n = static_cast<int64_t>(snaps.size());
  for (const phema::Profile target : {phema::Profile{800, phema::gamma_of(0.07)}, phema::Profile{700, 3.0},
                                      phema::Profile{800, phema::gamma_of(0.15)}}) {
    at::Tensor a = at::empty({n, n}, at::kDouble), b = at::empty({n, 1}, at::kDouble);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j)
        a[i][j] = phema::profile_dot(snaps[i].t, snaps[i].gamma, snaps[j].t, snaps[j].gamma);
      b[i][0] = phema::profile_dot(snaps[i].t, snaps[i].gamma, target.t, target.gamma);
    }
    const at::Tensor x_ref = std::get<0>(at::linalg_lstsq(a, b, c10::nullopt, "gelsd")).squeeze(1);
    const std::vector<double> x = phema::least_squares(snaps, target);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], x_ref[i].item<double>(), 1e-8) << target.gamma << " " << i;
    // the residual Σ x_j p_j − p_target is orthogonal to every snapshot profile (integrated numerically)
    for (int64_t i = 0; i < n; ++i) {
      double r = -integrated_dot(snaps[i], target);
      for (int64_t j = 0; j < n; ++j) r += x[j] * integrated_dot(snaps[i], snaps[j]);
      EXPECT_NEAR(r, 0.0, 1e-10) << target.gamma << " " << i;  // the products are O(1e-3)
    }
    double sum = 0;
    for (double v : phema::coefficients(snaps, target)) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  // a target that is one of the snapshots is that snapshot alone
  const std::vector<double> self = phema::coefficients(snaps, snaps[5]);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(self[i], i == 5 ? 1.0 : 0.0, 1e-8) << i;
  snaps.push_back(snaps[2]);
  EXPECT_THROW(phema::least_squares(snaps, snaps[0]), UserError);
}

TEST(PostHocEma, ReconstructionApproachesTheEmaTrackedDirectly) {
  // weights following a smooth known sequence, tracked at σ_rel 0.05 and 0.10 with snapshots every 100 steps, and
  // at σ_rel 0.07 directly: the reconstruction of 0.07 from the snapshots is close to the direct one, much closer
  // than either tracked profile is
  const std::vector<double> gammas{phema::gamma_of(0.05), phema::gamma_of(0.10), phema::gamma_of(0.07)};
  phema::Tracker tracker({at::zeros({4}, at::kDouble)}, gammas);
  auto value = [](int64_t tau) {
    const double u = tau / 1000.0;
    return at::tensor({std::exp(-3 * u), u * u, std::sin(5 * u), 1.0 / (1.0 + 10 * u)}, at::kDouble);
  };
  std::vector<phema::Profile> snaps;
  std::vector<std::map<std::string, at::Tensor>> maps;
  const int64_t T = 1000;
  for (int64_t tau = 1; tau <= T; ++tau) {
    tracker.update({value(tau)}, tau);
    if (tau % 100 == 0)
      for (size_t k = 0; k < 2; ++k) {
        snaps.push_back({static_cast<double>(tau), gammas[k]});
        maps.push_back({{"w", tracker.profile(k)[0].clone()}});
      }
  }
  const at::Tensor direct = tracker.profile(2)[0];
  const at::Tensor rec = phema::combine(maps, phema::coefficients(snaps, {double(T), gammas[2]})).at("w");
  const double err = (rec - direct).abs().max().item<double>();
  const double gap = std::min((tracker.profile(0)[0] - direct).abs().max().item<double>(),
                              (tracker.profile(1)[0] - direct).abs().max().item<double>());
  EXPECT_LT(err, 5e-4) << "gap of the tracked profiles " << gap;
  EXPECT_LT(err, gap / 100);
  EXPECT_THROW(phema::combine(maps, {1.0}), UserError);
}

}  // namespace
}  // namespace moh
