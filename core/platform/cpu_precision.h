#pragma once
// What `precision: auto` means on a CPU. Native bf16 instructions do not make bf16 autocast faster by themselves: on
// a Sapphire Rapids guest the pip build's bf16 step was 2x slower than its fp32 step while Debian's build was 2.8x
// faster in bf16 (its fp32 ran on a generic kernel then); docs/BENCHMARKS.md has the table. So auto measures, once
// per machine, build and model: the experiment's training step at its batch, or the largest smaller one that fits the
// budget (or, for a model whose step would not, a DiT-style transformer block) in fp32 and under bf16 autocast,
// interleaved, within about 10 s;
// bf16 is chosen only where it is clearly faster (time < 0.9x fp32's). The verdict is cached, keyed by CPU, flags,
// LibTorch, BLAS core, thread count and workload, so every later run — and every rank of a data-parallel run — takes
// the same precision; the first process to measure holds a lock while the others wait.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "core/train_config.h"

namespace moh {

/// The choice of `precision: auto` on this CPU and why.
struct CpuPrecision {
  Precision precision = Precision::fp32;
  double fp32_ms = 0, bf16_ms = 0;  ///< the calibration's step times (0 when nothing was measured)
  std::string how;                  ///< "no native bf16 on this CPU", "measured", "measured <date>, cached in <file>"
};

/// A workload whose step times decide `precision: auto`: `build(p)` returns one step of it in precision p. moh
/// train passes the experiment's own training step (its model at its per-rank batch, random data; the registry's
/// bench step): a small model can lose in bf16 where a larger one wins (docs/BENCHMARKS.md). `name` keys the cache.
struct PrecisionProbe {
  std::string name;
  int64_t batch = 1;  ///< the batch one step of the run sees: the largest timed (smaller ones when it is slow)
  /// One step in precision p at `batch` images (1 for the first look at the model's size, then 8, then larger).
  std::function<std::function<void()>(Precision, int64_t batch)> build;
};

/// Memoised per process and probe. Without a probe the workload is a DiT-S/2-sized transformer block. The global CPU
/// random state is left as it was. MOH_CPU_PRECISION_CACHE overrides the cache file
/// ($XDG_CACHE_HOME/moh/cpu_precision.json, else ~/.cache/moh/...); an unwritable cache means measuring every time.
const CpuPrecision& cpu_auto_precision(const PrecisionProbe* probe = nullptr);

/// The calibration itself (median step times in fp32 and bf16, ms, interleaved rounds within the budget; the block's
/// when the probe's steps are too slow for it): what cpu_auto_precision caches.
std::pair<double, double> measure_cpu_precision(const PrecisionProbe* probe = nullptr);

/// The rule: bf16 only where measured clearly faster than fp32 (bf16 < 0.9 · fp32).
Precision precision_from_timing(double fp32_ms, double bf16_ms);

}  // namespace moh
