#pragma once
// The bytes of CPU tensors a piece of work holds at once, counted by a wrapper of LibTorch's CPU allocator rather
// than read from the resident set: a short forward's resident set rises by what the heap could not take from its free
// space, which depends on what ran before (the same evaluation forward measured 364 to 447 MiB in four processes,
// docs/BENCHMARKS.md); the tensors it allocates do not.
#include <functional>
#include <optional>

namespace moh {

/// The peak of the bytes of CPU tensors alive while `run` runs, beyond those alive when it starts (tensors allocated
/// on any thread of this process). nullopt when LibTorch's CPU allocator cannot be wrapped (one that gives no raw
/// deleter, or one installed at a higher priority): then `run` runs uncounted.
std::optional<double> cpu_tensor_peak_during(const std::function<void()>& run);

}  // namespace moh
