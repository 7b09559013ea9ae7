#pragma once
// The classification trainer (TransNeXt / MoH-ViT recipe): AdamW with the official no-decay rules, timm-style cosine
// schedule with linear warm-up (per epoch as in the official code, or per step), gradient clipping, label
// smoothing, the MoH load-balance loss (mean over routed layers × β), gradient accumulation, top-1/top-5
// evaluation, metrics JSONL, a progress bar, atomic checkpoints and exact resume.
#include <string>

#include "core/amp.h"
#include "core/distributed.h"
#include "core/experiment_config.h"
#include "core/run_context.h"
#include "datasets/augment.h"
#include "datasets/image_folder.h"
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

/// One split of a classification experiment: decoded into memory (data.loader: memory) or an ImageFolder index
/// streamed batch by batch (data.loader: stream), with the loaders of its epochs.
class ClassifierSplit {
 public:
  ClassifierSplit(const ExperimentConfig& cfg, const TransNeXtOptions& model, bool train);
  int64_t size() const;
  /// One epoch in batches (train: shuffled and augmented; eval: in order, every image once).
  /// With world > 1 the rank's share (strided), `batch_size` images per rank.
  std::unique_ptr<datasets::BatchStream> epoch(int64_t epoch, int64_t batch_size, bool train, int64_t start_batch = 0,
                                               bool drop_last = true, int rank = 0, int world = 1) const;
  const datasets::ImageSet& images() const { return set_; }

 private:
  ExperimentConfig cfg_;
  TransNeXtOptions model_;
  datasets::ClassifierTransform tf_;
  datasets::SampleTransformOptions stream_tf_;
  datasets::ImageSet set_;
  datasets::ImageFolderIndex index_;
  bool stream_ = false, train_ = false;
};

/// Mixup/CutMix settings of the experiment (off unless augment.mixup / augment.cutmix > 0).
datasets::MixupOptions mixup_for(const ExperimentConfig& cfg, const TransNeXtOptions& model);

/// Accuracy and loss over a split.
struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t count = 0;
};
/// With `head_load`, also accumulates the MoH head selections of every batch.
EvalResult evaluate_classifier(TransNeXt& model, datasets::BatchStream& batches, const RunContext& ctx,
                               HeadLoadStats* head_load = nullptr);
/// Every rank evaluates its share of the split; the counts (and head loads) are summed (identical on every rank).
EvalResult evaluate_sharded(TransNeXt& model, const ClassifierSplit& split, int64_t batch_size, const RunContext& ctx,
                            dist::Group& group, HeadLoadStats* head_load = nullptr);
/// Convenience: every image of an in-memory set, in order.
EvalResult evaluate_classifier(TransNeXt& model, const datasets::ImageSet& set, const datasets::ClassifierTransform& tf,
                               int64_t batch_size, const RunContext& ctx, HeadLoadStats* head_load = nullptr);

/// Task and load-balance loss of one optimizer step (means over its micro-batches).
struct StepLosses {
  double loss = 0, aux = 0;
};
/// The forward/backward half of a training step: the batch (x, y) is split into `accum` micro-batches, each runs
/// forward under autocast, cross-entropy (label smoothing) + β·aux in fp32, scaled backward; gradients accumulate in
/// the parameters. Floating-point y (B, classes) are soft targets (Mixup/CutMix, smoothing already folded in). The optimizer half is finish_optimizer_step (core/amp.h).
StepLosses classifier_backward(TransNeXt& model, const at::Tensor& x, const at::Tensor& y, int64_t accum, double beta,
                               double label_smoothing, const RunContext& ctx, const GradScaler& scaler);

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
