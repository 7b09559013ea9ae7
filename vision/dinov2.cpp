#include "vision/dinov2.h"

#include <torch/nn/functional/upsampling.h>
#include <torch/nn/init.h>

#include <cmath>
#include <stdexcept>

#include "core/error.h"
#include "core/io/torch_file.h"
#include "core/train/checkpoint.h"
#include "datasets/augment.h"

namespace moh::vision {

namespace {

constexpr double kLayerNormEps = 1e-6;  // timm's partial(nn.LayerNorm, eps=1e-6), DINOv2's likewise
constexpr int64_t kHeadDim = 64;
constexpr double kOfficialOffset = 0.1;  // facebookresearch/dinov2 interpolate_offset
constexpr const char* kWeightsHint = "a DINOv2 ViT file from timm (vit_base_patch14_dinov2) or facebookresearch/dinov2";

torch::nn::LayerNorm layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(kLayerNormEps));
}

}  // namespace

DinoV2Options dinov2_options_for_weights(const TensorMap& w, const std::string& origin) {
  for (const char* k : {"cls_token", "pos_embed", "patch_embed.proj.weight", "norm.weight", "blocks.0.attn.qkv.weight"})
    if (!w.count(k))
      throw UserError(origin, std::string("not DINOv2 ViT weights: no tensor '") + k + "'", kWeightsHint);
  DinoV2Options o;
  const at::Tensor& proj = w.at("patch_embed.proj.weight");  // (D, 3, p, p)
  o.embed_dim = proj.size(0);
  o.patch_size = proj.size(2);
  o.num_heads = o.embed_dim / kHeadDim;
  o.depth = 0;
  while (w.count("blocks." + std::to_string(o.depth) + ".attn.qkv.weight")) ++o.depth;
  const int64_t positions = w.at("pos_embed").size(1) - 1;
  o.pos_grid = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(positions))));
  if (o.pos_grid * o.pos_grid != positions || o.embed_dim % kHeadDim != 0 || proj.size(1) != 3)
    throw UserError(origin,
                    "not DINOv2 ViT weights: pos_embed " + c10::str(w.at("pos_embed").sizes()) + ", patch_embed " +
                        c10::str(proj.sizes()),
                    kWeightsHint);
  if (w.count("blocks.0.mlp.w12.weight"))
    throw UserError(origin, "DINOv2 ViT-g/14's SwiGLU blocks are not built here", "use ViT-S/B/L/14");
  o.mlp_ratio = static_cast<double>(w.at("blocks.0.mlp.fc1.weight").size(0)) / static_cast<double>(o.embed_dim);
  o.positions = w.count("mask_token") ? DinoV2Positions::official : DinoV2Positions::timm;
  return o;
}

LayerScaleImpl::LayerScaleImpl(int64_t dim) {
  gamma = register_parameter("gamma", at::full({dim}, 1e-5));
}

DinoV2BlockImpl::DinoV2BlockImpl(const DinoV2Options& o) {
  const int64_t D = o.embed_dim;
  norm1 = register_module("norm1", layer_norm(D));
  attn = register_module("attn", nn::MoHAttention(nn::MoHAttentionOptions(D, o.num_heads)));
  ls1 = register_module("ls1", LayerScale(D));
  norm2 = register_module("norm2", layer_norm(D));
  mlp = register_module("mlp", nn::Mlp(D, static_cast<int64_t>(std::lround(D * o.mlp_ratio)), /*tanh_gelu=*/false));
  ls2 = register_module("ls2", LayerScale(D));
}

at::Tensor DinoV2BlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x + ls1->forward(attn->forward(norm1->forward(x)).out);  // (B, 1 + N, D)
  return h + ls2->forward(mlp->forward(norm2->forward(h)));
}

DinoV2Impl::DinoV2Impl(const DinoV2Options& o) : options(o) {
  const int64_t D = o.embed_dim;
  cls_token = register_parameter("cls_token", at::zeros({1, 1, D}));
  pos_embed = register_parameter("pos_embed", at::zeros({1, 1 + o.pos_grid * o.pos_grid, D}));
  patch_embed = register_module("patch_embed", nn::PatchEmbed(3, D, o.patch_size));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) blocks->push_back(DinoV2Block(o));
  norm = register_module("norm", layer_norm(D));
}

at::Tensor DinoV2Impl::positions(int64_t h, int64_t w) const {
  const int64_t G = options.pos_grid;
  if (h == G && w == G) return pos_embed;
  namespace F = torch::nn::functional;
  const at::Tensor grid = pos_embed.narrow(1, 1, G * G).to(at::kFloat).reshape({1, G, G, -1}).permute({0, 3, 1, 2});
  auto how = F::InterpolateFuncOptions().mode(torch::kBicubic).align_corners(false);
  if (options.positions == DinoV2Positions::timm) {
    how.size(std::vector<int64_t>{h, w}).antialias(true);
  } else {  // the official "historical kludge": scale factors (g + 0.1) / G, the kernel mapping by those factors
    how.scale_factor(std::vector<double>{(static_cast<double>(h) + kOfficialOffset) / static_cast<double>(G),
                                         (static_cast<double>(w) + kOfficialOffset) / static_cast<double>(G)})
        .recompute_scale_factor(false);
  }
  const at::Tensor resized = F::interpolate(grid, how);  // (1, D, h, w)
  if (resized.size(2) != h || resized.size(3) != w)
    throw std::runtime_error("DINOv2 positions: resampled to " + c10::str(resized.sizes()));
  const at::Tensor table = resized.permute({0, 2, 3, 1}).reshape({1, h * w, -1}).to(pos_embed.scalar_type());
  return at::cat({pos_embed.narrow(1, 0, 1), table}, 1);  // (1, 1 + h·w, D)
}

DinoV2Tokens DinoV2Impl::forward_tokens(const at::Tensor& images) {
  const int64_t B = images.size(0), p = options.patch_size;
  const int64_t h = images.size(2) / p, w = images.size(3) / p;
  at::Tensor x = patch_embed->forward(images);                             // (B, h·w, D)
  x = at::cat({cls_token.expand({B, -1, -1}).to(x.scalar_type()), x}, 1);  // (B, 1 + h·w, D)
  x = x + positions(h, w).to(x.scalar_type());
  for (auto& b : *blocks) x = b->as<DinoV2BlockImpl>()->forward(x);
  x = norm->forward(x);
  return {x.select(1, 0), x.narrow(1, 1, h * w)};  // (B, D), (B, h·w, D)
}

DinoV2 load_dinov2(const std::string& path) {
  TensorMap w = load_weights_file(path, "");
  const DinoV2Options o = dinov2_options_for_weights(w, path);
  w.erase("mask_token");  // the official model's masked-image-modelling token: not used for features
  DinoV2 model(o);
  load_module_tensors(*model, w, path);
  model->eval();
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  return model;
}

at::Tensor imagenet_normalize(const at::Tensor& x) {
  const auto opts = at::TensorOptions().dtype(x.scalar_type()).device(x.device());
  const at::Tensor mean =
      at::tensor(std::vector<double>(datasets::kImageNetMean.begin(), datasets::kImageNetMean.end()))
          .to(opts)
          .view({1, 3, 1, 1});
  const at::Tensor std = at::tensor(std::vector<double>(datasets::kImageNetStd.begin(), datasets::kImageNetStd.end()))
                             .to(opts)
                             .view({1, 3, 1, 1});
  return (x - mean) / std;
}

}  // namespace moh::vision
