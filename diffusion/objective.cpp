#include "diffusion/objective.h"

#include <algorithm>
#include <stdexcept>

#include "core/error.h"

namespace moh {

const config::EnumTable<Objective>& enum_table(Objective) {
  static const config::EnumTable<Objective> t = [] {  // the objective records name their kinds
    config::EnumTable<Objective> names;
    for (const auto& r : diffusion::objectives()) names.emplace_back(r.kind, r.name);
    return names;
  }();
  return t;
}

}  // namespace moh

namespace moh::diffusion {

TrainingProcess::TrainingProcess(const DiffusionConfig& c) : chain(GaussianDiffusion::base(c.steps)), flow(c.flow) {}

namespace {

// DiT's train.py: t ~ U{0..T−1}, q_sample, the hybrid loss (MSE on ε + the learned σ's variational bound).
LossTensors ddpm_step(DiT& model, const TrainingProcess& p, const at::Tensor& data, const at::Tensor& y, double beta,
                      const RunContext& ctx, const GradScaler& scaler, int rank, int world, const RepaTerm& repa) {
  return diffusion_backward(model, p.chain, data, y, beta, ctx, scaler, rank, world, repa);
}
// SiT's train.py: t on the interpolant by diffusion.t_sampling, the velocity / noise / score loss.
LossTensors flow_step(DiT& model, const TrainingProcess& p, const at::Tensor& data, const at::Tensor& y, double beta,
                      const RunContext& ctx, const GradScaler& scaler, int rank, int world, const RepaTerm& repa) {
  return flow_backward(model, p.flow, data, y, beta, ctx, scaler, rank, world, repa);
}

bool ddpm_admits(const SamplerRecord& s) {
  return s.runs_ddpm;
}
bool flow_admits(const SamplerRecord& s) {
  return s.flow_chain != nullptr;
}

// LightningDiT's cosine term is taken over channels: over one it is ±1, without gradient except an unbounded one at 0
// — where the zero-initialised output starts — which freezes AdamW (measured: a grey-image run never learns).
void flow_validate(const DiffusionConfig& c, const DiTOptions& o, const std::string& name) {
  if (c.flow.loss == FlowLoss::mse_cosine && o.in_channels < 2)
    throw UserError("config: diffusion.loss",
                    "mse+cosine compares velocities over channels; " + name + " has " + std::to_string(o.in_channels) +
                        " (the cosine of one channel is ±1, its gradient 0 or unbounded)",
                    "use loss: mse for single-channel images");
}

}  // namespace

const std::vector<ObjectiveRecord>& objectives() {
  static const std::vector<ObjectiveRecord> table{
      {Objective::ddpm,
       "ddpm",
       "DDPM",
       "DiT: ε prediction on a chain of T steps with a learned σ (guided-diffusion)",
       ddpm_step,
       {"loss", "mse", "vb"},
       /*u = t / (T − 1)*/ 0.0,
       1.0,
       true,
       ddpm_admits,
       ddpm_reverse,
       ddpm_planned_nfe,
       /*solver_steps_within_chain=*/true,
       /*warps_flow_grid=*/false,
       "e.g. 25",
       nullptr},
      {Objective::flow,
       "flow",
       "flow",
       "SiT: flow matching on the interpolant of diffusion.path (transport.py)",
       // u = 1 − t on the interpolant (0 = noise), clamped: dopri5's stages may pass t = 1, where SiT still guides
       flow_step,
       {"loss", "mse", "cosine"},
       1.0,
       -1.0,
       false,
       flow_admits,
       flow_reverse,
       flow_planned_nfe,
       /*solver_steps_within_chain=*/false,
       /*warps_flow_grid=*/true,
       "SiT: 250 (sde), 50 (euler)",
       flow_validate},
  };
  return table;
}

double ObjectiveRecord::noise_level(double t, int64_t T) const {
  const double per = slope_per_step ? static_cast<double>(T - 1) : 1.0;
  return std::clamp(level_at_zero + level_slope * t / per, 0.0, 1.0);
}

double ObjectiveRecord::chain_timestep(double t, int64_t T) const {
  const double steps = static_cast<double>(T - 1), slope = slope_per_step ? level_slope : level_slope * steps;
  return std::clamp(level_at_zero * steps + slope * t, 0.0, steps);
}

const ObjectiveRecord& objective_record(Objective kind) {
  for (const ObjectiveRecord& r : objectives())
    if (r.kind == kind) return r;
  throw std::logic_error("objective_record: no record for objective " + config::to_string(kind));
}

Objective objective_of_sampler(SamplerKind sampler) {
  for (const ObjectiveRecord& r : objectives())
    if (r.admits(sampler_record(sampler))) return r.kind;
  throw std::logic_error("objective_of_sampler: no objective runs " + config::to_string(sampler));
}

}  // namespace moh::diffusion
