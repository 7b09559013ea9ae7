#pragma once
// Reverse-process sampling for DiT / MoH-DiT: DDPM ancestral sampling (p_sample_loop, what DiT's sample.py and
// sample_ddp.py run), DDIM (η configurable) and the probability-flow ODE solvers of ode_solvers.h (dpm++2m, euler,
// heun), with classifier-free guidance exactly as DiT's forward_with_cfg: the batch is doubled with null labels, the
// model sees the first half twice, guidance is applied to the first 3 output channels (DiT's reproducibility quirk)
// or to every ε channel, and the variance channels are not guided. A guidance interval (Kynkäänniemi et al. 2024)
// guides only where the noise level u = t / (T − 1) of the model timestep t lies in [lo, hi] (1 = pure noise);
// elsewhere one conditional forward on the un-doubled batch.
#include <array>
#include <functional>
#include <vector>

#include "diffusion/cuda_graph.h"
#include "diffusion/diffusion_config.h"
#include "diffusion/dit.h"
#include "diffusion/flow_solvers.h"
#include "diffusion/gaussian_diffusion.h"
#include "diffusion/ode_solvers.h"

namespace moh::diffusion {

/// How to run the reverse process.
struct SampleOptions {
  SamplerKind sampler = SamplerKind::ddpm;
  Objective
      objective{};   ///< ddpm (the default) or flow: what the model predicts: DDPM's ε chain or a flow (then `flow`)
  FlowProcess flow;  ///< objective: flow
  SolverSettings solver;   ///< η (DDIM), dopri5's tolerances, the flow grid's warp
  double cfg_scale = 1.0;  ///< 1 = plain forward, no doubling (sample_ddp's behaviour)
  CfgChannels cfg_channels = CfgChannels::three;
  bool clip_denoised = false;                    ///< DiT never clips
  std::array<double, 2> cfg_interval{0.0, 1.0};  ///< guide where lo ≤ t / (T − 1) ≤ hi
  int64_t ode_steps = 0;       ///< solver steps of dpm++2m / euler / heun / sde (DDPM / DDIM: the respaced chain's)
  int64_t train_steps = 1000;  ///< T of the training chain (the noise-level fraction's scale; DDPM models)
  int64_t topk = -1;           ///< K of every routed MoH layer (−1 = as trained)
  std::vector<int64_t> topk_schedule;  ///< K by noise-level bucket, clean → noise (overrides topk)
  int64_t guide_topk = -1;             ///< K of the unconditional branch (CFG then runs as two forwards)
  bool cuda_graph = false;             ///< replay the network evaluations as CUDA graphs where they can be
};

/// How a sampler walks time: a respaced chain of the training process ("250", "ddim50"), or a solver's own grid of
/// `steps` points over the base chain's ᾱ table.
enum class SamplerGrid { respaced, solver };

/// x_{t−1} of an ancestral step from the model's prediction `p` at step t of `chain`, the state x, the step's noise
/// z and DDIM's η (`last`: the step to t = 0, which adds no noise).
using AncestralUpdate = at::Tensor (*)(const GaussianDiffusion& chain, const GaussianDiffusion::MeanVariance& p,
                                       const at::Tensor& x, const at::Tensor& t, const at::Tensor& z, double eta,
                                       bool last);
/// A solver's time grid from the base chain's ᾱ table and its step count.
using SolverGrid = OdeGrid (*)(const std::vector<double>& alphas_cumprod, int64_t steps);
/// A solver's chain over its grid (ode_solvers.h).
using SolverChain = at::Tensor (*)(const EpsModel& eps, const at::Tensor& noise, const OdeGrid& grid,
                                   const StepHook& on_step, bool clip_x0);

/// Everything the toolkit knows about one sampler, in one place: adding a sampler is its SamplerKind value and an
/// entry of samplers() (which also names it for the schema) plus its reference test. The loop, the NFE count, the chain
/// and the progress bar all read it.
struct SamplerRecord {
  SamplerKind kind;
  const char* name;     ///< the word of sampling.sampler / --sampler (the schema's SamplerKind table is these)
  const char* summary;  ///< what it is and whose formulas it follows
  SamplerGrid grid;
  int evals_per_step = 1;            ///< network evaluations of one step (one more per guided evaluation's CFG pair)
  bool last_step_single = false;     ///< the last step evaluates once (Heun's step to σ = 0)
  bool stochastic = false;           ///< fresh noise every step (DDPM; DDIM with η > 0)
  bool cfg_interval = true;          ///< guidance can be limited to a noise-level interval
  bool head_budget = true;           ///< the MoH head budget (topk, topk_schedule, guide_topk) applies per evaluation
  AncestralUpdate update = nullptr;  ///< respaced samplers
  SolverGrid make_grid = nullptr;    ///< solver samplers
  SolverChain chain = nullptr;       ///< solver samplers
  bool runs_ddpm = true;             ///< runs on DDPM (ε) models
  FlowChain flow_chain = nullptr;    ///< runs on flow models with this chain (diffusion/flow_solvers.h)
  bool adaptive = false;             ///< its step count is found while it runs (dopri5): NFE measured, not planned
  bool timestep_shift = false;       ///< walks a fixed flow grid that sampling.timestep_shift can warp
};

/// Every sampler, in the schema's order.
const std::vector<SamplerRecord>& samplers();
/// The record of `kind`.
const SamplerRecord& sampler_record(SamplerKind kind);

/// True for the samplers with their own time grid (the DDPM probability-flow ODE solvers and every flow sampler): they
/// take a step count rather than a respacing.
bool is_ode_sampler(SamplerKind kind);

/// Whether `kind` runs on a model trained for `objective`.
bool runs_on(SamplerKind kind, Objective objective);
/// The names of the samplers that run on `objective`, for messages ("euler, heun, dopri5 or sde").
std::string samplers_for(Objective objective);

/// The chain a sampler walks: DDPM / DDIM the respacing `steps` over T ("250", "ddim50"); the ODE solvers the base
/// chain of T steps (their grid is built from its ᾱ).
GaussianDiffusion sampling_chain(SamplerKind kind, int64_t T, const std::string& steps);

/// Steps of the loop (on_step calls per batch).
int64_t sampler_steps(const SampleOptions& options, const GaussianDiffusion& chain);

/// Network evaluations per image the loop will make: 2 per guided step, 1 per unguided step (Heun: 2 per step but
/// the last); −1 for an adaptive sampler (dopri5), whose count sample_loop's `nfe` measures.
int64_t planned_nfe(const SampleOptions& options, const GaussianDiffusion& chain);

/// DiT's forward_with_cfg on a doubled batch x = [x_c; x_u], y = [labels; null]: returns the guided output.
at::Tensor forward_with_cfg(DiT& model, const at::Tensor& x, const at::Tensor& t_model, const at::Tensor& y,
                            double scale, CfgChannels channels);

/// Runs the chain from `noise` (N, C, H, W) for class `labels` (N) and returns x0 samples (N, C, H, W) in the model's
/// data space ([−1, 1] for pixels). Randomness comes from the global generator in DiT's order (the caller draws the
/// noise first; then DDPM / DDIM draw one randn_like of the (doubled) batch per step). `on_step` is called after every
/// step; `nfe`, when given, is increased by the network evaluations per image. `graphs` (built on `model`) keeps
/// CUDA graphs across calls; without it a call with options.cuda_graph captures its own.
at::Tensor sample_loop(DiT& model, const GaussianDiffusion& chain, const at::Tensor& noise, const at::Tensor& labels,
                       const SampleOptions& options, const std::function<void()>& on_step = {}, int64_t* nfe = nullptr,
                       GraphedForward* graphs = nullptr);

/// The MoH head budget of each network evaluation (sampling.topk, topk_schedule, guide_topk), as sample_loop sets it.
class HeadBudget;

/// What sample_loop hands an objective's reverse process (objective.h): the network, the chain, the noise (n, ...), the
/// labels ([labels; null] with CFG), the options, the head budget, the step callback and the evaluation count.
struct ReverseArgs {
  GraphedForward& net;
  const GaussianDiffusion& chain;
  const at::Tensor& noise;
  const at::Tensor& y;
  const SampleOptions& options;
  HeadBudget& heads;
  const std::function<void()>& on_step;
  int64_t& nfe;
};
/// The reverse process of a DDPM (ε) model: the ancestral / DDIM chain, or the sampler's solver over the base chain.
at::Tensor ddpm_reverse(const ReverseArgs& args);
/// The reverse process of a flow model: the sampler's flow chain (flow_solvers.h).
at::Tensor flow_reverse(const ReverseArgs& args);
/// planned_nfe of a DDPM model's chain and of a flow model's.
int64_t ddpm_planned_nfe(const SampleOptions& options, const GaussianDiffusion& chain);
int64_t flow_planned_nfe(const SampleOptions& options, const GaussianDiffusion& chain);

/// Pixel samples in [−1, 1] → uint8 NHWC exactly as sample_ddp.py: clamp(127.5·x + 128, 0, 255) truncated.
at::Tensor to_uint8_nhwc(const at::Tensor& samples);

}  // namespace moh::diffusion
