#pragma once
// The batch interface between data loaders (datasets/) and the training loop (core/train/train_loop.h).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace moh {

/// A sequence of (inputs, labels) batches: one epoch of one rank's share of a loader.
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  /// Batches in the epoch (after drop_last).
  virtual int64_t num_batches() const = 0;
  /// Next batch; false at the end of the epoch.
  virtual bool next(at::Tensor& x, at::Tensor& y) = 0;
  /// What the task needs of the last batch beside x and y, one row per item (the clean images of a latent batch, for
  /// REPA's encoder); undefined for most streams. Passed to TrainTask::backward as StepInfo::side.
  virtual at::Tensor side() const { return {}; }
};

}  // namespace moh
