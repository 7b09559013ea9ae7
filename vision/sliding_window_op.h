#pragma once
// TransNeXt's 3×3 sliding-window attention as two autograd operations, without the 9× neighbour tensors of the
// im2col path: CPU loops here (every build) and the CUDA kernels of vision/cuda/sliding_window.cu (builds with
// MOH_CUDA_KERNELS, a CUDA LibTorch). The im2col + matmul path of vision/transnext.cpp (the official native code's
// unfold) and the neighbour-by-neighbour reference stay beside them; tests/vision/test_transnext.cpp checks all three.
#include <ATen/ATen.h>

namespace moh::vision {

/// Whether the window operations run on `device` (CPU: always; CUDA: builds with the kernels).
bool sliding_window_kernels_available(const at::Device& device);

/// q, k: (B, h, N, d) with N = H·W (the channel dim contiguous on the CPU; any strides otherwise) → logits
/// (B, h, N, 9): q · k of the 3×3 zero-padded neighbourhood, neighbour z = 3·(dy+1) + (dx+1).
at::Tensor sliding_window_qk(const at::Tensor& q, const at::Tensor& k, int64_t H, int64_t W);

/// w: (B, h, N, 9), v: (B, h, N, d) → (B, h, N, d): the w-weighted sum of the neighbours' values.
at::Tensor sliding_window_av(const at::Tensor& w, const at::Tensor& v, int64_t H, int64_t W);

}  // namespace moh::vision
