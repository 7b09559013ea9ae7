#include "diffusion/sampler.h"

#include <torch/torch.h>

#include "core/error.h"

namespace moh::diffusion {

at::Tensor forward_with_cfg(DiT& model, const at::Tensor& x, const at::Tensor& t_model, const at::Tensor& y,
                            double scale, CfgChannels channels) {
  const int64_t n = x.size(0) / 2, C = x.size(1);
  const at::Tensor half = x.narrow(0, 0, n);
  const at::Tensor out = model->forward(at::cat({half, half}), t_model, y).out;  // (2n, C_out, H, W)
  // DiT guides eps[:, :3] (a quirk inherited from pixel-space GLIDE, kept for parity); "all" guides the C ε channels.
  const int64_t k = channels == CfgChannels::three ? 3 : C;
  const at::Tensor eps = out.narrow(1, 0, k), rest = out.narrow(1, k, out.size(1) - k);
  const at::Tensor cond = eps.narrow(0, 0, n), uncond = eps.narrow(0, n, n);
  const at::Tensor guided = uncond + scale * (cond - uncond);
  return at::cat({at::cat({guided, guided}), rest}, 1);
}

at::Tensor sample_loop(DiT& model, const GaussianDiffusion& chain, const at::Tensor& noise, const at::Tensor& labels,
                       const SampleOptions& o, const std::function<void()>& on_step) {
  torch::NoGradGuard ng;
  const DiTOptions& mo = model->options;
  const bool cfg = o.cfg_scale > 1.0;
  // Configs are checked by validate_dit_experiment; these are the invariants forward_with_cfg relies on.
  TORCH_CHECK(!cfg || mo.class_dropout_prob > 0, "sample_loop: CFG needs a null class");
  TORCH_CHECK(!cfg || o.cfg_channels != CfgChannels::three || mo.in_channels >= 3,
              "sample_loop: cfg_channels three needs 3 channels");
  const int64_t n = noise.size(0);
  at::Tensor x = cfg ? at::cat({noise, noise}) : noise;
  at::Tensor y = labels.to(noise.device(), at::kLong);
  if (cfg) y = at::cat({y, at::full({n}, mo.num_classes, y.options())});  // null class index = num_classes
  const int64_t B = x.size(0);
  for (int64_t i = chain.num_steps() - 1; i >= 0; --i) {
    const at::Tensor t = at::full({B}, i, at::TensorOptions().dtype(at::kLong).device(x.device()));
    const at::Tensor tm = chain.model_timesteps(t);
    const at::Tensor out =
        cfg ? forward_with_cfg(model, x, tm, y, o.cfg_scale, o.cfg_channels) : model->forward(x, tm, y).out;
    const auto p = chain.p_mean_variance(out, x, t, o.clip_denoised);
    const at::Tensor z = at::randn_like(x);  // drawn every step, also at t = 0 (DiT's RNG order)
    const double nonzero = i != 0 ? 1.0 : 0.0;
    if (o.sampler == SamplerKind::ddpm) {
      x = p.mean + nonzero * at::exp(0.5 * p.log_variance) * z;
    } else {
      const auto& s = chain.schedule();
      const at::Tensor eps = (chain.extract(s.sqrt_recip_alphas_cumprod, t, x) * x - p.pred_xstart) /
                             chain.extract(s.sqrt_recipm1_alphas_cumprod, t, x);
      const at::Tensor ac = chain.extract(s.alphas_cumprod, t, x), ac_prev = chain.extract(s.alphas_cumprod_prev, t, x);
      const at::Tensor sigma = o.eta * at::sqrt((1.0 - ac_prev) / (1.0 - ac)) * at::sqrt(1.0 - ac / ac_prev);
      const at::Tensor mean = p.pred_xstart * at::sqrt(ac_prev) + at::sqrt(1.0 - ac_prev - sigma.pow(2)) * eps;
      x = mean + nonzero * sigma * z;
    }
    if (on_step) on_step();
  }
  return cfg ? x.narrow(0, 0, n) : x;
}

at::Tensor to_uint8_nhwc(const at::Tensor& samples) {
  return (127.5 * samples + 128.0).clamp(0.0, 255.0).permute({0, 2, 3, 1}).to(at::kCPU).to(at::kByte).contiguous();
}

}  // namespace moh::diffusion
