// Runs a test's body once for each instruction set the CPU has (vision/nn/cpu_simd.h: AVX-512, AVX2, the baseline),
// so that one machine checks every variant it can run, whatever the CI machine of the day is.
#pragma once

#include <gtest/gtest.h>

#include "vision/nn/cpu_simd.h"

namespace moh::nn {

template <class F>
void for_each_isa(const F& body) {
  const int own = static_cast<int>(simd::isa());
  for (int i = own; i >= 0; --i) {
    const auto isa = static_cast<simd::Isa>(i);
    const simd::IsaCap cap(isa);
    SCOPED_TRACE(std::string("instruction set ") + simd::isa_name(isa));
    body();
  }
}

}  // namespace moh::nn
