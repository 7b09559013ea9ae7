#pragma once
// The classification trainer (TransNeXt / MoH-ViT recipe): AdamW with the official no-decay rules, timm-style cosine
// schedule with linear warm-up (per epoch as in the official code, or per step), gradient clipping, label
// smoothing, the MoH load-balance loss (mean over routed layers × β), gradient accumulation, top-1/top-5
// evaluation, metrics JSONL, a progress bar, atomic checkpoints and exact resume.
#include <string>

#include "core/experiment_config.h"
#include "core/run_context.h"
#include "datasets/loader.h"
#include "vision/head_load.h"
#include "vision/transnext.h"

namespace moh::vision {

/// The model of an experiment: the registry variant with the config's overrides applied.
TransNeXtOptions classifier_options_for(const ExperimentConfig& cfg);

/// Learning rate at (fractional) epoch t: timm CosineLRScheduler as the official recipe configures it
/// (t_initial = epochs, warm-up from warmup_lr over warmup_epochs, cosine to min_lr over t / epochs).
double learning_rate_at(const ExperimentConfig& cfg, double t);

/// Train or validation split of the experiment's dataset (limits applied); image folders are decoded to `channels`
/// (1 = grey, 3 = RGB).
datasets::ImageSet load_split(const ExperimentConfig& cfg, bool train, int64_t channels);

/// Input pipeline of the experiment (training adds the configured augmentation).
datasets::ClassifierTransform transform_for(const ExperimentConfig& cfg, const TransNeXtOptions& model);

/// Accuracy and loss over a split.
struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t count = 0;
};
/// With `head_load`, also accumulates the MoH head selections of every batch.
EvalResult evaluate_classifier(TransNeXt& model, const datasets::ImageSet& set, const datasets::ClassifierTransform& tf,
                               int64_t batch_size, const RunContext& ctx, HeadLoadStats* head_load = nullptr);

/// Where a training run lives and whether to continue one.
struct TrainArgs {
  std::string run_dir;  ///< "" = runs/<config name>
  std::string resume;   ///< "" (fresh; refuses an existing run), "auto" (latest checkpoint if any) or a directory
};

/// Result of a training run.
struct TrainResult {
  EvalResult final_eval;
  EvalResult final_eval_ema;  ///< of the EMA weights (train.ema_decay > 0), else empty
  double best_top1 = 0;
  int64_t steps = 0;
  std::string run_dir;
  double seconds = 0;
};

/// Runs (or resumes) training as configured.
TrainResult train_classifier(const ExperimentConfig& cfg, const TrainArgs& args);

}  // namespace moh::vision
