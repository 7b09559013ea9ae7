#pragma once
// The training objectives of the DiT family, one record each (as diffusion/sampler.h keeps one per sampler): what a
// training step draws and which loss terms it logs, how the network's time input maps to a noise level, which
// samplers run on a model trained by it and how they walk, and the rules its settings obey. Nothing outside a record
// compares an objective's kind: adding one is its Objective value, its record in objectives() and its reference test.
#include <string>
#include <vector>

#include "diffusion/diffusion_config.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/sampler.h"

namespace moh {

/// The training objectives, in the order of objectives(); the first is what a value-initialised Objective means.
enum class Objective : int { ddpm, flow };

}  // namespace moh

namespace moh::diffusion {

/// The processes a training step draws from: DDPM's chain of diffusion.steps and the flow path of diffusion.path /
/// prediction / t_sampling; an objective reads its own.
struct TrainingProcess {
  GaussianDiffusion chain;
  FlowProcess flow;
  explicit TrainingProcess(const DiffusionConfig& c);
};

/// The forward and scaled backward of one training step on clean data (B, C, H, W) with labels y: the loss terms
/// of the objective ("loss" first) and β·aux, λ·REPA (diffusion_trainer.h).
using ObjectiveStep = LossTensors (*)(DiT& model, const TrainingProcess& process, const at::Tensor& data,
                                      const at::Tensor& y, double beta, const RunContext& ctx, const GradScaler& scaler,
                                      int rank, int world, const RepaTerm& repa);

/// Everything the toolkit knows about one training objective.
struct ObjectiveRecord {
  Objective kind;
  const char* name;        ///< its word in diffusion.objective (the schema's Objective table)
  const char* model_word;  ///< how messages name a model trained by it ("a DDPM model")
  const char* summary;     ///< what it is and whose formulas it follows
  ObjectiveStep train_step;
  std::vector<const char*> loss_terms;  ///< the step's logged terms besides aux / repa, "loss" first
  /// Time ↔ noise level, as one line u = level_at_zero + level_slope · t (per chain step when slope_per_step, i.e.
  /// t / (T − 1)), clamped to [0, 1]; read through noise_level() and chain_timestep() only.
  double level_at_zero, level_slope;
  bool slope_per_step;
  bool (*admits)(const SamplerRecord& sampler);    ///< whether a sampler runs on a model trained by it
  at::Tensor (*reverse)(const ReverseArgs& args);  ///< the sampling chain sample_loop runs (sampler.h)
  int64_t (*planned_nfe)(const SampleOptions& options, const GaussianDiffusion& chain);  ///< its network evaluations
  bool solver_steps_within_chain;  ///< a solver's step count is at most diffusion.steps (it walks the chain's ᾱ)
  bool warps_flow_grid;            ///< sampling.timestep_shift applies (flow euler / heun)
  const char* steps_hint;          ///< the step counts its reference code samples with, for messages
  /// The rules of its settings against the model `name` (a UserError naming the key); none is nullptr.
  void (*validate)(const DiffusionConfig& config, const DiTOptions& model, const std::string& name);

  /// The noise level u ∈ [0, 1] (1 = pure noise) of the network's time input t for a training chain of T steps
  /// (guidance intervals and head budgets read it).
  double noise_level(double t, int64_t T) const;
  /// The timestep of a T-step DDPM chain at the same noise level, u · (T − 1), without its rounding for a DDPM model
  /// (head-load statistics bucket every objective's evaluations by it).
  double chain_timestep(double t, int64_t T) const;
};

/// Every objective, in the schema's order.
const std::vector<ObjectiveRecord>& objectives();
/// The record of `kind`.
const ObjectiveRecord& objective_record(Objective kind);
/// The first objective whose models `sampler` runs on (a benchmark's chain without a trained model).
Objective objective_of_sampler(SamplerKind sampler);

}  // namespace moh::diffusion
