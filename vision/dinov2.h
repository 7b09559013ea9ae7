#pragma once
// DINOv2 (Oquab et al. 2023) ViT image encoders, as timm's `vit_*_patch14_dinov2` and facebookresearch/dinov2's
// `dinov2_vit*14` build them: patch 14, a class token, learned absolute positions for a 37×37 grid (518 px) resampled
// to the input's grid, pre-norm blocks with LayerScale (ls1, ls2), LayerNorm eps 1e-6, exact GELU. Registered names
// equal both state_dicts (cls_token, pos_embed, patch_embed.proj, blocks.N.{norm1,attn.qkv,attn.proj,ls1.gamma,norm2,
// mlp.fc1,mlp.fc2,ls2.gamma}, norm); the official file's unused mask_token is dropped on load. The frozen encoder of
// REPA and of FD-DINOv2.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>

#include <string>

#include "core/io/safetensors.h"
#include "vision/nn/linear.h"
#include "vision/nn/moh_attention.h"
#include "vision/nn/vit_layers.h"

namespace moh::vision {

/// How the 37×37 position table is resampled to another grid: timm's resample_abs_pos_embed (bicubic to the size,
/// antialiased) or facebookresearch/dinov2's interpolate_pos_encoding (bicubic by scale factor (g + 0.1) / 37, no
/// antialiasing — the torch.hub models REPA and EDM2's FD-DINOv2 load).
enum class DinoV2Positions { timm, official };

/// Options of a DINOv2 ViT (ViT-S/B/L: 384/768/1024 wide, 12/12/24 blocks, head width 64).
struct DinoV2Options {
  int64_t embed_dim = 768;
  int64_t depth = 12;
  int64_t num_heads = 12;
  int64_t patch_size = 14;
  int64_t pos_grid = 37;  ///< the grid the position table was trained on (518 px)
  double mlp_ratio = 4.0;
  DinoV2Positions positions = DinoV2Positions::timm;
  int64_t head_dim() const { return embed_dim / num_heads; }
};

/// The options of a DINOv2 state_dict, read off its shapes (width, blocks, patch, position grid; 64-wide heads); an
/// official file (it holds mask_token) resamples positions as the official code, a timm file as timm. UserError
/// naming `origin` when the tensors are not a DINOv2 ViT's.
DinoV2Options dinov2_options_for_weights(const TensorMap& w, const std::string& origin);

/// LayerScale: x · gamma (per channel).
struct LayerScaleImpl : torch::nn::Module {
  explicit LayerScaleImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x) { return x * gamma; }
  at::Tensor gamma;
};
TORCH_MODULE(LayerScale);

/// x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))).
struct DinoV2BlockImpl : torch::nn::Module {
  explicit DinoV2BlockImpl(const DinoV2Options& o);
  at::Tensor forward(const at::Tensor& x);  // (B, 1 + N, D) → (B, 1 + N, D)
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  nn::MoHAttention attn{nullptr};
  LayerScale ls1{nullptr}, ls2{nullptr};
  nn::Mlp mlp{nullptr};
};
TORCH_MODULE(DinoV2Block);

/// The final-norm tokens of a DINOv2 ViT: x_norm_clstoken (B, D) — what the official model returns, FD-DINOv2's
/// features — and x_norm_patchtokens (B, N, D) — REPA's targets.
struct DinoV2Tokens {
  at::Tensor cls, patches;
};

/// The DINOv2 ViT.
struct DinoV2Impl : torch::nn::Module {
  explicit DinoV2Impl(const DinoV2Options& o);
  /// images (B, 3, H, W), H and W multiples of 14, ImageNet-normalised → the final-norm tokens, positions resampled
  /// to the input grid as options.positions says.
  DinoV2Tokens forward_tokens(const at::Tensor& images);
  /// forward_tokens(images).patches: (B, N, D).
  at::Tensor forward_patch_tokens(const at::Tensor& images) { return forward_tokens(images).patches; }
  /// The position table for an h × w grid (1, 1 + h·w, D).
  at::Tensor positions(int64_t h, int64_t w) const;

  DinoV2Options options;
  at::Tensor cls_token, pos_embed;  ///< (1, 1, D), (1, 1 + G², D)
  nn::PatchEmbed patch_embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(DinoV2);

/// A DINOv2 encoder from a timm or official weights file (.safetensors or torch.save; the official mask_token
/// dropped), in eval mode without gradients. UserError for files that are not DINOv2 ViT weights.
DinoV2 load_dinov2(const std::string& path);

/// The ImageNet normalisation DINOv2 was trained with, on images in [0, 1]: (x - mean) / std per channel of a
/// (B, 3, H, W) tensor, on its device (REPA's encoder input and EDM2's FD-DINOv2 detector alike).
at::Tensor imagenet_normalize(const at::Tensor& x);

}  // namespace moh::vision
