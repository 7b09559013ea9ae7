#include "diffusion/repa.h"

#include <torch/nn/modules/activation.h>

#include <stdexcept>

#include "vision/nn/linear.h"

namespace moh::diffusion {

torch::nn::Sequential repa_projector(int64_t hidden, int64_t projector_dim, int64_t z_dim) {
  return torch::nn::Sequential(nn::Linear(hidden, projector_dim), torch::nn::SiLU(),
                               nn::Linear(projector_dim, projector_dim), torch::nn::SiLU(),
                               nn::Linear(projector_dim, z_dim));
}

namespace {

// torch.nn.functional.normalize(x, dim=-1): x / max(‖x‖₂, 1e-12).
at::Tensor unit_rows(const at::Tensor& x) {
  return x / x.norm(2, {-1}, /*keepdim=*/true).clamp_min(1e-12);
}

}  // namespace

at::Tensor repa_loss(const std::vector<at::Tensor>& zs, const std::vector<at::Tensor>& targets) {
  if (zs.empty() || zs.size() != targets.size()) throw std::invalid_argument("repa_loss: one target per projection");
  at::Tensor total = at::zeros({}, zs[0].options().dtype(at::kFloat));
  for (size_t e = 0; e < zs.size(); ++e) {
    const at::Tensor z_tilde = unit_rows(zs[e].to(at::kFloat));  // (N, T, D)
    const at::Tensor z = unit_rows(targets[e].to(at::kFloat));   // (N, T, D)
    total = total - (z * z_tilde).sum(-1).mean(-1).sum();        // Σ_n mean_t −cos
  }
  return total / static_cast<double>(zs.size() * zs[0].size(0));
}

}  // namespace moh::diffusion
