#pragma once
// The typed, versioned experiment configuration: the only place YAML becomes values. The file's sections are declared
// by the libraries that own their words — training (core/train_config.h), data (datasets/data_config.h), the model
// and its attention (vision/nn/model_config.h), diffusion and sampling (diffusion/diffusion_config.h) — and put
// together here, above every family; `moh config --schema` prints them all. Models and trainers take the sections
// (or options derived from them), never YAML.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"
#include "core/train_config.h"
#include "datasets/data_config.h"
#include "diffusion/diffusion_config.h"
#include "vision/nn/model_config.h"

namespace moh::experiments {

/// Current config format version (`version:` in every experiment file).
constexpr int64_t kConfigVersion = 1;

/// `train:` as the file writes it: the loop's keys (core/train_config.h) and the DiT-only `train.repa` section.
struct TrainSection {
  TrainConfig& loop;
  RepaConfig& repa;
  template <class V>
  void visit(V& v) {
    loop.visit(v);
    v.section("repa", repa, "REPA representation alignment (DiT experiments; off while encoder is empty)");
  }
};

/// The whole experiment file.
struct ExperimentConfig {
  int64_t version = kConfigVersion;
  std::string name;  ///< run name; "" = the config file's stem
  ModelConfig model;
  DataConfig data;
  AugmentConfig augment;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  RepaConfig repa;  ///< train.repa
  DiffusionConfig diffusion;
  SamplingConfig sampling;
  LogConfig log;

  template <class V>
  void visit(V& v) {
    v.field("version", version, "config format version (this toolkit reads 1)", config::Range{1, 1000});
    v.field("name", name, "run name; empty = the config file's stem");
    v.section("model", model, "network variant and attention options");
    v.section("data", data, "dataset, batch size and loading");
    v.section("augment", augment, "classification augmentation (ImageNet recipe)");
    v.section("optim", optim, "optimizer (AdamW)");
    v.section("schedule", schedule, "learning-rate schedule");
    TrainSection train_section{train, repa};
    v.section("train", train_section, "training loop");
    v.section("diffusion", diffusion, "Gaussian diffusion process (DiT experiments)");
    v.section("sampling", sampling, "reverse-process sampling and classifier-free guidance (DiT experiments)");
    v.section("log", log, "what a run writes besides metrics.jsonl and log.txt");
  }

  /// Cross-field rules; throws UserError naming the key (origin = the config file).
  void validate(const std::string& origin) const;
};

/// Loads a config file with `base:` inheritance and `--set` overrides, parses it strictly and validates it.
ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides = {});

/// Parses and validates resolved YAML text (e.g. the config.resolved.yaml stored in a checkpoint).
ExperimentConfig parse_experiment(const std::string& yaml_text, const std::string& origin);

/// A resolved config with `--set` overrides applied (through its YAML form, so the same strict parsing and
/// validation apply; origin names the overrides in errors).
ExperimentConfig with_overrides(const ExperimentConfig& cfg, const std::vector<std::string>& overrides,
                                const std::string& origin = "--set");

/// The resolved config as YAML text (printed at start, saved in run dirs and checkpoints).
std::string to_yaml(const ExperimentConfig& cfg);

}  // namespace moh::experiments
