#pragma once
// A classification experiment built from its config: the model options, input pipelines, data splits and their
// loaders, top-1/top-5 evaluation and checkpoint loading. Used by the classification task (train_tasks.cpp),
// `moh eval` and the classifier feature net (feature_nets.cpp).
#include <memory>
#include <string>

#include "core/dist/distributed.h"
#include "core/platform/run_context.h"
#include "datasets/augment.h"
#include "datasets/image_folder.h"
#include "datasets/loader.h"
#include "experiments/experiment_config.h"
#include "experiments/model_family.h"
#include "vision/head_load.h"
#include "vision/transnext.h"

namespace moh::experiments {

/// The registry variant with the model section's overrides applied (UserError for overrides a classifier cannot
/// take); not yet validated, as `moh forward` still sets the input's size and the weights' classes.
vision::TransNeXtOptions classifier_options_for(const ModelConfig& model);
/// The model of an experiment: the above with the training settings that shape it, validated.
vision::TransNeXtOptions classifier_options_for(const ExperimentConfig& cfg);

/// Every rule of a classification experiment beyond ExperimentConfig::validate(): model overrides, augmentation
/// specs. Reads no data; run by `moh config` and before any work by every command.
void validate_classifier_experiment(const ExperimentConfig& cfg);

/// Input pipeline of the experiment (training adds the configured augmentation).
datasets::ImageTransform transform_for(const ExperimentConfig& cfg, const vision::TransNeXtOptions& model);

/// Mixup/CutMix settings of the experiment (off unless augment.mixup / augment.cutmix > 0).
datasets::MixupOptions mixup_for(const ExperimentConfig& cfg, const vision::TransNeXtOptions& model);

/// One split of a classification experiment: decoded into memory (data.loader: memory) or an ImageFolder index
/// streamed batch by batch (data.loader: stream), with the loaders of its epochs.
class ClassifierSplit {
 public:
  ClassifierSplit(const ExperimentConfig& cfg, const vision::TransNeXtOptions& model, bool train);
  int64_t size() const;
  /// One epoch in batches (train: shuffled and augmented; eval: in order, every image once).
  /// With world > 1 the rank's share (strided), `batch_size` images per rank.
  std::unique_ptr<datasets::BatchStream> epoch(int64_t epoch, int64_t batch_size, bool train, int64_t start_batch = 0,
                                               bool drop_last = true, int rank = 0, int world = 1) const;

 private:
  ExperimentConfig cfg_;
  vision::TransNeXtOptions model_;
  datasets::ImageTransform tf_;
  datasets::SampleTransformOptions stream_tf_;
  datasets::ImageSet set_;
  datasets::ImageFolderIndex index_;
  bool stream_ = false, train_ = false;
};

/// Accuracy and loss over a split.
struct EvalResult {
  double top1 = 0, top5 = 0, loss = 0;
  int64_t count = 0;
};
/// With `head_load`, also accumulates the MoH head selections of every batch.
EvalResult evaluate_classifier(vision::TransNeXt& model, datasets::BatchStream& batches, const RunContext& ctx,
                               vision::HeadLoadStats* head_load = nullptr);
/// Every rank evaluates its share of the split; the counts (and head loads) are summed (identical on every rank).
EvalResult evaluate_sharded(vision::TransNeXt& model, const ClassifierSplit& split, int64_t batch_size,
                            const RunContext& ctx, dist::Group& group, vision::HeadLoadStats* head_load = nullptr);

/// A classifier loaded from one of this toolkit's checkpoints.
using LoadedClassifier = LoadedModel<vision::TransNeXt>;
/// Loads a classifier checkpoint (checkpoint or run directory): its model weights, or with `ema` its EMA weights (a
/// UserError if it kept none). A DiT checkpoint is a UserError.
LoadedClassifier load_classifier_checkpoint(const std::string& path, bool ema = false);

}  // namespace moh::experiments
