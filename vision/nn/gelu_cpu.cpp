#include "vision/nn/gelu_cpu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <type_traits>

#include "vision/nn/cpu_simd.h"
#include "vision/nn/fused_math.h"

// Vector values only inside the always-inlined helpers of one instruction set's function (cpu_simd.h).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moh::nn {

namespace gelu_kernels {
namespace {

using simd::exp_clamped;
using simd::load;
using simd::load_n;
using simd::store;
using simd::store_n;
using simd::stored_as;
using simd::Vec;

using fused::kGeluBeta;
using fused::kGeluKappa;

// 0.5 u (1 + tanh(v)) = u σ(2v) with v = β (u + κ u³): written with σ, so that no 1 + tanh cancels for negative u.
template <int W>
MOH_INLINE_INTO_CLONES Vec<W> gelu(const Vec<W>& u) {
  const Vec<W> v = kGeluBeta * (u + kGeluKappa * u * u * u);
  return u / (1.f + exp_clamped<W>(-2.f * v));
}
// d/du u σ(2v) = σ + 2 u σ (1 − σ) v', with 1 − σ = σ e^{−2v}.
template <int W>
MOH_INLINE_INTO_CLONES Vec<W> gelu_grad(const Vec<W>& u) {
  const Vec<W> u2 = u * u;
  const Vec<W> e = exp_clamped<W>(-2.f * kGeluBeta * (u + kGeluKappa * u2 * u));
  const Vec<W> s = 1.f / (1.f + e);
  return s + 2.f * u * s * (s * e) * kGeluBeta * (1.f + 3.f * kGeluKappa * u2);
}

// Elements [i, i + m) of x, m <= W, as W lanes (the tail through the same vector code: simd::load_n), and back.
template <int W, class T>
MOH_INLINE_INTO_CLONES Vec<W> part(const T* x, int64_t i, int64_t m) {
  return m == W ? load<W>(x + i) : load_n<W>(x + i, m);
}
template <int W, class T>
MOH_INLINE_INTO_CLONES void put(T* x, int64_t i, int64_t m, const Vec<W>& v) {
  if (m == W)
    store<W>(x + i, v);
  else
    store_n<W>(x + i, v, m);
}

// z [+ bias] as T holds it: `bias` (fp32, one value per element, or null) added in T's precision, as the official
// Linear's output z + b is rounded once.
template <int W, class T>
MOH_INLINE_INTO_CLONES Vec<W> biased(const T* z, const float* bias, int64_t i, int64_t m) {
  const Vec<W> zv = part<W>(z, i, m);
  return bias ? stored_as<W, T>(zv + part<W>(bias, i, m)) : zv;
}

// y = GELU(z [+ bias]) for T = float or bf16 (uint16_t raw bits), W elements at a time.
template <int W, class T>
MOH_INLINE_INTO_CLONES void forward_loop(const T* z, const float* bias, T* y, int64_t n) {
  for (int64_t i = 0; i < n; i += W) {
    const int64_t m = n - i < W ? n - i : W;
    put<W>(y, i, m, gelu<W>(biased<W>(z, bias, i, m)));
  }
}

// dz = dy · GELU'(z [+ bias]) in T; with dbias, dz's values (as stored) are added to it.
template <int W, class T>
MOH_INLINE_INTO_CLONES void backward_loop(const T* dy, const T* z, const float* bias, T* dz, float* dbias, int64_t n) {
  for (int64_t i = 0; i < n; i += W) {
    const int64_t m = n - i < W ? n - i : W;
    const Vec<W> g = stored_as<W, T>(part<W>(dy, i, m) * gelu_grad<W>(biased<W>(z, bias, i, m)));
    put<W>(dz, i, m, g);
    if (dbias) put<W>(dbias, i, m, part<W>(dbias, i, m) + g);
  }
}

template <int W, class T>
MOH_INLINE_INTO_CLONES void forward_plain(const T* z, T* y, int64_t n) {
  forward_loop<W>(z, nullptr, y, n);
}
template <int W, class T>
MOH_INLINE_INTO_CLONES void backward_plain(const T* dy, const T* z, T* dz, int64_t n) {
  backward_loop<W>(dy, z, nullptr, dz, nullptr, n);
}

}  // namespace

MOH_SIMD_VARIANTS(forward, forward_plain, (const uint16_t* z, uint16_t* y, int64_t n), (z, y, n))
MOH_SIMD_VARIANTS(forward, forward_plain, (const float* z, float* y, int64_t n), (z, y, n))
MOH_SIMD_VARIANTS(backward, backward_plain, (const uint16_t* dy, const uint16_t* z, uint16_t* dz, int64_t n),
                  (dy, z, dz, n))
MOH_SIMD_VARIANTS(backward, backward_plain, (const float* dy, const float* z, float* dz, int64_t n), (dy, z, dz, n))
MOH_SIMD_VARIANTS(bias_forward, forward_loop, (const uint16_t* z, const float* bias, uint16_t* y, int64_t n),
                  (z, bias, y, n))
MOH_SIMD_VARIANTS(bias_forward, forward_loop, (const float* z, const float* bias, float* y, int64_t n), (z, bias, y, n))
MOH_SIMD_VARIANTS(bias_backward, backward_loop,
                  (const uint16_t* dy, const uint16_t* z, const float* bias, uint16_t* dz, float* dbias, int64_t n),
                  (dy, z, bias, dz, dbias, n))
MOH_SIMD_VARIANTS(bias_backward, backward_loop,
                  (const float* dy, const float* z, const float* bias, float* dz, float* dbias, int64_t n),
                  (dy, z, bias, dz, dbias, n))

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
    ctx->save_for_backward({z});
    return gelu_tanh_cpu_forward(z);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {gelu_tanh_cpu_backward(grads[0], ctx->get_saved_variables()[0])};
  }
};

bool gelu_cpu_takes(const at::Tensor& z) {
  return z.device().is_cpu() && (z.scalar_type() == at::kBFloat16 || z.scalar_type() == at::kFloat);
}

}  // namespace

at::Tensor gelu_tanh_cpu_forward(const at::Tensor& z_in) {
  TORCH_CHECK(gelu_cpu_takes(z_in), "gelu_tanh_cpu: a bf16 or fp32 CPU tensor");
  const at::Tensor z = z_in.contiguous();
  at::Tensor y = at::empty_like(z);
  run_typed(z, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* zp = ptr<T>(z);
    T* yp = ptr<T>(y);
    at::parallel_for(0, z.numel(), kGrain, [&](int64_t b, int64_t e) { gelu_kernels::forward(zp + b, yp + b, e - b); });
  });
  return y;
}

at::Tensor gelu_tanh_cpu_backward(const at::Tensor& dy_in, const at::Tensor& z_in) {
  TORCH_CHECK(gelu_cpu_takes(z_in) && dy_in.sizes() == z_in.sizes(), "gelu_tanh_cpu_backward: dy and z of one shape");
  const at::Tensor z = z_in.contiguous();
  const at::Tensor dy = dy_in.to(z.scalar_type()).contiguous();
  at::Tensor dz = at::empty_like(z);
  run_typed(z, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *dyp = ptr<T>(dy), *zp = ptr<T>(z);
    T* dzp = ptr<T>(dz);
    at::parallel_for(0, z.numel(), kGrain,
                     [&](int64_t b, int64_t e) { gelu_kernels::backward(dyp + b, zp + b, dzp + b, e - b); });
  });
  return dz;
}

at::Tensor gelu_tanh_cpu(const at::Tensor& z) {
  TORCH_CHECK(gelu_cpu_takes(z), "gelu_tanh_cpu: a bf16 or fp32 CPU tensor");
  return GeluTanhCpu::apply(z);
}

}  // namespace moh::nn
