#pragma once
// DiT / MoH-DiT and the latent autoencoders as entries of the model registry (experiments/registry.h).
#include "diffusion/diffusion_config.h"
#include "experiments/model_family.h"

namespace moh::experiments {

/// Variants, experiment rules, training task, forward, summary, benchmark step and attention-path rows.
ModelFamily dit_family();

/// A fixed latent autoencoder (the SD-VAE "sd-vae", VA-VAE "vavae-f16d32"): forward (encode + decode of the
/// posterior mean) and summary; weights in diffusers or LDM names.
ModelFamily vae_family(VaeKind kind);

/// The registered names of the autoencoders.
constexpr const char* kSdVaeName = "sd-vae";
constexpr const char* kVaVaeName = "vavae-f16d32";

}  // namespace moh::experiments
