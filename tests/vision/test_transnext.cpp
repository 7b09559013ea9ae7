// TransNeXt / MoH-ViT: exact parameter counts (TransNeXt and MoH papers' tables, docs/MODELS.md), every variant's tiny
// forward/backward, aggregated attention against a neighbour-by-neighbour reference, CPB tables and length scales.
#include <torch/version.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "tests/test_util.h"
#include "vision/nn/head_surgery.h"
#include "vision/sliding_window_op.h"
#include "vision/transnext.h"

namespace moh::vision {
namespace {

using test::count_params;
using test::rel_err;

// Paper variants; MoH = TransNeXt + router weights (per block dim·h + 2·dim where h_s > 1 and K > 0, dim·h_s for
// K = 0 layers, etc.): S-80/S-75 +168,984, B-75 +299,136, B-50 +302,016.
const std::map<std::string, int64_t>& expected_counts() {
  static const std::map<std::string, int64_t> m{
      {"TransNeXt-Micro", 12809304},       {"TransNeXt-Tiny", 28258960},        {"TransNeXt-Small", 49741564},
      {"TransNeXt-Base", 89721496},        {"MoH-ViT-S-80", 49741564 + 168984}, {"MoH-ViT-S-75", 49741564 + 168984},
      {"MoH-ViT-B-75", 89721496 + 299136}, {"MoH-ViT-B-50", 89721496 + 302016}};
  return m;
}

// Every variant: exact count (parameters do not depend on resolution, so paper variants are built at 64 px with the
// CPB coordinates of a 224-px pretraining), finite forward/backward, aux loss iff routed layers exist.
TEST(ClassifierRegistry, EveryVariantCountsForwardBackward) {
  for (const auto& [name, base] : classifier_variants()) {
    TransNeXtOptions o = base;
    if (o.img_size == 224) {
      o.img_size = 64;
      o.pretrain_size = 224;
    }
    torch::manual_seed(0);
    TransNeXt m(o);
    if (expected_counts().count(name)) {
      EXPECT_EQ(count_params(m), expected_counts().at(name)) << name;
    }
    m->train();
    auto out = m->forward(torch::randn({2, o.in_chans, o.img_size, o.img_size}));
    ASSERT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, o.num_classes})) << name;
    EXPECT_EQ(out.aux_loss.defined(), o.routed_layers() > 0) << name;
    torch::Tensor loss = torch::cross_entropy_loss(out.logits, torch::tensor({1, 3}));
    if (out.aux_loss.defined()) loss = loss + 0.01 * out.aux_loss;
    loss.backward();
    EXPECT_TRUE(torch::isfinite(out.logits).all().item<bool>()) << name;
    for (const auto& p : m->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined() && torch::isfinite(p.value().grad()).all().item<bool>())
          << name << " " << p.key();
    }
  }
}

TEST(ClassifierRegistry, PaperActiveHeadRatiosAndNames) {
  EXPECT_NEAR(classifier_options("MoH-ViT-S-80").active_ratio(), 343.0 / 429, 1e-12);
  EXPECT_NEAR(classifier_options("MoH-ViT-S-75").active_ratio(), 323.0 / 429, 1e-12);
  EXPECT_NEAR(classifier_options("MoH-ViT-B-75").active_ratio(), 441.0 / 588, 1e-12);
  EXPECT_NEAR(classifier_options("MoH-ViT-B-50").active_ratio(), 294.0 / 588, 1e-12);
  TransNeXtOptions o = classifier_options("MoH-ViT-S-80");
  o.img_size = 64;
  o.pretrain_size = 224;
  TransNeXt m(o);
  auto params = m->named_parameters();
  for (const char* k : {"patch_embed1.proj.weight",
                        "patch_embed1.norm.bias",
                        "block1.0.norm1.weight",
                        "block1.0.attn.q.weight",
                        "block1.0.attn.kv.bias",
                        "block1.0.attn.sr.weight",
                        "block1.0.attn.norm.weight",
                        "block1.0.attn.temperature",
                        "block1.0.attn.query_embedding",
                        "block1.0.attn.relative_pos_bias_local",
                        "block1.0.attn.learnable_tokens",
                        "block1.0.attn.learnable_bias",
                        "block1.0.attn.cpb_fc1.weight",
                        "block1.0.attn.cpb_fc2.bias",
                        "block1.0.attn.wg_1.weight",
                        "block3.21.attn.wg.weight",
                        "block3.0.attn.wg_0.weight",
                        "block4.4.attn.qkv.weight",
                        "block4.0.attn.proj.bias",
                        "block1.0.mlp.fc1.weight",
                        "block1.0.mlp.dwconv.dwconv.weight",
                        "block2.4.mlp.fc2.weight",
                        "norm1.weight",
                        "norm4.bias",
                        "head.weight"})
    EXPECT_TRUE(params.contains(k)) << k;
  EXPECT_FALSE(params.contains("block1.0.attn.wg.weight"));  // K = 0 stage: weighted, not routed
  EXPECT_EQ(m->named_buffers().size(), 0u);                  // resolution-dependent tensors are not state
  EXPECT_THROW(classifier_options("MoH-ViT-X"), UserError);
}

// The tables are memoised per grid (every model build asks again): each call gets its own copy, equal to the first.
TEST(TransNeXtAttention, RelativePositionTablesAreCopiesOfOneComputation) {
  auto [table, index] = relative_position_cpb(9, 7, 3, 2, 9, 7);
  const at::Tensor table0 = table.clone(), index0 = index.clone();
  table.add_(1), index.zero_();  // a caller changing its copy
  auto [again, again_index] = relative_position_cpb(9, 7, 3, 2, 9, 7);
  EXPECT_TRUE(at::equal(again, table0));
  EXPECT_TRUE(at::equal(again_index, index0));
  EXPECT_EQ(again_index.size(0), 9 * 7 * 3 * 2);
  EXPECT_EQ(relative_position_cpb(9, 7, 3, 3, 9, 7).second.size(0), 9 * 7 * 3 * 3);  // another grid, another entry
}

// The dense aggregated path three ways: the sliding-window ops (the default), im2col + matmul (the official native
// code's unfold) and the neighbour-by-neighbour reference; output and input gradient in fp32 (≤ 1e-5), every parameter
// gradient in fp64 (≤ 1e-10). Odd maps (9×7) and a 1-row-high pool: every border case of the window.
TEST(TransNeXtAttention, AggregatedMatchesNeighbourReference) {
  for (auto dtype : {at::kFloat, at::kDouble})
    for (auto mode : {AttentionMode::mha, AttentionMode::moh})
      for (auto [Hm, Wm, sr] : {std::array<int64_t, 3>{8, 6, 2}, std::array<int64_t, 3>{9, 7, 3}}) {
        torch::manual_seed(3);
        nn::MoHAttentionOptions o(48, 4);
        if (mode == AttentionMode::moh) o.moh(1, 2);
        TransNeXtAttention a(o, Hm, Wm, sr);
        {
          torch::NoGradGuard ng;
          a->relative_pos_bias_local.normal_(0, 0.5);
          a->learnable_bias.normal_(0, 0.5);
          if (a->router.wg) a->router.wg->weight.normal_(0, 1);
        }
        a->to(dtype);
        auto [table, index] = relative_position_cpb(Hm, Wm, Hm / sr, Wm / sr, Hm, Wm);
        table = table.to(dtype);
        torch::Tensor x = torch::randn({2, Hm * Wm, 48}, torch::dtype(dtype).requires_grad(true));
        std::vector<torch::Tensor> params{x};
        for (auto& p : a->parameters()) params.push_back(p);
        auto grads = [&](const torch::Tensor& out) {  // d(Σ out²)/d(x, parameters); unused parameters → zeros
          auto g = torch::autograd::grad({out.square().sum()}, params, {}, false, false, true);
          for (size_t i = 0; i < g.size(); ++i)
            if (!g[i].defined()) g[i] = torch::zeros_like(params[i]);
          return g;
        };
        a->window_kernels = true;
        auto fast = a->forward(x, table, index).out;
        a->window_kernels = false;
        auto unfold = a->forward(x, table, index).out;
        auto ref = a->forward_reference(x, table, index).out;
        const auto gf = grads(fast), gu = grads(unfold), gr = grads(ref);
        const double tol = dtype == at::kFloat ? 1e-5 : 1e-10;
        EXPECT_LE(rel_err(fast, ref), tol);
        EXPECT_LE(rel_err(unfold, ref), tol);
        const size_t n = dtype == at::kFloat ? 1 : gf.size();  // fp32: the input gradient; fp64: all
        for (size_t i = 0; i < n; ++i) {
          EXPECT_LE(rel_err(gf[i], gr[i]), tol) << "gradient " << i << " (0 = input), " << Hm << "x" << Wm;
          EXPECT_LE(rel_err(gu[i], gr[i]), tol) << "gradient " << i << " (0 = input), " << Hm << "x" << Wm;
        }
      }
}

// The sparse path (only the selected (token, head) pairs attend) against the dense official path: output and the
// gradients of the input and of every parameter, for aggregated attention (odd maps: every border case of the window)
// and stage-4 full attention, MoH with shared heads and MoA without, in training mode (aux loss included).
// fp32: output and input gradient ≤ 1e-5. fp64: every parameter gradient ≤ 1e-9 relative to max(|grad|∞, 1e-3 · the
// layer's largest gradient entry) — some true gradients are exactly zero (cpb_fc2.bias at stage 4 shifts every logit
// of a softmax; the routed gates are p / p · K when K = 1) and hold only rounding noise, which fp32 makes ~1e-5.
TEST(TransNeXtAttention, SparseMatchesDenseForwardAndBackward) {
  struct Case {
    int64_t dim, heads, shared, topk, height, width, sr;
    bool moa;
  };
  for (const Case& c :
       {Case{48, 4, 1, 2, 9, 7, 3, false}, Case{72, 6, 2, 1, 8, 6, 2, false}, Case{48, 4, 0, 2, 8, 6, 2, true},
        Case{48, 4, 1, 1, 7, 5, 1, false}, Case{48, 4, 0, 3, 6, 6, 1, true}})
    for (auto dtype : {at::kFloat, at::kDouble}) {
      SCOPED_TRACE("heads " + std::to_string(c.heads) + " shared " + std::to_string(c.shared) + " topk " +
                   std::to_string(c.topk) + " sr " + std::to_string(c.sr) + (dtype == at::kFloat ? " fp32" : " fp64"));
      torch::manual_seed(11);
      nn::MoHAttentionOptions o(c.dim, c.heads);
      if (c.moa) {
        o.moa(c.topk);
      } else {
        o.moh(c.shared, c.topk);
      }
      TransNeXtAttention a(o, c.height, c.width, c.sr);
      {
        torch::NoGradGuard ng;
        if (a->relative_pos_bias_local.defined()) a->relative_pos_bias_local.normal_(0, 0.5);
        if (a->learnable_bias.defined()) a->learnable_bias.normal_(0, 0.5);
        a->router.wg->weight.normal_(0, 1);
      }
      a->to(dtype);
      const int64_t pool_h = c.sr > 1 ? c.height / c.sr : c.height, pool_w = c.sr > 1 ? c.width / c.sr : c.width;
      auto [table, index] = relative_position_cpb(c.height, c.width, pool_h, pool_w, c.height, c.width);
      table = table.to(dtype);
      const auto opts = torch::TensorOptions().dtype(dtype);
      torch::Tensor x = torch::randn({3, c.height * c.width, c.dim}, opts).requires_grad_(true);
      torch::Tensor gy = torch::randn({3, c.height * c.width, c.dim}, opts);
      std::vector<torch::Tensor> inputs{x};
      for (auto& p : a->parameters()) inputs.push_back(p);
      auto run = [&](AttentionPath path) {
        a->options.path = path;
        auto r = a->forward(x, table, index);
        torch::Tensor loss = (r.out * gy).sum() + r.aux_loss;
        auto grads = torch::autograd::grad({loss}, inputs, {}, false, false, /*allow_unused=*/true);
        grads.insert(grads.begin(), r.out.detach());
        return grads;
      };
      auto dense = run(AttentionPath::dense), sparse = run(AttentionPath::sparse);
      ASSERT_EQ(dense.size(), sparse.size());
      if (dtype == at::kFloat) {
        EXPECT_LE(rel_err(sparse[0], dense[0]), 1e-5) << "output";
        EXPECT_LE(rel_err(sparse[1], dense[1]), 1e-5) << "grad x";
        continue;
      }
      double largest = 0;
      for (size_t i = 1; i < dense.size(); ++i)
        if (dense[i].defined()) largest = std::max(largest, dense[i].abs().max().item<double>());
      auto names = a->named_parameters().keys();
      for (size_t i = 0; i < dense.size(); ++i) {
        const std::string what = i == 0 ? "output" : i == 1 ? "grad x" : "grad " + names[i - 2];
        ASSERT_EQ(dense[i].defined(), sparse[i].defined()) << what;
        if (!dense[i].defined()) continue;
        const double denom = std::max(dense[i].abs().max().item<double>(), i == 0 ? 1e-30 : 1e-3 * largest);
        EXPECT_LE((sparse[i] - dense[i]).abs().max().item<double>() / denom, 1e-9) << what;
      }
    }
}

// router: query_norm in TransNeXt's aggregated (sr 2) and full (sr 1) attention: the raw query projections (before
// the L2 normalisation) choose the heads — the K largest norms, a direct count — and the dense, sparse and reference
// paths agree.
TEST(TransNeXtAttention, QueryNormRouterOnEveryPath) {
  for (int64_t sr : {2, 1}) {
    SCOPED_TRACE("sr " + std::to_string(sr));
    torch::manual_seed(5);
    nn::MoHAttentionOptions o(48, 4);
    o.moh(1, 2);
    o.router = RouterKind::query_norm;
    TransNeXtAttention a(o, 8, 6, sr);
    a->eval();
    for (const auto& p : a->named_parameters()) EXPECT_EQ(p.key().find("wg"), std::string::npos) << p.key();
    auto [table, index] = relative_position_cpb(8, 6, sr > 1 ? 4 : 8, sr > 1 ? 3 : 6, 8, 6);
    torch::NoGradGuard ng;
    const torch::Tensor x = torch::randn({2, 48, 48});
    a->options.path = AttentionPath::dense;
    const nn::AttentionOutput dense = a->forward(x, table, index);
    a->options.path = AttentionPath::sparse;
    const nn::AttentionOutput sparse = a->forward(x, table, index);
    EXPECT_LE(rel_err(sparse.out, dense.out), 1e-5);
    EXPECT_LE(rel_err(a->forward_reference(x, table, index).out, dense.out), 1e-5);
    const nn::Linear& q_lin = sr > 1 ? a->q : a->qkv;
    const torch::Tensor q =
        torch::linear(x.reshape({96, 48}), q_lin->weight.narrow(0, 0, 48), q_lin->bias.narrow(0, 0, 48))
            .view({96, 4, 12});
    for (int64_t t = 0; t < 96; ++t) {
      std::vector<std::pair<double, int64_t>> by_norm;
      for (int64_t j = 1; j < 4; ++j) by_norm.emplace_back(q[t][j].norm().item<double>(), j - 1);
      std::sort(by_norm.rbegin(), by_norm.rend());
      std::set<int64_t> want{by_norm[0].second, by_norm[1].second};
      std::set<int64_t> got{dense.routed[t][0].item<int64_t>(), dense.routed[t][1].item<int64_t>()};
      ASSERT_EQ(got, want) << "token " << t;
    }
  }
}

// A whole MoH-ViT forward gives the same logits on either path (eval mode: the router's choice is deterministic).
TEST(TransNeXt, SparsePathKeepsTheLogits) {
  torch::manual_seed(2);
  TransNeXtOptions o = classifier_options("MoH-ViT-Nano-50");
  o.attention_path = AttentionPath::dense;
  TransNeXt dense(o);
  o.attention_path = AttentionPath::sparse;
  TransNeXt sparse(o);
  torch::NoGradGuard ng;
  auto sp = sparse->named_parameters();
  for (auto& p : dense->named_parameters()) sp[p.key()].copy_(p.value());
  dense->eval(), sparse->eval();
  torch::Tensor img = torch::randn({2, 1, 32, 32});
  EXPECT_LE(rel_err(sparse->forward(img).logits, dense->forward(img).logits), 1e-5);
  // attention_path: auto runs every classifier layer dense (TransNeXtOptions::attention_path): the same bits.
  o.attention_path = AttentionPath::automatic;
  TransNeXt autos(o);
  auto ap = autos->named_parameters();
  for (auto& p : dense->named_parameters()) ap[p.key()].copy_(p.value());
  autos->eval();
  EXPECT_TRUE(torch::equal(autos->forward(img).logits, dense->forward(img).logits));
  EXPECT_FALSE(torch::equal(sparse->forward(img).logits, dense->forward(img).logits));  // the check sees a path change
}

// model.fused in the classifier: its MoH layers' router and head gates (the fused pieces that apply to TransNeXt's
// blocks) against the official sequence on the same weights, logits, load-balance loss and every gradient, on the
// test device. fp32: each piece within a few ulps (tests/vision/nn/test_fused.cpp), the network within 1e-5.
TEST(TransNeXt, FusedRouterAndGatesKeepTheNetwork) {
  torch::manual_seed(3);
  TransNeXt m(classifier_options("MoH-ViT-Nano-75"));
  m->to(test::device());
  m->train();
  const torch::Tensor img = torch::randn({3, 1, 32, 32}, torch::TensorOptions().device(test::device()));
  std::vector<std::vector<torch::Tensor>> runs;
  for (const FusedMode mode : {FusedMode::off, FusedMode::on}) {
    nn::set_fused_attention(*m, mode);
    m->zero_grad();
    torch::manual_seed(4);  // drop path draws alike
    const ClassifierOutput out = m->forward(img);
    (out.logits.square().sum() + out.aux_loss).backward();
    std::vector<torch::Tensor> r{out.logits.detach().clone(), out.aux_loss.detach().clone()};
    for (const auto& p : m->parameters())
      if (p.grad().defined()) r.push_back(p.grad().clone());
    runs.push_back(r);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  // Some gradients are 0 up to rounding (cpb_fc2.bias shifts every logit of a softmax alike; a router whose gates
  // barely move the loss): those are judged against a thousandth of the largest gradient, not against their own noise.
  double largest = 0;
  for (size_t i = 2; i < runs[0].size(); ++i) largest = std::max(largest, runs[0][i].abs().max().item<double>());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    const double scale = std::max(runs[0][i].abs().max().item<double>(), i >= 2 ? 1e-3 * largest : 0.0);
    EXPECT_LE((runs[1][i] - runs[0][i]).abs().max().item<double>(), 1e-5 * scale)
        << "tensor " << i << " (logits, aux, then gradients)";
  }
}

// The CUDA sliding-window kernels (CUDA builds, options.fused) against the neighbour-by-neighbour reference on the
// same GPU, forward and backward, in fp32, fp16 and bf16. Skipped where no GPU / no kernels are present.
TEST(TransNeXtAttention, CudaKernelsMatchReference) {
  if (!torch::cuda::is_available() || !sliding_window_kernels_available(torch::kCUDA))
    GTEST_SKIP() << "no CUDA kernels or no GPU";
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    torch::manual_seed(5);
    nn::MoHAttentionOptions o(64, 4);
    o.moh(1, 2);
    o.fused = true;
    TransNeXtAttention a(o, 9, 7, 3);  // odd sizes: every border case of the window
    {
      torch::NoGradGuard ng;
      a->relative_pos_bias_local.normal_(0, 0.5);
      a->learnable_bias.normal_(0, 0.5);
      a->router.wg->weight.normal_(0, 1);
    }
    a->to(torch::kCUDA, dtype);
    auto [table, index] = relative_position_cpb(9, 7, 3, 2, 9, 7);
    table = table.to(torch::kCUDA, dtype);
    index = index.to(torch::kCUDA);
    torch::Tensor x =
        torch::randn({3, 63, 64}, torch::TensorOptions().device(torch::kCUDA).dtype(dtype).requires_grad(true));
    auto fast = a->forward(x, table, index).out;
    auto ref = a->forward_reference(x, table, index).out;
    const double tol = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 1e-2 : 3e-2;
    EXPECT_LE(rel_err(fast.to(at::kFloat), ref.to(at::kFloat)), tol);
    auto g1 = torch::autograd::grad({fast.to(at::kFloat).square().sum()}, {x})[0];
    auto g2 = torch::autograd::grad({ref.to(at::kFloat).square().sum()}, {x})[0];
    EXPECT_LE(rel_err(g1.to(at::kFloat), g2.to(at::kFloat)), tol);
  }
}

TEST(TransNeXtAttention, LengthScaleAndPaddingAtStage1) {
  TransNeXtAttention a(nn::MoHAttentionOptions(48, 2), 56, 56, 8);  // 224-px stage 1: 56×56, pool 7×7 (P = 49)
  EXPECT_NEAR(a->seq_length_scale[57][0].item<double>(), std::log(58.0), 1e-6);  // interior: 9 + 49
  EXPECT_NEAR(a->seq_length_scale[1][0].item<double>(), std::log(55.0), 1e-6);   // top edge: 6 + 49
  EXPECT_NEAR(a->seq_length_scale[0][0].item<double>(), std::log(53.0), 1e-6);   // corner: 4 + 49
  EXPECT_EQ(a->padding_mask[0].sum().item<int64_t>(), 5);                        // corner: 5 of 9 outside
}

TEST(TransNeXtCPB, TableSizesAndCoordinates) {
  EXPECT_EQ(relative_position_cpb(56, 56, 7, 7, 56, 56).first.size(0), 10816);
  EXPECT_EQ(relative_position_cpb(28, 28, 7, 7, 28, 28).first.size(0), 2704);
  EXPECT_EQ(relative_position_cpb(14, 14, 7, 7, 14, 14).first.size(0), 676);
  EXPECT_EQ(relative_position_cpb(7, 7, 7, 7, 7, 7).first.size(0), 169);
  auto [table, index] = relative_position_cpb(56, 56, 7, 7, 56, 56);
  EXPECT_EQ(index.numel(), 3136 * 49);
  EXPECT_LE(table.abs().max().item<double>(), 1.07);  // log-spaced, roughly within ±1.06
  // query (0, 0) vs the first pooled bin centre (3.5, 3.5): rel = −3.5/55·8 -> sign·log2(|r|+1)/3
  const double r = -3.5 / 55.0 * 8.0, expect = -std::log2(std::abs(r) + 1.0) / 3.0;
  torch::Tensor first = table.index_select(0, index.narrow(0, 0, 1));
  EXPECT_NEAR(first[0][0].item<double>(), expect, 1e-6);
  EXPECT_NEAR(first[0][1].item<double>(), expect, 1e-6);
}

// The plain path of relative_position_cpb: every (query, key) pair's coordinates, as the official
// get_relative_position_cpb builds them, through at::unique_dim. The fast path ranks each axis on its own; the same
// table, order and index, bit for bit, on square, oblong, pooled and unpooled grids, at and off the pretraining size.
TEST(TransNeXtCPB, PerAxisRanksEqualUniqueDimOverEveryPair) {
  const std::vector<std::array<int64_t, 6>> grids{{9, 7, 3, 2, 9, 7},       {56, 56, 7, 7, 56, 56},
                                                  {28, 28, 28, 28, 28, 28}, {12, 20, 4, 5, 16, 24},
                                                  {14, 14, 14, 14, 7, 7},   {1, 5, 1, 5, 2, 6}};
  for (const auto& [qh, qw, kh, kw, ph, pw] : grids) {
    auto axis = [](int64_t q, int64_t k) {
      const at::Tensor aq = at::arange(q, at::kFloat);
      return std::make_pair(aq, at::adaptive_avg_pool1d(aq.unsqueeze(0), {k}).squeeze(0));
    };
    auto [aqh, akh] = axis(qh, kh);
    auto [aqw, akw] = axis(qw, kw);
    const auto kg = at::meshgrid({akh, akw}, "ij"), qg = at::meshgrid({aqh, aqw}, "ij");
    const at::Tensor rh = (qg[0].reshape({-1, 1}) - kg[0].reshape({1, -1})) / static_cast<double>(ph - 1) * 8.0;
    const at::Tensor rw = (qg[1].reshape({-1, 1}) - kg[1].reshape({1, -1})) / static_cast<double>(pw - 1) * 8.0;
    auto [rows, inverse, counts] = at::unique_dim(at::stack({rh.reshape({-1}), rw.reshape({-1})}, -1), 0, true, true);
    const at::Tensor table = at::sign(rows) * at::log2(rows.abs() + 1.0) / std::log2(8.0);
    auto [fast_table, fast_index] = relative_position_cpb(qh, qw, kh, kw, ph, pw);
    EXPECT_TRUE(fast_table.equal(table)) << qh << "x" << qw << " " << kh << "x" << kw;
    EXPECT_TRUE(fast_index.equal(inverse)) << qh << "x" << qw << " " << kh << "x" << kw;
  }
}

// gather_bias gathers each head's bias from its own 1-D column of the (T, h) table; the plain path gathers along dim 1
// of the (h, T) table.
// Forward: the same elements. Backward: each table entry's gradient sums the upstream gradients of the positions that
// gather it, in an order either path may choose: within count·eps·Σ|terms| of the plain path's (count: the most
// positions gathering one entry).
TEST(TransNeXtCPB, FlatGatherEqualsTheGatherAlongTheHeadsTable) {
  auto [table, index] = relative_position_cpb(56, 56, 7, 7, 56, 56);  // 224 px stage 1: 153,664 positions
  const int64_t h = 3, nq = 3136, nk = 49, rows = table.size(0);
  torch::manual_seed(5);
  const at::Tensor b = at::randn({rows, h}).requires_grad_(true), upstream = at::randn({h, nq, nk});
  const at::Tensor ours = gather_bias(b, index, nq, nk), plain = b.t().index_select(1, index).view({h, nq, nk});
  EXPECT_TRUE(ours.equal(plain));
  const at::Tensor g = torch::autograd::grad({ours}, {b}, {upstream})[0];
  const at::Tensor g_plain = torch::autograd::grad({plain}, {b}, {upstream})[0];
  const double count = at::bincount(index).max().item<double>(), eps = std::numeric_limits<float>::epsilon();
  const at::Tensor bound = at::zeros({h, rows}).index_add_(1, index, upstream.abs().view({h, -1})).t() * count * eps;
  EXPECT_TRUE((g - g_plain).abs().le(bound).all().item<bool>());
  EXPECT_GT(g.abs().sum().item<double>(), 0.0);
}

TEST(ClassifierRegistry, SmallInputPitfallIsAClearError) {
  TransNeXtOptions o = classifier_options("TransNeXt-Micro");
  o.img_size = 32;  // stage 4 would be 1×1: CPB coordinates divide by zero in the official code
  try {
    TransNeXt m(o);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("1×1"), std::string::npos) << e.what();
  }
  o.img_size = 100;
  EXPECT_THROW(TransNeXt{o}, UserError);
}

}  // namespace
}  // namespace moh::vision
