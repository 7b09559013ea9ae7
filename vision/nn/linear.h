#pragma once
// The fully connected layer of every model here: torch::nn::Linear with the forward of Python's torch.nn.Linear.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "core/train/working_copies.h"

namespace moh::nn {

/// torch::nn::Linear (same parameter names `weight`/`bias`, options and initialisation) whose forward is at::linear,
/// as Python's nn.Linear. LibTorch's C++ frontend computes a Linear on inputs of 3 or more dims as a matmul followed
/// by a separate `+= bias` (torch/nn/functional/linear.h), Python folds the bias into the GEMM, so the two round
/// differently: 1.2e-7 on the SD-VAE's attention output projection, amplified to 1.2e-5 in the decoded image
/// (measured against diffusers on LibTorch 2.14; tests/pyref_test.sh vae).
struct LinearImpl : torch::nn::LinearImpl {
  using torch::nn::LinearImpl::LinearImpl;
  /// (*, in_features) → (*, out_features); under autocast with working copies (core/train/working_copies.h) the product
  /// reads them instead of casting its weights.
  at::Tensor forward(const at::Tensor& input) {
    return at::linear(input, working_weight(weight), working_weight(bias));
  }
};
TORCH_MODULE(Linear);

}  // namespace moh::nn
