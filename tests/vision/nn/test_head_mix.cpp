// Head mixing with written-out gradients (vision/nn/head_mix.h) against LibTorch's autograd through the plain
// composition in fp64 — softmax(q kᵀ · scale + bias) v for every head, times the gates — for both paths (dense,
// sparse), every attention core, MHA / MoH / MoA, with and without a score bias, fp32 / bf16 / fp64, on the test
// device. Sizes are odd on purpose (37 tokens: no multiple of the kernels' row blocks).
#include <vector>

#include "tests/test_util.h"
#include "vision/nn/attention_core.h"
#include "vision/nn/fused_ops.h"
#include "vision/nn/head_mix.h"

namespace moh::nn {
namespace {

using test::rel_err;

// Each result is a sum of at most ~64 products (tokens, or head width) computed in fp32 in another order than the
// fp64 reference: within 64 ulps of fp32 (64 · 2^-24 ≈ 3.8e-6) of the tensor's largest value.
constexpr double kFp32Tol = 4e-6;
// bf16 results: fp32 arithmetic rounded to bf16 once (one bf16 step, 2^-8 of the largest value), the gradients from
// an output gradient that the gating already rounded once: two steps, 2^-7.
constexpr double kBf16Tol = 1.0 / 128;
// fp64 (the plain core): the same sums in another order, 64 ulps of fp64.
constexpr double kFp64Tol = 64 * 1.1e-16;

torch::TensorOptions opts(torch::ScalarType t = torch::kFloat) {
  return torch::TensorOptions().device(test::device()).dtype(t);
}

struct Case {
  int64_t B = 2, h = 6, N = 37, d = 16, hkv = 6, shared = 2, topk = 2;
  bool moh = true, scale_by_k = true;
  int bias_dims = 0;  // 0: none, 3: (h, N, N), 4: (B, h, N, N)
  torch::ScalarType type = torch::kFloat;
};

// Inputs drawn from a seed: q, k, v in `type`; gates and routed from the fused router (fp32) for MoH / MoA.
HeadMixInputs inputs(const Case& c, int seed) {
  torch::manual_seed(seed);
  HeadMixInputs in;
  in.q = torch::randn({c.B, c.N, c.h, c.d}, opts()).transpose(1, 2).to(c.type);  // (B, h, N, d), strided
  in.k = torch::randn({c.B, c.hkv, c.N, c.d}, opts()).to(c.type);
  in.v = torch::randn({c.B, c.hkv, c.N, c.d}, opts()).to(c.type);
  in.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  in.shared = c.moh ? c.shared : 0;
  if (c.bias_dims == 3) in.bias = torch::randn({c.h, c.N, c.N}, opts()).to(c.type);
  if (c.bias_dims == 4) in.bias = torch::randn({c.B, c.h, c.N, c.N}, opts()).to(c.type);
  if (c.moh) {
    fused::RouterShape s;
    s.experts = static_cast<int>(c.h - c.shared), s.shared = static_cast<int>(c.shared);
    s.topk = static_cast<int>(c.topk), s.scale_by_k = c.scale_by_k;
    const FusedRouting r = fused::route_forward(torch::randn({c.B * c.N, s.logits()}, opts()) * 2, s);
    in.gates = r.gates, in.routed = r.routed;
  }
  return in;
}

// The reference: outputs and the gradients of (out · w) in fp64 through LibTorch's autograd.
struct Reference {
  torch::Tensor out, dq, dk, dv, dgates, dbias;
};
Reference reference(const HeadMixInputs& in, const torch::Tensor& w) {
  auto leaf = [](const torch::Tensor& t) {
    return t.defined() ? t.to(torch::kDouble).detach().requires_grad_(true) : t;
  };
  const torch::Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v), g = leaf(in.gates), b = leaf(in.bias);
  const int64_t B = q.size(0), h = q.size(1), N = q.size(2), d = q.size(3);
  torch::Tensor s = torch::matmul(q * in.scale, k.expand({B, h, N, d}).transpose(-2, -1));
  if (b.defined()) s = s + b;
  torch::Tensor o = torch::matmul(torch::softmax(s, -1), v.expand({B, h, N, d})).transpose(1, 2);  // (B, N, h, d)
  if (g.defined()) o = o * g.view({B, N, h, 1});
  Reference r;
  r.out = o.reshape({B, N, h * d});
  std::vector<torch::Tensor> leaves{q, k, v};
  if (g.defined()) leaves.push_back(g);
  if (b.defined()) leaves.push_back(b);
  const auto grads = torch::autograd::grad({(r.out * w.to(torch::kDouble)).sum()}, leaves);
  r.dq = grads[0], r.dk = grads[1], r.dv = grads[2];
  if (g.defined()) r.dgates = grads[3];
  if (b.defined()) r.dbias = grads.back();
  return r;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LE(rel_err(got.to(torch::kDouble), want), tol) << what;
}

double tolerance(torch::ScalarType t) {
  return t == torch::kBFloat16 ? kBf16Tol : t == torch::kDouble ? kFp64Tol : kFp32Tol;
}

// Forward and backward of head_mix for `c` on `path` and `core` against the reference.
void check(const Case& c, AttentionPath path, AttentionCore core, int seed, const std::string& label) {
  HeadMixInputs in = inputs(c, seed);
  in.path = path, in.core = core;
  const HeadMixForward f = head_mix_forward(in);
  torch::manual_seed(seed + 1);
  const torch::Tensor w = torch::randn(f.out.sizes(), opts()).to(c.type);
  const Reference r = reference(in, w);
  const double tol = tolerance(c.type);
  EXPECT_EQ(f.out.scalar_type(), c.type) << label;
  expect_close(f.out, r.out, tol, label + " out");
  const HeadMixGrads g = head_mix_backward(w, in, f);
  expect_close(g.q, r.dq, tol, label + " dq");
  expect_close(g.k, r.dk, tol, label + " dk");
  expect_close(g.v, r.dv, tol, label + " dv");
  if (r.dgates.defined()) {
    // The sparse path leaves a skipped pair's gate gradient 0 (its head output was never computed; the router's
    // gradient reads only the kept gates); the gates are fp32, so is their gradient.
    const torch::Tensor want = path == AttentionPath::sparse ? r.dgates * (in.gates != 0) : r.dgates;
    if (path == AttentionPath::sparse) {
      EXPECT_EQ(g.gates.masked_select(in.gates == 0).abs().max().item<float>(), 0.f) << label << " skipped dgates";
    }
    expect_close(g.gates, want, std::max(tol, kFp32Tol), label + " dgates");
  }
  if (r.dbias.defined()) expect_close(g.bias, r.dbias, tol, label + " dbias");
}

const std::vector<std::pair<AttentionCore, const char*>> kCores{{AttentionCore::automatic, "auto"},
                                                                {AttentionCore::fused_cpu, "fused_cpu"},
                                                                {AttentionCore::kernel_cpu, "kernel_cpu"},
                                                                {AttentionCore::plain, "plain"}};
const std::vector<std::pair<AttentionPath, const char*>> kPaths{{AttentionPath::dense, "dense"},
                                                                {AttentionPath::sparse, "sparse"}};

void check_all(const Case& c, int seed, const std::string& label) {
  for (const auto& [path, pname] : kPaths)
    for (const auto& [core, cname] : kCores) check(c, path, core, seed, label + " " + pname + " " + cname);
}

TEST(HeadMix, MoHMatchesAutogradOfThePlainCompositionFp32) {
  check_all(Case{}, 1, "moh fp32");
}

TEST(HeadMix, MoHMatchesAutogradOfThePlainCompositionBf16) {
  Case c;
  c.type = torch::kBFloat16;
  check_all(c, 2, "moh bf16");
}

TEST(HeadMix, ScoreBiasSharedOverTheBatchAndPerElement) {
  Case c;
  c.bias_dims = 3;
  check_all(c, 3, "bias (h, N, N)");
  c.bias_dims = 4;
  check_all(c, 4, "bias (B, h, N, N)");
}

TEST(HeadMix, PlainMultiHeadAttentionAndMoA) {
  Case mha;
  mha.moh = false;
  check_all(mha, 5, "mha");
  Case moa;  // one key/value head for all, no shared heads, routed gates summing to 1
  moa.hkv = 1, moa.shared = 0, moa.topk = 3, moa.scale_by_k = false;
  check_all(moa, 6, "moa");
}

TEST(HeadMix, Fp64RunsThePlainCore) {
  Case c;
  c.type = torch::kDouble;
  c.bias_dims = 3;
  check_all(c, 7, "fp64");
}

TEST(HeadMix, SparsePathLeavesUnselectedPairsExactlyZero) {
  HeadMixInputs in = inputs(Case{}, 8);
  in.path = AttentionPath::sparse;
  const HeadMixForward f = head_mix_forward(in);
  const torch::Tensor off = (in.gates == 0).view({2, 37, 6}).permute({0, 2, 1});  // (B, h, N)
  ASSERT_GT(off.sum().item<int64_t>(), 0);
  EXPECT_EQ(f.o.masked_select(off.unsqueeze(-1)).abs().max().item<float>(), 0.f);
  EXPECT_EQ(f.lse.masked_select(off).abs().max().item<float>(), 0.f);
  // ...and computes the selected ones as the dense path does.
  in.path = AttentionPath::dense;
  const HeadMixForward dense = head_mix_forward(in);
  EXPECT_LE(rel_err(f.out, dense.out), kFp32Tol);
}

TEST(HeadMix, AutomaticPathIsTheToolkitRule) {
  Case c;
  c.N = 300, c.h = 6, c.shared = 1, c.topk = 2;  // (1 + 2) / 6 = 0.5 of the heads on 300 tokens
  const HeadMixInputs in = inputs(c, 9);
  EXPECT_EQ(head_mix_path(AttentionPath::automatic, in),
            choose_attention_path(AttentionPath::automatic, 0.5, 300, in.q.device()));
  EXPECT_EQ(head_mix_path(AttentionPath::sparse, in), AttentionPath::sparse);
  HeadMixInputs mha = in;
  mha.gates = mha.routed = torch::Tensor();
  EXPECT_EQ(head_mix_path(AttentionPath::sparse, mha), AttentionPath::dense);  // nothing to skip
}

}  // namespace
}  // namespace moh::nn
