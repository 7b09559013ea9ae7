#include "diffusion/experiment.h"

#include "core/error.h"
#include "diffusion/dit.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/dit_experiment.h"
#include "vision/classification_trainer.h"
#include "vision/classifier_experiment.h"
#include "vision/attention_core.h"
#include "vision/transnext.h"

#include <cstdio>

namespace moh {

std::string family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::classifier: return "classifier";
    case ModelFamily::dit: return "DiT";
    case ModelFamily::sd_vae: return "SD-VAE";
    case ModelFamily::fid_inception: return "FID-Inception";
  }
  return "?";
}

std::vector<std::string> all_model_names() {
  std::vector<std::string> all;
  for (const auto& [n, o] : vision::classifier_variants()) all.push_back(n);
  for (const auto& [n, o] : diffusion::dit_variants()) all.push_back(n);
  all.emplace_back(kSdVaeName);
  all.emplace_back(kFidInceptionName);
  return all;
}

ModelFamily model_family(const std::string& name, const std::string& what) {
  for (const auto& [n, o] : vision::classifier_variants())
    if (n == name) return ModelFamily::classifier;
  for (const auto& [n, o] : diffusion::dit_variants())
    if (n == name) return ModelFamily::dit;
  if (name == kSdVaeName) return ModelFamily::sd_vae;
  if (name == kFidInceptionName) return ModelFamily::fid_inception;
  const std::string near = nearest_name(name, all_model_names());
  throw UserError(what.empty() ? "model '" + name + "'" : what, "unknown model variant or network",
                  near.empty() ? "see `moh info --list`" : "did you mean '" + near + "'?");
}

namespace {

std::string path_word(AttentionPath p) { return p == AttentionPath::sparse ? "**sparse**" : "dense"; }

// Rows of a DiT variant at `tokens` per image: consecutive layers with the same heads and active heads share a row.
std::string dit_path_rows(const std::string& name, int64_t image_px, int64_t latent_factor) {
  diffusion::DiTOptions o = diffusion::dit_options(name);
  o.input_size = image_px / latent_factor;
  const int64_t tokens = o.num_patches();
  std::string rows;
  for (int64_t i = 0; i < o.depth;) {
    const vision::MoHAttentionOptions a = o.layer(i);
    int64_t j = i + 1;
    while (j < o.depth && o.layer(j).num_heads == a.num_heads && o.layer(j).active_heads() == a.active_heads()) ++j;
    const double active = static_cast<double>(a.active_heads()) / static_cast<double>(a.num_heads);
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %lld px, %lld tokens | %lld–%lld | %lld of %lld (%.2f) | %s | %s | %s |\n",
                  name.c_str(), static_cast<long long>(image_px), static_cast<long long>(tokens),
                  static_cast<long long>(i), static_cast<long long>(j - 1), static_cast<long long>(a.active_heads()),
                  static_cast<long long>(a.num_heads), active,
                  path_word(vision::auto_attention_path(active, tokens, vision::PathTarget::cpu_libtorch2)).c_str(),
                  path_word(vision::auto_attention_path(active, tokens, vision::PathTarget::cpu_libtorch1)).c_str(),
                  path_word(vision::auto_attention_path(active, tokens, vision::PathTarget::cuda)).c_str());
    rows += line;
    i = j;
  }
  return rows;
}

}  // namespace

TaskFactory task_factory(const ExperimentConfig& cfg) {
  switch (model_family(cfg.model.name, "config: model.name '" + cfg.model.name + "'")) {
    case ModelFamily::classifier:
      return [cfg](const RunContext& ctx) { return vision::make_classifier_task(cfg, ctx); };
    case ModelFamily::dit:
      return [cfg](const RunContext& ctx) { return diffusion::make_dit_task(cfg, ctx); };
    default:
      throw UserError("config: model.name", cfg.model.name + " is a fixed network, not a trainable experiment",
                      "pick a classifier or DiT variant (moh info --list)");
  }
}

LoopResult train_experiment(const ExperimentConfig& cfg, const TrainArgs& args) {
  validate_experiment(cfg);
  return run_training(cfg, args, task_factory(cfg));
}

std::string attention_path_table() {
  std::string t =
      "| model | input | layers | active heads | CPU, LibTorch 2.x | CPU, LibTorch 1.13 | GPU |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const auto& [name, o] : diffusion::dit_variants())
    if (o.attention == AttentionMode::moh && name.find("Pixel") == std::string::npos) t += dit_path_rows(name, 256, 8);
  t += dit_path_rows("MoH-DiT-XL/2-90", 512, 8) + dit_path_rows("MoH-DiT-XL/2-75", 512, 8);
  t += dit_path_rows("MoH-DiT-Pixel/4-75", 28, 1);
  for (const auto& [name, o] : vision::classifier_variants())
    if (name.rfind("MoH-ViT", 0) == 0 && name.find("Nano") == std::string::npos)
      t += "| " + name + " | 224 px | every MoH layer | " + std::to_string(static_cast<int>(o.active_ratio() * 100 + 0.5)) +
           " % overall | dense | dense | dense |\n";
  return t;
}

void validate_experiment(const ExperimentConfig& cfg, ExperimentUse use) {
  switch (model_family(cfg.model.name, "config: model.name '" + cfg.model.name + "'")) {
    case ModelFamily::classifier: return vision::validate_classifier_experiment(cfg);
    case ModelFamily::dit:
      return diffusion::validate_dit_experiment(cfg, use != ExperimentUse::extract_latents, use == ExperimentUse::sample);
    default:
      throw UserError("config: model.name", cfg.model.name + " is a fixed network, not a trainable experiment",
                      "pick a classifier or DiT variant (moh info --list)");
  }
}

}  // namespace moh
