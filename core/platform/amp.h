#pragma once
// Mixed precision for the trainers: an autocast scope (bf16 on CPU or CUDA, fp16 on CUDA) and a dynamic loss scaler
// for fp16 (LibTorch has no GradScaler). Master weights, optimizer state, EMA and the losses stay fp32: callers run
// the forward pass inside the scope and compute losses on `.to(kFloat)` outputs outside it.
#include <ATen/ATen.h>

#include <torch/optim/adamw.h>

#include <utility>
#include <vector>

#include "core/platform/run_context.h"
#include "core/train_config.h"

namespace moh {

/// Enables autocast on the context's device for the lifetime of the object (fp32: does nothing).
class AutocastScope {
 public:
  explicit AutocastScope(const RunContext& ctx);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false, cuda_ = false, prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

/// Whether `p` runs the forward pass under autocast (bf16, fp16); fp32 and tf32 do not.
bool autocasts(Precision p);
/// The type autocast computes products in under `p` (bf16; fp16 for fp16).
at::ScalarType autocast_dtype(Precision p);

/// Sets whether CUDA's fp32 matrix products (cuBLAS) and convolutions (cuDNN) may round their inputs to TF32 for the
/// lifetime of the object, then restores the previous setting. LibTorch keeps this per process: `precision: tf32`
/// allows it for a whole run, as the official DiT's train.py and sample.py do (`torch.backends.cuda.matmul.allow_tf32
/// = True`); the FID feature networks forbid it while they run (spec: TF32 moves Inception features at 1e-3). A CPU
/// ignores the setting.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool allow);
  /// Allows TF32 under Precision::tf32; any other precision leaves the setting as it is.
  explicit Tf32Scope(Precision p);
  ~Tf32Scope();
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;
  /// The process's current setting: {cuBLAS, cuDNN}.
  static std::pair<bool, bool> current();

 private:
  void engage(bool allow);
  bool active_ = false, prev_cublas_ = false, prev_cudnn_ = false;
};

/// The autocast settings of the calling thread, CPU and CUDA (activation checkpointing re-enters them when autograd
/// recomputes a forward pass on its own thread, as torch.utils.checkpoint does).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  static AutocastState current();
};

/// Applies an AutocastState for its lifetime, then restores the thread's previous settings.
class AutocastRestore {
 public:
  explicit AutocastRestore(const AutocastState& state);
  ~AutocastRestore();
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  AutocastState prev_;
  bool nested_ = false;
};

/// Dynamic loss scaling as torch.cuda.amp.GradScaler (init 2^16, ×2 after 2000 finite steps, ×½ and skip the step on
/// inf/NaN gradients). Disabled (scale 1, never skips) unless the precision is fp16.
class GradScaler {
 public:
  explicit GradScaler(Precision precision);
  at::Tensor scale(const at::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }
  /// Divides the gradients by the scale; returns false (and updates the scale) when any is inf/NaN: skip the step.
  bool unscale_and_update(const std::vector<at::Tensor>& params);
  double current_scale() const { return scale_; }
  /// State for exact resume: {scale, finite steps since the last change}.
  at::Tensor state() const;
  void load_state(const at::Tensor& state);

 private:
  bool enabled_;
  double scale_ = 65536.0;
  int64_t growth_tracker_ = 0;
};

}  // namespace moh
