#pragma once
// Seeded, data-parallel sampling of a labelled set of images (DiT's sample.py / sample_ddp.py): batch k is seeded by
// (seed, k), so its noise and the chain's draws do not depend on other batches; rank r samples batches r, r + world,
// ... and the images are gathered in batch order, so any number of ranks produces exactly one process's images.
#include <ATen/ATen.h>

#include <functional>

#include "core/distributed.h"
#include "core/run_context.h"
#include "diffusion/sampler.h"
#include "diffusion/sd_vae.h"

namespace moh::diffusion {

/// What to sample and how.
struct SampleSetOptions {
  SampleOptions chain;      ///< sampler, eta, CFG
  int64_t batch_size = 100;
  uint64_t seed = 0;
};

/// Samples one image per label (N) with `model` on `chain`, decoding latents with `vae` when it is set (z / 0.18215,
/// DiT's sample.py). `on_step` is called after every chain step of this rank. Returns the (N, H, W, C) uint8 images
/// on every rank (C = the model's channels, 3 after the VAE).
at::Tensor sample_images(DiT& model, const GaussianDiffusion& chain, AutoencoderKL& vae, const at::Tensor& labels,
                         const SampleSetOptions& o, const RunContext& ctx, dist::Group& group,
                         const std::function<void()>& on_step = {});

/// Chain steps this rank runs for `n` labels (for its progress bar).
int64_t sample_images_steps(int64_t n, const SampleSetOptions& o, const GaussianDiffusion& chain, const dist::Group& group);

}  // namespace moh::diffusion
