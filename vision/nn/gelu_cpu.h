// GELU with the tanh approximation (DiT's approx_gelu) on bf16 CPU tensors, in one pass over memory with fp32
// arithmetic: LibTorch 1.13's own bf16 tanh-GELU has no vectorised CPU kernel, and its fp32 one calls a scalar tanh
// (docs/BENCHMARKS.md, "bf16 GELU"). nn::gelu() uses it where kUpcastBf16Gelu says; at::gelu is the reference.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace moh::nn {

/// gelu_tanh(z) of a bf16 CPU tensor, differentiable: the output (and in backward the input gradient) is the fp32
/// value rounded once to bf16, as at::gelu(z.float()).bfloat16() gives.
at::Tensor gelu_tanh_bf16_cpu(const at::Tensor& z);

namespace gelu_kernels {
// The loops (bf16 as its raw bits; n elements, contiguous), compiled for AVX-512, AVX2 and the baseline where the
// compiler can pick at run time.
void forward(const uint16_t* z, uint16_t* y, int64_t n);
void backward(const uint16_t* dy, const uint16_t* z, uint16_t* dz, int64_t n);
}  // namespace gelu_kernels

}  // namespace moh::nn
