#include "diffusion/diffusion_schedule.h"

#include <cfenv>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/parse.h"

namespace moh::diffusion {

std::vector<double> linear_betas(int64_t T) {
  const double scale = 1000.0 / static_cast<double>(T);
  const double a = scale * kLinearBetaStart, b = scale * kLinearBetaEnd;
  std::vector<double> betas(T);
  // numpy.linspace: start + i·step, with the last value exactly `stop`.
  const double step = T > 1 ? (b - a) / static_cast<double>(T - 1) : 0.0;
  for (int64_t i = 0; i < T; ++i) betas[i] = a + static_cast<double>(i) * step;
  if (T > 1) betas[T - 1] = b;
  return betas;
}

DiffusionSchedule make_schedule(const std::vector<double>& betas) {
  DiffusionSchedule s;
  const size_t T = betas.size();
  s.betas = betas;
  s.alphas_cumprod.resize(T);
  double acc = 1.0;
  for (size_t t = 0; t < T; ++t) s.alphas_cumprod[t] = acc *= (1.0 - betas[t]);
  s.alphas_cumprod_prev.resize(T);
  s.alphas_cumprod_next.resize(T);
  for (size_t t = 0; t < T; ++t) {
    s.alphas_cumprod_prev[t] = t == 0 ? 1.0 : s.alphas_cumprod[t - 1];
    s.alphas_cumprod_next[t] = t + 1 < T ? s.alphas_cumprod[t + 1] : 0.0;
  }
  for (size_t t = 0; t < T; ++t) {
    const double ab = s.alphas_cumprod[t], abp = s.alphas_cumprod_prev[t];
    s.sqrt_alphas_cumprod.push_back(std::sqrt(ab));
    s.sqrt_one_minus_alphas_cumprod.push_back(std::sqrt(1.0 - ab));
    s.sqrt_recip_alphas_cumprod.push_back(std::sqrt(1.0 / ab));
    s.sqrt_recipm1_alphas_cumprod.push_back(std::sqrt(1.0 / ab - 1.0));
    s.posterior_variance.push_back(betas[t] * (1.0 - abp) / (1.0 - ab));
    s.posterior_mean_coef1.push_back(betas[t] * std::sqrt(abp) / (1.0 - ab));
    s.posterior_mean_coef2.push_back((1.0 - abp) * std::sqrt(1.0 - betas[t]) / (1.0 - ab));
  }
  // log of the posterior variance with the t = 0 entry (which is 0) replaced by the t = 1 value.
  for (size_t t = 0; t < T; ++t)
    s.posterior_log_variance_clipped.push_back(
        std::log(T > 1 && t == 0 ? s.posterior_variance[1] : s.posterior_variance[t]));
  s.timestep_map.resize(T);
  for (size_t t = 0; t < T; ++t) s.timestep_map[t] = static_cast<int64_t>(t);
  return s;
}

std::vector<int64_t> space_timesteps(int64_t T, const std::string& spec) {
  std::set<int64_t> steps;
  const std::string what = "timestep respacing \"" + spec + "\"";
  if (spec.empty()) {
    for (int64_t t = 0; t < T; ++t) steps.insert(t);
    return {steps.begin(), steps.end()};
  }
  if (spec.rfind("ddim", 0) == 0) {
    const std::optional<int64_t> parsed = parse_int(spec.substr(4));
    if (!parsed) throw UserError(what, "expected ddimN with an integer N", "e.g. ddim50");
    const int64_t want = *parsed;
    for (int64_t stride = 1; stride < T; ++stride) {
      if ((T + stride - 1) / stride == want) {
        std::vector<int64_t> out;
        for (int64_t t = 0; t < T; t += stride) out.push_back(t);
        return out;
      }
    }
    throw UserError(what, "cannot create exactly " + std::to_string(want) + " steps with an integer stride",
                    "pick another count, e.g. ddim50 or ddim250");
  }
  std::vector<int64_t> counts;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    std::string part = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::optional<int64_t> count = parse_int(part);
    if (!count) throw UserError(what, "expected step counts like 250 or 10,15,20, or ddimN", "");
    counts.push_back(*count);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const int64_t sections = static_cast<int64_t>(counts.size());
  const int64_t size_per = T / sections, extra = T % sections;
  int64_t start_idx = 0;
  std::fesetround(FE_TONEAREST);  // Python round(): half to even
  for (int64_t i = 0; i < sections; ++i) {
    const int64_t size = size_per + (i < extra ? 1 : 0), count = counts[i];
    if (count <= 0 || size < count)
      throw UserError(what,
                      "cannot divide a section of " + std::to_string(size) + " steps into " + std::to_string(count),
                      "use at most " + std::to_string(T) + " steps");
    const double frac_stride = count <= 1 ? 1.0 : static_cast<double>(size - 1) / static_cast<double>(count - 1);
    double cur = 0.0;
    for (int64_t k = 0; k < count; ++k) {
      steps.insert(start_idx + static_cast<int64_t>(std::nearbyint(cur)));
      cur += frac_stride;
    }
    start_idx += size;
  }
  return {steps.begin(), steps.end()};
}

DiffusionSchedule respace(const std::vector<double>& base_betas, const std::vector<int64_t>& use_timesteps) {
  DiffusionSchedule base = make_schedule(base_betas);
  std::set<int64_t> keep(use_timesteps.begin(), use_timesteps.end());
  std::vector<double> betas;
  std::vector<int64_t> map;
  double last = 1.0;
  for (int64_t t = 0; t < base.num_steps(); ++t) {
    if (!keep.count(t)) continue;
    betas.push_back(1.0 - base.alphas_cumprod[t] / last);
    last = base.alphas_cumprod[t];
    map.push_back(t);
  }
  DiffusionSchedule s = make_schedule(betas);
  s.timestep_map = map;
  return s;
}

}  // namespace moh::diffusion
