#pragma once
// The two plain ViT layers DiT and DINOv2 share (timm's Mlp and PatchEmbed): registered names fc1 / fc2 and proj, as
// in both official state_dicts.
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/version.h>

#include "vision/nn/linear.h"
#include "vision/nn/model_config.h"

namespace moh::nn {

/// Whether gelu() computes a CPU's bf16 exact GELU in fp32 and rounds once: LibTorch 1.13 has no vectorised bf16 GELU
/// on CPUs (it converts element by element, and its backward rounds inside); 2.x's own bf16 kernel is vectorised.
constexpr bool kUpcastCpuGelu = TORCH_VERSION_MAJOR < 2;

/// Whether gelu() runs a CPU's tanh GELU (fp32 or bf16) through gelu_tanh_cpu's loop: always on LibTorch 1.13 (its
/// fp32 tanh-GELU calls a scalar tanh, its bf16 one is not vectorised); on 2.x where the loop's AVX2 variant runs,
/// measured 1.4–4.2× at::gelu forward and backward (docs/BENCHMARKS.md, "CPU kernels against LibTorch"). Its baseline
/// variant was level with or slower than at::gelu, and its AVX-512 variant is not yet measured against 2.x: there
/// at::gelu.
bool own_cpu_tanh_gelu();

/// GELU (tanh approximation or exact) of z. With `own` on a CPU: the tanh approximation of a bf16 or fp32 tensor by
/// gelu_tanh_cpu's one-pass loop where own_cpu_tanh_gelu() (bf16 rounded once from fp32), the exact GELU of a bf16
/// tensor in fp32 rounded back once where kUpcastCpuGelu. `own` false is the plain at::gelu, the reference.
at::Tensor gelu(const at::Tensor& z, bool tanh, bool own = true);

/// timm Mlp: fc1 → GELU → fc2; `tanh_gelu` picks GELU's tanh approximation (DiT's approx_gelu) over the exact one
/// (DINOv2).
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t dim, int64_t hidden, bool tanh_gelu);
  at::Tensor forward(const at::Tensor& x);  // (…, dim) → (…, dim)
  Linear fc1{nullptr}, fc2{nullptr};
  bool tanh_gelu;
  /// GELU(tanh) and fc1's bias in one fused pass after fc1's product (fused_bias_gelu) where use_fused_ops says so.
  FusedMode fused = FusedMode::off;
};
TORCH_MODULE(Mlp);

/// Patch embedding: proj = Conv2d(C_in, D, p, stride p); (N, C_in, H, W) → (N, T, D), tokens row-major over the grid.
struct PatchEmbedImpl : torch::nn::Module {
  PatchEmbedImpl(int64_t in_channels, int64_t dim, int64_t patch);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

}  // namespace moh::nn
