#include "diffusion/flow_solvers.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace moh::diffusion {

namespace {

at::Tensor flow_times(double t, const at::Tensor& x) {
  return at::full({x.size(0)}, t, x.options());
}

// The probability-flow velocity at (x, t) from one network prediction.
at::Tensor velocity_at(const FlowChainArgs& a, const at::Tensor& x, double t) {
  return a.process->velocity(a.predict(x, t), x, flow_times(t, x));
}

void check_args(const FlowChainArgs& a, int64_t min_steps) {
  TORCH_CHECK(a.process && a.predict && a.noise.defined(), "flow chain: process, prediction and noise are needed");
  TORCH_CHECK(a.steps >= min_steps, "flow chain: needs at least ", min_steps, " steps, got ", a.steps);
}

}  // namespace

namespace {
std::vector<double> flow_grid(double t0, double t1, int64_t n) {
  TORCH_CHECK(n >= 2, "flow_grid: needs >= 2 points");
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    g[static_cast<size_t>(i)] = t0 + (t1 - t0) * static_cast<double>(i) / static_cast<double>(n - 1);
  g.back() = t1;
  return g;
}
}  // namespace

std::vector<double> shifted_flow_grid(double t0, double t1, int64_t n, double shift) {
  std::vector<double> g = flow_grid(t0, t1, n);
  if (shift > 0)
    for (double& t : g) t = shift * t / (1.0 + (shift - 1.0) * t);  // LightningDiT's compute_tm
  return g;
}

at::Tensor flow_euler_chain(const FlowChainArgs& a) {
  check_args(a, 1);
  const auto [t0, t1] = a.process->sample_interval(false);
  const std::vector<double> g = shifted_flow_grid(t0, t1, a.steps + 1, a.solver.timestep_shift);
  at::Tensor x = a.noise;
  for (size_t i = 0; i + 1 < g.size(); ++i) {
    x = x + (g[i + 1] - g[i]) * velocity_at(a, x, g[i]);
    if (a.on_step) a.on_step(static_cast<int64_t>(i), x);
  }
  return x;
}

at::Tensor flow_heun_chain(const FlowChainArgs& a) {
  check_args(a, 1);
  const auto [t0, t1] = a.process->sample_interval(false);
  const std::vector<double> g = shifted_flow_grid(t0, t1, a.steps + 1, a.solver.timestep_shift);
  at::Tensor x = a.noise;
  for (size_t i = 0; i + 1 < g.size(); ++i) {
    const double dt = g[i + 1] - g[i];
    const at::Tensor v = velocity_at(a, x, g[i]);
    const at::Tensor x_euler = x + dt * v;
    // The last step stays Euler, as diffusers' Heun does into σ = 0 (and Karras et al.'s Algorithm 1).
    x = i + 2 == g.size() ? x_euler : x + dt * 0.5 * (v + velocity_at(a, x_euler, g[i + 1]));
    if (a.on_step) a.on_step(static_cast<int64_t>(i), x);
  }
  return x;
}

at::Tensor sde_chain(const FlowChainArgs& a) {
  check_args(a, 2);
  TORCH_CHECK(a.draw, "sde_chain: needs a noise draw");
  const auto [t0, t1] = a.process->sample_interval(true);
  const std::vector<double> g = flow_grid(t0, t1, a.steps);
  // SiT's drift v + w_t·s with the diffusion coefficient w_t = σ_t, both from one prediction.
  auto drift = [&](const at::Tensor& x, double t, at::Tensor* w) {
    const at::Tensor out = a.predict(x, t), tt = flow_times(t, x);
    *w = a.process->coefficients(tt).sigma.reshape({-1, 1, 1, 1}).to(x.scalar_type());
    return a.process->velocity(out, x, tt) + *w * a.process->score(out, x, tt);
  };
  const double dt = g[1] - g[0];
  at::Tensor x = a.noise, w;
  for (size_t i = 0; i + 1 < g.size(); ++i) {
    const at::Tensor z = a.draw(x);  // SiT draws the Wiener increment before evaluating the drift
    const at::Tensor mean = x + drift(x, g[i], &w) * dt;
    x = mean + at::sqrt(2.0 * w) * z * std::sqrt(dt);
    if (a.on_step) a.on_step(static_cast<int64_t>(i), x);
  }
  x = x + drift(x, t1, &w) * (1.0 - t1);  // SiT's "Mean" last step of size 1 − t1
  if (a.on_step) a.on_step(a.steps - 1, x);
  return x;
}

namespace {

// Dormand–Prince 5(4) (Shampine's tableau as in torchdiffeq dopri5.py): stage times, stage weights, the error
// weights (5th − 4th order solution) and the weights of the midpoint used by the interpolant.
constexpr std::array<double, 6> kStageT{1.0 / 5, 3.0 / 10, 4.0 / 5, 8.0 / 9, 1.0, 1.0};
const std::array<std::vector<double>, 6> kStageW{{
    {1.0 / 5},
    {3.0 / 40, 9.0 / 40},
    {44.0 / 45, -56.0 / 15, 32.0 / 9},
    {19372.0 / 6561, -25360.0 / 2187, 64448.0 / 6561, -212.0 / 729},
    {9017.0 / 3168, -355.0 / 33, 46732.0 / 5247, 49.0 / 176, -5103.0 / 18656},
    {35.0 / 384, 0, 500.0 / 1113, 125.0 / 192, -2187.0 / 6784, 11.0 / 84},
}};
constexpr std::array<double, 7> kErrW{35.0 / 384 - 1951.0 / 21600,
                                      0,
                                      500.0 / 1113 - 22642.0 / 50085,
                                      125.0 / 192 - 451.0 / 720,
                                      -2187.0 / 6784 - -12231.0 / 42400,
                                      11.0 / 84 - 649.0 / 6300,
                                      -1.0 / 60};
constexpr std::array<double, 7> kMidW{6025192743.0 / 30085553152 / 2,     0,
                                      51252292925.0 / 65400821598 / 2,    -2691868925.0 / 45128329728 / 2,
                                      187940372067.0 / 1594534317056 / 2, -1776094331.0 / 19743644256 / 2,
                                      11237099.0 / 235043384 / 2};
constexpr double kSafety = 0.9, kGrow = 10.0, kShrink = 0.2, kOrder = 5.0;

double rms(const at::Tensor& x) {
  return x.to(at::kDouble).pow(2).mean().sqrt().item<double>();
}

at::Tensor weighted(const std::vector<at::Tensor>& k, const double* w, size_t n) {
  at::Tensor s = k[0] * w[0];
  for (size_t j = 1; j < n; ++j)
    if (w[j] != 0.0) s = s + k[j] * w[j];
  return s;
}

// Hairer, Nørsett & Wanner, Sec. II.4 (torchdiffeq _select_initial_step, order 4).
double initial_step(const FlowChainArgs& a, const at::Tensor& y0, const at::Tensor& f0, double t0) {
  const at::Tensor scale = a.solver.atol + y0.abs() * a.solver.rtol;
  const double d0 = rms(y0 / scale), d1 = rms(f0 / scale);
  const double h0 = (d0 < 1e-5 || d1 < 1e-5) ? 1e-6 : 0.01 * d0 / d1;
  const at::Tensor f1 = velocity_at(a, y0 + h0 * f0, t0 + h0);
  const double d2 = rms((f1 - f0) / scale) / h0;
  const double h1 =
      (d1 <= 1e-15 && d2 <= 1e-15) ? std::max(1e-6, h0 * 1e-3) : std::pow(0.01 / std::max(d1, d2), 1.0 / kOrder);
  return std::min(100 * h0, h1);
}

// The 4th-order polynomial through one accepted step (torchdiffeq _interp_fit), evaluated at fraction s ∈ [0, 1].
at::Tensor interpolate(const at::Tensor& y0, const at::Tensor& y1, const std::vector<at::Tensor>& k, double dt,
                       double s) {
  const at::Tensor mid = y0 + dt * weighted(k, kMidW.data(), 7), &f0 = k[0], &f1 = k[6];
  const at::Tensor c4 = 2 * dt * (f1 - f0) - 8 * (y1 + y0) + 16 * mid;
  const at::Tensor c3 = dt * (5 * f0 - 3 * f1) + 18 * y0 + 14 * y1 - 32 * mid;
  const at::Tensor c2 = dt * (f1 - 4 * f0) - 11 * y0 - 5 * y1 + 16 * mid;
  return y0 + s * (dt * f0 + s * (c2 + s * (c3 + s * c4)));
}

}  // namespace

at::Tensor dopri5_chain(const FlowChainArgs& a) {
  check_args(a, 0);
  const auto [t0, t1] = a.process->sample_interval(false);
  at::Tensor y = a.noise, f = velocity_at(a, y, t0), y_prev;
  double t = t0, t_prev = t0, dt = initial_step(a, y, f, t0), dt_done = 0;
  std::vector<at::Tensor> k(7), k_done;
  int64_t reported = 0;
  while (t < t1) {
    TORCH_CHECK(t + dt > t, "dopri5: step size underflow at t = ", t);
    k[0] = f;
    at::Tensor yi;
    for (size_t i = 0; i < 6; ++i) {  // stages 2…7; the 7th is the solution itself (first same as last)
      yi = y + dt * weighted(k, kStageW[i].data(), i + 1);
      k[i + 1] = velocity_at(a, yi, kStageT[i] == 1.0 ? t + dt : t + kStageT[i] * dt);
    }
    const at::Tensor err = dt * weighted(k, kErrW.data(), 7);
    const double ratio = rms(err / (a.solver.atol + a.solver.rtol * at::max(y.abs(), yi.abs())));
    if (ratio <= 1) {  // accepted
      y_prev = y, t_prev = t, dt_done = dt, k_done = k;
      y = yi, f = k[6], t = t + dt;
      const auto pct = static_cast<int64_t>(100 * (std::min(t, t1) - t0) / (t1 - t0));
      for (; a.on_step && reported < std::min<int64_t>(pct, 100); ++reported) a.on_step(reported, y);
    }
    const double factor =
        ratio == 0 ? kGrow
                   : std::min(kGrow, std::max(kSafety / std::pow(ratio, 1.0 / kOrder), ratio < 1 ? 1.0 : kShrink));
    dt *= factor;
  }
  for (; a.on_step && reported < 100; ++reported) a.on_step(reported, y);
  // The last step usually passes t1: the value at t1 comes from that step's interpolant.
  return t == t1 ? y : interpolate(y_prev, y, k_done, dt_done, (t1 - t_prev) / dt_done);
}

}  // namespace moh::diffusion
