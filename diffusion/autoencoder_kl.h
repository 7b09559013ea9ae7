#pragma once
// The latent autoencoders of this toolkit, both diffusers AutoencoderKL: the Stable Diffusion kl-f8 VAE (sd-vae-ft-ema
// / -mse config) that maps 256×256×3 images to the 32×32×4 latents DiT is trained on, and VA-VAE f16d32 (LightningDiT's
// 16×16×32 latents). Encoder (down blocks of ResNets, mid block with one single-head attention), quant convs, a
// diagonal Gaussian posterior and the decoder. Module names equal the diffusers state_dict keys
// (encoder.down_blocks.1.resnets.0.conv_shortcut.weight, decoder.mid_block.attentions.0.to_q.weight, ...); the legacy
// attention names (query/key/value/proj_attn) and the LDM layout of published files are mapped on load. SD-VAE: 248
// tensors, 83,653,863 parameters.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <map>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "datasets/latents.h"
#include "diffusion/diffusion_config.h"
#include "vision/nn/linear.h"

namespace moh::diffusion {

/// DiT's latent scale: z = 0.18215 · posterior sample; images are decoded from z / 0.18215.
constexpr double kSdVaeLatentScale = 0.18215;
/// Parameter count of the SD kl-f8 VAE (spec §5.3).
constexpr int64_t kSdVaeParams = 83653863;
/// Parameter count of VA-VAE f16d32 (the autoencoder without its training-only DINOv2 projection).
constexpr int64_t kVaVaeParams = 69836067;
/// GroupNorm settings of every norm in the VAE.
constexpr int64_t kSdVaeGroups = 32;
constexpr double kSdVaeNormEps = 1e-6;

/// Shape of the autoencoder (the SD config by default).
struct SdVaeOptions {
  int64_t in_channels = 3, out_channels = 3, latent_channels = 4;
  std::vector<int64_t> block_out_channels{128, 256, 512, 512};
  int64_t layers_per_block = 2;
  /// Attention after every ResNet of the lowest-resolution down and up blocks (diffusers AttnDownEncoderBlock2D /
  /// AttnUpDecoderBlock2D; LDM's attn_resolutions = [16] at 256 px): VA-VAE has it, the SD VAE does not.
  bool lowest_level_attention = false;
  /// Spatial downsampling factor (2^(blocks − 1) = 8).
  int64_t factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
};

/// VA-VAE f16d32 (hustvl/LightningDiT tokenizer/configs/vavae_f16d32.yaml, the LDM AutoencoderKL): 5 levels of
/// widths 128, 128, 256, 256, 512 with attention at the lowest, 32 latent channels at 1/16 of the image side.
SdVaeOptions va_vae_f16d32_options();

/// GN → SiLU → conv3×3 → GN → SiLU → conv3×3, plus a 1×1 conv shortcut when the width changes.
struct ResnetBlock2DImpl : torch::nn::Module {
  ResnetBlock2DImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
};
TORCH_MODULE(ResnetBlock2D);

/// Single-head self-attention over the H·W positions with a residual (diffusers Attention in the mid block).
struct VaeAttentionImpl : torch::nn::Module {
  explicit VaeAttentionImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm group_norm{nullptr};
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  torch::nn::ModuleList to_out{nullptr};  ///< [Linear] (diffusers keeps a dropout at index 1)
};
TORCH_MODULE(VaeAttention);

/// Downsample2D: zero-pad right/bottom by 1, then conv 3×3 stride 2 (asymmetric, as diffusers).
struct Downsample2DImpl : torch::nn::Module {
  explicit Downsample2DImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

/// Upsample2D: nearest ×2, then conv 3×3.
struct Upsample2DImpl : torch::nn::Module {
  explicit Upsample2DImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

/// A down or up block: `resnets` (each followed by its `attentions.i` when `attention`), then an optional resampler
/// (`downsamplers.0` / `upsamplers.0`).
struct VaeBlockImpl : torch::nn::Module {
  VaeBlockImpl(int64_t in, int64_t out, int64_t layers, bool up, bool resample, bool attention = false);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr}, downsamplers{nullptr}, upsamplers{nullptr};
};
TORCH_MODULE(VaeBlock);

/// ResNet → attention → ResNet at the lowest resolution.
struct VaeMidBlockImpl : torch::nn::Module {
  explicit VaeMidBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};
};
TORCH_MODULE(VaeMidBlock);

/// Image (B, 3, H, W) → moments (B, 2·latent, H/8, W/8) before quant_conv.
struct VaeEncoderImpl : torch::nn::Module {
  explicit VaeEncoderImpl(const SdVaeOptions& o);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  VaeMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(VaeEncoder);

/// Latent (B, latent, h, w) after post_quant_conv → image (B, 3, 8h, 8w).
struct VaeDecoderImpl : torch::nn::Module {
  explicit VaeDecoderImpl(const SdVaeOptions& o);
  at::Tensor forward(const at::Tensor& z);
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  VaeMidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(VaeDecoder);

/// Posterior N(mean, exp(logvar)) of an encoded batch (logvar clamped to [−30, 20]).
struct LatentPosterior {
  at::Tensor mean, logvar;
  /// mean + exp(½·logvar)·ε with ε from the global generator.
  at::Tensor sample() const;
};

/// AutoencoderKL.
struct AutoencoderKLImpl : torch::nn::Module {
  explicit AutoencoderKLImpl(const SdVaeOptions& options = {});
  /// The map between this VAE's latents and a DiT's (x = latents.to_model(z)): SD's scale 0.18215 by default; for
  /// VA-VAE the channel statistics of the latents the DiT was trained on (set by the loader).
  datasets::LatentNorm latents{kSdVaeLatentScale, {}, {}};
  /// Images in [−1, 1] (B, 3, H, W), H and W multiples of 8 → posterior over unscaled latents.
  LatentPosterior encode(const at::Tensor& images);
  /// Unscaled latents → images in ~[−1, 1] (not clamped).
  at::Tensor decode(const at::Tensor& latents);

  SdVaeOptions options;
  VaeEncoder encoder{nullptr};
  VaeDecoder decoder{nullptr};
  torch::nn::Conv2d quant_conv{nullptr}, post_quant_conv{nullptr};
};
TORCH_MODULE(AutoencoderKL);

/// The same for one name.
std::string normalize_vae_key(const std::string& name);

/// The diffusers name of an LDM / CompVis AutoencoderKL key (encoder.down.1.block.0.nin_shortcut.weight →
/// encoder.down_blocks.1.resnets.0.conv_shortcut.weight; decoder.up.I → decoder.up_blocks.(levels − 1 − I);
/// mid.attn_1.q → mid_block.attentions.0.to_q), or "" for a key outside the autoencoder (VA-VAE checkpoints also hold
/// the training loss's and the DINOv2 projection's tensors). Names already in diffusers form come back unchanged.
std::string ldm_vae_key(const std::string& name, int64_t levels);
/// Renames an LDM-named state_dict to diffusers names (1×1-conv attention weights become Linear weights), dropping
/// what is not the autoencoder's.
TensorMap ldm_vae_tensors(const TensorMap& tensors, int64_t levels);
/// A VAE state_dict in diffusers names, whichever naming it came in (LDM, legacy or current diffusers).
TensorMap diffusers_vae_tensors(const TensorMap& tensors, int64_t levels);

/// The shape of an autoencoder whose diffusers-named tensors have these shapes: `base` (the kind's) with the file's
/// level widths (block_out_channels[i]: the output width of encoder.down_blocks.i's first ResNet), so that a VAE
/// trained at other widths loads. The kind fixes the rest: another number of levels (the latent's downsampling), or
/// a width that is not a multiple of the 32 GroupNorm groups, is a UserError naming `origin`. No encoder levels at
/// all: `base` (the load then names what is missing).
SdVaeOptions vae_options_from_shapes(const std::map<std::string, std::vector<int64_t>>& shapes, SdVaeOptions base,
                                     const std::string& origin);
/// The same from diffusers-named tensors (diffusers_vae_tensors).
SdVaeOptions vae_options_from_tensors(const TensorMap& named, SdVaeOptions base, const std::string& origin);

/// The autoencoder of `kind` (its latent scale set) built at the widths of its weights file and loaded from it:
/// diffusers files (.safetensors or torch.save .bin/.pt, either attention naming) or LDM / CompVis ones (VA-VAE's .pt:
/// a state_dict, or a checkpoint holding one under "state_dict"). A missing file is a UserError saying where the
/// weights come from (`source`); missing/unexpected tensors are named.
AutoencoderKL load_vae(VaeKind kind, const std::string& path, const std::string& source);

/// One latent space of the toolkit (diffusion.vae): the autoencoder's shape, how its latents are scaled and where
/// its weights come from.
struct VaeSpec {
  const char* name;
  SdVaeOptions options;
  double scale;              ///< DiT's latent scale (0.18215) or LightningDiT's latent_multiplier (1)
  bool channel_stats;        ///< latents standardised per channel (LightningDiT's latent_norm)
  int64_t params;            ///< parameter count
  const char* weights_hint;  ///< where the weights come from
};
/// The spec of a latent kind (not VaeKind::none).
const VaeSpec& vae_spec(VaeKind kind);
/// An autoencoder of that kind with random weights and the kind's latent scale.
AutoencoderKL make_vae(VaeKind kind);

}  // namespace moh::diffusion
