// LightningDiT's block options (model.norm / mlp / pos / qk_norm): the rotary tables and RMSNorm against their
// formulas element by element, a whole block against a direct computation from its weights, and MoH attention with
// qk_norm and RoPE on its dense and sparse paths (equal forward and gradients).
#include <cmath>

#include "diffusion/dit.h"
#include "tests/test_util.h"
#include "vision/nn/norms.h"

namespace moh::diffusion {
namespace {

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// Channel c of token (row, col), head width d: c < d/2 turns with the row at θ_{⌊c/2⌋}, the rest with the column at
// θ_{⌊(c − d/2)/2⌋}; θ_k = 10000^(−2k/(d/2)).
TEST(LightningDiT, RopeTablesFollowTheirFormula) {
  const int64_t d = 8, G = 3;
  const nn::RopeTables t = nn::rope2d_tables(d, G);
  ASSERT_EQ(t.cos.sizes(), (std::vector<int64_t>{G * G, d}));
  for (int64_t row = 0; row < G; ++row)
    for (int64_t col = 0; col < G; ++col)
      for (int64_t c = 0; c < d; ++c) {
        const int64_t k = c < d / 2 ? c / 2 : (c - d / 2) / 2;
        const double theta = std::pow(10000.0, -2.0 * static_cast<double>(k) / (d / 2.0));
        const double angle = static_cast<double>(c < d / 2 ? row : col) * theta;
        EXPECT_NEAR(t.cos[row * G + col][c].item<double>(), std::cos(angle), 1e-6);
        EXPECT_NEAR(t.sin[row * G + col][c].item<double>(), std::sin(angle), 1e-6);
      }
  // rotate_half on pairs: (x_{2m}, x_{2m+1}) → (x_{2m} cos − x_{2m+1} sin, x_{2m+1} cos + x_{2m} sin)
  const at::Tensor x = at::randn({2, G * G, d}), y = nn::apply_rope(x, t);
  for (int64_t m = 0; m < d / 2; ++m) {
    const at::Tensor c = t.cos.select(1, 2 * m), s = t.sin.select(1, 2 * m);
    const at::Tensor a = x.select(2, 2 * m), b = x.select(2, 2 * m + 1);
    EXPECT_TRUE(at::allclose(y.select(2, 2 * m), a * c - b * s, 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(y.select(2, 2 * m + 1), b * c + a * s, 1e-5, 1e-6));
  }
}

TEST(LightningDiT, RMSNormFormula) {
  nn::RMSNorm n(5);
  {
    torch::NoGradGuard ng;
    n->weight.copy_(at::arange(1, 6, at::kFloat));
  }
  const at::Tensor x = at::randn({3, 5});
  EXPECT_TRUE(at::allclose(n->forward(x), x / at::sqrt(x.pow(2).mean(-1, true) + 1e-6) * n->weight, 1e-5, 1e-6));
}

DiTOptions small_lightning() {
  DiTOptions o = dit_options("LightningDiT-B/1");
  o.hidden_size = 32, o.num_heads = 4, o.depth = 1, o.input_size = 4, o.in_channels = 2, o.num_classes = 3;
  o.qk_norm = true;
  return o;
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w) {
  return x / at::sqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
}

// One LightningDiT block (RMSNorm, qk_norm, RoPE, SwiGLU, adaLN-Zero) written out from its weights.
TEST(LightningDiT, BlockEqualsADirectComputation) {
  const DiTOptions o = small_lightning();
  torch::manual_seed(4);
  DiT m(o);
  {
    torch::NoGradGuard ng;
    for (auto& p : m->parameters()) p.add_(at::randn_like(p) * 0.2);
  }
  auto& b = *m->blocks[0]->as<DiTBlockImpl>();
  const int64_t B = 2, N = 16, D = 32, h = 4, d = 8;
  const at::Tensor x = at::randn({B, N, D}), c = at::randn({B, D});
  const nn::RopeTables rope = m->feat_rope->tables();
  const at::Tensor got = b.forward(x, c, rope).out;

  const auto p = b.named_parameters();
  auto lin = [&](const at::Tensor& t, const std::string& name) {
    return at::linear(t, p[name + ".weight"], p[name + ".bias"]);
  };
  const auto mod = lin(at::silu(c), "adaLN_modulation.1").chunk(6, 1);
  auto modulate = [](const at::Tensor& t, const at::Tensor& shift, const at::Tensor& scale) {
    return t * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
  };
  const at::Tensor qkv = lin(modulate(rms(x, p["norm1.weight"]), mod[0], mod[1]), "attn.qkv")
                             .view({B, N, 3, h, d})
                             .permute({2, 0, 3, 1, 4});  // (3, B, h, N, d)
  const at::Tensor q = nn::apply_rope(rms(qkv[0], p["attn.q_norm.weight"]), rope);
  const at::Tensor k = nn::apply_rope(rms(qkv[1], p["attn.k_norm.weight"]), rope);
  const at::Tensor att = at::softmax(at::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0), -1);
  const at::Tensor a = lin(at::matmul(att, qkv[2]).transpose(1, 2).reshape({B, N, h * d}), "attn.proj");
  const at::Tensor hx = x + mod[2].unsqueeze(1) * a;
  const auto x12 = lin(modulate(rms(hx, p["norm2.weight"]), mod[3], mod[4]), "mlp.w12").chunk(2, -1);
  const at::Tensor want = hx + mod[5].unsqueeze(1) * lin(at::silu(x12[0]) * x12[1], "mlp.w3");
  EXPECT_LE(rel_diff(got, want), 1e-5);
  // The model as a whole runs, its rotary buffers follow it (double), and the options change the output.
  m->to(at::kDouble);
  EXPECT_EQ(m->feat_rope->freqs_cos.scalar_type(), at::kDouble);
}

// MoH attention with qk_norm (LayerNorm and RMSNorm) and RoPE: the sparse path (whole queries, then the selected
// pairs) equals the dense reference, forward and backward.
TEST(LightningDiT, MoHAttentionDenseEqualsSparseWithRopeAndQkNorm) {
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    nn::MoHAttentionOptions ao(32, 4);
    ao.moh(1, 2);
    ao.qk_norm = true, ao.qk_norm_kind = kind, ao.rope_grid = 4;
    torch::manual_seed(1);
    nn::MoHAttention a(ao);
    {
      torch::NoGradGuard ng;
      for (auto& p : a->parameters()) p.add_(at::randn_like(p) * 0.2);
    }
    const nn::RopeTables rope = nn::rope2d_tables(8, 4);
    const at::Tensor x = torch::randn({2, 16, 32}, torch::requires_grad());
    const at::Tensor qn = a->named_parameters()["q_norm.weight"];
    std::vector<at::Tensor> outs, grads;
    for (AttentionPath path : {AttentionPath::dense, AttentionPath::sparse}) {
      const at::Tensor y = a->forward_with_path(x, path, rope).out;
      const at::Tensor loss = (y * at::linspace(-1, 1, y.numel()).view(y.sizes())).sum();
      const auto g = torch::autograd::grad({loss}, {x, qn});
      outs.push_back(y.detach());
      grads.insert(grads.end(), g.begin(), g.end());
    }
    EXPECT_LE(rel_diff(outs[1], outs[0]), 1e-5) << config::to_string(kind);
    EXPECT_LE(rel_diff(grads[2], grads[0]), 1e-5) << config::to_string(kind);
    EXPECT_LE(rel_diff(grads[3], grads[1]), 1e-5) << config::to_string(kind);
    // RoPE matters: without it the output differs.
    nn::MoHAttentionOptions plain = ao;
    plain.rope_grid = 0;
    nn::MoHAttention b(plain);
    torch::NoGradGuard ng;
    for (const auto& p : a->named_parameters()) b->named_parameters()[p.key()].copy_(p.value());
    EXPECT_GT(rel_diff(b->forward_with_path(x, AttentionPath::dense).out, outs[0]), 1e-3);
  }
}

}  // namespace
}  // namespace moh::diffusion
