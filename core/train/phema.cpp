#include "core/train/phema.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace moh::phema {

double sigma_rel_of(double gamma) {
  return std::sqrt((gamma + 1.0) / ((gamma + 2.0) * (gamma + 2.0) * (gamma + 3.0)));
}

namespace {
// σ_rel(γ) rises from 0 at γ = −1 to a peak and falls after it; the peak is where d/dγ log σ_rel² =
// 1/(γ+1) − 2/(γ+2) − 1/(γ+3) vanishes, i.e. γ² + 3γ + 1 = 0: γ = (√5 − 3)/2.
double peak_gamma() {
  return 0.5 * (std::sqrt(5.0) - 3.0);
}
}  // namespace

double max_sigma_rel() {
  static const double m = sigma_rel_of(peak_gamma());
  return m;
}

double min_sigma_rel() {
  return kMinSigmaRel;
}

double gamma_of(double sigma_rel, const std::string& what) {
  if (!(sigma_rel >= min_sigma_rel()) || !(sigma_rel <= max_sigma_rel())) {
    std::ostringstream why;
    why << sigma_rel << " is outside [" << min_sigma_rel() << ", " << max_sigma_rel()
        << "], the power-function EMA profiles whose arithmetic stays finite";
    throw UserError(what, why.str(), "EDM2 tracks 0.05 and 0.10 and reconstructs within about 0.01-0.25");
  }
  // f(γ) = γ³ + 7γ² + (16 − s)γ + (12 − s), s = σ⁻²: convex for γ > −7/3, so Newton from a point right of the
  // largest root falls monotonically onto it.
  const double s = 1.0 / (sigma_rel * sigma_rel);
  auto f = [s](double g) { return ((g + 7.0) * g + 16.0 - s) * g + 12.0 - s; };
  auto df = [s](double g) { return (3.0 * g + 14.0) * g + 16.0 - s; };
  double g = std::max(1.0, std::sqrt(s)) + 8.0;  // f(g) > 0 there: g² ≥ s + 1 ⇒ every term outweighs its −s part
  for (int i = 0; i < 200; ++i) {
    const double step = f(g) / df(g);
    g -= step;
    if (std::abs(step) <= 1e-15 * std::max(1.0, std::abs(g))) break;
  }
  return std::max(g, peak_gamma());  // at the peak itself the double root is the answer
}

void check_config(const PhemaConfig& c, const std::string& what) {
  for (size_t i = 0; i < c.sigma_rels.size(); ++i) {
    gamma_of(c.sigma_rels[i], what + ".sigma_rels");
    for (size_t j = 0; j < i; ++j)
      if (c.sigma_rels[j] == c.sigma_rels[i]) {
        std::ostringstream why;
        why << "lists " << c.sigma_rels[i] << " twice";
        throw UserError(what + ".sigma_rels", why.str(), "each profile once, e.g. [0.05, 0.10]");
      }
  }
  if (!c.sigma_rels.empty() && c.snapshot_every < 1)
    throw UserError(what + ".snapshot_every", "must be >= 1 while sigma_rels are tracked",
                    "e.g. a tenth of the run's steps; the snapshots are what moh ema reconstruct combines");
  if (c.sigma_rels.empty() && c.snapshot_every != 0)
    throw UserError(what + ".snapshot_every", "is set but no sigma_rels are tracked", "e.g. sigma_rels: [0.05, 0.10]");
}

double beta(double gamma, int64_t t) {
  return std::pow(1.0 - 1.0 / static_cast<double>(t), gamma + 1.0);
}

double profile_dot(double t_a, double gamma_a, double t_b, double gamma_b) {
  if (t_a > t_b) return profile_dot(t_b, gamma_b, t_a, gamma_a);
  // Both profiles overlap on [0, t_a]: (γa+1)(γb+1) / (t_a^(γa+1) t_b^(γb+1)) · t_a^(γa+γb+1) / (γa+γb+1),
  // written with the ratio t_a / t_b ≤ 1 so that no power overflows.
  return (gamma_a + 1.0) * (gamma_b + 1.0) / ((gamma_a + gamma_b + 1.0) * t_b) * std::pow(t_a / t_b, gamma_b);
}

std::vector<double> least_squares(const std::vector<Profile>& snapshots, const Profile& target) {
  const size_t n = snapshots.size(), w = n + 1;
  if (n == 0) throw UserError("post-hoc EMA", "no snapshots to combine", "train with train.phema.snapshot_every > 0");
  std::vector<double> a(n * w);  // [A | b], row-major
  const auto at = [&](size_t r, size_t c) -> double& { return a[r * w + c]; };
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j)
      at(i, j) = profile_dot(snapshots[i].t, snapshots[i].gamma, snapshots[j].t, snapshots[j].gamma);
    at(i, n) = profile_dot(snapshots[i].t, snapshots[i].gamma, target.t, target.gamma);
  }
  for (size_t c = 0; c < n; ++c) {  // forward elimination, the largest pivot of each column first
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::abs(at(r, c)) > std::abs(at(p, c))) p = r;
    if (!(std::abs(at(p, c)) > 1e-300))
      throw UserError("post-hoc EMA", "the snapshots' profiles are linearly dependent",
                      "every (step, sigma_rel) pair may appear once");
    std::swap_ranges(a.begin() + static_cast<std::ptrdiff_t>(c * w),
                     a.begin() + static_cast<std::ptrdiff_t>((c + 1) * w),
                     a.begin() + static_cast<std::ptrdiff_t>(p * w));
    for (size_t r = c + 1; r < n; ++r) {
      const double m = at(r, c) / at(c, c);
      for (size_t k = c; k <= n; ++k) at(r, k) -= m * at(c, k);
    }
  }
  std::vector<double> x(n);
  for (size_t i = n; i-- > 0;) {
    double v = at(i, n);
    for (size_t k = i + 1; k < n; ++k) v -= at(i, k) * x[k];
    x[i] = v / at(i, i);
  }
  return x;
}

std::vector<double> coefficients(const std::vector<Profile>& snapshots, const Profile& target) {
  std::vector<double> x = least_squares(snapshots, target);
  double sum = 0;
  for (double v : x) sum += v;
  for (double& v : x) v /= sum;
  return x;
}

std::map<std::string, at::Tensor> combine(const std::vector<std::map<std::string, at::Tensor>>& maps,
                                          const std::vector<double>& c) {
  if (maps.empty() || maps.size() != c.size())
    throw UserError("post-hoc EMA", "needs one coefficient per snapshot", "");
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, first] : maps.front()) {
    at::Tensor acc = at::zeros(first.sizes(), first.options().dtype(at::kDouble));
    for (size_t i = 0; i < maps.size(); ++i) {
      const auto it = maps[i].find(name);
      if (it == maps[i].end() || !it->second.sizes().equals(first.sizes()))
        throw UserError("post-hoc EMA snapshot " + std::to_string(i),
                        "tensor " + name + " is missing or has another shape",
                        "every snapshot of a run holds the same tensors");
      acc.add_(it->second.to(at::kDouble), c[i]);
    }
    out.emplace(name, acc.to(first.scalar_type()));
  }
  for (size_t i = 1; i < maps.size(); ++i)
    if (maps[i].size() != out.size())
      throw UserError("post-hoc EMA snapshot " + std::to_string(i), "holds tensors the first snapshot lacks",
                      "every snapshot of a run holds the same tensors");
  return out;
}

Tracker::Tracker(const std::vector<at::Tensor>& tensors, std::vector<double> gammas) : gammas_(std::move(gammas)) {
  at::NoGradGuard ng;
  for (size_t k = 0; k < gammas_.size(); ++k) {
    std::vector<at::Tensor> copy;
    copy.reserve(tensors.size());
    for (const auto& t : tensors) copy.push_back(t.detach().clone());
    emas_.push_back(std::move(copy));
  }
}

void Tracker::update(const std::vector<at::Tensor>& tensors, int64_t t, const at::Tensor& taken) {
  at::NoGradGuard ng;
  for (size_t k = 0; k < gammas_.size(); ++k) {
    const double w = 1.0 - beta(gammas_[k], t);  // t = 1: w = 1, the profile starts as a copy of θ_1
    if (taken.defined()) {
      const at::Tensor wt = taken * w;  // 0-dim on the device: no host read
      for (size_t i = 0; i < tensors.size(); ++i) emas_[k][i].lerp_(tensors[i], wt);
      continue;
    }
#if TORCH_VERSION_MAJOR >= 2
    at::_foreach_lerp_(emas_[k], tensors, w);
#else
    for (size_t i = 0; i < tensors.size(); ++i) emas_[k][i].lerp_(tensors[i], w);
#endif
  }
}

}  // namespace moh::phema
