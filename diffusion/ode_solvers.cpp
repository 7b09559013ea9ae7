#include "diffusion/ode_solvers.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace moh::diffusion {

namespace {

// σ_t = √((1 − ᾱ_t)/ᾱ_t) of the T training steps.
std::vector<double> sigma_table(const std::vector<double>& alphas_cumprod) {
  std::vector<double> s;
  for (double a : alphas_cumprod) s.push_back(std::sqrt((1.0 - a) / a));
  return s;
}

// numpy.interp(t, arange(T), table) for t in [0, T − 1].
double interp(const std::vector<double>& table, double t) {
  const auto lo = static_cast<size_t>(std::floor(t));
  if (lo + 1 >= table.size()) return table.back();
  const double w = t - static_cast<double>(lo);
  return table[lo] + w * (table[lo + 1] - table[lo]);
}

// numpy.linspace(0, stop, num): i·step with the last value exactly stop.
std::vector<double> linspace(double stop, int64_t num) {
  std::vector<double> v(static_cast<size_t>(num));
  const double step = num > 1 ? stop / static_cast<double>(num - 1) : 0.0;
  for (int64_t i = 0; i < num; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i) * step;
  if (num > 1) v.back() = stop;
  return v;
}

void check_grid(const OdeGrid& g) {
  TORCH_CHECK(g.steps() >= 1 && g.sigmas.size() == g.timesteps.size() + 1 && g.sigmas.back() == 0.0,
              "ODE solver: malformed grid");
}

// The network input of the σ parameterisation: x_σ / √(σ² + 1) is a sample of the VP chain at that noise level.
at::Tensor eps_at(const EpsModel& eps, const at::Tensor& x, double sigma, double t) {
  return eps(x / std::sqrt(sigma * sigma + 1.0), t);
}

at::Tensor denoised(const at::Tensor& x0, bool clip) {
  return clip ? x0.clamp(-1.0, 1.0) : x0;
}

}  // namespace

OdeGrid karras_grid(const std::vector<double>& alphas_cumprod, int64_t steps) {
  TORCH_CHECK(steps >= 1 && alphas_cumprod.size() >= 2, "karras_grid: needs steps >= 1 and T >= 2");
  const std::vector<double> table = sigma_table(alphas_cumprod);
  const std::vector<double> t = linspace(static_cast<double>(table.size() - 1), steps);
  OdeGrid g;
  for (auto it = t.rbegin(); it != t.rend(); ++it) {
    const double ts = static_cast<double>(static_cast<float>(*it));  // diffusers keeps float32 timesteps
    g.timesteps.push_back(ts);
    g.sigmas.push_back(interp(table, ts));
  }
  g.sigmas.push_back(0.0);
  return g;
}

OdeGrid dpm_grid(const std::vector<double>& alphas_cumprod, int64_t steps) {
  TORCH_CHECK(steps >= 1 && alphas_cumprod.size() >= 2, "dpm_grid: needs steps >= 1 and T >= 2");
  const std::vector<double> table = sigma_table(alphas_cumprod);
  const std::vector<double> t = linspace(static_cast<double>(table.size() - 1), steps + 1);
  OdeGrid g;
  for (int64_t i = steps; i >= 1; --i) {                          // reversed, without t = 0
    const double ts = std::nearbyint(t[static_cast<size_t>(i)]);  // numpy.round: half to even
    g.timesteps.push_back(ts);
    g.sigmas.push_back(table[static_cast<size_t>(ts)]);
  }
  g.sigmas.push_back(0.0);
  return g;
}

at::Tensor euler_chain(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& g, const StepHook& on_step,
                       bool clip_x0) {
  check_grid(g);
  at::Tensor x = noise * g.sigmas[0];
  for (int64_t i = 0; i < g.steps(); ++i) {
    const double s = g.sigmas[static_cast<size_t>(i)], s_next = g.sigmas[static_cast<size_t>(i) + 1];
    const at::Tensor x0 = denoised(x - s * eps_at(eps, x, s, g.timesteps[static_cast<size_t>(i)]), clip_x0);
    const at::Tensor d = (x - x0) / s;  // dx/dσ
    x = x + d * (s_next - s);
    if (on_step) on_step(i, x);
  }
  return x;
}

at::Tensor heun_chain(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& g, const StepHook& on_step,
                      bool clip_x0) {
  check_grid(g);
  at::Tensor x = noise * g.sigmas[0];
  for (int64_t i = 0; i < g.steps(); ++i) {
    const auto k = static_cast<size_t>(i);
    const double s = g.sigmas[k], s_next = g.sigmas[k + 1];
    const at::Tensor d = (x - denoised(x - s * eps_at(eps, x, s, g.timesteps[k]), clip_x0)) / s;
    const at::Tensor x_euler = x + d * (s_next - s);
    if (s_next == 0.0) {
      x = x_euler;  // the last step: Euler (Algorithm 1, line 7 skipped at σ = 0)
    } else {
      const at::Tensor x0 = denoised(x_euler - s_next * eps_at(eps, x_euler, s_next, g.timesteps[k + 1]), clip_x0);
      const at::Tensor d2 = (x_euler - x0) / s_next;
      x = x + (s_next - s) * 0.5 * (d + d2);
    }
    if (on_step) on_step(i, x);
  }
  return x;
}

at::Tensor dpmpp_2m_chain(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& g, const StepHook& on_step,
                          bool clip_x0) {
  check_grid(g);
  auto alpha = [](double sigma) { return 1.0 / std::sqrt(sigma * sigma + 1.0); };
  auto lambda = [&](double sigma) { return std::log(alpha(sigma)) - std::log(sigma * alpha(sigma)); };
  at::Tensor x = noise, d_prev;
  for (int64_t i = 0; i < g.steps(); ++i) {
    const auto k = static_cast<size_t>(i);
    const double s = g.sigmas[k], s_next = g.sigmas[k + 1];
    const double a_s = alpha(s), sig_s = s * a_s;
    const at::Tensor d0 = denoised((x - sig_s * eps(x, g.timesteps[k])) / a_s, clip_x0);  // data prediction x̂_0
    if (s_next == 0.0) {
      x = d0;  // first order into σ = 0: (σ_t/σ_s)·x → 0, α_t = 1, e^{−h} → 0
    } else {
      const double a_t = alpha(s_next), sig_t = s_next * a_t, h = lambda(s_next) - lambda(s);
      x = (sig_t / sig_s) * x - (a_t * (std::exp(-h) - 1.0)) * d0;
      if (d_prev.defined()) {  // second order from the previous step's x̂_0 (midpoint form)
        const double r0 = (lambda(s) - lambda(g.sigmas[k - 1])) / h;
        x = x - 0.5 * (a_t * (std::exp(-h) - 1.0)) * ((1.0 / r0) * (d0 - d_prev));
      }
    }
    d_prev = d0;
    if (on_step) on_step(i, x);
  }
  return x;
}

}  // namespace moh::diffusion
