#pragma once
// DiT / MoH-DiT and the SD-VAE as entries of the model registry (experiments/registry.h).
#include "experiments/model_family.h"

namespace moh::experiments {

/// Variants, experiment rules, training task, forward, summary, benchmark step and attention-path rows.
ModelFamily dit_family();

/// The fixed SD-VAE ("sd-vae"): forward (encode + decode) and summary.
ModelFamily sd_vae_family();

/// The registered name of the SD-VAE.
constexpr const char* kSdVaeName = "sd-vae";

}  // namespace moh::experiments
