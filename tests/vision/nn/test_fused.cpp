// The fused block operations (vision/nn/fused_ops.h) against the official op sequences they replace, forward and
// backward, in fp32 and in the mixed types of bf16 autocast, on the test device (MOH_TEST_DEVICE: the CPU loops here,
// the CUDA kernels on a GPU). Shapes are odd on purpose: token counts that are no multiple of the reduction tiles,
// widths that are no multiple of a warp.
#include <cmath>
#include <vector>

#include "simd_variants.h"
#include "tests/test_util.h"
#include "vision/nn/cpu_simd.h"
#include "vision/nn/fused_ops.h"
#include "vision/nn/gelu_cpu.h"
#include "vision/nn/moh_attention.h"
#include "vision/nn/vit_layers.h"

namespace moh::nn {
namespace {

using test::rel_err;

// fp32: the fused loops sum in another order than LibTorch's kernels; each result differs by a few ulps of the
// largest term it sums (8 ulps of fp32 = 4.8e-7 relative): 1e-6 of the tensor's largest value.
constexpr double kFp32Tol = 1e-6;
// A result stored in bf16 after the same fp32 arithmetic in another order: at most one rounding step apart, i.e. one
// bf16 ulp (2^-8 relative) of the largest value; sums over rounded terms: two.
constexpr double kBf16Tol = 1.0 / 128;

torch::TensorOptions opts(torch::ScalarType t = torch::kFloat) {
  return torch::TensorOptions().device(test::device()).dtype(t);
}

// Gradients of `out` · w_out (a fixed random weight) with respect to `inputs`.
std::vector<torch::Tensor> grads_of(const torch::Tensor& out, const std::vector<torch::Tensor>& inputs, int seed) {
  torch::manual_seed(seed);
  const torch::Tensor w = torch::randn(out.sizes(), opts());
  return torch::autograd::grad({(out.to(torch::kFloat) * w).sum()}, inputs, {}, /*retain_graph=*/true);
}

void expect_all_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want, double tol,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined() && want[i].defined()) << what << " tensor " << i;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what << " tensor " << i;
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << what << " tensor " << i;
    EXPECT_LE(rel_err(got[i].to(torch::kDouble), want[i].to(torch::kDouble)), tol) << what << " tensor " << i;
  }
}

// adaLN's output (B, 6D) in `mod_type` and its six (B, D) chunks (row stride 6D, as the block reads them).
struct Modulation {
  torch::Tensor all;
  std::vector<torch::Tensor> chunks;
};
Modulation modulation(int64_t B, int64_t D, torch::ScalarType mod_type, int seed) {
  torch::manual_seed(seed);
  Modulation m;
  m.all = (torch::randn({B, 6 * D}, opts()) * 0.5).to(mod_type).requires_grad_(true);
  m.chunks = m.all.chunk(6, 1);
  return m;
}

// Widths 203 and 139 leave a tail past the last whole vector of every instruction set's loops (fused_rows.h); each
// set the CPU has runs (the CPU loops: their vector rows for fp32 x, the per-element ones otherwise).
TEST(FusedOps, LnModulateEqualsTheOfficialSequence) {
  const double eps = 1e-6;
  for (const auto mod_type : {torch::kFloat, torch::kBFloat16}) {
    const int64_t B = 3, N = 37, D = 203;
    torch::manual_seed(1);
    const torch::Tensor x = (torch::randn({B, N, D}, opts()) * 2 + 0.5).requires_grad_(true);
    const Modulation m = modulation(B, D, mod_type, 2);
    const torch::Tensor plain = plain_ln_modulate(x, m.chunks[0], m.chunks[1], eps);
    for_each_isa([&] {
      const torch::Tensor fused = fused_ln_modulate(x, m.chunks[0], m.chunks[1], eps, plain.scalar_type());
      // Mixed types round `1 + scale` to bf16 as the official code: the fp32 outputs agree to fp32 rounding either way.
      expect_all_close({fused}, {plain}, kFp32Tol, "output");
      expect_all_close(grads_of(fused, {x, m.all}, 3), grads_of(plain, {x, m.all}, 3),
                       mod_type == torch::kFloat ? kFp32Tol : kBf16Tol, "dx, d(adaLN)");
      // Stored in bf16 for a product that casts it there anyway: the cast of the fp32 result.
      const torch::Tensor low = fused_ln_modulate(x, m.chunks[0], m.chunks[1], eps, torch::kBFloat16);
      EXPECT_EQ(low.scalar_type(), torch::kBFloat16);
      expect_all_close({low}, {plain.to(torch::kBFloat16)}, kBf16Tol, "bf16 output");
      expect_all_close(grads_of(low, {x, m.all}, 4), grads_of(plain.to(torch::kBFloat16), {x, m.all}, 4),
                       mod_type == torch::kFloat ? kFp32Tol : kBf16Tol, "bf16-stored gradients");
    });
  }
}

TEST(FusedOps, GateResidualEqualsTheOfficialSequence) {
  for (const auto branch_type : {torch::kFloat, torch::kBFloat16}) {
    const int64_t B = 2, N = 45, D = 139;
    torch::manual_seed(5);
    const torch::Tensor x = torch::randn({B, N, D}, opts()).requires_grad_(true);
    const torch::Tensor branch = torch::randn({B, N, D}, opts()).to(branch_type).requires_grad_(true);
    const Modulation m = modulation(B, D, branch_type, 6);
    const torch::Tensor plain = plain_gate_residual(x, m.chunks[2], branch);
    for_each_isa([&] {
      const torch::Tensor fused = fused_gate_residual(x, m.chunks[2], branch);
      const bool f32 = branch_type == torch::kFloat;
      expect_all_close({fused}, {plain}, f32 ? kFp32Tol : 0.0, "output");  // bf16: the official rounding, exactly
      expect_all_close(grads_of(fused, {x, branch, m.all}, 7), grads_of(plain, {x, branch, m.all}, 7),
                       f32 ? kFp32Tol : kBf16Tol, "dx, dbranch, d(adaLN)");
    });
  }
}

// How far apart two bf16 runs' gradients dz (T, F) of GELU's input z = x W^T + b can be, in bf16 ulps: each
// rounds dz (|dz|), and z itself may be a rounding step apart, which moves dz = GELU'(z) w_out by at most
// |GELU''| ≤ 1 times that step times |w_out| (|z| |w_out|).
torch::Tensor pre_activation_grad_scale(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                        at::IntArrayRef out_sizes, int seed) {
  torch::manual_seed(seed);
  const torch::Tensor w_out = torch::randn(out_sizes, opts());
  const torch::Tensor z =
      at::linear(x.detach().to(torch::kFloat), w.detach().to(torch::kFloat), b.detach()).requires_grad_(true);
  const torch::Tensor dz = torch::autograd::grad({(at::gelu(z, "tanh") * w_out).sum()}, {z})[0];
  return (dz.abs() + z.detach().abs() * w_out.abs()).reshape({-1, dz.size(-1)});
}

TEST(FusedOps, BiasGeluEqualsTheOfficialLinearAndGelu) {
  for (const auto type : {torch::kFloat, torch::kBFloat16}) {
    const int64_t T = 70, C = 48, F = 300;
    torch::manual_seed(8);
    const torch::Tensor x = torch::randn({2, T / 2, C}, opts()).to(type).requires_grad_(true);
    const torch::Tensor w = (torch::randn({F, C}, opts()) * 0.2).to(type).requires_grad_(true);
    const torch::Tensor b = torch::randn({F}, opts()).requires_grad_(true);  // fp32, as the Linear's parameter
    const torch::Tensor plain = plain_linear_gelu(x, w, b.to(type));         // autocast casts the bias
    const torch::Tensor fused = fused_bias_gelu(at::linear(x, w), b);
    const bool f32 = type == torch::kFloat;
    // bf16: the official Linear rounds z + b once, the fused op z, then z + b: one ulp apart at most.
    expect_all_close({fused}, {plain}, f32 ? kFp32Tol : kBf16Tol, "output");
    const std::vector<torch::Tensor> got = grads_of(fused, {x, w, b}, 9), want = grads_of(plain, {x, w, b}, 9);
    if (f32) {
      expect_all_close(got, want, kFp32Tol, "dx, dw, db");
      continue;
    }
    // bf16: dx = dz W, dw = dz^T x and db = sum dz add the steps between the two dz with cancellation, so each bound
    // is relative to the sum of the terms' magnitudes (|dz| |W| ...), plus the final rounding of the result.
    const torch::Tensor dz = pre_activation_grad_scale(x, w, b, plain.sizes(), 9);
    const torch::Tensor xf = x.detach().to(torch::kFloat).abs().reshape({T, C}),
                        wf = w.detach().to(torch::kFloat).abs();
    const std::vector<torch::Tensor> magnitudes{dz.matmul(wf).reshape(x.sizes()), dz.t().matmul(xf), dz.sum(0)};
    for (size_t i = 0; i < got.size(); ++i) {
      const double largest = want[i].abs().max().item<double>();
      const double tol = kBf16Tol * magnitudes[i].max().item<double>() / largest + kBf16Tol;
      expect_all_close({got[i]}, {want[i]}, tol, i == 0 ? "dx" : i == 1 ? "dw" : "db");
    }
  }
}

// The MLPs' GELU (gelu()): on LibTorch 1.13 a CPU's bf16 tensor computed in fp32 and rounded back once, on 2.x
// at::gelu itself. Against GELU in fp64 of the same bf16 values, its output is the exact one rounded to bf16 (half a
// bf16 ulp, 2^-9 relative, plus fp32's error: within one ulp) and its input gradient that with the upstream gradient
// rounded to bf16 first (two roundings). The plain at::gelu on the bf16 tensor meets the output's bound; 1.13's bf16
// backward rounds inside (1.2 % of the largest value off here), the reason for the fp32 round trip.
TEST(FusedOps, UpcastGeluIsTheExactGeluRoundedOnce) {
  for (const bool tanh : {true, false}) {
    torch::manual_seed(10);
    const torch::Tensor z = (torch::randn({3, 37, 129}, opts()) * 3).to(torch::kBFloat16).requires_grad_(true);
    const torch::Tensor z64 = z.detach().to(torch::kDouble).requires_grad_(true);
    const torch::Tensor exact = at::gelu(z64, tanh ? "tanh" : "none");
    const torch::Tensor fast = gelu(z, tanh), plain = gelu(z, tanh, /*own=*/false);
    EXPECT_EQ(fast.scalar_type(), torch::kBFloat16);
    EXPECT_LE(rel_err(fast.to(torch::kDouble), exact.detach()), kBf16Tol / 2) << "output, tanh " << tanh;
    EXPECT_LE(rel_err(plain.to(torch::kDouble), exact.detach()), kBf16Tol / 2) << "plain output, tanh " << tanh;
    const torch::Tensor g = grads_of(fast, {z}, 11)[0], g64 = grads_of(exact, {z64}, 11)[0];
    EXPECT_EQ(g.scalar_type(), torch::kBFloat16);
    EXPECT_LE(rel_err(g.to(torch::kDouble), g64), kBf16Tol) << "dz, tanh " << tanh;  // the upstream grad rounded too
    const torch::Tensor zf = z.detach().to(torch::kFloat);  // fp32: at::gelu unless the tanh loop (own test below)
    if (!(tanh && own_cpu_tanh_gelu() && zf.is_cpu())) {
      EXPECT_TRUE(gelu(zf, tanh).equal(at::gelu(zf, tanh ? "tanh" : "none")));
    }
  }
}

// The bf16 tanh-GELU loop on every bf16 value in [-16, 16] against fp64: the output and the input gradient (upstream
// gradient 1) each the fp32 value rounded once, so within half a bf16 ulp (2^-8 relative) plus the fp32 arithmetic's
// few ulps; absolute floors for the tail below u ≈ -9.7, where e^{-2v} is clamped (exact values under 1e-37), and for
// the gradient's zero crossing near u = -0.75, where its two fp32 terms cancel (at::gelu's tanh form is far less
// exact in the negative tail, where 1 + tanh cancels).
TEST(FusedOps, TanhGeluBf16KernelIsTheExactValueRoundedOnce) {
  std::vector<uint16_t> bits;
  for (uint32_t b = 0; b <= 0x4180u; ++b) {  // +0 .. 16 and -0 .. -16
    bits.push_back(static_cast<uint16_t>(b));
    bits.push_back(static_cast<uint16_t>(b | 0x8000u));
  }
  const int64_t n = static_cast<int64_t>(bits.size());
  const torch::Tensor z = torch::from_blob(bits.data(), {n}, torch::kInt16).clone().view(torch::kBFloat16);
  const torch::Tensor z64 = z.to(torch::kDouble).requires_grad_(true);
  // 0.5 u (1 + tanh v) as u σ(2v): even fp64's 1 + tanh cancels below u ≈ -6
  const torch::Tensor exact = z64 * torch::sigmoid(2 * 0.7978845608028654 * (z64 + 0.044715 * z64.pow(3)));
  const torch::Tensor dexact = torch::autograd::grad({exact.sum()}, {z64})[0];
  for_each_isa([&] {
    const torch::Tensor zg = z.clone().requires_grad_(true);
    const torch::Tensor y = gelu_tanh_cpu(zg);
    ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
    const torch::Tensor dz = torch::autograd::grad({y}, {zg}, {torch::ones_like(y)})[0];
    ASSERT_EQ(dz.scalar_type(), torch::kBFloat16);
    const double rel = 1.0 / 256 + 1e-5;
    const torch::Tensor y_over = (y.to(torch::kDouble) - exact.detach()).abs() - (rel * exact.detach().abs() + 1e-36);
    EXPECT_LE(y_over.max().item<double>(), 0.0) << "output, worst at z = " << z[y_over.argmax()].item<float>();
    const torch::Tensor d_over = (dz.to(torch::kDouble) - dexact).abs() - (rel * dexact.abs() + 1e-6);
    EXPECT_LE(d_over.max().item<double>(), 0.0) << "gradient, worst at z = " << z[d_over.argmax()].item<float>();
    // Non-contiguous input, an upstream gradient that is not 1: the same as the contiguous loop's values.
    const torch::Tensor m = z.narrow(0, 0, 2 * 4096).view({64, 128}).t().requires_grad_(true);
    const torch::Tensor ym = gelu_tanh_cpu(m);
    EXPECT_TRUE(ym.equal(gelu_tanh_cpu(m.detach().contiguous())));
    const torch::Tensor up = torch::full({128, 64}, 0.5, torch::kBFloat16);
    const torch::Tensor dm = torch::autograd::grad({ym}, {m}, {up})[0];
    const torch::Tensor dm1 = torch::autograd::grad({gelu_tanh_cpu(m)}, {m}, {torch::ones_like(up)})[0];
    EXPECT_TRUE(dm.equal(dm1 * 0.5));  // halving is exact in bf16, and commutes with the one rounding
  });
}

// The fp32 tanh-GELU loop against fp64 on every 4096th fp32 value in [-16, 16] (each sign) and seeded random ones.
// Error budget, in units of ε = 2^-24: v = β(u + κu³) takes 5 roundings whose two terms share u's sign (no
// cancellation), so e = exp(-2v) carries 5 |2v| ε from v plus exp's own 2 ulps; 1 + e and the division add one each:
// the output within (8 + 6 |2v|) ε relative. The gradient s + 2u s (s e) β (1 + 3κu²) has terms with about three times
// those errors, bounded against the sum of the terms' magnitudes (they cancel near u = -0.75). Below 1e-30 absolute
// (e^{-2v} clamped at e^87) the values are taken as equal. A wrong constant or a lost term is off by >= 1e-4.
TEST(FusedOps, TanhGeluFp32KernelIsWithinItsRoundingBudget) {
  std::vector<float> values;
  for (uint32_t b = 0; b <= 0x41800000u; b += 4096u)
    for (const uint32_t sign : {0u, 0x80000000u}) values.push_back(simd::from_bits(b | sign));
  torch::manual_seed(12);
  const torch::Tensor random = torch::randn({100000}) * 4;
  const torch::Tensor z = torch::cat({torch::tensor(values), random});
  const torch::Tensor u = z.to(torch::kDouble);
  const torch::Tensor v2 = 2 * 0.7978845608028654 * (u + 0.044715 * u.pow(3));
  const torch::Tensor s = torch::sigmoid(v2), e = torch::exp(-v2.clamp_max(700));
  const torch::Tensor exact = u * s;
  const torch::Tensor term2 = 2 * u * s * (s * e) * 0.7978845608028654 * (1 + 3 * 0.044715 * u * u);
  const torch::Tensor dexact = s + term2;
  const double eps = std::ldexp(1.0, -24);
  for_each_isa([&] {
    const torch::Tensor zg = z.clone().requires_grad_(true);
    const torch::Tensor y = gelu_tanh_cpu(zg);
    ASSERT_EQ(y.scalar_type(), torch::kFloat);
    const torch::Tensor dz = torch::autograd::grad({y}, {zg}, {torch::ones_like(y)})[0];
    const torch::Tensor y_tol = eps * (8 + 6 * v2.abs()) * exact.abs() + 1e-30;
    const torch::Tensor y_over = (y.to(torch::kDouble) - exact).abs() / y_tol;
    EXPECT_LE(y_over.max().item<double>(), 1.0) << "output, worst at z = " << z[y_over.argmax()].item<float>();
    const torch::Tensor d_tol = eps * (24 + 18 * v2.abs()) * (s.abs() + term2.abs()) + 1e-30;
    const torch::Tensor d_over = (dz.to(torch::kDouble) - dexact).abs() / d_tol;
    EXPECT_LE(d_over.max().item<double>(), 1.0) << "gradient, worst at z = " << z[d_over.argmax()].item<float>();
    // Non-contiguous input, an upstream gradient that is not 1: the contiguous loop's values, the gradient halved.
    const torch::Tensor m = random.narrow(0, 0, 64 * 128).view({64, 128}).t().requires_grad_(true);
    const torch::Tensor ym = gelu_tanh_cpu(m);
    EXPECT_TRUE(ym.equal(gelu_tanh_cpu(m.detach().contiguous())));
    const torch::Tensor dm = torch::autograd::grad({ym}, {m}, {torch::full({128, 64}, 0.5)})[0];
    const torch::Tensor dm1 = torch::autograd::grad({gelu_tanh_cpu(m)}, {m}, {torch::ones({128, 64})})[0];
    EXPECT_TRUE(dm.equal(dm1 * 0.5));  // halving is exact in fp32
  });
}

TEST(FusedOps, GateHeadsEqualsTheOfficialGating) {
  const int64_t B = 2, h = 5, N = 23, d = 40;
  torch::manual_seed(10);
  const torch::Tensor gates = torch::rand({B * N, h}, opts()).requires_grad_(true);
  for (const auto type : {torch::kFloat, torch::kBFloat16})
    for (const bool bnhd : {false, true}) {  // (B, h, N, d) memory, or the (B, N, h, d) memory flash attention leaves
      torch::Tensor o = bnhd ? torch::randn({B, N, h, d}, opts()).transpose(1, 2) : torch::randn({B, h, N, d}, opts());
      o = o.to(type).requires_grad_(true);
      const torch::Tensor plain = plain_gate_heads(o, gates);  // fp32: bf16 × fp32 gates promote
      const torch::Tensor fused = fused_gate_heads(o, gates, type);
      expect_all_close({fused.to(torch::kFloat)}, {plain.to(type).to(torch::kFloat)}, 0.0, "output");
      expect_all_close(grads_of(fused, {o, gates}, 11), grads_of(plain.to(type), {o, gates}, 11),
                       type == torch::kFloat ? kFp32Tol : kBf16Tol, "do, dgates");
    }
}

// The fused router against route_compact (its reference, itself equal to the official sequence) on the same
// layer: gates, picks, loss, and the gradients of x and the router weights through gates and loss.
void expect_fused_router_equals_compact(const MoHAttentionOptions& o, int seed) {
  torch::manual_seed(seed);
  MoHAttention a(o);
  a->to(test::device());
  for (auto& p : a->parameters()) p.data().normal_(0, 0.5);
  const torch::Tensor x0 = torch::randn({53, o.dim}, opts()), w = torch::randn({53, o.num_heads}, opts());
  std::vector<std::vector<torch::Tensor>> runs;
  std::vector<torch::Tensor> routed, picks;
  for (const bool fused : {false, true}) {
    a->zero_grad();
    a->router.fused = fused ? FusedMode::on : FusedMode::off;
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const HeadRouting r = a->router.route(x, true);
    ((r.gates * w).sum() + 3.0 * r.aux_loss).backward();
    std::vector<torch::Tensor> run{r.gates, r.aux_loss, x.grad()};
    for (const auto& p : a->parameters()) run.push_back(p.grad());
    runs.push_back(run);
    routed.push_back(r.routed), picks.push_back(r.picks);
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    if (!runs[0][i].defined()) continue;  // parameters without a gradient (the qkv / proj layers)
    EXPECT_LE(rel_err(runs[1][i], runs[0][i]), kFp32Tol) << "tensor " << i << " (gates, aux, dx, then parameters)";
  }
  EXPECT_TRUE(torch::equal(routed[0], routed[1])) << "the same heads, in the same order";
  EXPECT_TRUE(torch::equal(picks[0], picks[1])) << "the same picks";
}

TEST(FusedOps, RouterEqualsTheCompactRouter) {
  expect_fused_router_equals_compact(MoHAttentionOptions(32, 8).moh(3, 2), 21);  // h_s > 1: wg, wg_1, wg_0
  expect_fused_router_equals_compact(MoHAttentionOptions(32, 4).moh(1, 2), 22);  // h_s = 1: no wg_1
  expect_fused_router_equals_compact(MoHAttentionOptions(24, 6).moh(0, 2), 23);  // no shared heads
  expect_fused_router_equals_compact(MoHAttentionOptions(24, 6).moh(2, 4), 24);  // every routed head
  expect_fused_router_equals_compact(MoHAttentionOptions(32, 4).moa(2), 25);     // MoA: no × K
  MoHAttentionOptions xl(1152, 24);                                              // MoH-DiT-XL/2-90's last layers
  xl.head_dim = 72;
  expect_fused_router_equals_compact(xl.moh(16, 3), 26);
}

TEST(FusedOps, OnlyTheTypesAndDevicesTheLoopsTakeAreFused) {
  EXPECT_TRUE(fused_kernels_available(torch::Device(torch::kCPU)));
  EXPECT_TRUE(fused_dtype(torch::kBFloat16));
  EXPECT_FALSE(fused_dtype(torch::kDouble));
  // fp64 (the reference twins of tests/test_on_device.cpp) runs the official sequence.
  const torch::Tensor x = torch::randn({2, 3, 8}, torch::kDouble), m = torch::randn({2, 8}, torch::kDouble);
  EXPECT_TRUE(torch::equal(fused_ln_modulate(x, m, m, 1e-6, torch::kDouble), plain_ln_modulate(x, m, m, 1e-6)));
  EXPECT_FALSE(use_fused_ops(FusedMode::off, torch::Device(torch::kCPU)));
  EXPECT_TRUE(use_fused_ops(FusedMode::on, torch::Device(torch::kCPU)));
}

}  // namespace
}  // namespace moh::nn
