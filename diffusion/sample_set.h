#pragma once
// Seeded, data-parallel sampling of a labelled set of images into one ADM .npz (DiT's sample_ddp.py: every rank
// writes its images, one process merges them). Batch k is seeded by (seed, k), so its noise and the chain's draws do
// not depend on other batches or on the number of ranks; rank r samples batches r, r + world, ... and writes each as
// a part file (PARTS/batch_NNNNNN.npy, written atomically). Parts already on disk are kept, so an interrupted run
// resumes where it stopped (with any number of ranks). Rank 0 then streams the parts in batch order into the .npz:
// memory holds one batch, whatever the number of samples.
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "core/dist/distributed.h"
#include "core/platform/run_context.h"
#include "diffusion/autoencoder_kl.h"
#include "diffusion/sampler.h"

namespace moh::diffusion {

/// What to sample and how.
struct SampleSetOptions {
  SampleOptions sampling;  ///< the sampler and its settings (sampler, eta, CFG, head budget)
  int64_t batch_size = 100;
  uint64_t seed = 0;
};

/// The part file of batch k.
std::string sample_part_path(const std::string& parts_dir, int64_t batch);

/// The batches of `n` labels without a part file yet, ascending.
std::vector<int64_t> missing_sample_batches(int64_t n, const std::string& parts_dir, int64_t batch_size);
/// This rank's share of them (every world-th, from its rank: the ranks finish within one batch of each other).
std::vector<int64_t> rank_share(const std::vector<int64_t>& batches, const dist::Group& group);

/// Samples `batches` of `labels` (N) with `model` on `chain` into part files (b, H, W, C) uint8, decoding latents
/// with `vae` when it is set (vae->latents.to_vae: z / 0.18215 as DiT's sample.py, or LightningDiT's channel
/// statistics); C is the model's channels (3 after the VAE).
/// `on_step` is called after every chain step. Returns the network evaluations per image summed over the batches
/// (an adaptive sampler's count differs from batch to batch).
int64_t sample_parts(DiT& model, const GaussianDiffusion& chain, AutoencoderKL& vae, const at::Tensor& labels,
                     const std::vector<int64_t>& batches, const SampleSetOptions& o, const RunContext& ctx,
                     const std::string& parts_dir, const std::function<void()>& on_step = {});

/// Streams the parts of `labels` (N) into `out_npz` in ADM's layout (arr_0 (N, H, W, 3) uint8, grey replicated to
/// RGB; arr_1 labels int64), one batch in memory at a time; `on_batch(first_row, images)` sees each batch on its way
/// (e.g. to pick grid tiles). A missing or mis-shaped part is a runtime error naming it.
void merge_sample_parts(const std::string& parts_dir, const at::Tensor& labels, int64_t batch_size,
                        const std::string& out_npz,
                        const std::function<void(int64_t, const at::Tensor&)>& on_batch = {});

}  // namespace moh::diffusion
