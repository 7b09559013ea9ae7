#pragma once
// Operator-level measurements through ATen's RecordFunction callbacks (the hook PyTorch's profiler uses; present in
// LibTorch 1.13 and 2.x):
//   FlopCounter  counts the floating-point operations of matrix products and convolutions while it lives — the FLOP
//                count behind MFU figures (one multiply-add = 2 FLOPs; element-wise ops are not counted);
//   OpProfiler   accumulates self time per operator name (time in an op minus the ops it called), for finding
//                where a step goes.
// Both see every thread's ATen calls (autograd's backward included). Neither is reentrant: one of each at a time.
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

}  // namespace moh::bench
