#include "vision/nn/vit_layers.h"

#include "vision/nn/cpu_simd.h"
#include "vision/nn/fused_ops.h"
#include "vision/nn/gelu_cpu.h"

namespace moh::nn {

bool own_cpu_tanh_gelu() {
  return TORCH_VERSION_MAJOR < 2 || simd::isa() == simd::Isa::avx2;
}

at::Tensor gelu(const at::Tensor& z, bool tanh, bool own) {
  const char* approximate = tanh ? "tanh" : "none";
  if (!own || !z.device().is_cpu()) return at::gelu(z, approximate);
  const bool bf16 = z.scalar_type() == at::kBFloat16;
  if (tanh && (bf16 || z.scalar_type() == at::kFloat) && own_cpu_tanh_gelu()) return gelu_tanh_cpu(z);
  if (bf16 && kUpcastCpuGelu) return at::gelu(z.to(at::kFloat), approximate).to(at::kBFloat16);
  return at::gelu(z, approximate);
}

MlpImpl::MlpImpl(int64_t dim, int64_t hidden, bool tanh) : tanh_gelu(tanh) {
  fc1 = register_module("fc1", Linear(dim, hidden));
  fc2 = register_module("fc2", Linear(hidden, dim));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  if (tanh_gelu && use_fused_ops(fused, x.device()))
    return fc2->forward(fused_bias_gelu(at::linear(x, working_weight(fc1->weight)), working_weight(fc1->bias)));
  return fc2->forward(gelu(fc1->forward(x), tanh_gelu));
}

PatchEmbedImpl::PatchEmbedImpl(int64_t in_channels, int64_t dim, int64_t patch) {
  proj = register_module("proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, dim, patch).stride(patch)));
}

at::Tensor PatchEmbedImpl::forward(const at::Tensor& x) {
  // Contiguous: the transposed view's layout would otherwise pass through every residual sum of the model after it,
  // and each LayerNorm (forward and backward) would copy its input into rows first.
  return proj->forward(x).flatten(2).transpose(1, 2).contiguous();  // (N, T, D)
}

}  // namespace moh::nn
