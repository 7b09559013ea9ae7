#pragma once
// Operator-level measurements through ATen's RecordFunction callbacks (the hook PyTorch's profiler uses; present in
// LibTorch 1.13 and 2.x):
//   FlopCounter  counts the floating-point operations of matrix products and convolutions while it lives — the FLOP
//                count behind MFU figures (one multiply-add = 2 FLOPs; element-wise ops are not counted);
//   OpProfiler   accumulates self time per operator name (time in an op minus the ops it called), for finding
//                where a step goes on the CPU;
//   StepProfiler records every operator and user scope (and, on CUDA, every kernel) of what runs while it is active,
//                and classify_profile() turns that into time per op class: where a step's device time goes.
// All see every thread's ATen calls (autograd's backward included). None is reentrant: one of each at a time.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moh::bench {

/// Counts FLOPs of aten::mm/addmm/bmm/baddbmm/convolution and the fused attention kernels while alive.
class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;
  /// FLOPs counted so far.
  double flops() const;

 private:
  uint64_t handle_;
};

/// One row of an operator profile.
struct OpTime {
  std::string name;
  double self_ms = 0;  ///< total self time
  int64_t calls = 0;
};

/// Accumulates per-operator self time while alive.
class OpProfiler {
 public:
  OpProfiler();
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  /// The operators sorted by self time, largest first.
  std::vector<OpTime> table() const;

 private:
  uint64_t handle_;
};

/// One timed event of a step: an operator or `moh::` user scope on a host thread, or a kernel (or copy) on a device.
struct ProfileEvent {
  std::string name;
  uint64_t thread = 0;  ///< host thread of an operator
  int64_t start_ns = 0, end_ns = 0;
  int64_t seq = -1;          ///< autograd sequence number: a forward op and its backward function share it
  bool backward = false;     ///< an autograd backward function (its scope is that of its forward op)
  int64_t parent = -1;       ///< operators: the enclosing operator on the same thread (-1: none)
  bool kernel = false;       ///< ran on a device: its duration is device time
  int64_t launched_by = -1;  ///< kernels: the operator that launched it (-1: unknown, classified by name)
};

/// Where a step's time goes, by op class: "gemm" (matrix products, convolutions), "attention" (the attention core:
/// scores, softmax, values, gating), "router" (gate products, softmax, top-K, two-stage weights, load-balance loss,
/// head-load counts: the `moh::router` scope), "optimizer" (AdamW, clipping), "ema", "copies" (copies, casts,
/// concatenation, gathers, memcpy/memset) and "elementwise" (normalisation, activations, adaLN modulation, residuals
/// and the rest). Device profiles add "idle": the gaps between kernels within the step.
struct ClassProfile {
  bool device = false;               ///< times are kernels' device time (else operators' host self time)
  std::map<std::string, double> ms;  ///< per class
  double busy_ms = 0, span_ms = 0;   ///< device: kernel time (union) and first-kernel-start to last-kernel-end
  std::vector<OpTime> ops;           ///< per operator: its kernels' device time, or its self time; largest first
};

/// Attributes every event's time to an op class: a kernel by the operator that launched it, an operator (host
/// profile) by its self time. The class comes from the innermost `moh::` scope around the operator (a backward
/// function inherits the scope of its forward op by sequence number), else from the operator and its callers'
/// names (attention ops anywhere up the chain, then products, then copies), else from a kernel's own name.
ClassProfile classify_profile(const std::vector<ProfileEvent>& events);

/// Records the events of what runs while active (start() to stop()): Kineto on a LibTorch that has it (operators,
/// scopes and CUDA kernels, the way torch.profiler records them), else RecordFunction callbacks (operators and
/// scopes, host time). `cuda` asks for the kernels of CUDA devices too.
class StepProfiler {
 public:
  explicit StepProfiler(bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  void start();
  /// Ends recording; the events in recording order, operators' parents set.
  std::vector<ProfileEvent> stop();
  /// Whether kernels are recorded (a CUDA request on a LibTorch with Kineto).
  bool records_kernels() const { return kineto_ && cuda_; }

 private:
  bool cuda_, kineto_ = false, running_ = false;
  uint64_t handle_ = 0;
};

}  // namespace moh::bench
