#include "vision/nn/gelu_cpu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstring>

#include "vision/nn/fused_math.h"

namespace moh::nn {

namespace gelu_kernels {
namespace {

// Plain float arithmetic throughout (no library calls), so that the compiler vectorises the loops below.
inline float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float bf16_to_float(uint16_t h) {
  return from_bits(static_cast<uint32_t>(h) << 16);
}
/// Round to nearest even, NaN kept a (quiet) NaN: c10::BFloat16's rounding.
inline uint16_t float_to_bf16(float f) {
  const uint32_t b = to_bits(f);
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

/// e^x for x in [-87, 88] (clamped outside), within 2 ulps: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite, two-part
/// ln2), e^r by its degree-7 Taylor-like minimax polynomial (Cephes expf's coefficients), 2^n built in the exponent.
inline float exp_clamped(float x) {
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

using fused::kGeluBeta;
using fused::kGeluKappa;

// 0.5 u (1 + tanh(v)) = u σ(2v) with v = β (u + κ u³): written with σ, so that no 1 + tanh cancels for negative u.
inline float gelu(float u) {
  const float v = kGeluBeta * (u + kGeluKappa * u * u * u);
  return u / (1.f + exp_clamped(-2.f * v));
}
// d/du u σ(2v) = σ + 2 u σ (1 − σ) v', with 1 − σ = σ e^{−2v}.
inline float gelu_grad(float u) {
  const float u2 = u * u;
  const float e = exp_clamped(-2.f * kGeluBeta * (u + kGeluKappa * u2 * u));
  const float s = 1.f / (1.f + e);
  return s + 2.f * u * s * (s * e) * kGeluBeta * (1.f + 3.f * kGeluKappa * u2);
}

}  // namespace

// AVX-512 (with BW/VL: the bf16 bits are 16-bit lanes) and AVX2 copies beside the baseline one, picked at load time;
// GCC vectorises neither loop for the baseline's SSE2 (the clamp's select).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define MOH_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MOH_CPU_CLONES
#endif

MOH_CPU_CLONES void forward(const uint16_t* z, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(gelu(bf16_to_float(z[i])));
}

MOH_CPU_CLONES void backward(const uint16_t* dy, const uint16_t* z, uint16_t* dz, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dz[i] = float_to_bf16(bf16_to_float(dy[i]) * gelu_grad(bf16_to_float(z[i])));
}

#undef MOH_CPU_CLONES

}  // namespace gelu_kernels

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk

const uint16_t* bits_of(const at::Tensor& t) {
  return static_cast<const uint16_t*>(t.data_ptr());
}
uint16_t* bits_of_mut(at::Tensor& t) {
  return static_cast<uint16_t*>(t.data_ptr());
}

struct GeluTanhBf16 : torch::autograd::Function<GeluTanhBf16> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& z_in) {
    const at::Tensor z = z_in.contiguous();
    at::Tensor y = at::empty_like(z);
    const uint16_t* zp = bits_of(z);
    uint16_t* yp = bits_of_mut(y);
    at::parallel_for(0, z.numel(), kGrain, [&](int64_t b, int64_t e) { gelu_kernels::forward(zp + b, yp + b, e - b); });
    ctx->save_for_backward({z});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor z = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(at::kBFloat16).contiguous();
    at::Tensor dz = at::empty_like(z);
    const uint16_t *dyp = bits_of(dy), *zp = bits_of(z);
    uint16_t* dzp = bits_of_mut(dz);
    at::parallel_for(0, z.numel(), kGrain,
                     [&](int64_t b, int64_t e) { gelu_kernels::backward(dyp + b, zp + b, dzp + b, e - b); });
    return {dz};
  }
};

}  // namespace

at::Tensor gelu_tanh_bf16_cpu(const at::Tensor& z) {
  TORCH_CHECK(z.device().is_cpu() && z.scalar_type() == at::kBFloat16, "gelu_tanh_bf16_cpu: a bf16 CPU tensor");
  return GeluTanhBf16::apply(z);
}

}  // namespace moh::nn
