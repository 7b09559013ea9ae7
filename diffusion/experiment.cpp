#include "diffusion/experiment.h"

#include "core/error.h"
#include "diffusion/dit.h"
#include "diffusion/dit_experiment.h"
#include "vision/classifier_experiment.h"
#include "vision/transnext.h"

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

void validate_experiment(const ExperimentConfig& cfg, ExperimentUse use) {
  switch (model_family(cfg.model.name, "config: model.name '" + cfg.model.name + "'")) {
    case ModelFamily::classifier: return vision::validate_classifier_experiment(cfg);
    case ModelFamily::dit: return diffusion::validate_dit_experiment(cfg, use == ExperimentUse::train);
    default:
      throw UserError("config: model.name", cfg.model.name + " is a fixed network, not a trainable experiment",
                      "pick a classifier or DiT variant (moh info --list)");
  }
}

}  // namespace moh
