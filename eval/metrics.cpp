#include "eval/metrics.h"

#include <cmath>
#include <random>

namespace moh::eval {

const config::EnumTable<ISMode>& enum_table(ISMode) {
  static const config::EnumTable<ISMode> t{{ISMode::adm, "adm"}, {ISMode::fidelity, "fidelity"}};
  return t;
}

namespace {

// exp(E_x KL(p(y|x) ‖ p(y))) over one split of probabilities/log-probabilities (float64).
double split_score(const at::Tensor& p, const at::Tensor& logp) {
  const at::Tensor py = p.mean(0, true);                 // (1, K) marginal
  const at::Tensor kl = (p * (logp - py.log())).sum(1);  // (n)
  return std::exp(kl.mean().item<double>());
}

// DistanceBlock: max(|u|² − 2·u·vᵀ + |v|², 0) in float32 (ADM's fallback precision).
at::Tensor squared_distances(const at::Tensor& u, const at::Tensor& v, const at::Tensor& v_norm) {
  const at::Tensor u_norm = u.pow(2).sum(1, true);                                    // (n, 1)
  return (u_norm - 2.0 * at::matmul(u, v.t()) + v_norm.unsqueeze(0)).clamp_min(0.0);  // (n, m)
}

int64_t rows_per_block(int64_t cols, int64_t block_bytes) {
  return std::max<int64_t>(1, block_bytes / std::max<int64_t>(1, cols * 4));
}

}  // namespace

uint64_t NumpyLegacyRandom::interval(uint64_t max) {
  // random_interval: the smallest all-ones mask covering max, rejection until the masked draw is ≤ max.
  uint64_t mask = max;
  for (int s = 1; s <= 32; s <<= 1) mask |= mask >> s;
  uint64_t j;
  if (max <= 0xffffffffULL) {
    do j = mt_() & mask;
    while (j > max);
  } else {
    do j = ((static_cast<uint64_t>(mt_()) << 32) | mt_()) & mask;
    while (j > max);
  }
  return j;
}

std::vector<int64_t> NumpyLegacyRandom::permutation(int64_t n) {
  std::vector<int64_t> a(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i >= 1; --i)
    std::swap(a[static_cast<size_t>(i)], a[static_cast<size_t>(interval(static_cast<uint64_t>(i)))]);
  return a;
}

std::vector<int64_t> NumpyLegacyRandom::choice(int64_t n, int64_t k) {
  std::vector<int64_t> p = permutation(n);
  p.resize(static_cast<size_t>(k));
  return p;
}

std::vector<int64_t> numpy_legacy_permutation(int64_t n, uint32_t seed) {
  return NumpyLegacyRandom(seed).permutation(n);
}

namespace {

// torch-fidelity's mmd2(..., mmd_est="unbiased") of two m-row subsets under the cubic polynomial kernel.
double unbiased_mmd2(const at::Tensor& x, const at::Tensor& y) {
  const double m = static_cast<double>(x.size(0)), gamma = 1.0 / static_cast<double>(x.size(1));
  const auto kernel = [gamma](const at::Tensor& u, const at::Tensor& v) {
    return (at::matmul(u, v.t()) * gamma + 1.0).pow(3);  // (m, m)
  };
  const at::Tensor kxx = kernel(x, x), kyy = kernel(y, y), kxy = kernel(x, y);
  const double off_xx = (kxx.sum() - kxx.diagonal().sum()).item<double>();
  const double off_yy = (kyy.sum() - kyy.diagonal().sum()).item<double>();
  return (off_xx + off_yy) / (m * (m - 1)) - 2.0 * kxy.sum().item<double>() / (m * m);
}

}  // namespace

KIDResult kernel_inception_distance(const at::Tensor& a, const at::Tensor& b, int64_t subsets, int64_t subset_size,
                                    uint32_t seed) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1) && subsets > 0,
              "kernel_inception_distance: feature sets must be (N, D) with the same D");
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  KIDResult r;
  r.subsets = subsets;
  r.subset_size = std::min({subset_size, x.size(0), y.size(0)});
  TORCH_CHECK(r.subset_size >= 2, "kernel_inception_distance: need at least 2 rows per set");
  NumpyLegacyRandom rng(seed);
  std::vector<double> mmds;
  for (int64_t i = 0; i < subsets; ++i) {
    const at::Tensor ia = at::tensor(rng.choice(x.size(0), r.subset_size), at::kLong).to(x.device());
    const at::Tensor ib = at::tensor(rng.choice(y.size(0), r.subset_size), at::kLong).to(y.device());
    mmds.push_back(unbiased_mmd2(x.index_select(0, ia), y.index_select(0, ib)));
  }
  for (double v : mmds) r.mean += v / static_cast<double>(subsets);
  for (double v : mmds) r.std += (v - r.mean) * (v - r.mean) / static_cast<double>(subsets);
  r.std = std::sqrt(r.std);
  return r;
}

ISResult inception_score(const at::Tensor& logits, ISMode mode) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) > 0, "inception_score: expected (N, classes) logits");
  at::Tensor z = logits.to(at::kDouble);
  const int64_t n = z.size(0);
  ISResult r;
  std::vector<double> scores;
  if (mode == ISMode::adm) {
    for (int64_t i = 0; i < n; i += kAdmISSplitSize) {
      const at::Tensor part = z.narrow(0, i, std::min(kAdmISSplitSize, n - i));
      scores.push_back(split_score(part.softmax(1), part.log_softmax(1)));
    }
  } else {
    const std::vector<int64_t> perm = numpy_legacy_permutation(n, kFidelityISSeed);
    z = z.index_select(0, at::tensor(perm, at::kLong));
    for (int64_t i = 0; i < kFidelityISSplits; ++i) {
      const int64_t lo = i * n / kFidelityISSplits, hi = (i + 1) * n / kFidelityISSplits;
      if (hi <= lo) continue;
      const at::Tensor part = z.narrow(0, lo, hi - lo);
      scores.push_back(split_score(part.softmax(1), part.log_softmax(1)));
    }
  }
  double sum = 0;
  for (double s : scores) sum += s;
  r.mean = sum / static_cast<double>(scores.size());
  if (mode == ISMode::fidelity) {
    double var = 0;
    for (double s : scores) var += (s - r.mean) * (s - r.mean);
    r.std = std::sqrt(var / static_cast<double>(scores.size()));  // np.std, ddof = 0
  }
  r.splits = static_cast<int64_t>(scores.size());
  return r;
}

at::Tensor manifold_radii(const at::Tensor& features, int64_t k, int64_t block_bytes) {
  const at::Tensor f = features.to(at::kFloat).contiguous();
  const int64_t n = f.size(0);
  TORCH_CHECK(n > k, "manifold_radii: need more than k = ", k, " points, got ", n);
  const at::Tensor norm = f.pow(2).sum(1);
  at::Tensor radii = at::empty({n}, at::kFloat);
  const int64_t rows = rows_per_block(n, block_bytes);
  for (int64_t i = 0; i < n; i += rows) {
    const int64_t b = std::min(rows, n - i);
    const at::Tensor d = squared_distances(f.narrow(0, i, b), f, norm);  // (b, n)
    radii.narrow(0, i, b).copy_(std::get<0>(d.kthvalue(k + 1, 1)));      // k-th neighbour, self (0) counted
  }
  return radii;
}

PRResult precision_recall(const at::Tensor& reference, const at::Tensor& samples, int64_t k, int64_t block_bytes) {
  TORCH_CHECK(reference.dim() == 2 && samples.dim() == 2 && reference.size(1) == samples.size(1),
              "precision_recall: feature sets must be (N, D) with the same D");
  const at::Tensor ref = reference.to(at::kFloat).contiguous(), smp = samples.to(at::kFloat).contiguous();
  const at::Tensor r_ref = manifold_radii(ref, k, block_bytes), r_smp = manifold_radii(smp, k, block_bytes);
  const at::Tensor smp_norm = smp.pow(2).sum(1);
  at::Tensor ref_in = at::zeros({ref.size(0)}, at::kBool), smp_in = at::zeros({smp.size(0)}, at::kBool);
  const int64_t rows = rows_per_block(smp.size(0), block_bytes);
  for (int64_t i = 0; i < ref.size(0); i += rows) {
    const int64_t b = std::min(rows, ref.size(0) - i);
    const at::Tensor d = squared_distances(ref.narrow(0, i, b), smp, smp_norm);  // (b, Ns)
    ref_in.narrow(0, i, b).copy_(d.le(r_smp.unsqueeze(0)).any(1));               // ref i in a sample ball
    smp_in.logical_or_(d.le(r_ref.narrow(0, i, b).unsqueeze(1)).any(0));         // sample j in a ref ball
  }
  PRResult r;
  r.precision = smp_in.to(at::kDouble).mean().item<double>();
  r.recall = ref_in.to(at::kDouble).mean().item<double>();
  return r;
}

}  // namespace moh::eval
