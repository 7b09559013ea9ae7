// Fréchet distance: closed forms (unit covariances with shifted means, diagonal covariances, identical sets) and the
// two matrix square-root routes against each other.
#include "eval/frechet.h"
#include "tests/test_util.h"

namespace moh::eval {
namespace {

TEST(Frechet, UnitCovarianceShiftedMeanIs2048) {
  GaussianStats a{torch::zeros({2048}, torch::kDouble), torch::eye(2048, torch::kDouble)};
  GaussianStats b{torch::ones({2048}, torch::kDouble), torch::eye(2048, torch::kDouble)};
  EXPECT_NEAR(frechet_distance(a, b), 2048.0, 1e-8);
}

TEST(Frechet, DiagonalClosedForm) {
  torch::manual_seed(0);
  torch::Tensor da = torch::rand({64}, torch::kDouble) + 0.1, db = torch::rand({64}, torch::kDouble) + 0.1;
  GaussianStats a{torch::randn({64}, torch::kDouble), torch::diag(da)};
  GaussianStats b{torch::randn({64}, torch::kDouble), torch::diag(db)};
  double expect = (a.mu - b.mu).pow(2).sum().item<double>() + (da.sqrt() - db.sqrt()).pow(2).sum().item<double>();
  EXPECT_NEAR(frechet_distance(a, b), expect, 1e-9 * expect);
}

TEST(Frechet, IdenticalSetsNearZeroAndSingularHandled) {
  torch::manual_seed(1);
  torch::Tensor f = torch::randn({500, 32});
  GaussianStats s = compute_stats(f);
  EXPECT_LT(std::abs(frechet_distance(s, s)), 1e-6);
  // Fewer samples than dimensions: singular covariance, still finite.
  GaussianStats t = compute_stats(torch::randn({10, 32}));
  EXPECT_TRUE(std::isfinite(frechet_distance(s, t)));
  // np.cov semantics: unbiased N−1.
  torch::Tensor x = torch::tensor({{1.0, 2.0}, {3.0, 6.0}}, torch::kDouble);
  GaussianStats c = compute_stats(x);
  EXPECT_DOUBLE_EQ(c.sigma[0][0].item<double>(), 2.0);
  EXPECT_DOUBLE_EQ(c.sigma[0][1].item<double>(), 4.0);
}

TEST(Frechet, CholeskyRouteEqualsEighRoute) {
  torch::manual_seed(3);
  GaussianStats a = compute_stats(at::relu(torch::randn({400, 64}))), b = compute_stats(torch::randn({400, 64}) * 2);
  const double fast = trace_sqrt_product(a.sigma, b.sigma), ref = trace_sqrt_product_reference(a.sigma, b.sigma);
  EXPECT_NEAR(fast, ref, 1e-9 * ref);
  // Singular Σ1 (N < D): the fast route falls back and still agrees with the reference.
  GaussianStats c = compute_stats(torch::randn({20, 64}));
  EXPECT_NEAR(trace_sqrt_product(c.sigma, b.sigma), trace_sqrt_product_reference(c.sigma, b.sigma), 1e-8);
}

}  // namespace
}  // namespace moh::eval
