#pragma once
// Autograd operations over the CUDA sliding-window kernels (vision/cuda/sliding_window.cu) for TransNeXt's
// aggregated attention. Present in builds with MOH_CUDA_KERNELS (a CUDA LibTorch); elsewhere available() is false
// and the model keeps its LibTorch path (im2col + matmul), which is also the reference the GPU parity test uses.
#include <ATen/ATen.h>

namespace moh::vision {

/// Whether the kernels were built in.
bool sliding_window_kernels_available();

/// q, k: (B, h, N, d) CUDA tensors with N = H·W → logits (B, h, N, 9): q · k of the 3×3 zero-padded neighbourhood.
at::Tensor sliding_window_qk(const at::Tensor& q, const at::Tensor& k, int64_t H, int64_t W);

/// w: (B, h, N, 9), v: (B, h, N, d) → (B, h, N, d): the w-weighted sum of the neighbours' values.
at::Tensor sliding_window_av(const at::Tensor& w, const at::Tensor& v, int64_t H, int64_t W);

}  // namespace moh::vision
