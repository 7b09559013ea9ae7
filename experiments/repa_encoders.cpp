#include "experiments/repa_encoders.h"

#include "datasets/latents.h"

#include <torch/nn/functional/upsampling.h>

#include <filesystem>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/sha256.h"
#include "datasets/augment.h"
#include "experiments/classifier_experiment.h"
#include "vision/dinov2.h"

namespace moh::experiments {

namespace {

namespace F = torch::nn::functional;

constexpr const char* kEncoderKey = "config: train.repa.encoder";
constexpr const char* kEncoderHint =
    "a DINOv2 ViT weights file (timm's vit_base_patch14_dinov2 or the official dinov2_vitb14) or a classifier run of "
    "this toolkit";

// How an encoder grid of side g reaches the DiT's side G: the same, area averaging (g > G), each token repeated
// (G a multiple of g), or "" (it cannot).
std::string grid_mapping(int64_t g, int64_t G) {
  if (g == G) return "same";
  if (g > G) return "area";
  return G % g == 0 ? "repeat" : "";
}

// (B, C, g, g) → (B, G², C) by grid_mapping.
at::Tensor to_dit_grid(const at::Tensor& map, int64_t G) {
  const int64_t g = map.size(2);
  at::Tensor m = map;
  if (g > G) m = at::adaptive_avg_pool2d(map, {G, G});
  if (g < G) m = map.repeat_interleave(G / g, 2).repeat_interleave(G / g, 3);
  return m.flatten(2).transpose(1, 2);  // (B, G², C)
}

// Images in [−1, 1] (B, C, H, W) → [0, 1] with `channels` channels (grey repeated to RGB, RGB averaged to grey).
at::Tensor unit_images(const at::Tensor& x, int64_t channels) {
  at::Tensor u = (x.to(at::kFloat) + 1) / 2;
  if (u.size(1) == 1 && channels == 3) u = u.expand({-1, 3, -1, -1});
  if (u.size(1) == 3 && channels == 1) u = u.mean(1, true);
  return u;
}

const std::string& stage_name(int64_t stage) {
  static const std::string names[] = {"1", "2", "3", "4"};
  return names[stage];
}

// The stage (0-based) train.repa.stage names for a classifier: 0 = the last.
int64_t classifier_stage(const RepaConfig& r) {
  return r.stage == 0 ? 3 : r.stage - 1;
}

// UserError unless the classifier's stage grid maps to the DiT's; lists the stages that would.
void check_classifier_grid(const vision::TransNeXtOptions& c, int64_t stage, int64_t G, const std::string& name) {
  const int64_t g = c.stage_size(stage);
  if (!grid_mapping(g, G).empty()) return;
  std::string ok;
  for (int64_t s = 0; s < 4; ++s)
    if (!grid_mapping(c.stage_size(s), G).empty()) ok += (ok.empty() ? "" : ", ") + stage_name(s);
  throw UserError(
      kEncoderKey,
      name + "'s stage-" + stage_name(stage) + " token grid " + std::to_string(g) + "×" + std::to_string(g) +
          " cannot map to the DiT's " + std::to_string(G) + "×" + std::to_string(G) +
          " grid (neither finer nor a divisor of it)",
      ok.empty() ? "no stage of this classifier maps; use a DINOv2 encoder" : "set train.repa.stage to " + ok);
}

RepaEncoder classifier_encoder(const ExperimentConfig& cfg, const diffusion::DiTOptions& dit, const RunContext& ctx) {
  LoadedClassifier c = load_classifier_checkpoint(cfg.repa.encoder);
  const vision::TransNeXtOptions o = c.model->options;
  const int64_t stage = classifier_stage(cfg.repa), G = dit.grid_size(), g = o.stage_size(stage);
  check_classifier_grid(o, stage, G, "classifier " + c.cfg.model.name);
  const datasets::ImageTransform tf = transform_for(c.cfg, o);
  vision::TransNeXt model = c.model;
  model->to(ctx.device);
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  RepaEncoder e;
  e.dim = o.embed_dims[static_cast<size_t>(stage)];
  e.description = "classifier:" + c.cfg.model.name + " (" + c.dir + ") stage " + stage_name(stage) + " (" +
                  std::to_string(g) + "×" + std::to_string(g) + " → " + std::to_string(G) + "×" + std::to_string(G) +
                  ", " + grid_mapping(g, G) + ")";
  e.weights_sha256 = sha256_file(c.weights_file);
  e.targets = [model, tf, stage, G, in = o.in_chans](const at::Tensor& x) mutable {
    at::Tensor u = unit_images(x, in);  // (B, C, H, W) in [0, 1]
    const int64_t H = u.size(2), S = tf.size;
    if (H > S) u = at::adaptive_avg_pool2d(u, {S, S});  // as its FID features: area down, centred zero padding up
    if (H < S) u = at::constant_pad_nd(u, {(S - H) / 2, S - H - (S - H) / 2, (S - H) / 2, S - H - (S - H) / 2}, 0);
    const vision::ClassifierOutput out = model->forward((u - tf.mean) / tf.std);
    return to_dit_grid(out.stages[static_cast<size_t>(stage)].permute({0, 3, 1, 2}), G);  // (B, G², C_s)
  };
  return e;
}

RepaEncoder dinov2_encoder(const ExperimentConfig& cfg, const diffusion::DiTOptions& dit, const RunContext& ctx) {
  vision::DinoV2 model = vision::load_dinov2(cfg.repa.encoder);
  model->to(ctx.device);
  const int64_t G = dit.grid_size(), side = G * model->options.patch_size;
  RepaEncoder e;
  e.dim = model->options.embed_dim;
  e.description = "DINOv2 ViT (" + std::to_string(e.dim) + " wide, " + std::to_string(model->options.depth) +
                  " blocks) at " + std::to_string(side) + " px (" + cfg.repa.encoder + ")";
  e.weights_sha256 = sha256_file(cfg.repa.encoder);
  e.targets = [model, side](const at::Tensor& x) mutable {
    // REPA's preprocess_raw_image: x / 255, ImageNet normalisation, then bicubic resize to the encoder's side.
    const at::Tensor u = vision::imagenet_normalize(unit_images(x, 3));
    const at::Tensor r = F::interpolate(
        u,
        F::InterpolateFuncOptions().size(std::vector<int64_t>{side, side}).mode(torch::kBicubic).align_corners(false));
    return model->forward_patch_tokens(r);  // (B, G², D)
  };
  return e;
}

}  // namespace

void check_repa(const ExperimentConfig& cfg, const diffusion::DiTOptions& dit, bool files) {
  const RepaConfig& r = cfg.repa;
  if (r.encoder.empty()) return;
  if (r.depth < 1 || r.depth > dit.depth)
    throw UserError(
        "config: train.repa.depth",
        std::to_string(r.depth) + " is not a block of " + cfg.model.name + " (1.." + std::to_string(dit.depth) + ")",
        "REPA aligns block 8 of SiT-XL's 28; about a third of the depth");
  if (!files) return;
  if (cfg.data.dataset == DatasetKind::latents && !datasets::read_latent_meta(cfg.data.root).images)
    throw UserError(kEncoderKey, "the latent shards in " + cfg.data.root + " hold no images for the encoder",
                    "extract them with `moh extract-latents CONFIG.yaml --keep-images --out DIR`");
  if (!std::filesystem::exists(r.encoder)) throw UserError(kEncoderKey, "no such file: " + r.encoder, kEncoderHint);
  if (!std::filesystem::is_directory(r.encoder))
    check_regular_file(r.encoder, kEncoderKey + std::string(":"), kEncoderHint);
  if (std::filesystem::is_directory(r.encoder)) {
    const LoadedClassifier c = load_classifier_checkpoint(r.encoder);
    check_classifier_grid(c.model->options, classifier_stage(r), dit.grid_size(), "classifier " + c.cfg.model.name);
  }
}

RepaEncoder make_repa_encoder(const ExperimentConfig& cfg, const diffusion::DiTOptions& dit, const RunContext& ctx) {
  check_repa(cfg, dit);
  return std::filesystem::is_directory(cfg.repa.encoder) ? classifier_encoder(cfg, dit, ctx)
                                                         : dinov2_encoder(cfg, dit, ctx);
}

diffusion::DiTOptions with_repa_projectors(diffusion::DiTOptions dit, const RepaConfig& repa,
                                           const std::vector<int64_t>& z_dims) {
  dit.repa_depth = repa.depth;
  dit.repa_projector_dim = repa.projector_dim;
  dit.repa_z_dims = z_dims;
  return dit;
}

}  // namespace moh::experiments
