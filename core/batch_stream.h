#pragma once
// The batch interface between data loaders (datasets/) and the training loop (core/train_loop.h).
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
};

}  // namespace moh
