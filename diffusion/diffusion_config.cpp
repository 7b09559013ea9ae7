#include "diffusion/diffusion_config.h"

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

const config::EnumTable<Objective>& enum_table(Objective) {
  static const config::EnumTable<Objective> t = [] {  // the objective records name their kinds
    config::EnumTable<Objective> names;
    for (const auto& r : diffusion::objectives()) names.emplace_back(r.kind, r.name);
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

}  // namespace moh
