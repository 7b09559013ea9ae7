#pragma once
// Reverse-process sampling for DiT / MoH-DiT: DDPM ancestral sampling (p_sample_loop, what DiT's sample.py and
// sample_ddp.py run) and DDIM (η configurable), with classifier-free guidance exactly as DiT's forward_with_cfg:
// the batch is doubled with null labels, the model sees the first half twice, guidance is applied to the first 3
// output channels (DiT's reproducibility quirk) or to every ε channel, and the variance channels are not guided.
#include <functional>

#include "core/experiment_config.h"
#include "diffusion/dit.h"
#include "diffusion/gaussian_diffusion.h"

namespace moh::diffusion {

/// How to run the reverse process.
struct SampleOptions {
  SamplerKind sampler = SamplerKind::ddpm;
  double eta = 0.0;        ///< DDIM noise
  double cfg_scale = 1.0;  ///< 1 = plain forward, no doubling (sample_ddp's behaviour)
  CfgChannels cfg_channels = CfgChannels::three;
  bool clip_denoised = false;  ///< DiT never clips
};

/// DiT's forward_with_cfg on a doubled batch x = [x_c; x_u], y = [labels; null]: returns the guided output.
at::Tensor forward_with_cfg(DiT& model, const at::Tensor& x, const at::Tensor& t_model, const at::Tensor& y,
                            double scale, CfgChannels channels);

/// Runs the chain from `noise` (N, C, H, W) for class `labels` (N) and returns x0 samples (N, C, H, W) in the model's
/// data space ([−1, 1] for pixels). Randomness comes from the global generator in DiT's order (the caller draws the
/// noise first; then one randn_like of the (doubled) batch per step). `on_step` is called after every step.
at::Tensor sample_loop(DiT& model, const GaussianDiffusion& chain, const at::Tensor& noise, const at::Tensor& labels,
                       const SampleOptions& options, const std::function<void()>& on_step = {});

/// Pixel samples in [−1, 1] → uint8 NHWC exactly as sample_ddp.py: clamp(127.5·x + 128, 0, 255) truncated.
at::Tensor to_uint8_nhwc(const at::Tensor& samples);

}  // namespace moh::diffusion
