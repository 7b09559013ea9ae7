#pragma once
// The pieces LightningDiT (hustvl/LightningDiT, models/rmsnorm.py and models/pos_embed.py) adds to a DiT block and its
// attention: RMSNorm with a learned scale, and the 2-D rotary position embedding of queries and keys
// (VisionRotaryEmbeddingFast, from EVA): half of each head's channels rotate with the token's row, half with its
// column.
#include <torch/nn/module.h>

#include <cstdint>

namespace moh::nn {

/// RMSNorm over the last dim (LLaMA's, as LightningDiT uses it): x / √(mean(x²) + eps) computed in fp32 and cast back
/// to x's dtype, times `weight` (ones at init).
struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

/// The rotary tables of one attention layer: cos and sin (N, d) for N tokens of head width d.
struct RopeTables {
  at::Tensor cos, sin;
  bool defined() const { return cos.defined(); }
};

/// LightningDiT's VisionRotaryEmbeddingFast(dim = d / 2, pt_seq_len = grid) tables, fp32 (d % 4 == 0): per axis the
/// frequencies θ_k = 10000^(−2k/(d/2)), k < d/4, each repeated twice, times the position (float32 i / grid · grid, as
/// the official code computes it); channels [0, d/2) follow the token's row, [d/2, d) its column; token n = row·grid +
/// column (row-major patches).
RopeTables rope2d_tables(int64_t head_dim, int64_t grid);

/// x·cos + rotate_half(x)·sin with rotate_half on channel pairs (x_{2m}, x_{2m+1}) → (−x_{2m+1}, x_{2m});
/// x (..., N, d), tables (N, d) → (..., N, d).
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope);

}  // namespace moh::nn
