// Scalar float arithmetic the compiler vectorises, shared by the hand-written CPU loops (gelu_cpu.cpp,
// attention_cpu.cpp): bf16 <-> fp32 on raw bits, an exponential without library calls, and the attribute that
// compiles a loop for AVX-512, AVX2 and the baseline, picked at load time.
#pragma once

#include <cstdint>
#include <cstring>

// AVX-512 (with BW/VL: bf16 bits are 16-bit lanes) and AVX2 copies beside the baseline one, picked at load time;
// GCC vectorises these loops' selects and conversions for neither SSE2 baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define MOH_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MOH_CPU_CLONES
#endif
// For the helpers such a loop calls: a helper left out of line is compiled for the baseline only.
#if defined(__GNUC__)
#define MOH_INLINE_INTO_CLONES inline __attribute__((always_inline))
#else
#define MOH_INLINE_INTO_CLONES inline
#endif

namespace moh::nn::simd {

MOH_INLINE_INTO_CLONES float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
MOH_INLINE_INTO_CLONES uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
MOH_INLINE_INTO_CLONES float bf16_to_float(uint16_t h) {
  return from_bits(static_cast<uint32_t>(h) << 16);
}
/// Round to nearest even, NaN kept a (quiet) NaN: c10::BFloat16's rounding.
MOH_INLINE_INTO_CLONES uint16_t float_to_bf16(float f) {
  const uint32_t b = to_bits(f);
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

/// e^x for x in [-87, 88] (clamped outside), within 2 ulps: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite, two-part
/// ln2), e^r by its degree-7 Taylor-like minimax polynomial (Cephes expf's coefficients), 2^n built in the exponent.
/// NaN stays NaN.
MOH_INLINE_INTO_CLONES float exp_clamped(float x) {
  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23 trick
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  return p * from_bits(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace moh::nn::simd
