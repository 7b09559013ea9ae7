#pragma once
// The non-finite guard of a training run (what Megatron and DeepSpeed do every step): after the backward pass and the
// gradient average, one flag on the device says whether the loss and every gradient are finite. A step with a
// non-finite value is not taken — weights, optimizer state, EMA, schedule and step counter stay as they were (the
// fp16 loss scaler's skip, for every precision) — and counted in `skipped_steps`; `train.max_nonfinite_steps` such
// steps in a row end the run with one line naming the steps and the last finite checkpoint.
//
// Where the optimizer can skip on the device (fused AdamW takes the flag as its found_inf), nothing waits for the
// flag: the update is masked there, and the host learns of a skipped step one step later, from a copy it queued
// into pinned memory, while the next step runs (DeferredFlag). Elsewhere the host reads the flag before the optimizer
// step (on a CPU that costs nothing; the fp16 scaler reads its own flag anyway).
#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moh {

/// 1 where `loss` and every defined gradient of `params` are finite, else 0: a 0-dim float tensor on the gradients'
/// device, computed there (multi-tensor norms; no read back).
at::Tensor finite_flag(const at::Tensor& loss, const std::vector<at::Tensor>& params);

/// A 0-dim device value read back on the host later without stalling the device: put() queues a copy into pinned
/// host memory and records an event; take() waits for that event only (normally long done) and returns the value.
/// On the CPU the value is simply kept.
class DeferredFlag {
 public:
  void put(const at::Tensor& value);
  bool pending() const { return pending_; }
  double take();

 private:
  at::Tensor host_;
  std::unique_ptr<c10::Event> event_;
  bool pending_ = false;
};

/// Consecutive non-finite steps of a run and where they began; what the loop tells the user when it gives up.
class NonFiniteRun {
 public:
  explicit NonFiniteRun(int64_t max_in_a_row) : max_(max_in_a_row) {}
  /// Records one step's outcome (`batch`: its 0-based index among the run's batches). True when the run must end.
  bool record(bool finite, int64_t batch);
  int64_t in_a_row() const { return in_a_row_; }
  /// "non-finite loss or gradients in batches 1205–1214 of the run (10 in a row)" (the current streak).
  std::string streak() const;

 private:
  int64_t max_, in_a_row_ = 0, first_ = 0, last_ = 0;
};

/// Whether every tensor is finite (one reduction per tensor on its device, one read back): checkpoints are checked
/// with it before they are written.
bool all_finite(const std::vector<at::Tensor>& tensors);

}  // namespace moh
