#pragma once
// Deterministic samplers on the probability-flow ODE of a discrete VP chain (DiT's linear schedule), for an
// ε-predicting model: Euler and Heun in the σ parameterisation of Karras et al. 2022 (x_σ = x_0 + σ·ε,
// σ = √((1 − ᾱ)/ᾱ), the network sees x_σ / √(σ² + 1)), and DPM-Solver++(2M) (Lu et al. 2022, data prediction,
// multistep, first order at the first and the last step). Grids and update rules follow diffusers'
// EulerDiscreteScheduler and DPMSolverMultistepScheduler with their defaults (timestep_spacing "linspace", linear
// σ interpolation, final σ = 0, DPM++ "midpoint"), so that the same noise and model outputs give the same chain
// (pyref_solvers); Heun is Karras et al.'s Algorithm 1 on the Euler grid. The solvers know no network: they call
// an ε model, so a closed-form stand-in can drive them in tests.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace moh::diffusion {

/// ε at VP input x (N, C, H, W) and (possibly fractional) model timestep t → (N, C, H, W).
using EpsModel = std::function<at::Tensor(const at::Tensor& x, double t)>;

/// Called after step i with the state x_{i+1} (σ parameterisation for Euler / Heun, VP for DPM-Solver++).
using StepHook = std::function<void(int64_t i, const at::Tensor& x)>;

/// The points an ODE solver visits: model timesteps (N, descending) and σ (N + 1, the last one 0).
struct OdeGrid {
  std::vector<double> timesteps, sigmas;
  int64_t steps() const { return static_cast<int64_t>(timesteps.size()); }
};

/// Euler / Heun grid (EulerDiscreteScheduler "linspace"): t_i = linspace(0, T − 1, N) reversed, in float32 as
/// diffusers stores them, σ linearly interpolated in the table of the T training steps.
OdeGrid karras_grid(const std::vector<double>& alphas_cumprod, int64_t steps);

/// DPM-Solver grid (DPMSolverMultistepScheduler "linspace"): t_i = round(linspace(0, T − 1, N + 1)) reversed without
/// its last entry, σ from the table.
OdeGrid dpm_grid(const std::vector<double>& alphas_cumprod, int64_t steps);

// Every solver forms the data estimate x̂_0 = D(x; σ) at each evaluation; clip_x0 clamps it to [−1, 1] (DiT's
// clip_denoised for pixel models; off in diffusers' defaults and in the reference comparison).

/// Euler from x = noise·σ_0 (diffusers' init_noise_sigma for "linspace") to σ = 0; returns x_0. N model calls.
at::Tensor euler_chain(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& grid, const StepHook& on_step = {},
                       bool clip_x0 = false);

/// Heun (Karras et al. 2022, Algorithm 1, deterministic): an Euler step corrected by the slope at its end, except
/// the last step to σ = 0; returns x_0. 2N − 1 model calls.
at::Tensor heun_chain(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& grid, const StepHook& on_step = {},
                      bool clip_x0 = false);

/// DPM-Solver++(2M) from x = noise (VP, σ_max ≈ 157 for T = 1000 makes x_T ≈ ε) to σ = 0; returns x_0. N model
/// calls.
at::Tensor dpmpp_2m_chain(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& grid,
                          const StepHook& on_step = {}, bool clip_x0 = false);

}  // namespace moh::diffusion
