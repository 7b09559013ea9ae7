#include "vision/nn/cpu_simd.h"

#include <atomic>

namespace moh::nn::simd {

namespace {

Isa cpu_own_isa() {
#if MOH_SIMD_X86
  static const Isa own = __builtin_cpu_supports("x86-64-v4")   ? Isa::avx512
                         : __builtin_cpu_supports("x86-64-v3") ? Isa::avx2
                                                               : Isa::baseline;
  return own;
#else
  return Isa::baseline;
#endif
}

std::atomic<int> g_cap{static_cast<int>(Isa::avx512)};

}  // namespace

Isa isa() {
  const int own = static_cast<int>(cpu_own_isa()), cap = g_cap.load(std::memory_order_relaxed);
  return static_cast<Isa>(own < cap ? own : cap);
}

void set_isa(Isa cap) {
  g_cap.store(static_cast<int>(cap), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "AVX-512";
    case Isa::avx2:
      return "AVX2";
    case Isa::baseline:
      return "baseline";
  }
  return "baseline";
}

}  // namespace moh::nn::simd
