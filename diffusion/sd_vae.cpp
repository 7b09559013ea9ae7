#include "diffusion/sd_vae.h"

#include <torch/nn/functional/padding.h>

#include <filesystem>

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/torch_file.h"
#include "vision/nn/attention_core.h"

namespace moh::diffusion {

namespace {

torch::nn::GroupNorm group_norm(int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(kSdVaeGroups, channels).eps(kSdVaeNormEps));
}

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride = 1, int64_t pad = -1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(pad < 0 ? k / 2 : pad));
}

}  // namespace

ResnetBlock2DImpl::ResnetBlock2DImpl(int64_t in, int64_t out) {
  norm1 = register_module("norm1", group_norm(in));
  conv1 = register_module("conv1", conv(in, out, 3));
  norm2 = register_module("norm2", group_norm(out));
  conv2 = register_module("conv2", conv(out, out, 3));
  if (in != out) conv_shortcut = register_module("conv_shortcut", conv(in, out, 1));
}

at::Tensor ResnetBlock2DImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv1->forward(at::silu(norm1->forward(x)));
  h = conv2->forward(at::silu(norm2->forward(h)));  // dropout 0
  return (conv_shortcut ? conv_shortcut->forward(x) : x) + h;
}

VaeAttentionImpl::VaeAttentionImpl(int64_t c) {
  group_norm = register_module("group_norm", moh::diffusion::group_norm(c));
  to_q = register_module("to_q", nn::Linear(c, c));
  to_k = register_module("to_k", nn::Linear(c, c));
  to_v = register_module("to_v", nn::Linear(c, c));
  to_out = register_module("to_out", torch::nn::ModuleList(nn::Linear(c, c)));
}

at::Tensor VaeAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  // Normalised as (B, C, HW), as diffusers does: for a channels-last x (the decoder's, after the first attention)
  // GroupNorm of the 4-d tensor runs its channels-last kernel, which rounds differently.
  const at::Tensor h = group_norm->forward(x.reshape({B, C, H * W})).transpose(1, 2);  // (B, HW, C)
  const at::Tensor q = to_q->forward(h), k = to_k->forward(h), v = to_v->forward(h);
  // One head of width C, scale 1/√C.
  const double scale = 1.0 / std::sqrt(static_cast<double>(C));
  at::Tensor a;  // (B, HW, C)
  if (nn::kFusedAttentionAvailable) {
    // LibTorch ≥ 2.1: scaled_dot_product_attention on (B, 1, HW, C), what diffusers' AttnProcessor2_0 runs under
    // torch 2 (the same kernel, so the same rounding; memory-efficient at 256 px, where HW = 1024).
    a = nn::attend(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), scale, {}, true).squeeze(1);
  } else {  // diffusers' classic AttnProcessor: softmax upcast to fp32 (upcast_softmax)
    const at::Tensor scores = at::matmul(q, k.transpose(1, 2)) * scale;  // (B, HW, HW)
    a = at::matmul(scores.to(at::kFloat).softmax(-1).to(q.scalar_type()), v);
  }
  at::Tensor out = to_out[0]->as<nn::Linear>()->forward(a);  // (B, HW, C)
  return out.transpose(1, 2).reshape({B, C, H, W}) + x;
}

Downsample2DImpl::Downsample2DImpl(int64_t c) {
  conv = register_module("conv", moh::diffusion::conv(c, c, 3, 2, 0));
}

at::Tensor Downsample2DImpl::forward(const at::Tensor& x) {
  return conv->forward(at::constant_pad_nd(x, {0, 1, 0, 1}, 0.0));  // pad right and bottom only
}

Upsample2DImpl::Upsample2DImpl(int64_t c) {
  conv = register_module("conv", moh::diffusion::conv(c, c, 3));
}

at::Tensor Upsample2DImpl::forward(const at::Tensor& x) {
  return conv->forward(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}, c10::nullopt, c10::nullopt));
}

VaeBlockImpl::VaeBlockImpl(int64_t in, int64_t out, int64_t layers, bool up, bool resample) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < layers; ++i) resnets->push_back(ResnetBlock2D(i == 0 ? in : out, out));
  if (resample && up) upsamplers = register_module("upsamplers", torch::nn::ModuleList(Upsample2D(out)));
  if (resample && !up) downsamplers = register_module("downsamplers", torch::nn::ModuleList(Downsample2D(out)));
}

at::Tensor VaeBlockImpl::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (auto& r : *resnets) x = r->as<ResnetBlock2DImpl>()->forward(x);
  if (downsamplers) x = downsamplers[0]->as<Downsample2DImpl>()->forward(x);
  if (upsamplers) x = upsamplers[0]->as<Upsample2DImpl>()->forward(x);
  return x;
}

VaeMidBlockImpl::VaeMidBlockImpl(int64_t c) {
  resnets = register_module("resnets", torch::nn::ModuleList(ResnetBlock2D(c, c), ResnetBlock2D(c, c)));
  attentions = register_module("attentions", torch::nn::ModuleList(VaeAttention(c)));
}

at::Tensor VaeMidBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = resnets[0]->as<ResnetBlock2DImpl>()->forward(x);
  h = attentions[0]->as<VaeAttentionImpl>()->forward(h);
  return resnets[1]->as<ResnetBlock2DImpl>()->forward(h);
}

VaeEncoderImpl::VaeEncoderImpl(const SdVaeOptions& o) {
  const auto& ch = o.block_out_channels;
  conv_in = register_module("conv_in", conv(o.in_channels, ch[0], 3));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < ch.size(); ++i)
    down_blocks->push_back(VaeBlock(i == 0 ? ch[0] : ch[i - 1], ch[i], o.layers_per_block, false, i + 1 < ch.size()));
  mid_block = register_module("mid_block", VaeMidBlock(ch.back()));
  conv_norm_out = register_module("conv_norm_out", group_norm(ch.back()));
  conv_out = register_module("conv_out", conv(ch.back(), 2 * o.latent_channels, 3));
}

at::Tensor VaeEncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in->forward(x);                                  // (B, 128, H, W)
  for (auto& b : *down_blocks) h = b->as<VaeBlockImpl>()->forward(h);  // (B, 512, H/8, W/8)
  h = mid_block->forward(h);
  return conv_out->forward(at::silu(conv_norm_out->forward(h)));  // (B, 8, H/8, W/8)
}

VaeDecoderImpl::VaeDecoderImpl(const SdVaeOptions& o) {
  std::vector<int64_t> ch(o.block_out_channels.rbegin(), o.block_out_channels.rend());  // 512, 512, 256, 128
  conv_in = register_module("conv_in", conv(o.latent_channels, ch[0], 3));
  mid_block = register_module("mid_block", VaeMidBlock(ch[0]));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < ch.size(); ++i)
    up_blocks->push_back(VaeBlock(i == 0 ? ch[0] : ch[i - 1], ch[i], o.layers_per_block + 1, true, i + 1 < ch.size()));
  conv_norm_out = register_module("conv_norm_out", group_norm(ch.back()));
  conv_out = register_module("conv_out", conv(ch.back(), o.out_channels, 3));
}

at::Tensor VaeDecoderImpl::forward(const at::Tensor& z) {
  at::Tensor h = mid_block->forward(conv_in->forward(z));            // (B, 512, h, w)
  for (auto& b : *up_blocks) h = b->as<VaeBlockImpl>()->forward(h);  // (B, 128, 8h, 8w)
  return conv_out->forward(at::silu(conv_norm_out->forward(h)));     // (B, 3, 8h, 8w)
}

at::Tensor LatentPosterior::sample() const {
  return mean + at::exp(0.5 * logvar) * at::randn_like(mean);
}

AutoencoderKLImpl::AutoencoderKLImpl(const SdVaeOptions& o) : options(o) {
  encoder = register_module("encoder", VaeEncoder(o));
  decoder = register_module("decoder", VaeDecoder(o));
  quant_conv = register_module("quant_conv", conv(2 * o.latent_channels, 2 * o.latent_channels, 1));
  post_quant_conv = register_module("post_quant_conv", conv(o.latent_channels, o.latent_channels, 1));
}

LatentPosterior AutoencoderKLImpl::encode(const at::Tensor& images) {
  const int64_t f = options.factor();
  if (images.size(2) % f != 0 || images.size(3) % f != 0)
    throw UserError("vae encode",
                    "image side " + std::to_string(images.size(2)) + "x" + std::to_string(images.size(3)) +
                        " is not a multiple of " + std::to_string(f),
                    "resize/crop to a multiple of 8");
  const at::Tensor moments = quant_conv->forward(encoder->forward(images));  // (B, 8, H/8, W/8)
  const int64_t L = options.latent_channels;
  return {moments.narrow(1, 0, L), moments.narrow(1, L, L).clamp(-30.0, 20.0)};
}

at::Tensor AutoencoderKLImpl::decode(const at::Tensor& latents) {
  return decoder->forward(post_quant_conv->forward(latents));
}

std::string normalize_vae_key(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> kLegacy{
      {".query.", ".to_q."}, {".key.", ".to_k."}, {".value.", ".to_v."}, {".proj_attn.", ".to_out.0."}};
  std::string n = name;
  if (n.find(".attentions.") != std::string::npos)
    for (const auto& [from, to] : kLegacy)
      if (auto p = n.find(from); p != std::string::npos) n.replace(p, from.size(), to);
  return n;
}

TensorMap normalize_vae_keys(const TensorMap& tensors) {
  TensorMap out;
  for (const auto& [name, t] : tensors) out[normalize_vae_key(name)] = t;
  return out;
}

void load_sd_vae(AutoencoderKL& vae, const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw UserError(
        "vae weights " + path, "no such file",
        "download stabilityai/sd-vae-ft-ema (diffusion_pytorch_model.safetensors) from Hugging Face and set "
        "diffusion.vae_weights");
  const bool safetensors = path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  if (safetensors) return load_module_file(*vae, path, false, normalize_vae_key);  // one tensor in memory at a time
  load_module_tensors(*vae, normalize_vae_keys(load_weights_file(path, "")), path);
}

}  // namespace moh::diffusion
