// GELU with the tanh approximation (DiT's approx_gelu) on bf16 and fp32 CPU tensors, in one pass over memory with fp32
// arithmetic: LibTorch 1.13's own bf16 tanh-GELU has no vectorised CPU kernel, and its fp32 one calls a scalar tanh
// (docs/BENCHMARKS.md, "GELU on LibTorch 1.13"). nn::gelu() uses it where own_cpu_tanh_gelu() says; at::gelu is the
// reference.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace moh::nn {

/// gelu_tanh(z) of a bf16 or fp32 CPU tensor, differentiable, in z's type. bf16: the output (and in backward the input
/// gradient) is the fp32 value rounded once to bf16, as at::gelu(z.float()).bfloat16() gives. fp32: relative error
/// within (8 + 6 |2v|) 2^-24 (v the tanh's argument), far more exact than at::gelu's 1 + tanh form where that cancels
/// (1e-5 relative at u = -3, 0.3 at u = -5).
at::Tensor gelu_tanh_cpu(const at::Tensor& z);
/// Its two passes as plain functions (no autograd; what its autograd operation and the kernel benchmark call): y from
/// z, and dz = dy · GELU'(z) in z's type.
at::Tensor gelu_tanh_cpu_forward(const at::Tensor& z);
at::Tensor gelu_tanh_cpu_backward(const at::Tensor& dy, const at::Tensor& z);

namespace gelu_kernels {
// The loops (bf16 as its raw bits; n elements, contiguous), compiled for AVX-512, AVX2 and the baseline and run in
// the widest the CPU has (cpu_simd.h).
void forward(const uint16_t* z, uint16_t* y, int64_t n);
void backward(const uint16_t* dy, const uint16_t* z, uint16_t* dz, int64_t n);
void forward(const float* z, float* y, int64_t n);
void backward(const float* dy, const float* z, float* dz, int64_t n);
// With a bias (n values, already in z's type, as fp32) added to z first, in z's type (the official Linear's output):
// GELU(tanh) of it, and in the backward dz = dy · GELU'(z + bias) in z's type, whose values are added to dbias.
void bias_forward(const uint16_t* z, const float* bias, uint16_t* y, int64_t n);
void bias_backward(const uint16_t* dy, const uint16_t* z, const float* bias, uint16_t* dz, float* dbias, int64_t n);
void bias_forward(const float* z, const float* bias, float* y, int64_t n);
void bias_backward(const float* dy, const float* z, const float* bias, float* dz, float* dbias, int64_t n);
}  // namespace gelu_kernels

}  // namespace moh::nn
