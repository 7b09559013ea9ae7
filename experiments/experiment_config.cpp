#include "experiments/experiment_config.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/train/phema.h"

namespace moh::experiments {

void ExperimentConfig::validate(const std::string& origin) const {
  const config::RuleError bad = [&](const std::string& key, const std::string& why, const std::string& hint) {
    throw UserError("config " + origin + ": " + key, why, hint);
  };
  if (version != kConfigVersion)
    bad("version", "unsupported version " + std::to_string(version), "this toolkit reads version 1");
  // Each section's own rules (its owner's validate), then the rules between sections.
  model.validate(bad);
  data.validate(bad);
  augment.validate(bad);
  optim.validate(bad);
  schedule.validate(bad);
  train.validate(bad);
  repa.validate(bad);
  diffusion.validate(bad);
  sampling.validate(bad);
  phema::check_config(train.phema, "config " + origin + ": train.phema");
  if (schedule.min_lr < 0 || schedule.min_lr > optim.lr)
    bad("schedule.min_lr", "must be in [0, optim.lr]", "e.g. 1e-5");
  if (schedule.warmup_epochs > static_cast<double>(train.epochs))
    bad("schedule.warmup_epochs", "longer than train.epochs", "shorten the warm-up");
  if (data.batch_size % train.accum_steps != 0)
    bad("train.accum_steps", "must divide data.batch_size", "pick a divisor of the global batch");
  if (train.processes > 1 && data.batch_size % train.processes != 0)
    bad("data.batch_size",
        std::to_string(data.batch_size) + " does not split into " + std::to_string(train.processes) +
            " processes (train.processes)",
        "use a multiple of it");
  if (data.loader == LoaderKind::memory && (!augment.rand_augment.empty() || augment.repeated > 1))
    bad(augment.repeated > 1 ? "augment.repeated" : "augment.rand_augment", "applies to data.loader: stream",
        "set data.loader: stream (image_folder) or remove it");
  if ((augment.mixup > 0 || augment.cutmix > 0) && data.batch_size % 2 != 0)
    bad("augment.mixup", "Mixup/CutMix pair each image with the reversed batch: data.batch_size must be even", "");
}

ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node tree = config::load_tree(path);
  for (const auto& o : overrides) config::apply_override(tree, o);
  auto cfg = config::read_struct<ExperimentConfig>(tree, path);
  if (cfg.name.empty()) cfg.name = std::filesystem::path(path).stem().string();
  cfg.validate(path);
  return cfg;
}

ExperimentConfig parse_experiment(const std::string& yaml_text, const std::string& origin) {
  YAML::Node tree;
  try {
    tree = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw UserError(origin, "invalid YAML: " + std::string(e.what()), "the stored config is corrupt");
  }
  config::check_tree_size(tree, origin);
  config::check_duplicate_keys(tree, origin);
  auto cfg = config::read_struct<ExperimentConfig>(tree, origin);
  cfg.validate(origin);
  return cfg;
}

ExperimentConfig with_overrides(const ExperimentConfig& cfg, const std::vector<std::string>& overrides,
                                const std::string& origin) {
  YAML::Node tree = YAML::Load(to_yaml(cfg));
  for (const auto& o : overrides) config::apply_override(tree, o);
  ExperimentConfig out = config::read_struct<ExperimentConfig>(tree, origin);
  out.validate(origin);
  return out;
}

std::string to_yaml(const ExperimentConfig& cfg) {
  return config::write_struct(cfg);
}

}  // namespace moh::experiments
