#include "diffusion/autoencoder_kl.h"

#include <torch/nn/functional/padding.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "core/error.h"
#include "core/io/torch_file.h"
#include "core/train/checkpoint.h"
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

VaeBlockImpl::VaeBlockImpl(int64_t in, int64_t out, int64_t layers, bool up, bool resample, bool attention) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < layers; ++i) resnets->push_back(ResnetBlock2D(i == 0 ? in : out, out));
  if (attention) {
    attentions = register_module("attentions", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) attentions->push_back(VaeAttention(out));
  }
  if (resample && up) upsamplers = register_module("upsamplers", torch::nn::ModuleList(Upsample2D(out)));
  if (resample && !up) downsamplers = register_module("downsamplers", torch::nn::ModuleList(Downsample2D(out)));
}

at::Tensor VaeBlockImpl::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (size_t i = 0; i < resnets->size(); ++i) {
    x = resnets[i]->as<ResnetBlock2DImpl>()->forward(x);
    if (attentions) x = attentions[i]->as<VaeAttentionImpl>()->forward(x);
  }
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
  for (size_t i = 0; i < ch.size(); ++i) {
    const bool lowest = i + 1 == ch.size();
    down_blocks->push_back(VaeBlock(i == 0 ? ch[0] : ch[i - 1], ch[i], o.layers_per_block, false, !lowest,
                                    lowest && o.lowest_level_attention));
  }
  mid_block = register_module("mid_block", VaeMidBlock(ch.back()));
  conv_norm_out = register_module("conv_norm_out", group_norm(ch.back()));
  conv_out = register_module("conv_out", conv(ch.back(), 2 * o.latent_channels, 3));
}

at::Tensor VaeEncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in->forward(x);                                  // (B, 128, H, W)
  for (auto& b : *down_blocks) h = b->as<VaeBlockImpl>()->forward(h);  // (B, 512, H/f, W/f)
  h = mid_block->forward(h);
  return conv_out->forward(at::silu(conv_norm_out->forward(h)));  // (B, 2·latent, H/f, W/f)
}

VaeDecoderImpl::VaeDecoderImpl(const SdVaeOptions& o) {
  std::vector<int64_t> ch(o.block_out_channels.rbegin(), o.block_out_channels.rend());  // 512, 512, 256, 128
  conv_in = register_module("conv_in", conv(o.latent_channels, ch[0], 3));
  mid_block = register_module("mid_block", VaeMidBlock(ch[0]));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < ch.size(); ++i)
    up_blocks->push_back(VaeBlock(i == 0 ? ch[0] : ch[i - 1], ch[i], o.layers_per_block + 1, true, i + 1 < ch.size(),
                                  i == 0 && o.lowest_level_attention));
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
                    "resize/crop to a multiple of " + std::to_string(f));
  const at::Tensor moments = quant_conv->forward(encoder->forward(images));  // (B, 2·latent, H/f, W/f)
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

namespace {
// Renames legacy diffusers attention keys (query/key/value/proj_attn → to_q/to_k/to_v/to_out.0).
TensorMap normalize_vae_keys(const TensorMap& tensors) {
  TensorMap out;
  for (const auto& [name, t] : tensors) out[normalize_vae_key(name)] = t;
  return out;
}
}  // namespace

namespace {

// The rest of an LDM resnet or attention key ("nin_shortcut.weight", "q.bias") in diffusers form.
std::string ldm_leaf(const std::string& module, const std::string& leaf) {
  static const std::map<std::string, std::string> kAttention{
      {"norm", "group_norm"}, {"q", "to_q"}, {"k", "to_k"}, {"v", "to_v"}, {"proj_out", "to_out.0"}};
  const size_t dot = leaf.find('.');
  const std::string head = leaf.substr(0, dot), tail = dot == std::string::npos ? "" : leaf.substr(dot);
  if (module == "attentions") {
    const auto it = kAttention.find(head);
    return it == kAttention.end() ? "" : it->second + tail;
  }
  return (head == "nin_shortcut" ? "conv_shortcut" : head) + tail;
}

// "down.I.block.J.rest" / "up.I.attn.J.rest" / "down.I.downsample.conv.rest" (LDM) → the diffusers block path.
std::string ldm_level_key(const std::string& part, int64_t levels) {
  const bool up = part.rfind("up.", 0) == 0;
  const size_t a = part.find('.') + 1, b = part.find('.', a);
  if (b == std::string::npos) return "";
  int64_t level = 0;
  try {
    level = std::stoll(part.substr(a, b - a));
  } catch (const std::exception&) {
    return "";
  }
  if (level < 0 || level >= levels) return "";
  const std::string block =
      std::string(up ? "up_blocks." : "down_blocks.") + std::to_string(up ? levels - 1 - level : level) + ".";
  const std::string rest = part.substr(b + 1);
  for (const char* resample : {"downsample.", "upsample."})
    if (rest.rfind(resample, 0) == 0)
      return block + (up ? "upsamplers.0." : "downsamplers.0.") + rest.substr(std::strlen(resample));
  const size_t c = rest.find('.'), d = c == std::string::npos ? c : rest.find('.', c + 1);
  if (d == std::string::npos) return "";
  const std::string kind = rest.substr(0, c), index = rest.substr(c + 1, d - c - 1);
  const std::string module = kind == "block" ? "resnets" : kind == "attn" ? "attentions" : "";
  const std::string leaf = module.empty() ? "" : ldm_leaf(module, rest.substr(d + 1));
  return leaf.empty() ? "" : block + module + "." + index + "." + leaf;
}

}  // namespace

std::string ldm_vae_key(const std::string& name, int64_t levels) {
  if (name.rfind("quant_conv.", 0) == 0 || name.rfind("post_quant_conv.", 0) == 0) return name;
  const bool enc = name.rfind("encoder.", 0) == 0, dec = name.rfind("decoder.", 0) == 0;
  if (!enc && !dec) return "";
  const std::string side = enc ? "encoder." : "decoder.", part = name.substr(side.size());
  for (const char* kept : {"down_blocks.", "up_blocks.", "mid_block.", "conv_norm_out.", "conv_in.", "conv_out."})
    if (part.rfind(kept, 0) == 0) return name;  // diffusers already
  if (part.rfind("norm_out.", 0) == 0) return side + "conv_" + part;
  static const std::vector<std::pair<std::string, std::string>> kMid{
      {"mid.block_1.", "resnets.0."}, {"mid.block_2.", "resnets.1."}, {"mid.attn_1.", "attentions.0."}};
  for (const auto& [from, to] : kMid)
    if (part.rfind(from, 0) == 0) {
      const std::string leaf = ldm_leaf(to.substr(0, to.find('.')), part.substr(from.size()));
      return leaf.empty() ? "" : side + "mid_block." + to + leaf;
    }
  if (part.rfind("down.", 0) == 0 || part.rfind("up.", 0) == 0) {
    const std::string key = ldm_level_key(part, levels);
    return key.empty() ? "" : side + key;
  }
  return "";
}

TensorMap ldm_vae_tensors(const TensorMap& tensors, int64_t levels) {
  TensorMap out;
  for (const auto& [name, t] : tensors) {
    const std::string key = ldm_vae_key(name, levels);
    if (key.empty()) continue;
    const bool conv_attention = key.find(".attentions.") != std::string::npos && t.dim() == 4;
    out[key] = conv_attention ? t.reshape({t.size(0), t.size(1)}) : t;  // 1×1 conv (C, C, 1, 1) → Linear (C, C)
  }
  return out;
}

TensorMap diffusers_vae_tensors(const TensorMap& tensors, int64_t levels) {
  const bool ldm = std::any_of(tensors.begin(), tensors.end(),
                               [](const auto& kv) { return kv.first.rfind("encoder.down.", 0) == 0; });
  return ldm ? ldm_vae_tensors(tensors, levels) : normalize_vae_keys(tensors);
}

SdVaeOptions vae_options_from_shapes(const std::map<std::string, std::vector<int64_t>>& shapes, SdVaeOptions base,
                                     const std::string& origin) {
  std::vector<int64_t> widths;
  for (size_t i = 0;; ++i) {
    const auto it = shapes.find("encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.weight");
    if (it == shapes.end() || it->second.empty()) break;
    widths.push_back(it->second[0]);  // (out, in, 3, 3)
  }
  if (widths.empty()) return base;
  const std::string what = "vae weights " + origin;
  if (widths.size() != base.block_out_channels.size())
    throw UserError(what,
                    "has " + std::to_string(widths.size()) + " encoder levels, this latent kind's autoencoder " +
                        std::to_string(base.block_out_channels.size()),
                    "set diffusion.vae to the kind these weights are");
  for (const int64_t w : widths)
    if (w <= 0 || w % kSdVaeGroups != 0)
      throw UserError(what, "has a level of width " + std::to_string(w),
                      "the widths must be multiples of the " + std::to_string(kSdVaeGroups) + " GroupNorm groups");
  base.block_out_channels = widths;
  return base;
}

SdVaeOptions vae_options_from_tensors(const TensorMap& named, SdVaeOptions base, const std::string& origin) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : named) shapes[name] = t.sizes().vec();
  return vae_options_from_shapes(shapes, std::move(base), origin);
}

namespace {

// A diffusers-named .safetensors file, read one tensor at a time; nullptr for LDM names (renamed in memory instead).
AutoencoderKL load_diffusers_safetensors(const VaeSpec& spec, const std::string& path) {
  const SafetensorsReader reader(path);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& e : reader.entries()) {
    if (e.name.rfind("encoder.down.", 0) == 0) return AutoencoderKL(nullptr);
    shapes[normalize_vae_key(e.name)] = e.shape;
  }
  AutoencoderKL vae(vae_options_from_shapes(shapes, spec.options, path));
  load_module_file(*vae, path, false, normalize_vae_key);
  return vae;
}

}  // namespace

AutoencoderKL load_vae(VaeKind kind, const std::string& path, const std::string& source) {
  const VaeSpec& spec = vae_spec(kind);
  if (!std::filesystem::is_regular_file(path)) throw UserError("vae weights " + path, "no such file", source);
  const bool safetensors = path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  AutoencoderKL vae = safetensors ? load_diffusers_safetensors(spec, path) : AutoencoderKL(nullptr);
  if (!vae) {
    TensorMap tensors;
    if (safetensors) {
      tensors = load_safetensors(path).tensors;
    } else {
      const TorchFile file = load_torch_file(path);
      const bool nested = file.root->kind == PyValue::Kind::dict && file.root->get("state_dict");
      tensors = torch_state_dict(file, nested ? "state_dict" : "", path);
    }
    const auto levels = static_cast<int64_t>(spec.options.block_out_channels.size());
    const TensorMap named = diffusers_vae_tensors(tensors, levels);
    vae = AutoencoderKL(vae_options_from_tensors(named, spec.options, path));
    load_module_tensors(*vae, named, path);
  }
  vae->latents = {spec.scale, {}, {}};
  return vae;
}

SdVaeOptions va_vae_f16d32_options() {
  SdVaeOptions o;
  o.latent_channels = 32;
  o.block_out_channels = {128, 128, 256, 256, 512};
  o.lowest_level_attention = true;
  return o;
}

const VaeSpec& vae_spec(VaeKind kind) {
  static const VaeSpec sd{"sd",
                          SdVaeOptions{},
                          kSdVaeLatentScale,
                          false,
                          kSdVaeParams,
                          "download stabilityai/sd-vae-ft-ema (diffusion_pytorch_model.safetensors) from Hugging Face "
                          "and set diffusion.vae_weights"};
  static const VaeSpec vavae{"vavae",
                             va_vae_f16d32_options(),
                             1.0,
                             true,
                             kVaVaeParams,
                             "download hustvl/vavae-imagenet256-f16d32-dinov2 (vavae-imagenet256-f16d32-dinov2.pt) "
                             "from Hugging Face and set diffusion.vae_weights"};
  if (kind == VaeKind::sd) return sd;
  if (kind == VaeKind::vavae) return vavae;
  throw std::logic_error("vae_spec: diffusion.vae none has no autoencoder");
}

AutoencoderKL make_vae(VaeKind kind) {
  const VaeSpec& spec = vae_spec(kind);
  AutoencoderKL vae(spec.options);
  vae->latents = {spec.scale, {}, {}};
  return vae;
}

}  // namespace moh::diffusion
