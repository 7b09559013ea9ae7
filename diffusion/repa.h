#pragma once
// REPA (Yu et al. 2024, "Representation Alignment for Generation", sihyun-yu/REPA): the tokens of an early DiT / SiT
// block, projected by a 3-layer MLP, are aligned with a frozen encoder's patch features of the clean image by a
// negative cosine similarity (REPA loss.py), added to the denoising loss with weight λ. The projector lives in the DiT
// (`projectors.0.{0,2,4}`, REPA's SiT names); the encoder is the caller's (experiments/repa_encoders.h).
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace moh::diffusion {

/// REPA's build_mlp: Linear(hidden, projector_dim) → SiLU → Linear(projector_dim, projector_dim) → SiLU →
/// Linear(projector_dim, z_dim), registered as 0..4.
torch::nn::Sequential repa_projector(int64_t hidden, int64_t projector_dim, int64_t z_dim);

/// REPA's projection loss: for every encoder e and sample n, the mean over tokens of −cos(z̃, z) (each side
/// L2-normalised over channels), summed, divided by (encoders · N). zs[e], targets[e]: (N, T, D_e). Returns a 0-dim
/// fp32 tensor.
at::Tensor repa_loss(const std::vector<at::Tensor>& zs, const std::vector<at::Tensor>& targets);

/// The frozen encoder of a training step: clean images (N, C, H, W) in [-1, 1] → its features on the DiT's token grid
/// (N, T, D), without gradients.
using RepaTargets = std::function<at::Tensor(const at::Tensor& images)>;

/// The REPA term of a training step: off when `targets` is empty.
struct RepaTerm {
  RepaTargets targets;
  double weight = 0.5;  ///< λ (REPA's --proj-coeff)
  at::Tensor images;    ///< the step's clean images (N, 3, H, W) in [-1, 1] when the inputs are latents (else x0)
  bool enabled() const { return static_cast<bool>(targets); }
};

}  // namespace moh::diffusion
