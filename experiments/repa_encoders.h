#pragma once
// REPA's frozen encoders (train.repa.encoder, diffusion/repa.h) built for a DiT experiment:
//   - a DINOv2 ViT weights file (timm or official): ImageNet-normalised images resized bicubically to 14 × the DiT's
//     token grid side (REPA: 224 px for SiT-XL/2 at 256 px), final-norm patch tokens — one per DiT token;
//   - a classifier checkpoint or run directory of this toolkit: the images as its own evaluation transform makes them,
//     the normalised tokens of train.repa.stage, resized to the DiT's grid (area averaging when the stage's grid is
//     finer, each token repeated when the DiT's grid is a multiple of it; other grids cannot map: a UserError).
#include <string>

#include "core/platform/run_context.h"
#include "diffusion/dit.h"
#include "diffusion/repa.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

/// A built encoder: the targets of a batch of clean images and what the run records about it.
struct RepaEncoder {
  diffusion::RepaTargets targets;  ///< (B, C, H, W) in [−1, 1] → (B, grid², dim), no gradients
  int64_t dim = 0;                 ///< feature width (the projector's output)
  std::string description;         ///< e.g. "classifier:MoH-ViT-Nano stage 2 (8×8 → 7×7)"
  std::string weights_sha256;      ///< of the encoder's weights file
};

/// Checks train.repa against the experiment: a block within the model; with `files` (training, before any work) also
/// an encoder that exists and whose grid maps to the DiT's, and images beside latent shards (extract-latents
/// --keep-images). `moh config` checks without `files`, as it does not open model.weights or diffusion.vae_weights
/// either. UserErrors name the key.
void check_repa(const ExperimentConfig& cfg, const diffusion::DiTOptions& dit, bool files = true);

/// Builds the encoder of train.repa on ctx.device (frozen, eval mode); the same UserErrors as check_repa.
RepaEncoder make_repa_encoder(const ExperimentConfig& cfg, const diffusion::DiTOptions& dit, const RunContext& ctx);

/// `dit` with REPA's projectors for encoders of widths `z_dims` (block train.repa.depth, width
/// train.repa.projector_dim).
diffusion::DiTOptions with_repa_projectors(diffusion::DiTOptions dit, const RepaConfig& repa,
                                           const std::vector<int64_t>& z_dims);

}  // namespace moh::experiments
