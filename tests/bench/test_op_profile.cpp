// Where a training step's time goes (bench/op_profile.h): op classes from scopes, names and autograd sequence
// numbers, on a hand-made event list with known answers and on a recorded step of a small MoH-DiT.
#include <torch/optim/adamw.h>

#include "bench/common.h"
#include "bench/op_profile.h"
#include "core/platform/blas_core.h"
#include "core/platform/run_context.h"
#include "core/train/ema.h"
#include "core/train/optimizer.h"
#include "tests/diffusion/tiny_dit.h"
#include "tests/test_util.h"
#include "vision/nn/attention_cpu.h"

namespace moh::bench {
namespace {

ProfileEvent op(const std::string& name, uint64_t thread, int64_t start_ms, int64_t end_ms, int64_t seq, int64_t parent,
                bool backward = false) {
  ProfileEvent e;
  e.name = name, e.thread = thread, e.seq = seq, e.parent = parent, e.backward = backward;
  e.start_ns = start_ms * 1000000, e.end_ns = end_ms * 1000000;
  return e;
}

ProfileEvent kernel(const std::string& name, int64_t start_ms, int64_t end_ms, int64_t launched_by) {
  ProfileEvent e = op(name, 0, start_ms, end_ms, -1, -1);
  e.kernel = true, e.launched_by = launched_by;
  return e;
}

// A router product in the forward pass (seq 5) and its backward on the autograd thread, an add outside any scope.
std::vector<ProfileEvent> host_events() {
  return {op("moh::router", 1, 0, 100, -1, -1),
          op("aten::linear", 1, 10, 50, 5, 0),
          op("aten::mm", 1, 20, 40, 5, 1),
          op("aten::add", 1, 110, 150, 6, -1),
          op("MmBackward0", 2, 200, 300, 5, -1, true),
          op("aten::mm", 2, 210, 290, -1, 4)};
}

TEST(OpProfile, HostSelfTimeByClassFollowsScopesIntoTheBackward) {
  const ClassProfile p = classify_profile(host_events());
  EXPECT_FALSE(p.device);
  EXPECT_DOUBLE_EQ(p.ms.at("router"), 60 + 20 + 20 + 20 + 80);  // self times: forward in the scope, its backward
  EXPECT_DOUBLE_EQ(p.ms.at("elementwise"), 40);
  EXPECT_EQ(p.ms.count("gemm"), 0u);
  EXPECT_EQ(p.ops.front().name, "aten::mm");  // 20 + 80 ms
  EXPECT_DOUBLE_EQ(p.ops.front().self_ms, 100);
}

TEST(OpProfile, DeviceTimeByLaunchingOperatorKernelNameAndIdleGaps) {
  std::vector<ProfileEvent> ev = host_events();
  ev.push_back(kernel("sm90_xmma_gemm_bf16", 1000, 1100, 2));  // the router's forward product
  ev.push_back(kernel("vectorized_elementwise_kernel", 1150, 1200, 3));
  ev.push_back(kernel("ampere_sgemm_128x64", 1200, 1300, 5));  // the router's backward product
  ev.push_back(kernel("nvjet_tst_128x256", 1300, 1350, -1));   // launched from outside any recorded operator
  ev.push_back(kernel("multi_tensor_apply_kernel", 1360, 1370, -1));
  const ClassProfile p = classify_profile(ev);
  EXPECT_TRUE(p.device);
  EXPECT_DOUBLE_EQ(p.ms.at("router"), 200);
  EXPECT_DOUBLE_EQ(p.ms.at("elementwise"), 50);
  EXPECT_DOUBLE_EQ(p.ms.at("gemm"), 50);
  EXPECT_DOUBLE_EQ(p.ms.at("optimizer"), 10);
  EXPECT_DOUBLE_EQ(p.span_ms, 370);
  EXPECT_DOUBLE_EQ(p.busy_ms, 310);
  EXPECT_DOUBLE_EQ(p.ms.at("idle"), 60);  // 1100-1150 and 1350-1360
  // Without the sequence number the backward product is a plain product: the scope really comes from it.
  ev[4].seq = -1;
  EXPECT_DOUBLE_EQ(classify_profile(ev).ms.at("router"), 100);
  EXPECT_DOUBLE_EQ(classify_profile(ev).ms.at("gemm"), 150);
}

// A recorded training step of a small MoH-DiT on the CPU: every class the step has shows up, and the classes add up
// to the operators' self time.
TEST(OpProfile, RecordedMoHDiTStepHasEveryClass) {
  diffusion::DiT model = diffusion::tiny_dit(4, /*moh=*/true), ema_copy = diffusion::tiny_dit(4, true);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  ModelEma ema(ema_copy.ptr(), 0.999, false, OptimImpl::foreach);
  const at::Tensor x = at::randn({2, 4, 8, 8}), t = at::randint(0, 1000, {2}), y = at::randint(0, 10, {2});
  StepProfiler prof(/*cuda=*/false);
  prof.start();
  const diffusion::DiTOutput out = model->forward(x, t, y);
  (out.out.pow(2).mean() + 0.01 * out.aux_loss).backward();
  clip_grad_norm(model->parameters(), 1.0, OptimImpl::foreach);
  adamw_step(opt, OptimImpl::foreach);
  ema.update(*model, 0);
  const std::vector<ProfileEvent> events = prof.stop();
  ASSERT_FALSE(events.empty());
  const ClassProfile p = classify_profile(events);
  for (const char* c : {"gemm", "attention", "router", "optimizer", "ema", "elementwise"})
    EXPECT_GT(p.ms.count(c) ? p.ms.at(c) : 0.0, 0.0) << c;
  double classes = 0, ops = 0;
  for (const auto& [k, v] : p.ms) classes += v;
  for (const auto& r : p.ops) ops += r.self_ms;
  EXPECT_NEAR(classes, ops, 1e-6 * ops);
}

// The attention core's FLOPs are the model's products whichever path runs it: the plain path's four batched products
// forward and backward (QKᵀ, AV; dP, dV, dS·K, dSᵀ·Q), the toolkit's CPU loops (vision/nn/attention_cpu.h) and, on
// LibTorch 2.x, its fused kernel, each 4·B·H·N·M·d forward and twice that backward (a recomputed QKᵀ is not counted).
TEST(FlopCounter, CountsTheAttentionCoreAlikeOnEveryPath) {
  const int64_t B = 2, H = 3, N = 20, M = 24, d = 16;
  const double fwd = 4.0 * B * H * N * M * d;
  const torch::Tensor q0 = torch::randn({B, H, N, d}), k0 = torch::randn({B, H, M, d}), v0 = torch::randn({B, H, M, d});
  auto counted = [&](const std::function<torch::Tensor(torch::Tensor, torch::Tensor, torch::Tensor)>& core) {
    const torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
                        v = v0.clone().requires_grad_(true);
    const FlopCounter count;
    const torch::Tensor o = core(q, k, v);
    const double forward = count.flops();
    torch::autograd::grad({o}, {q, k, v}, {torch::ones_like(o)});
    return std::make_pair(forward, count.flops() - forward);
  };
  const auto plain = counted([](torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    return torch::matmul(torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * 0.25, -1), v);
  });
  EXPECT_DOUBLE_EQ(plain.first, fwd);
  EXPECT_DOUBLE_EQ(plain.second, 2 * fwd);
  const auto own =
      counted([](torch::Tensor q, torch::Tensor k, torch::Tensor v) { return nn::attention_cpu(q, k, v, 0.25); });
  EXPECT_DOUBLE_EQ(own.first, fwd);
  EXPECT_DOUBLE_EQ(own.second, 2 * fwd);
#if TORCH_VERSION_MAJOR >= 2
  const auto fused = counted([](torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, 0.25);
  });
  EXPECT_DOUBLE_EQ(fused.first, fwd);
  EXPECT_DOUBLE_EQ(fused.second, 2 * fwd);
#endif
}

// Every benchmark row names the BLAS kernel it ran on (an OpenBLAS fallback costs 2-6x: docs/BENCHMARKS.md).
TEST(BenchRecord, NamesTheCpuTheBlasAndItsKernel) {
  const nlohmann::json m = machine_record();
  EXPECT_EQ(m.at("cpu"), cpu_model_name());
  EXPECT_EQ(m.at("commit"), toolkit_commit());
  const std::string blas = m.at("blas"), core = blas_core().used;
  EXPECT_EQ(blas.rfind(detect_blas().name, 0), 0u) << blas;
  if (!core.empty()) {
    EXPECT_EQ(blas, "OpenBLAS (" + core + ")");
  }
}

}  // namespace
}  // namespace moh::bench
