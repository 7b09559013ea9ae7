#pragma once
// CUDA kernels of the fused block operations: the loops of vision/nn/fused_kernels.h (same arguments, same
// definitions and layouts) with the stream to launch on. Plain CUDA, no LibTorch types, so the file compiles with nvcc
// alone (the compile-only CI target) and links into CUDA builds of LibTorch (MOH_CUDA_KERNELS; the autograd operations
// are vision/nn/fused_ops.cpp). Every kernel computes with the functions of vision/nn/fused_math.h, as the CPU loops.
#include <cuda_runtime.h>

#include "vision/nn/fused_kernels.h"

namespace moh::nn::fused::cuda {

cudaError_t ln_modulate_forward(const void* x, DType tx, Rows shift, Rows scale, void* out, DType to, float* mean,
                                float* rstd, int64_t B, int64_t N, int64_t D, float eps, cudaStream_t stream);
cudaError_t ln_modulate_backward(const void* dy, DType tdy, const void* x, DType tx, Rows scale, const float* mean,
                                 const float* rstd, void* dx, float* dshift_part, float* dscale_part, int64_t B,
                                 int64_t N, int64_t D, cudaStream_t stream);
cudaError_t gate_residual_forward(const void* x, DType tx, Rows gate, const void* branch, DType tb, void* out,
                                  int64_t B, int64_t N, int64_t D, cudaStream_t stream);
cudaError_t gate_residual_backward(const void* dout, DType tx, Rows gate, const void* branch, DType tb, void* dbranch,
                                   float* dgate_part, int64_t B, int64_t N, int64_t D, cudaStream_t stream);
cudaError_t bias_gelu_forward(const void* z, DType tz, const void* bias, DType tbias, void* out, int64_t T, int64_t F,
                              cudaStream_t stream);
cudaError_t bias_gelu_backward(const void* dy, const void* z, DType tz, const void* bias, DType tbias, void* dz,
                               float* dbias_part, int64_t T, int64_t F, cudaStream_t stream);
cudaError_t route_forward(const void* logits, DType tl, int64_t T, RouterShape s, float* gates, int64_t* routed,
                          float* p_part, int64_t* picks_part, cudaStream_t stream);
cudaError_t route_backward(const void* logits, DType tl, int64_t T, RouterShape s, const int64_t* routed,
                           const float* dgates, const float* picks_coef, void* dlogits, cudaStream_t stream);
cudaError_t gate_heads_forward(const void* o, DType ti, HeadStrides st, const float* gates, void* out, DType to,
                               int64_t B, int64_t h, int64_t N, int64_t d, cudaStream_t stream);
cudaError_t gate_heads_backward(const void* dout, DType to, const void* o, DType ti, HeadStrides st, const float* gates,
                                void* d_o, float* dgates, int64_t B, int64_t h, int64_t N, int64_t d,
                                cudaStream_t stream);

}  // namespace moh::nn::fused::cuda
