// The one-pass CPU attention core (vision/nn/attention_cpu.h) against softmax(q kᵀ · scale) v computed in fp64 by
// LibTorch's own ops: outputs and the gradients of q, k and v, in fp32 and bf16, at the shapes the models run
// (the pixel DiTs' 16-wide heads over 196 tokens, the DiT-S's 64) and at edges (one key, peaked scores, strided
// operands). Bounds from the dtypes' rounding: fp32 within (d + Nk) accumulations of its unit roundoff of the largest
// value; bf16 within half a bf16 step of each value (rounded once from fp32) plus that.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch/version.h>
#include <limits>
#include <vector>

#include "simd_variants.h"
#include "vision/nn/attention_core.h"
#include "vision/nn/attention_cpu.h"

namespace moh::nn {
namespace {

struct Shape {
  std::vector<int64_t> lead;
  int64_t n, nk, d;
};

std::vector<int64_t> dims(const Shape& s, int64_t rows) {
  std::vector<int64_t> out = s.lead;
  out.push_back(rows);
  out.push_back(s.d);
  return out;
}

// Output and gradients of q, k, v for the upstream gradient g.
std::vector<torch::Tensor> run(const std::function<torch::Tensor(torch::Tensor, torch::Tensor, torch::Tensor)>& f,
                               torch::Tensor q, torch::Tensor k, torch::Tensor v, const torch::Tensor& g) {
  q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true);
  torch::Tensor o = f(q, k, v);
  auto grads = torch::autograd::grad({o}, {q, k, v}, {g.to(o.scalar_type())});
  return {o.detach(), grads[0], grads[1], grads[2]};
}

std::vector<torch::Tensor> reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& g, double scale) {
  auto plain = [&](torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    return torch::matmul(torch::softmax(torch::matmul(a, b.transpose(-2, -1)) * scale, -1), c);
  };
  return run(plain, q.to(torch::kDouble).detach(), k.to(torch::kDouble).detach(), v.to(torch::kDouble).detach(),
             g.to(torch::kDouble));
}

std::vector<torch::Tensor> fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& g, double scale) {
  auto f = [&](torch::Tensor a, torch::Tensor b, torch::Tensor c) { return attention_cpu(a, b, c, scale); };
  return run(f, q.detach().clone(), k.detach().clone(), v.detach().clone(), g);
}

// Every element within `relative` of its reference value plus `absolute` (× the largest reference value).
void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& ref, double relative,
                  double absolute, const std::string& what) {
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (size_t i = 0; i < got.size(); ++i) {
    const torch::Tensor r = ref[i], err = (got[i].to(torch::kDouble) - r).abs();
    const torch::Tensor bound = r.abs() * relative + absolute * r.abs().max();
    EXPECT_TRUE(torch::isfinite(got[i]).all().item<bool>()) << what << " " << names[i];
    EXPECT_TRUE((err <= bound).all().item<bool>())
        << what << " " << names[i] << ": largest excess " << (err - bound).max().item<double>() << " (largest error "
        << err.max().item<double>() << ", largest value " << r.abs().max().item<double>() << ")";
  }
}

const std::vector<Shape> kShapes = {{{2, 3}, 17, 19, 8}, {{1, 4}, 196, 196, 16}, {{2}, 5, 40, 24},
                                    {{3}, 1, 1, 16},     {{1, 2}, 33, 7, 64},    {{}, 9, 16, 17}};

TEST(AttentionCpu, Fp32IsTheFp64ValueWithinFp32Rounding) {
  torch::manual_seed(21);
  for (const Shape& s : kShapes) {
    const torch::Tensor q = torch::randn(dims(s, s.n)) * 2, k = torch::randn(dims(s, s.nk)),
                        v = torch::randn(dims(s, s.nk)), g = torch::randn(dims(s, s.n));
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    const double eps = std::numeric_limits<float>::epsilon();
    const std::vector<torch::Tensor> ref = reference(q, k, v, g, scale);
    for_each_isa([&] {
      expect_close(fused(q, k, v, g, scale), ref, 0.0, 4.0 * (s.d + s.nk) * eps,
                   "fp32 n=" + std::to_string(s.n) + " nk=" + std::to_string(s.nk) + " d=" + std::to_string(s.d));
    });
  }
}

TEST(AttentionCpu, Bf16IsTheFp32ValueRoundedOnce) {
  torch::manual_seed(22);
  for (const Shape& s : kShapes) {
    const torch::Tensor q = (torch::randn(dims(s, s.n)) * 2).to(torch::kBFloat16),
                        k = torch::randn(dims(s, s.nk)).to(torch::kBFloat16),
                        v = torch::randn(dims(s, s.nk)).to(torch::kBFloat16),
                        g = torch::randn(dims(s, s.n)).to(torch::kBFloat16);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    const std::vector<torch::Tensor> ref = reference(q, k, v, g, scale);
    for_each_isa([&] {
      const std::vector<torch::Tensor> got = fused(q, k, v, g, scale);
      for (const torch::Tensor& t : got) EXPECT_EQ(t.scalar_type(), torch::kBFloat16);
      const double eps = std::numeric_limits<float>::epsilon();
      expect_close(got, ref, std::ldexp(1.0, -8), 4.0 * (s.d + s.nk) * eps,
                   "bf16 n=" + std::to_string(s.n) + " d=" + std::to_string(s.d));
    });
  }
}

// Scores in the hundreds (nearly one-hot rows): the row maximum keeps the exponentials finite.
TEST(AttentionCpu, PeakedScoresStayFinite) {
  torch::manual_seed(23);
  const Shape s{{2, 2}, 30, 50, 16};
  const torch::Tensor q = torch::randn(dims(s, s.n)) * 40, k = torch::randn(dims(s, s.nk)) * 3,
                      v = torch::randn(dims(s, s.nk)), g = torch::randn(dims(s, s.n));
  const double eps = std::numeric_limits<float>::epsilon();
  // A score of ~600 carries ~600 eps of rounding into its exponent: the bound grows with the scores' size.
  const double largest = (torch::matmul(q, k.transpose(-2, -1)) * 0.25).abs().max().item<double>();
  expect_close(fused(q, k, v, g, 0.25), reference(q, k, v, g, 0.25), 4.0 * largest * eps,
               4.0 * (s.d + s.nk) * eps * largest, "peaked");
}

// The models pass q, k and v as strided views of one qkv product ((B, h, N, d) each from (B, N, 3, h, d)), read in
// place: the output and the product's gradient are those of contiguous copies, bit for bit; the output and the
// gradients come in the operands' layout ((B, N, h, d) memory: the projection reads the output as (B, N, h·d)
// without a copy). Also with keys and values shared by the heads (MoA: expanded, stride 0).
TEST(AttentionCpu, StridedViewsAreReadInPlaceWithTheContiguousResult) {
  torch::manual_seed(24);
  const int64_t B = 2, N = 12, h = 3, d = 16;
  const torch::Tensor base = torch::randn({B, N, 3 * h * d}), g = torch::randn({B, h, N, d});
  for (const bool shared_kv : {false, true}) {
    std::vector<torch::Tensor> outs;
    for (const bool copies : {false, true}) {
      const torch::Tensor x = base.clone().requires_grad_(true);
      std::vector<torch::Tensor> qkv = x.view({B, N, 3, h, d}).unbind(2);  // (B, N, h, d) each
      for (auto& t : qkv) t = t.transpose(1, 2);
      for (int i = 1; i < 3 && shared_kv; ++i) qkv[i] = qkv[i].narrow(1, 0, 1).expand({B, h, N, d});
      for (auto& t : qkv) t = copies ? t.contiguous() : t;
      const torch::Tensor o = attention_cpu(qkv[0], qkv[1], qkv[2], 0.25);
      EXPECT_TRUE(copies || o.transpose(1, 2).is_contiguous()) << "output layout, shared_kv " << shared_kv;
      outs.push_back(o.detach());
      outs.push_back(torch::autograd::grad({o}, {x}, {g})[0]);
    }
    EXPECT_TRUE(torch::equal(outs[0], outs[2])) << "output, shared_kv " << shared_kv;
    EXPECT_TRUE(torch::equal(outs[1], outs[3])) << "gradient, shared_kv " << shared_kv;
  }
}

// Query rows whose output gradient is zero (MoH's gated-off heads) are skipped in the backward: their dq rows are
// zero, and every other value is the one the kernel gives for the remaining query rows alone, bit for bit (the same
// rows in the same order), within fp32 rounding of the fp64 reference. In fp32 and bf16, with a row count that
// leaves the skip's gathered blocks part-filled.
TEST(AttentionCpu, RowsWithoutGradientAreSkippedExactly) {
  torch::manual_seed(25);
  const Shape s{{2, 3}, 45, 50, 16};
  for (const auto type : {torch::kFloat, torch::kBFloat16}) {
    const torch::Tensor q = (torch::randn(dims(s, s.n)) * 2).to(type), k = torch::randn(dims(s, s.nk)).to(type),
                        v = torch::randn(dims(s, s.nk)).to(type);
    const torch::Tensor keep = torch::rand({s.n}) < 0.6;  // the same query rows in every group, as the slice below
    const torch::Tensor g = (torch::randn(dims(s, s.n)) * keep.view({-1, 1})).to(type);
    const std::vector<torch::Tensor> got = fused(q, k, v, g, 0.25);
    const torch::Tensor kept = keep.nonzero().view({-1});
    ASSERT_GT(kept.numel(), 5);
    ASSERT_LT(kept.numel(), s.n - 5);
    const std::vector<torch::Tensor> alone = fused(q.index_select(2, kept), k, v, g.index_select(2, kept), 0.25);
    EXPECT_TRUE(torch::equal(got[0].index_select(2, kept), alone[0]));
    EXPECT_TRUE(torch::equal(got[1].index_select(2, kept), alone[1]));
    EXPECT_TRUE(torch::equal(got[2], alone[2]));
    EXPECT_TRUE(torch::equal(got[3], alone[3]));
    EXPECT_TRUE((got[1].index_select(2, (~keep).nonzero().view({-1})) == 0).all().item<bool>());
    const double eps = std::numeric_limits<float>::epsilon();
    if (type == torch::kFloat)
      expect_close(got, reference(q, k, v, g, 0.25), 0.0, 4.0 * (s.d + s.nk) * eps, "fp32 with skipped rows");
  }
}

// The loops' blocks of 4, 6 or 8 query rows (by the instruction set; each forced here, on any CPU) give the same
// outputs and gradients bit for bit, in each instruction set's variant, at row counts that leave each kind of
// remainder (none, a block of 4, 4 and single rows, single rows; tiles of the backward part-filled) and with rows
// whose gradient is zero skipped.
TEST(AttentionCpu, BlocksOfFourSixAndEightRowsAgreeBitForBit) {
  struct Restore {
    ~Restore() { attention_kernels::set_block_rows(0); }
  } restore;
  torch::manual_seed(27);
  for (const auto type : {torch::kFloat, torch::kBFloat16})
    for (const int64_t n : {64, 196, 199, 203}) {
      const Shape s{{2, 2}, n, 196, 16};
      const torch::Tensor q = (torch::randn(dims(s, s.n)) * 2).to(type), k = torch::randn(dims(s, s.nk)).to(type),
                          v = torch::randn(dims(s, s.nk)).to(type);
      const torch::Tensor keep = torch::rand({s.n}) < 0.7;
      const torch::Tensor g = (torch::randn(dims(s, s.n)) * keep.view({-1, 1})).to(type);
      for_each_isa([&] {
        attention_kernels::set_block_rows(4);
        const std::vector<torch::Tensor> four = fused(q, k, v, g, 0.25);
        for (const int rows : {6, 8}) {
          attention_kernels::set_block_rows(rows);
          const std::vector<torch::Tensor> other = fused(q, k, v, g, 0.25);
          for (size_t i = 0; i < four.size(); ++i)
            EXPECT_TRUE(torch::equal(four[i], other[i]))
                << "n=" << n << " " << type << " rows " << rows << " output/gradient " << i;
        }
      });
    }
}

// Rows marked not live (MoH's pairs whose gate is 0) are not computed: their output is zero and their lse +inf, and
// every live row's output and lse are the unmasked call's, bit for bit; with the upstream gradient zero on the dead
// rows (as the gates make it), the gradients of q, k and v are the unmasked call's too. fp32 and bf16, each
// instruction set, a mask that leaves part-filled blocks.
TEST(AttentionCpu, DeadRowsAreZeroAndLiveRowsUnchanged) {
  torch::manual_seed(28);
  const Shape s{{2, 3}, 45, 50, 16};
  for (const auto type : {torch::kFloat, torch::kBFloat16}) {
    const torch::Tensor q = (torch::randn(dims(s, s.n)) * 2).to(type), k = torch::randn(dims(s, s.nk)).to(type),
                        v = torch::randn(dims(s, s.nk)).to(type);
    const torch::Tensor live = torch::rand({2, 3, s.n}) < 0.7;
    const torch::Tensor g = (torch::randn(dims(s, s.n)) * live.unsqueeze(-1)).to(type);
    for_each_isa([&] {
      const AttentionCpuResult all = attention_cpu_forward(q, k, v, 0.25),
                               some = attention_cpu_forward(q, k, v, 0.25, live);
      const torch::Tensor dead = ~live;
      EXPECT_TRUE(
          torch::equal(some.out.masked_fill(dead.unsqueeze(-1), 0), all.out.masked_fill(dead.unsqueeze(-1), 0)));
      EXPECT_TRUE((some.out.masked_select(dead.unsqueeze(-1)) == 0).all().item<bool>());
      EXPECT_TRUE(torch::equal(some.lse.masked_select(live), all.lse.masked_select(live)));
      EXPECT_TRUE(torch::isinf(some.lse.masked_select(dead)).all().item<bool>());
      auto masked = [&](torch::Tensor a, torch::Tensor b, torch::Tensor c) {
        return attention_cpu(a, b, c, 0.25, live);
      };
      auto unmasked = [&](torch::Tensor a, torch::Tensor b, torch::Tensor c) { return attention_cpu(a, b, c, 0.25); };
      const std::vector<torch::Tensor> gm = run(masked, q.clone(), k.clone(), v.clone(), g),
                                       gu = run(unmasked, q.clone(), k.clone(), v.clone(), g);
      for (size_t i = 1; i < gm.size(); ++i) EXPECT_TRUE(torch::equal(gm[i], gu[i])) << type << " gradient " << i;
    });
  }
}

TEST(AttentionCpu, TakesOnlyWhatItComputes) {
  const torch::Tensor q = torch::randn({2, 4, 8}), k = torch::randn({2, 6, 8});
  EXPECT_TRUE(attention_cpu_applies(q, k, k));
  EXPECT_FALSE(attention_cpu_applies(q, torch::randn({1, 6, 8}), torch::randn({1, 6, 8})));  // broadcast lead
  EXPECT_FALSE(attention_cpu_applies(q, k, torch::randn({2, 6, 4})));                        // v narrower
  EXPECT_FALSE(attention_cpu_applies(q.to(torch::kDouble), k, k));                           // fp64
  EXPECT_FALSE(attention_cpu_applies(torch::randn({1, 2, kMaxHeadDim + 1}), torch::randn({1, 3, kMaxHeadDim + 1}),
                                     torch::randn({1, 3, kMaxHeadDim + 1})));
  EXPECT_FALSE(attention_cpu_applies(torch::randn({2, 0, 8}), k, k));  // no queries: the plain path
}

// attend() with `fused` takes the kernel only where it was measured to pay (fp32 or bf16, heads <= 16 dims, >= 128
// keys): the same values as the plain path there, within fp32 rounding.
TEST(AttentionCpu, AttendTakesItWhereItPays) {
  torch::manual_seed(25);
  const torch::Tensor q = torch::randn({2, 2, 40, 16}), k = torch::randn({2, 2, 196, 16}),
                      v = torch::randn({2, 2, 196, 16});
  for_each_isa([&] {  // 1.13: on every instruction set; 2.x: against its flash attention where AVX2 runs the loop
    const bool here = TORCH_VERSION_MAJOR < 2 || simd::isa() == simd::Isa::avx2;
    EXPECT_EQ(attention_cpu_pays(q, k, v), here);
    EXPECT_EQ(attention_cpu_pays(q.to(torch::kBFloat16), k.to(torch::kBFloat16), v.to(torch::kBFloat16)), here);
    EXPECT_FALSE(attention_cpu_pays(q, k.narrow(2, 0, 49), v.narrow(2, 0, 49)));  // 49 keys
    EXPECT_FALSE(attention_cpu_pays(q.to(torch::kBFloat16), k, v));  // mixed types: the plain path's promotion
    EXPECT_FALSE(attention_cpu_pays(torch::randn({1, 8, 64}), torch::randn({1, 196, 64}), torch::randn({1, 196, 64})));
  });
  const torch::Tensor g = torch::randn({2, 2, 40, 16});
  auto via_attend = [](torch::Tensor a, torch::Tensor b, torch::Tensor c) { return attend(a, b, c, 0.25, {}, true); };
  const double eps = std::numeric_limits<float>::epsilon();
  expect_close(run(via_attend, q.clone(), k.clone(), v.clone(), g), reference(q, k, v, g, 0.25), 0.0,
               4.0 * (16 + 196) * eps, "attend");
}

}  // namespace
}  // namespace moh::nn
