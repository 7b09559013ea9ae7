#pragma once
// A DiT / MoH-DiT experiment built from its config: the model options, the pixel input pipeline, the training data
// (pixels in memory or pre-extracted latents) checked against the model, and checkpoint loading for sampling.
#include <memory>
#include <string>

#include "core/batch_stream.h"
#include "core/platform/run_context.h"
#include "datasets/latents.h"
#include "datasets/loader.h"
#include "diffusion/autoencoder_kl.h"
#include "diffusion/dit.h"
#include "diffusion/sampler.h"
#include "experiments/experiment_config.h"
#include "experiments/model_family.h"

namespace moh::experiments {

/// The variant with the model section's overrides applied (model.img_size in pixels: a latent model's input is an
/// eighth of it); not yet validated, as `moh forward` still reads sizes from the weights.
diffusion::DiTOptions dit_options_for(const ModelConfig& model, int64_t latent_factor);
/// The model of a diffusion experiment: the above with the training settings that shape it, validated.
diffusion::DiTOptions dit_options_for(const ExperimentConfig& cfg);

/// Bytes of one fp32 attention map of the widest layer for `rank_batch` images: a lower bound of training memory.
double attention_map_bytes(const diffusion::DiTOptions& o, int64_t rank_batch);
/// UserError (config: model.img_size) when that map does not fit `memory`.
void check_attention_memory(const diffusion::DiTOptions& o, int64_t rank_batch, const DeviceMemory& memory);

/// Every rule of a DiT experiment beyond ExperimentConfig::validate(): model overrides, accumulation, VAE vs dataset,
/// the sampling respacing. Reads no data; run by `moh config` and before any work by every command. Without
/// `training` (moh extract-latents: the data are still images) the VAE-vs-dataset rule is left out.
/// With `sampling`, the rules of classifier-free guidance too (a null class; cfg_channels three needs 3 channels).
void validate_dit_experiment(const ExperimentConfig& cfg, bool training = true, bool sampling = false);

/// sampling.topk against the model (−1 = as trained): a UserError for a model without routed MoH layers or a K
/// outside 1 … the smallest routed pool (one K for every routed layer).
void check_sampling_topk(const diffusion::DiTOptions& o, int64_t topk, const std::string& key = "sampling.topk");

/// sampling.topk, every sampling.topk_schedule value and sampling.guide_topk against the model (UserErrors).
void check_head_budgets(const diffusion::DiTOptions& o, const SamplingConfig& sc);

/// The sampler's options from `sampling:` and `diffusion.steps`; a UserError when sampling.steps does not respace T
/// (DDPM / DDIM) or is not a count of 2 … T solver steps (the ODE solvers).
diffusion::SampleOptions sample_options_for(const ExperimentConfig& cfg);

/// The training data of a DiT experiment: Fashion-MNIST / image folders decoded into memory (pixels in [−1, 1],
/// DiT's ToTensor + Normalize(0.5, 0.5), optional flip) or latents written by `moh extract-latents`. The constructor
/// checks the data against the model (channels, side, classes).
class DiTTrainData {
 public:
  DiTTrainData(const ExperimentConfig& cfg, const diffusion::DiTOptions& model);
  /// This rank's share of an epoch (global batch data.batch_size, rank rows r, r + world, ...).
  std::unique_ptr<BatchStream> epoch(int64_t epoch, int rank, int world, int64_t start_batch = 0) const;
  /// Training images per epoch (all ranks).
  int64_t size() const;

 private:
  ExperimentConfig cfg_;
  bool latent_ = false;
  datasets::LatentMeta latent_meta_;
  std::shared_ptr<const datasets::LatentStore> latents_;  // opened once: labels in memory, moments read per batch
  datasets::ImageSet pixels_;
  datasets::ImageTransform tf_;
};

/// A DiT loaded from one of this toolkit's checkpoints.
using LoadedDiT = LoadedModel<diffusion::DiT>;
/// The decoder of a latent experiment's samples (diffusion.vae: sd; eval mode, on ctx.device), or an empty holder
/// for pixel-space models. UserError when diffusion.vae_weights is not set.
diffusion::AutoencoderKL load_sampling_vae(const ExperimentConfig& cfg, const RunContext& ctx);

/// Loads a DiT checkpoint (checkpoint or run directory) for sampling: the EMA weights when `prefer_ema` and the
/// checkpoint kept an EMA (what DiT samples from), else the trained weights. A classifier checkpoint is a UserError.
LoadedDiT load_dit_checkpoint(const std::string& path, bool prefer_ema = true);

}  // namespace moh::experiments
