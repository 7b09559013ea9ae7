#pragma once
// CUDA kernels of TransNeXt's sliding-window (3×3, zero-padded) attention — the part of aggregated attention that the
// LibTorch path builds from im2col + batched matmuls (vision/transnext.cpp). Plain CUDA, no LibTorch types, so the
// file compiles with nvcc alone (the compile-only CI target) and links into CUDA builds of LibTorch
// (MOH_CUDA_KERNELS; the autograd wrapper is vision/sliding_window_op.cpp).
//
// Layout: every tensor is contiguous (BH, N, ·) with BH = batch·heads and N = H·W tokens in row-major order;
// neighbour z = 3·(dy+1) + (dx+1) of token (y, x) is token (y+dy, x+dx), dy, dx ∈ {−1, 0, 1}; a neighbour outside
// the map contributes 0. Accumulation is in fp32 for every element type (float, __half, __nv_bfloat16).
#include <cuda_runtime.h>

namespace moh::vision::cuda {

/// logits[i, n, z] = Σ_c q[i, n, c] · k[i, nbr(n, z), c]        q, k: (BH, N, C); logits: (BH, N, 9)
template <class T>
cudaError_t sliding_qk(const T* q, const T* k, T* logits, int bh, int height, int width, int channels,
                       cudaStream_t stream);

/// out[i, n, c] = Σ_z w[i, n, z] · v[i, nbr(n, z), c]            w: (BH, N, 9); v, out: (BH, N, C)
template <class T>
cudaError_t sliding_av(const T* w, const T* v, T* out, int bh, int height, int width, int channels,
                       cudaStream_t stream);

/// The adjoint of sliding_av in v (and of sliding_qk in k):
/// out[i, m, c] = Σ_z w[i, m − off(z), z] · x[i, m − off(z), c]   w: (BH, N, 9); x, out: (BH, N, C)
template <class T>
cudaError_t sliding_av_transposed(const T* w, const T* x, T* out, int bh, int height, int width, int channels,
                                  cudaStream_t stream);

}  // namespace moh::vision::cuda
