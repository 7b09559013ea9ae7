#include "vision/nn/gelu_cpu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <type_traits>

#include "vision/nn/cpu_simd.h"
#include "vision/nn/fused_math.h"

namespace moh::nn {

namespace gelu_kernels {
namespace {

using simd::bf16_to_float;
using simd::exp_clamped;
using simd::float_to_bf16;

using fused::kGeluBeta;
using fused::kGeluKappa;

// 0.5 u (1 + tanh(v)) = u σ(2v) with v = β (u + κ u³): written with σ, so that no 1 + tanh cancels for negative u.
MOH_INLINE_INTO_CLONES float gelu(float u) {
  const float v = kGeluBeta * (u + kGeluKappa * u * u * u);
  return u / (1.f + exp_clamped(-2.f * v));
}
// d/du u σ(2v) = σ + 2 u σ (1 − σ) v', with 1 − σ = σ e^{−2v}.
MOH_INLINE_INTO_CLONES float gelu_grad(float u) {
  const float u2 = u * u;
  const float e = exp_clamped(-2.f * kGeluBeta * (u + kGeluKappa * u2 * u));
  const float s = 1.f / (1.f + e);
  return s + 2.f * u * s * (s * e) * kGeluBeta * (1.f + 3.f * kGeluKappa * u2);
}

}  // namespace

MOH_CPU_CLONES void forward(const uint16_t* z, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(gelu(bf16_to_float(z[i])));
}

MOH_CPU_CLONES void backward(const uint16_t* dy, const uint16_t* z, uint16_t* dz, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dz[i] = float_to_bf16(bf16_to_float(dy[i]) * gelu_grad(bf16_to_float(z[i])));
}

MOH_CPU_CLONES void forward(const float* z, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(z[i]);
}

MOH_CPU_CLONES void backward(const float* dy, const float* z, float* dz, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dz[i] = dy[i] * gelu_grad(z[i]);
}

namespace {
// The biased input in bf16: the official Linear's output, z + b rounded once.
MOH_INLINE_INTO_CLONES float biased_bf16(uint16_t z, float b) {
  return bf16_to_float(float_to_bf16(bf16_to_float(z) + b));
}
}  // namespace

MOH_CPU_CLONES void bias_forward(const uint16_t* z, const float* bias, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(gelu(biased_bf16(z[i], bias[i])));
}

MOH_CPU_CLONES void bias_backward(const uint16_t* dy, const uint16_t* z, const float* bias, uint16_t* dz, float* dbias,
                                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t g = float_to_bf16(bf16_to_float(dy[i]) * gelu_grad(biased_bf16(z[i], bias[i])));
    dz[i] = g;
    dbias[i] += bf16_to_float(g);
  }
}

MOH_CPU_CLONES void bias_forward(const float* z, const float* bias, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(z[i] + bias[i]);
}

MOH_CPU_CLONES void bias_backward(const float* dy, const float* z, const float* bias, float* dz, float* dbias,
                                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i] * gelu_grad(z[i] + bias[i]);
    dz[i] = g;
    dbias[i] += g;
  }
}

}  // namespace gelu_kernels

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk

// Calls `loop` with a null pointer of z's element type (bf16 as its raw bits), which picks the kernels' overload.
template <typename Loop>
void run_typed(const at::Tensor& z, Loop loop) {
  if (z.scalar_type() == at::kBFloat16)
    loop(static_cast<uint16_t*>(nullptr));
  else
    loop(static_cast<float*>(nullptr));
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

struct GeluTanhCpu : torch::autograd::Function<GeluTanhCpu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& z_in) {
    const at::Tensor z = z_in.contiguous();
    at::Tensor y = at::empty_like(z);
    run_typed(z, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* zp = ptr<T>(z);
      T* yp = ptr<T>(y);
      at::parallel_for(0, z.numel(), kGrain,
                       [&](int64_t b, int64_t e) { gelu_kernels::forward(zp + b, yp + b, e - b); });
    });
    ctx->save_for_backward({z});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor z = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(z.scalar_type()).contiguous();
    at::Tensor dz = at::empty_like(z);
    run_typed(z, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T *dyp = ptr<T>(dy), *zp = ptr<T>(z);
      T* dzp = ptr<T>(dz);
      at::parallel_for(0, z.numel(), kGrain,
                       [&](int64_t b, int64_t e) { gelu_kernels::backward(dyp + b, zp + b, dzp + b, e - b); });
    });
    return {dz};
  }
};

}  // namespace

at::Tensor gelu_tanh_cpu(const at::Tensor& z) {
  TORCH_CHECK(z.device().is_cpu() && (z.scalar_type() == at::kBFloat16 || z.scalar_type() == at::kFloat),
              "gelu_tanh_cpu: a bf16 or fp32 CPU tensor");
  return GeluTanhCpu::apply(z);
}

}  // namespace moh::nn
