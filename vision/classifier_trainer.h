#pragma once
// The classifier's training step (TransNeXt / MoH-ViT recipe): cross-entropy with label smoothing (or Mixup/CutMix
// soft targets) plus the MoH load-balance loss (mean over routed layers × β), gradient accumulation. The loop
// (schedule, EMA, checkpoints, resume, ranks) is core/train/train_loop.h; the task that joins them with the
// experiment's data and evaluation is experiments/train_tasks.h.
#include "core/platform/amp.h"
#include "core/platform/run_context.h"
#include "core/train/train_loop.h"
#include "vision/transnext.h"

namespace moh::vision {

/// The forward/backward half of a training step: the batch (x, y) is split into `accum` micro-batches, each runs
/// forward under autocast, cross-entropy (label smoothing) + β·aux in fp32, scaled backward; gradients accumulate in
/// the parameters. Floating-point y (B, classes) are soft targets (Mixup/CutMix, smoothing already folded in). The
/// optimizer half is finish_optimizer_step (core/train/optimizer.h). Returns the task and load-balance losses (means
/// over the micro-batches; 0-dim, on the device).
LossTensors classifier_backward(TransNeXt& model, const at::Tensor& x, const at::Tensor& y, int64_t accum, double beta,
                                double label_smoothing, const RunContext& ctx, const GradScaler& scaler);

}  // namespace moh::vision
