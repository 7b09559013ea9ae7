#include "diffusion/diffusion_config.h"

#include <cmath>

#include "diffusion/objective.h"
#include "diffusion/sampler.h"

namespace moh {

const config::EnumTable<VaeKind>& enum_table(VaeKind) {
  static const config::EnumTable<VaeKind> t{{VaeKind::none, "none"}, {VaeKind::sd, "sd"}, {VaeKind::vavae, "vavae"}};
  return t;
}

const config::EnumTable<SamplerKind>& enum_table(SamplerKind) {
  static const config::EnumTable<SamplerKind> t = [] {  // the sampler records name their kinds
    config::EnumTable<SamplerKind> names;
    for (const auto& r : diffusion::samplers()) names.emplace_back(r.kind, r.name);
    return names;
  }();
  return t;
}

const config::EnumTable<FlowPath>& enum_table(FlowPath) {
  static const config::EnumTable<FlowPath> t{{FlowPath::linear, "linear"}, {FlowPath::gvp, "gvp"}};
  return t;
}

const config::EnumTable<FlowPrediction>& enum_table(FlowPrediction) {
  static const config::EnumTable<FlowPrediction> t{
      {FlowPrediction::velocity, "velocity"}, {FlowPrediction::noise, "noise"}, {FlowPrediction::score, "score"}};
  return t;
}

const config::EnumTable<TimeSampling>& enum_table(TimeSampling) {
  static const config::EnumTable<TimeSampling> t{{TimeSampling::uniform, "uniform"},
                                                 {TimeSampling::lognormal, "lognormal"}};
  return t;
}

const config::EnumTable<FlowLoss>& enum_table(FlowLoss) {
  static const config::EnumTable<FlowLoss> t{{FlowLoss::mse, "mse"}, {FlowLoss::mse_cosine, "mse+cosine"}};
  return t;
}

const config::EnumTable<CfgChannels>& enum_table(CfgChannels) {
  static const config::EnumTable<CfgChannels> t{{CfgChannels::three, "three"}, {CfgChannels::all, "all"}};
  return t;
}

const config::EnumTable<CudaGraphMode>& enum_table(CudaGraphMode) {
  static const config::EnumTable<CudaGraphMode> t{{CudaGraphMode::automatic, "auto"}, {CudaGraphMode::off, "off"}};
  return t;
}

void FlowConfig::validate(const config::RuleError& bad) const {
  if (t_lognormal.size() != 2 || !(t_lognormal[1] > 0) || !std::isfinite(t_lognormal[0]))
    bad("diffusion.t_lognormal", "expected [m, s] with s > 0", "LightningDiT: [0, 1]");
  if (loss == FlowLoss::mse_cosine && prediction != FlowPrediction::velocity)
    bad("diffusion.loss", "mse+cosine compares velocities: it needs diffusion.prediction: velocity", "");
}

void DiffusionConfig::validate(const config::RuleError& bad) const {
  if (steps < 2) bad("diffusion.steps", "must be >= 2", "DiT uses 1000");
  flow.validate(bad);
}

void RepaConfig::validate(const config::RuleError& bad) const {
  if (!(weight >= 0) || !std::isfinite(weight)) bad("train.repa.weight", "must be >= 0", "REPA: 0.5");
  if (depth < 1) bad("train.repa.depth", "must be >= 1", "REPA: 8 of SiT-XL's 28 blocks");
  if (projector_dim < 1 || projector_dim > kMaxProjectorDim)
    bad("train.repa.projector_dim", "must be in 1.." + std::to_string(kMaxProjectorDim), "REPA: 2048");
  if (stage < 0 || stage > 4) bad("train.repa.stage", "must be in 0..4 (0 = the last stage)", "");
}

void SamplingConfig::validate(const config::RuleError& bad) const {
  if (!(solver.atol > 0) || !(solver.rtol > 0))
    bad(solver.atol > 0 ? "sampling.rtol" : "sampling.atol", "must be > 0", "SiT: atol 1e-6, rtol 1e-3");
  if (steps.empty()) bad("sampling.steps", "must not be empty", "e.g. \"250\" or \"ddim50\"");
  if (!(solver.eta >= 0)) bad("sampling.eta", "must be >= 0", "0 = deterministic DDIM");
  if (!(cfg_scale >= 1)) bad("sampling.cfg_scale", "must be >= 1 (1 = no guidance)", "DiT's FID setting is 1.5");
  if (cfg_interval.size() != 2 || !(cfg_interval[0] >= 0 && cfg_interval[0] <= cfg_interval[1] && cfg_interval[1] <= 1))
    bad("sampling.cfg_interval", "expected [lo, hi] with 0 <= lo <= hi <= 1 (noise level, 1 = pure noise)",
        "e.g. [0.0, 0.7]; [0, 1] guides every step");
  if (per_class <= 0) bad("sampling.per_class", "must be > 0", "");
  if (batch_size <= 0) bad("sampling.batch_size", "must be > 0", "");
}

}  // namespace moh
