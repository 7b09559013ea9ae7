#pragma once
// Samplers of a flow-matching model (diffusion/flow_matching.h), from noise at t0 to data at t1 on the interpolant's
// time (0 = noise, 1 = data):
//   euler   fixed steps on linspace(t0, t1, N + 1) (SiT's ODE with torchdiffeq "euler"; diffusers'
//           FlowMatchEulerDiscreteScheduler on the same grid, σ = 1 − t); with LightningDiT's timestep shift s > 0
//           each grid point t becomes s·t / (1 + (s − 1)·t) (diffusers: shift 1/s on σ);
//   heun    Heun's 2nd order on the same grid, the last step Euler (diffusers' FlowMatchHeunDiscreteScheduler);
//   dopri5  adaptive Dormand–Prince 5(4) with torchdiffeq's controller (Hairer's initial step, RMS error norm,
//           safety 0.9, growth ≤ 10, shrink ≥ 0.2, 4th-order interpolation at t1): SiT's default ODE sampler;
//   sde     Euler–Maruyama on dx = [v + w_t·s] dt + √(2 w_t) dW with w_t = σ_t (SiT sample.py's default diffusion
//           form "sigma"), N − 1 steps on linspace(t0, t1, N), then SiT's "Mean" last step x + drift·(1 − t1).
// The solvers know no network: they call a prediction function, so a closed-form stand-in can drive them in tests.
#include <ATen/ATen.h>

#include <functional>

#include "diffusion/diffusion_config.h"
#include "diffusion/flow_matching.h"
#include "diffusion/ode_solvers.h"

namespace moh::diffusion {

/// Everything a flow chain needs.
struct FlowChainArgs {
  const FlowProcess* process = nullptr;
  /// The network's prediction (velocity, noise or score, as the process says) at x (N, ...) and time t.
  std::function<at::Tensor(const at::Tensor& x, double t)> predict;
  at::Tensor noise;       ///< x at t0 (N, ...)
  int64_t steps = 0;      ///< euler / heun: steps; sde: grid points including the last step's (SiT num_steps)
  SolverSettings solver;  ///< dopri5's atol / rtol; euler / heun: LightningDiT's grid warp (0 = off)
  /// sde: the step's Wiener draw, standard normal shaped like x (the sampler owns the RNG order, e.g. CFG's doubled
  /// batch).
  std::function<at::Tensor(const at::Tensor& x)> draw;
  StepHook on_step;  ///< after every step (dopri5: once per percent of [t0, t1] passed, 100 calls in all)
};

/// A flow chain: returns x at t1.
using FlowChain = at::Tensor (*)(const FlowChainArgs& args);

/// The same warped by LightningDiT's timestep shift: t → s·t / (1 + (s − 1)·t) for s > 0 (s = 0: unchanged).
std::vector<double> shifted_flow_grid(double t0, double t1, int64_t n, double shift);

at::Tensor flow_euler_chain(const FlowChainArgs& args);
at::Tensor flow_heun_chain(const FlowChainArgs& args);
at::Tensor dopri5_chain(const FlowChainArgs& args);
at::Tensor sde_chain(const FlowChainArgs& args);

}  // namespace moh::diffusion
