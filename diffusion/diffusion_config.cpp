#include "diffusion/diffusion_config.h"

#include "diffusion/sampler.h"

namespace moh {

const config::EnumTable<VaeKind>& enum_table(VaeKind) {
  static const config::EnumTable<VaeKind> t{{VaeKind::none, "none"}, {VaeKind::sd, "sd"}};
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

const config::EnumTable<CfgChannels>& enum_table(CfgChannels) {
  static const config::EnumTable<CfgChannels> t{{CfgChannels::three, "three"}, {CfgChannels::all, "all"}};
  return t;
}

const config::EnumTable<CudaGraphMode>& enum_table(CudaGraphMode) {
  static const config::EnumTable<CudaGraphMode> t{{CudaGraphMode::automatic, "auto"}, {CudaGraphMode::off, "off"}};
  return t;
}

}  // namespace moh
