#pragma once
// What the one training loop (core/train/train_loop.h) is handed for an experiment: its LoopConfig (the loop's sections
// of the file, the file itself) and the family's TrainTask — the classification task (TransNeXt / MoH-ViT recipe: AdamW
// without decay on norms, biases and the official keywords; cross-entropy with label smoothing or Mixup/CutMix soft
// targets + β·load-balance loss; top-1/top-5 of the model and its EMA) and the DiT task (DiT train.py: uniform t, the
// hybrid loss + β·load-balance loss, the draws made for the global batch on every rank). The steps themselves are
// vision/classifier_trainer.h and diffusion/diffusion_trainer.h.
#include <memory>

#include "core/platform/run_context.h"
#include "core/train/train_loop.h"
#include "experiments/classifier_experiment.h"
#include "experiments/dit_experiment.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

/// The loop's view of an experiment (the resolved file included, as every checkpoint stores it).
LoopConfig loop_config(const ExperimentConfig& cfg);

/// The classification task for run_training().
std::unique_ptr<TrainTask> make_classifier_task(const ExperimentConfig& cfg, const RunContext& ctx);

/// The DiT task for run_training().
std::unique_ptr<TrainTask> make_dit_task(const ExperimentConfig& cfg, const RunContext& ctx);

}  // namespace moh::experiments
