// MoH attention: the official gate math on a hand-computed example, corner cases, dense == sparse (forward and
// backward, aux loss included), reduction to MHA, MoA, and option errors.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/platform/amp.h"
#include "tests/test_util.h"
#include "vision/nn/attention_core.h"
#include "vision/nn/moh_attention.h"

namespace moh::nn {
namespace {

using test::rel_err;

// h = 4, h_s = 1, K = 2, dim 8. Token 0 = e0, token 1 = e1; router columns chosen so every number is by hand:
//   token 0: p = softmax([0, ln2, ln3]) = [1/6, 1/3, 1/2] -> top-2 {1, 2} -> renorm [0.4, 0.6] -> ×K [0.8, 1.2];
//            α = softmax([0, ln3])·2 = [0.5, 1.5]; shared gate (h_s = 1) = 1 -> gates [0.5, 0, 1.2, 1.8].
//   token 1: p = [1/2, 1/3, 1/6] -> top-2 {0, 1} -> [0.6, 0.4]·2 = [1.2, 0.8]; α = [1, 1] -> gates [1, 1.2, 0.8, 0].
//   aux (both tokens): P = [1/3, 1/3, 1/3], f = [1/2, 1, 1/2] -> E·Σ P f = 3·(2/3) = 2 (the balanced minimum K).
//   aux (token 0 only): P = p, f = [0, 1, 1] -> 3·(1/3 + 1/2) = 2.5.
MoHAttention hand_example() {
  MoHAttention a(MoHAttentionOptions(8, 4).moh(1, 2));
  torch::NoGradGuard ng;
  a->router.wg->weight.zero_();
  a->router.wg->weight.index_put_({torch::indexing::Slice(), 0}, torch::tensor({0.0, std::log(2.0), std::log(3.0)}));
  a->router.wg->weight.index_put_({torch::indexing::Slice(), 1}, torch::tensor({std::log(3.0), std::log(2.0), 0.0}));
  a->router.wg_0->weight.zero_();
  a->router.wg_0->weight.index_put_({1, 0}, std::log(3.0));
  return a;
}

TEST(MoHRouting, HandComputedExample) {
  MoHAttention a = hand_example();
  EXPECT_FALSE(a->router.wg_1);                     // h_s = 1: no shared router (official: created only if h_s > 1)
  torch::Tensor x = torch::eye(8).narrow(0, 0, 2);  // tokens e0, e1
  HeadRouting r = a->router.route(x, /*training=*/true);
  torch::Tensor expect = torch::tensor({{0.5, 0.0, 1.2, 1.8}, {1.0, 1.2, 0.8, 0.0}}, torch::kFloat);
  EXPECT_LT((r.gates - expect).abs().max().item<double>(), 1e-6) << r.gates;
  auto sorted = std::get<0>(r.routed.sort(1));
  EXPECT_TRUE(torch::equal(sorted, torch::tensor({{1, 2}, {0, 1}}, torch::kLong)));
  EXPECT_NEAR(r.aux_loss.item<double>(), 2.0, 1e-6);
  HeadRouting r0 = a->router.route(x.narrow(0, 0, 1), true);
  EXPECT_NEAR(r0.aux_loss.item<double>(), 2.5, 1e-6);
  EXPECT_FALSE(a->router.route(x, /*training=*/false).aux_loss.defined());  // only in training mode
}

// Per token: Σ gates = α1·h_s + α2·K (h_s > 1: shared softmax×h_s sums to h_s; routed renorm×K sums to K).
TEST(MoHRouting, GateSumsAndTopKCounts) {
  torch::manual_seed(1);
  MoHAttention a(MoHAttentionOptions(16, 8).moh(3, 2));
  for (auto& p : a->parameters()) p.data().normal_(0, 1);
  torch::Tensor x = torch::randn({50, 16});
  HeadRouting r = a->router.route(x, false);
  torch::Tensor alpha = torch::softmax(torch::linear(x, a->router.wg_0->weight), -1) * 2;
  torch::Tensor expect = alpha.select(1, 0) * 3 + alpha.select(1, 1) * 2;
  EXPECT_LT((r.gates.sum(1) - expect).abs().max().item<double>(), 1e-5);
  torch::Tensor routed_nonzero = (r.gates.narrow(1, 3, 5) > 0).sum(1);
  EXPECT_TRUE((routed_nonzero == 2).all().item<bool>());
  EXPECT_TRUE((r.gates.narrow(1, 0, 3) > 0).all().item<bool>());
}

TEST(MoHRouting, CornerCases) {
  torch::manual_seed(2);
  torch::Tensor x = torch::randn({20, 12});
  {  // K = 0, h_s = h: every head, weighted softmax(wg_1 x)·h; no wg, wg_0, no aux
    MoHAttention a(MoHAttentionOptions(12, 4).moh(4, 0));
    EXPECT_FALSE(a->router.wg);
    EXPECT_FALSE(a->router.wg_0);
    ASSERT_TRUE(a->router.wg_1);
    HeadRouting r = a->router.route(x, true);
    EXPECT_LT((r.gates.sum(1) - 4).abs().max().item<double>(), 1e-5);
    EXPECT_FALSE(r.routed.defined());
    EXPECT_FALSE(r.aux_loss.defined());
  }
  {  // h_s = 0: routed only, no two-stage weights
    MoHAttention a(MoHAttentionOptions(12, 4).moh(0, 2));
    EXPECT_FALSE(a->router.wg_0);
    EXPECT_FALSE(a->router.wg_1);
    HeadRouting r = a->router.route(x, true);
    EXPECT_LT((r.gates.sum(1) - 2).abs().max().item<double>(), 1e-5);
    EXPECT_TRUE(((r.gates > 0).sum(1) == 2).all().item<bool>());
  }
  {  // h_s = 1, K > 0: shared gate is α1 (constant 1 before the two-stage weight)
    MoHAttention a(MoHAttentionOptions(12, 4).moh(1, 1));
    HeadRouting r = a->router.route(x, false);
    torch::Tensor alpha = torch::softmax(torch::linear(x, a->router.wg_0->weight), -1) * 2;
    EXPECT_LT((r.gates.select(1, 0) - alpha.select(1, 0)).abs().max().item<double>(), 1e-6);
  }
}

// The compact router (what trains) against the official op sequence (HeadRouter::plain) on the test device: a
// layer's output, load-balance loss, head picks and every gradient, fp64 and fp32; the gates alone under bf16
// autocast, where both compute the router in fp32 after bf16 products.
void expect_compact_router_equals_plain(const MoHAttentionOptions& o, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto dev = torch::TensorOptions().device(test::device()).dtype(dtype);
  MoHAttention a(o);
  a->to(test::device(), dtype);
  for (auto& p : a->parameters()) p.data().normal_(0, 0.5);
  const torch::Tensor x0 = torch::randn({3, 19, o.dim}, dev), w_out = torch::randn({3, 19, o.dim}, dev);
  std::vector<std::vector<torch::Tensor>> runs;
  for (const bool plain : {true, false}) {
    a->set_plain_router(plain);
    a->zero_grad();
    a->training_load = torch::Tensor();
    torch::Tensor x = x0.clone().requires_grad_(true);
    AttentionOutput out = a->forward(x);
    ((out.out * w_out).sum() + 3.0 * out.aux_loss).backward();
    std::vector<torch::Tensor> r{out.out, out.aux_loss, a->training_load.to(torch::kDouble), x.grad()};
    for (const auto& p : a->parameters()) r.push_back(p.grad());
    runs.push_back(r);
  }
  const double tol = dtype == torch::kDouble ? 1e-12 : 2e-5;
  for (size_t i = 0; i < runs[0].size(); ++i) {
    ASSERT_TRUE(runs[0][i].defined() && runs[1][i].defined()) << "tensor " << i;
    EXPECT_LE(rel_err(runs[1][i], runs[0][i]), tol) << "tensor " << i << " (output, aux, picks, dx, then parameters)";
  }
  EXPECT_TRUE(torch::equal(runs[0][2], runs[1][2]));  // the same heads picked
}

TEST(MoHRouting, CompactEqualsPlainForwardBackward) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    expect_compact_router_equals_plain(MoHAttentionOptions(32, 8).moh(3, 2), dtype, 11);  // h_s > 1: wg, wg_1, wg_0
    expect_compact_router_equals_plain(MoHAttentionOptions(32, 4).moh(1, 2), dtype, 12);  // h_s = 1: no wg_1
    expect_compact_router_equals_plain(MoHAttentionOptions(24, 6).moh(0, 2), dtype, 13);  // no shared heads
    expect_compact_router_equals_plain(MoHAttentionOptions(24, 6).moh(2, 4), dtype, 14);  // every routed head
    expect_compact_router_equals_plain(MoHAttentionOptions(32, 4).moa(2), dtype, 15);     // MoA: no × K
  }
  torch::manual_seed(16);  // bf16 autocast on the device (CPU autocast where the test device is the CPU)
  MoHAttention a(MoHAttentionOptions(64, 8).moh(2, 3));
  a->to(test::device());
  const torch::Tensor x = torch::randn({40, 64}, torch::TensorOptions().device(test::device()));
  const auto gates = [&](bool plain) {
    a->router.plain = plain;
    AutocastScope autocast(RunContext::create(test::device_name(), Precision::bf16, 0));
    return a->router.route(x, true);
  };
  const HeadRouting plain = gates(true), compact = gates(false);
  // The one product rounds its bf16 logits as the three do, up to the GEMM's accumulation order (1 bf16 ulp): a
  // near-tie may then pick another head; rows with the same picks must agree to bf16 rounding.
  const torch::Tensor same = (std::get<0>(plain.routed.sort(1)) == std::get<0>(compact.routed.sort(1))).all(1);
  EXPECT_GE(same.to(torch::kFloat).mean().item<double>(), 0.9);
  const torch::Tensor rows = same.nonzero().squeeze(1);
  EXPECT_LE(rel_err(compact.gates.index_select(0, rows), plain.gates.index_select(0, rows)),
            test::tolerance(torch::kBFloat16));
  EXPECT_LE(rel_err(compact.aux_loss, plain.aux_loss), test::tolerance(torch::kBFloat16));
}

TEST(MoHAttention, OfficialParameterNames) {
  MoHAttention a(MoHAttentionOptions(48, 6).moh(2, 2));
  std::set<std::string> names;
  for (const auto& p : a->named_parameters()) names.insert(p.key());
  EXPECT_EQ(names, (std::set<std::string>{"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "wg.weight",
                                          "wg_0.weight", "wg_1.weight"}));
  EXPECT_EQ(a->router.wg->weight.sizes(), (std::vector<int64_t>{4, 48}));
  EXPECT_EQ(a->router.wg_0->weight.sizes(), (std::vector<int64_t>{2, 48}));
  EXPECT_EQ(a->router.wg_1->weight.sizes(), (std::vector<int64_t>{2, 48}));
}

// Runs forward (training mode, aux loss included) + backward and returns output and every gradient.
std::vector<torch::Tensor> run_fwd_bwd(MoHAttention& a, const torch::Tensor& x0, AttentionPath path) {
  a->train();
  for (auto& p : a->parameters()) p.mutable_grad() = torch::Tensor();
  torch::Tensor x = x0.clone().requires_grad_(true);
  auto out = a->forward_with_path(x, path);
  torch::Tensor w = torch::sin(torch::arange(out.out.numel(), out.out.scalar_type())).view_as(out.out);
  torch::Tensor loss = (out.out * w).sum();
  if (out.aux_loss.defined()) loss = loss + 3.0 * out.aux_loss;
  loss.backward();
  std::vector<torch::Tensor> res{out.out.detach(), x.grad()};
  if (out.aux_loss.defined()) res.push_back(out.aux_loss.detach().view({1}));
  for (auto& p : a->parameters()) res.push_back(p.grad());
  return res;
}

void expect_dense_equals_sparse(MoHAttentionOptions o, int64_t B, int64_t N, uint64_t seed) {
  torch::manual_seed(seed);
  MoHAttention a(o);
  {
    torch::NoGradGuard ng;
    if (a->router.wg) a->router.wg->weight.normal_(0, 1.0);  // decisive, uneven routing
  }
  torch::Tensor x = torch::randn({B, N, o.dim});
  // fp32: output and input gradient within 1e-5.
  auto dense = run_fwd_bwd(a, x, AttentionPath::dense);
  auto sparse = run_fwd_bwd(a, x, AttentionPath::sparse);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_LE(rel_err(sparse[i], dense[i]), 1e-5) << "fp32 tensor " << i << " (0 = output, 1 = dx)";
  // fp64: every gradient, to 1e-10 of max(|tensor|, 1e-3). A router with one routed head selected of two gets no
  // gradient at all (its renormalised gate is s/s = 1 and the load-balance loss is constant), so its "gradient" is
  // rounding noise whose pattern depends on the path: fp32 noise of 1e-8 against a zero tensor read as 15 % apart
  // on one CPU; in fp64 it is ~1e-16 absolute, below the floor, while every real gradient here is O(0.1..1).
  a->to(torch::kDouble);
  dense = run_fwd_bwd(a, x.to(torch::kDouble), AttentionPath::dense);
  sparse = run_fwd_bwd(a, x.to(torch::kDouble), AttentionPath::sparse);
  ASSERT_EQ(dense.size(), sparse.size());
  for (size_t i = 0; i < dense.size(); ++i) {
    ASSERT_TRUE(dense[i].defined() && sparse[i].defined()) << "tensor " << i;
    const double scale = std::max(dense[i].abs().max().item<double>(), 1e-3);
    EXPECT_LE((sparse[i] - dense[i]).abs().max().item<double>() / scale, 1e-10)
        << "fp64 tensor " << i << " (0 = output, 1 = dx, then aux, params)";
  }
}

TEST(MoHAttention, DenseEqualsSparseForwardBackward) {
  expect_dense_equals_sparse(MoHAttentionOptions(32, 4).moh(1, 2), 2, 13, 3);
  expect_dense_equals_sparse(MoHAttentionOptions(48, 8).moh(3, 3), 3, 17, 4);
  expect_dense_equals_sparse(MoHAttentionOptions(24, 6).moh(0, 2), 2, 9, 5);   // no shared heads
  expect_dense_equals_sparse(MoHAttentionOptions(24, 6).moh(2, 4), 1, 31, 6);  // every routed head selected
  MoHAttentionOptions decoupled = MoHAttentionOptions(20, 4).moh(2, 1);
  decoupled.head_dim = 7;  // DiT-L/XL style head_dim
  expect_dense_equals_sparse(decoupled, 2, 11, 7);
  expect_dense_equals_sparse(MoHAttentionOptions(32, 4).moa(2), 2, 12, 8);  // MoA: shared K/V
}

// Large score blocks are computed in query chunks; values and gradients equal the one-shot formula.
// attention_path: auto picks per call from the active ratio and the sequence length (the measured rule of
// docs/BENCHMARKS.md), and then runs exactly that path; explicit paths are kept.
TEST(MoHAttention, AutoPathFollowsTheMeasuredRule) {
  const auto pick = [](double active, int64_t n) { return choose_attention_path(AttentionPath::automatic, active, n); };
  EXPECT_EQ(choose_attention_path(AttentionPath::dense, 0.5, 4096), AttentionPath::dense);
  EXPECT_EQ(choose_attention_path(AttentionPath::sparse, 0.9, 16), AttentionPath::sparse);
  EXPECT_EQ(pick(0.5, 64), AttentionPath::dense);     // short sequences: gathers cost more than they save
  EXPECT_EQ(pick(0.92, 1024), AttentionPath::dense);  // nearly every head on
  EXPECT_EQ(pick(0.5, 1024), AttentionPath::sparse);  // the same rule on both LibTorch versions
  EXPECT_EQ(pick(0.5, 256), AttentionPath::sparse);
  EXPECT_EQ(pick(0.75, 1024), AttentionPath::sparse);
  EXPECT_EQ(pick(1.0, 4096), AttentionPath::dense);
  // On a GPU (any device but the host; `meta` stands in) auto is dense until a rule measured there exists.
  EXPECT_EQ(choose_attention_path(AttentionPath::automatic, 0.5, 1024, c10::Device(c10::kMeta)), AttentionPath::dense);
  EXPECT_EQ(choose_attention_path(AttentionPath::sparse, 0.5, 1024, c10::Device(c10::kMeta)), AttentionPath::sparse);
  EXPECT_EQ(auto_attention_path(0.5, 1024, PathTarget::cuda), AttentionPath::dense);
  EXPECT_EQ(auto_attention_path(0.5, 1024, PathTarget::cpu_libtorch1), AttentionPath::sparse);
  EXPECT_EQ(auto_attention_path(0.92, 1024, PathTarget::cpu_libtorch1), AttentionPath::dense);
  EXPECT_EQ(auto_attention_path(0.5, 1024, PathTarget::cpu_libtorch2), AttentionPath::sparse);

  MoHAttentionOptions o(32, 4);
  o.moh(1, 1);  // 2 of 4 heads active
  torch::manual_seed(3);
  MoHAttention a(o);
  for (const int64_t n : {16, 1024}) {
    torch::Tensor x = torch::randn({1, n, 32});
    auto autos = run_fwd_bwd(a, x, AttentionPath::automatic);
    auto chosen = run_fwd_bwd(a, x, pick(0.5, n));
    ASSERT_EQ(autos.size(), chosen.size());
    for (size_t i = 0; i < autos.size(); ++i) EXPECT_TRUE(torch::equal(autos[i], chosen[i])) << n << " tensor " << i;
  }
}

TEST(Attend, ChunkedEqualsOneShot) {
  torch::manual_seed(12);
  torch::Tensor q = torch::randn({1, 2, 700, 8}, torch::requires_grad());
  torch::Tensor k = torch::randn({1, 2, 6000, 8}, torch::requires_grad());  // 2·700·6000 = 8.4M scores > chunk
  torch::Tensor v = torch::randn({1, 2, 6000, 8}, torch::requires_grad());
  torch::Tensor bias = torch::randn({700, 6000});
  torch::Tensor chunked = attend(q, k, v, 0.35, bias);
  torch::Tensor ref = torch::matmul(torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * 0.35 + bias, -1), v);
  EXPECT_LE(rel_err(chunked, ref), 1e-5);
  auto g1 = torch::autograd::grad({chunked.sum()}, {q, k, v});
  auto g2 = torch::autograd::grad({ref.sum()}, {q, k, v});
  for (int i = 0; i < 3; ++i) EXPECT_LE(rel_err(g1[i], g2[i]), 1e-5) << i;
}

// The fused path (scaled_dot_product_attention on LibTorch >= 2.1, attention_cpu on 1.13) equals the plain reference.
TEST(Attend, FusedEqualsPlain) {
  torch::manual_seed(13);
  torch::Tensor q = torch::randn({2, 3, 17, 8}), k = torch::randn({2, 3, 19, 8}), v = torch::randn({2, 3, 19, 8});
  EXPECT_LE(rel_err(attend(q, k, v, 0.3, {}, true), attend(q, k, v, 0.3, {}, false)), 1e-5);
  for (auto path : {AttentionPath::dense, AttentionPath::sparse}) {
    MoHAttentionOptions o = MoHAttentionOptions(32, 4).moh(1, 2);
    o.path = path;
    MoHAttention fused(o);
    o.fused = false;
    MoHAttention plain(o);
    {
      torch::NoGradGuard ng;
      for (auto& p : fused->named_parameters()) plain->named_parameters()[p.key()].copy_(p.value());
    }
    torch::Tensor x = torch::randn({2, 9, 32});
    EXPECT_LE(rel_err(fused->forward(x).out, plain->forward(x).out), 1e-5);
  }
}

// Core-scope sparse mixing (precomputed q) equals dense mixing.
TEST(MoHAttention, CoreSparseEqualsDense) {
  torch::manual_seed(9);
  const int64_t B = 2, h = 6, N = 20, d = 8, hs = 2;
  MoHAttention a(MoHAttentionOptions(h * d, h).moh(hs, 2));
  {
    torch::NoGradGuard ng;
    a->router.wg->weight.normal_(0, 1);
  }
  HeadRouting r = a->router.route(torch::randn({B * N, h * d}), false);
  torch::Tensor q = torch::randn({B, h, N, d}), k = torch::randn({B, h, N, d}), v = torch::randn({B, h, N, d});
  QuerySource qs;
  qs.q = q;
  torch::Tensor s = mix_heads_sparse(qs, k, v, r.gates, r.routed, h, hs, 0.3);
  torch::Tensor dn = mix_heads_dense(q, k, v, r.gates, 0.3);
  EXPECT_LE(rel_err(s, dn), 1e-5);
}

// With every routed head selected and a zero router, all gates are exactly 1: MoH == MHA with the same weights
// (scale 1; in general shared heads are scaled by α1·h_s·softmax and routed ones by α2·K·renormalised p).
TEST(MoHAttention, AllSelectedUniformGatesIsMHA) {
  torch::manual_seed(10);
  MoHAttention moh(MoHAttentionOptions(32, 4).moh(1, 3));
  MoHAttention mha(MoHAttentionOptions(32, 4));
  {
    torch::NoGradGuard ng;
    for (auto& p : moh->named_parameters()) {
      if (p.key().rfind("wg", 0) == 0)
        p.value().zero_();
      else
        mha->named_parameters()[p.key()].copy_(p.value());
    }
  }
  torch::Tensor x = torch::randn({2, 7, 32});
  for (auto path : {AttentionPath::dense, AttentionPath::sparse}) {
    auto y = moh->forward_with_path(x, path).out;
    EXPECT_LE(rel_err(y, mha->forward(x).out), 1e-6);
  }
}

TEST(MoHAttention, MoAForwardBackward) {
  torch::manual_seed(11);
  MoHAttention a(MoHAttentionOptions(32, 4).moa(2));
  std::set<std::string> names;
  for (const auto& p : a->named_parameters()) names.insert(p.key());
  EXPECT_EQ(names, (std::set<std::string>{"q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight", "proj.bias",
                                          "wg.weight"}));
  a->train();
  torch::Tensor x = torch::randn({2, 9, 32}, torch::requires_grad());
  auto out = a->forward(x);
  ASSERT_TRUE(out.aux_loss.defined());
  HeadRouting r = a->router.route(x.detach().reshape({18, 32}), false);
  EXPECT_LT((r.gates.sum(1) - 1).abs().max().item<double>(), 1e-5);  // MoA gates sum to 1 (no ×K)
  (out.out.sum() + out.aux_loss).backward();
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  for (const auto& p : a->parameters()) EXPECT_TRUE(p.grad().defined() && torch::isfinite(p.grad()).all().item<bool>());
}

// The parameter-free router (router: query_norm, as the released MoH-LLaMA3) against a direct count: per token the
// routed heads ordered by the L2 norm of their query projection, the K largest and every shared head weighted 1, the
// rest 0; the output is the plain per-head attention with those weights, on both paths. No router layers, no
// load-balance loss.
TEST(MoHAttention, QueryNormRouterEqualsADirectCount) {
  for (auto [h, hs, K] :
       {std::array<int64_t, 3>{8, 4, 2}, std::array<int64_t, 3>{6, 0, 3}, std::array<int64_t, 3>{4, 2, 1}}) {
    SCOPED_TRACE("h " + std::to_string(h) + " shared " + std::to_string(hs) + " K " + std::to_string(K));
    torch::manual_seed(21 + h);
    const int64_t C = 8 * h, B = 2, N = 7, d = 8, T = B * N;
    MoHAttentionOptions o(C, h);
    o.moh(hs, K);
    o.router = RouterKind::query_norm;
    MoHAttention a(o);
    a->eval();
    for (const auto& p : a->named_parameters()) EXPECT_EQ(p.key().find("wg"), std::string::npos) << p.key();
    torch::NoGradGuard ng;
    const torch::Tensor x = torch::randn({B, N, C});
    const torch::Tensor qkv = a->qkv->forward(x).view({B, N, 3, h, d}).permute({2, 0, 3, 1, 4});  // (3, B, h, N, d)
    const torch::Tensor q = qkv[0].permute({0, 2, 1, 3}).reshape({T, h, d});
    torch::Tensor gates = torch::zeros({T, h});
    for (int64_t t = 0; t < T; ++t) {
      std::vector<std::pair<double, int64_t>> by_norm;
      for (int64_t j = hs; j < h; ++j) by_norm.emplace_back(q[t][j].norm().item<double>(), j);
      std::sort(by_norm.rbegin(), by_norm.rend());
      for (int64_t j = 0; j < hs; ++j) gates[t][j] = 1.0;
      for (int64_t k = 0; k < K; ++k) gates[t][by_norm[static_cast<size_t>(k)].second] = 1.0;
    }
    const torch::Tensor heads = torch::matmul(
        torch::softmax(torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(d)), -1),
        qkv[2]);  // (B, h, N, d)
    const torch::Tensor expected =
        a->proj->forward((heads.transpose(1, 2) * gates.view({B, N, h, 1})).reshape({B, N, h * d}));
    for (AttentionPath path : {AttentionPath::dense, AttentionPath::sparse}) {
      const AttentionOutput out = a->forward_with_path(x, path);
      EXPECT_LE(rel_err(out.out, expected), 1e-5) << (path == AttentionPath::dense ? "dense" : "sparse");
      EXPECT_FALSE(out.aux_loss.defined());
      const torch::Tensor chosen = torch::zeros({T, h - hs}).scatter_(1, out.routed, 1.0);
      EXPECT_TRUE(torch::equal(chosen, gates.narrow(1, hs, h - hs)));
    }
  }
}

// K = 0 at inference switches the routed heads off and leaves the shared heads' gates (α1 included) as trained, so
// the output equals the same layer at its trained K with the routed heads' output-projection columns zeroed; both
// routers, both paths; the layer reads as routed with its K throughout, and K = 2 afterwards is the layer as before.
TEST(MoHAttention, TopKZeroKeepsOnlyTheSharedHeads) {
  for (RouterKind router : {RouterKind::learned, RouterKind::query_norm}) {
    SCOPED_TRACE(router == RouterKind::learned ? "learned" : "query_norm");
    torch::manual_seed(5);
    const int64_t C = 48, h = 6, hs = 3, d = C / h;
    MoHAttentionOptions o(C, h);
    o.moh(hs, 2);
    o.router = router;
    MoHAttention a(o), cut(o);
    for (auto& p : a->parameters()) p.data().normal_(0, 0.5);
    a->eval();
    cut->eval();
    torch::NoGradGuard ng;
    for (const auto& p : a->named_parameters()) cut->named_parameters()[p.key()].copy_(p.value());
    cut->proj->weight.narrow(1, hs * d, (h - hs) * d).zero_();  // the routed heads' columns
    const torch::Tensor x = torch::randn({2, 9, C});
    const torch::Tensor before = a->forward_with_path(x, AttentionPath::dense).out;
    a->set_routed_topk(0);
    EXPECT_EQ(a->routed_topk(), 2);
    for (AttentionPath path : {AttentionPath::dense, AttentionPath::sparse}) {
      const AttentionOutput out = a->forward_with_path(x, path);
      EXPECT_LE(rel_err(out.out, cut->forward_with_path(x, AttentionPath::dense).out), 1e-5);
      EXPECT_FALSE(out.routed.defined());
      EXPECT_GT(rel_err(out.out, before), 1e-3);
    }
    a->set_routed_topk(2);
    EXPECT_LE(rel_err(a->forward_with_path(x, AttentionPath::sparse).out, before), 1e-5);
  }
  MoHAttention no_shared(MoHAttentionOptions(32, 4).moh(0, 2));
  EXPECT_THROW(no_shared->set_routed_topk(0), UserError);  // no head would be left
}

// attention_path: auto decides by the heads a token uses now: a K set at inference (sampling.topk) changes the share
// it reads, K = 0 leaves the shared heads; MHA layers and MoA experts count alike.
TEST(MoHAttention, ActiveShareFollowsTheHeadBudget) {
  MoHAttention a(MoHAttentionOptions(48, 6).moh(2, 2));
  EXPECT_DOUBLE_EQ(a->active_share(), 4.0 / 6);
  a->set_routed_topk(4);
  EXPECT_DOUBLE_EQ(a->active_share(), 6.0 / 6);
  a->set_routed_topk(1);
  EXPECT_DOUBLE_EQ(a->active_share(), 3.0 / 6);
  a->set_routed_topk(0);
  EXPECT_DOUBLE_EQ(a->active_share(), 2.0 / 6);
  a->set_routed_topk(2);
  EXPECT_DOUBLE_EQ(a->active_share(), 4.0 / 6);
  EXPECT_DOUBLE_EQ(MoHAttention(MoHAttentionOptions(48, 6))->active_share(), 1.0);
  MoHAttention moa(MoHAttentionOptions(48, 6).moa(3));
  EXPECT_DOUBLE_EQ(moa->active_share(), 3.0 / 6);
  moa->set_routed_topk(1);
  EXPECT_DOUBLE_EQ(moa->active_share(), 1.0 / 6);
}

TEST(MoHAttention, BadOptionsAreClearErrors) {
  auto msg = [](MoHAttentionOptions o) {
    try {
      MoHAttention a(o);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(msg(MoHAttentionOptions(32, 4).moh(1, 4)).find("shared 1, top-K 4 do not fit"), std::string::npos);
  EXPECT_NE(msg(MoHAttentionOptions(32, 4).moh(5, 0)).find("shared 5, top-K 0 do not fit"), std::string::npos);
  EXPECT_NE(msg(MoHAttentionOptions(30, 4)).find("not divisible"), std::string::npos);
  EXPECT_NE(msg(MoHAttentionOptions(32, 4).moh(2, 0)).find("so shared must be 4"), std::string::npos);
  EXPECT_EQ(msg(MoHAttentionOptions(32, 4).moh(4, 0)), "<no error>");  // K = 0 with every head shared is allowed
  EXPECT_EQ(msg(MoHAttentionOptions(32, 4).moh(1, 3)), "<no error>");
  EXPECT_NE(msg(MoHAttentionOptions(32, 4).moa(0)).find("moa needs"), std::string::npos);
}

// The one head-split rule behind model.shared_heads / model.topk and the layer options: every (h_s, K) of a 4-head
// layer against 0 ≤ h_s ≤ h, 0 ≤ K ≤ h − h_s, K = 0 only with h_s = h.
TEST(MoHAttention, HeadSplitRule) {
  for (int64_t s = -1; s <= 5; ++s)
    for (int64_t k = -1; k <= 5; ++k) {
      const bool fits = s >= 0 && s <= 4 && k >= 0 && k <= 4 - s && (k > 0 || s == 4);
      EXPECT_EQ(head_split_error(4, s, k).empty(), fits) << "shared " << s << " K " << k;
    }
  EXPECT_NO_THROW(check_router(RouterKind::query_norm, true, "MoH-ViT"));
  EXPECT_NO_THROW(check_router(RouterKind::learned, false, "MoH-ViT"));
  EXPECT_THROW(check_router(RouterKind::query_norm, false, "MoH-ViT"), UserError);
}

}  // namespace
}  // namespace moh::nn
