#pragma once
// `moh extract-latents`: encodes a dataset split once with the experiment's VAE (SD or VA-VAE) into latent shards
// (datasets/latents.h) that the DiT trainer reads with data.dataset: latents. Images go through DiT's transform (ADM
// center crop to model.img_size, [−1, 1]); the posterior moments of each image and of its mirror are stored.
#include <string>

#include "core/platform/run_context.h"
#include "datasets/latents.h"
#include "diffusion/autoencoder_kl.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

struct ExtractOptions {
  std::string out;  ///< directory to write
  std::string split = "train";
  int64_t shard_size = 4096;   ///< images per shard
  int64_t batch_size = 16;     ///< images per VAE forward
  bool keep_images = false;    ///< store the encoded images too (n, S, S, 3) uint8: what REPA's encoder sees
  bool channel_stats = false;  ///< record the latents' per-channel mean and std in meta.json (VA-VAE)
};

/// Encodes the configured data (fashion_mnist or image_folder) at model.img_size. Shards already present in `out`
/// (from an interrupted extraction of the same source) are kept; meta.json is written last.
datasets::LatentMeta extract_latents(const ExperimentConfig& cfg, diffusion::AutoencoderKL& vae,
                                     const std::string& vae_file, const ExtractOptions& options, const RunContext& ctx);

}  // namespace moh::experiments
