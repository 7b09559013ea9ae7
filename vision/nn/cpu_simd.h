// Float arithmetic on vectors of W lanes (GCC's vector extension) for the hand-written CPU loops (gelu_cpu.cpp,
// attention_cpu.cpp), compiled once per instruction set and picked at run time: W = 16 with AVX-512, 8 with AVX2 +
// FMA, 4 with the x86-64 baseline (SSE2). Each loop is a template on W, instantiated inside a function compiled for
// that instruction set (MOH_SIMD_VARIANTS), so every vector is one register of that set. The width matters: a
// 16-lane vector compiled for AVX2 had its selects, conversions and loads split lane by lane, and left to the
// auto-vectoriser the AVX2 code of the exponential's clamp became branches: both left the AVX2 loops scalar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

// The vector values below live only inside the always-inlined helpers of one instruction set's function: no call
// passes or returns them across sets, so GCC's warning about the ABI of vector values without AVX does not apply
// (parameters are references: its note for a 64-byte vector parameter ignores the pragma).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define MOH_SIMD_X86 1
#define MOH_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define MOH_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define MOH_SIMD_X86 0
#define MOH_TARGET_AVX512
#define MOH_TARGET_AVX2
#endif
// For the helpers such a function calls: a helper left out of line is compiled for the baseline only.
#if defined(__GNUC__)
#define MOH_INLINE_INTO_CLONES inline __attribute__((always_inline))
#else
#define MOH_INLINE_INTO_CLONES inline
#endif

namespace moh::nn::simd {

/// The instruction sets the loops are compiled for, narrowest first.
enum class Isa { baseline = 0, avx2 = 1, avx512 = 2 };
/// The widest set this CPU runs (AVX-512 F/BW/DQ/VL, or AVX2 + FMA + BMI + F16C, as x86-64-v4 / -v3 define them),
/// unless set_isa() capped it.
Isa isa();
/// Caps isa() at `cap` (tests run every variant the CPU has); Isa::avx512 restores the CPU's own choice.
void set_isa(Isa cap);
/// The name printed for a set: "AVX-512", "AVX2", "baseline".
const char* isa_name(Isa isa);
/// Caps isa() at a set for its lifetime (tests and benchmarks run each variant the CPU has).
class IsaCap {
 public:
  explicit IsaCap(Isa cap) { set_isa(cap); }
  ~IsaCap() { set_isa(Isa::avx512); }
  IsaCap(const IsaCap&) = delete;
  IsaCap& operator=(const IsaCap&) = delete;
};

/// Defines `void name params`, which runs `impl<W> args` compiled for the widest set isa() allows: W = 16 with
/// AVX-512, 8 with AVX2, 4 otherwise. `impl` is a template on W whose helpers are all MOH_INLINE_INTO_CLONES.
#define MOH_SIMD_VARIANTS(name, impl, params, args)    \
  MOH_TARGET_AVX512 static void name##_avx512 params { \
    impl<16> args;                                     \
  }                                                    \
  MOH_TARGET_AVX2 static void name##_avx2 params {     \
    impl<8> args;                                      \
  }                                                    \
  static void name##_baseline params {                 \
    impl<4> args;                                      \
  }                                                    \
  void name params {                                   \
    switch (::moh::nn::simd::isa()) {                  \
      case ::moh::nn::simd::Isa::avx512:               \
        return name##_avx512 args;                     \
      case ::moh::nn::simd::Isa::avx2:                 \
        return name##_avx2 args;                       \
      case ::moh::nn::simd::Isa::baseline:             \
        return name##_baseline args;                   \
    }                                                  \
  }

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

/// W floats, W 32-bit integers and W bf16 bit patterns as values of GCC's vector extension.
template <int W>
struct Lanes {
  typedef float f __attribute__((vector_size(W * sizeof(float))));
  typedef int32_t i __attribute__((vector_size(W * sizeof(int32_t))));
  typedef uint32_t u __attribute__((vector_size(W * sizeof(uint32_t))));
  typedef uint16_t h __attribute__((vector_size(W * sizeof(uint16_t))));
};
template <int W>
using Vec = typename Lanes<W>::f;

template <int W>
MOH_INLINE_INTO_CLONES Vec<W> splat(float x) {
  return Vec<W>{} + x;
}
/// W values from memory (any alignment) and back: fp32 as is, bf16 (raw bits) widened exactly and rounded back to
/// nearest even as float_to_bf16 does.
template <int W>
MOH_INLINE_INTO_CLONES Vec<W> load(const float* p) {
  Vec<W> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int W>
MOH_INLINE_INTO_CLONES Vec<W> load(const uint16_t* p) {
  typename Lanes<W>::h h;
  std::memcpy(&h, p, sizeof h);
  const typename Lanes<W>::u b = __builtin_convertvector(h, typename Lanes<W>::u) << 16;
  return __builtin_bit_cast(Vec<W>, b);
}
template <int W>
MOH_INLINE_INTO_CLONES void store(float* p, const Vec<W>& v) {
  std::memcpy(p, &v, sizeof v);
}
template <int W>
MOH_INLINE_INTO_CLONES void store(uint16_t* p, const Vec<W>& f) {
  using U = typename Lanes<W>::u;
  const U b = __builtin_bit_cast(U, f);
  U rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  rounded = f != f ? U{} + 0x7FC0u : rounded;
  const typename Lanes<W>::h h = __builtin_convertvector(rounded, typename Lanes<W>::h);
  std::memcpy(p, &h, sizeof h);
}
/// The first m < W values (the rest zero), and back: a loop's tail through the same vector operations as its body,
/// so that an element's result does not depend on where it lies.
template <int W, class T>
MOH_INLINE_INTO_CLONES Vec<W> load_n(const T* p, int64_t m) {
  T buf[W] = {};
  std::memcpy(buf, p, static_cast<size_t>(m) * sizeof(T));
  return load<W>(buf);
}
template <int W, class T>
MOH_INLINE_INTO_CLONES void store_n(T* p, const Vec<W>& v, int64_t m) {
  T buf[W];
  store<W>(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(m) * sizeof(T));
}
/// Values as a tensor of T holds them: fp32 as is, bf16 rounded (to nearest even) and widened back.
template <int W, class T>
MOH_INLINE_INTO_CLONES Vec<W> stored_as(const Vec<W>& v) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return v;
  } else {
    uint16_t buf[W];
    store<W>(buf, v);
    return load<W>(buf);
  }
}
/// Lane-wise maximum and the sum and maximum of all lanes (NaN lanes skipped by the maxima; they reach a result
/// through the exponentials).
template <int W>
MOH_INLINE_INTO_CLONES Vec<W> max(const Vec<W>& a, const Vec<W>& b) {
  return a > b ? a : b;
}
template <int W>
MOH_INLINE_INTO_CLONES float lane_sum(const Vec<W>& v) {
  float s = 0.f;
  for (int l = 0; l < W; ++l) s += v[l];
  return s;
}
template <int W>
MOH_INLINE_INTO_CLONES float lane_max(const Vec<W>& v) {
  float m = v[0];
  for (int l = 1; l < W; ++l) m = v[l] > m ? v[l] : m;
  return m;
}

/// e^x for x in [-87, 88] (clamped outside), within 2 ulps, lane by lane: x = n ln2 + r with |r| <= ln2 / 2
/// (Cody-Waite, two-part ln2), e^r by its degree-7 Taylor-like minimax polynomial (Cephes expf's coefficients), 2^n
/// built in the exponent. NaN stays NaN.
template <int W>
MOH_INLINE_INTO_CLONES Vec<W> exp_clamped(const Vec<W>& in) {
  Vec<W> x = in < splat<W>(-87.f) ? splat<W>(-87.f) : in;
  x = x > splat<W>(88.f) ? splat<W>(88.f) : x;
  const Vec<W> n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23 trick
  const Vec<W> r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  Vec<W> p = splat<W>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const typename Lanes<W>::i e = (__builtin_convertvector(n, typename Lanes<W>::i) + 127) << 23;
  return p * __builtin_bit_cast(Vec<W>, e);
}

}  // namespace moh::nn::simd

#pragma GCC diagnostic pop
