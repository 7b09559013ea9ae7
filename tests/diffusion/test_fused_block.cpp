// The fused DiT / MoH-DiT block (model.fused) against the official op sequence on the same weights: one forward and
// backward of the whole network, 100 training steps through the training loop, and the weights' working copies
// (no per-step casts) against autocast's own casts, bit for bit.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/platform/amp.h"
#include "core/train/optimizer.h"
#include "core/train/working_copies.h"
#include "datasets/fashion_mnist.h"
#include "diffusion/diffusion_trainer.h"
#include "experiments/experiment_config.h"
#include "experiments/train_tasks.h"
#include "tests/diffusion/tiny_dit.h"
#include "tests/test_util.h"
#include "vision/nn/fused_ops.h"

namespace moh::diffusion {
namespace {

using test::rel_err;

// Output, load-balance loss and every parameter's gradient of one training-mode forward / backward.
std::vector<torch::Tensor> forward_backward(DiT& m, FusedMode fused, const torch::Tensor& x, const torch::Tensor& t,
                                            const torch::Tensor& y) {
  m->set_fused_ops(fused);
  m->zero_grad();
  torch::manual_seed(3);  // the label dropout draws the same
  const DiTOutput o = m->forward(x, t, y);
  torch::manual_seed(4);
  ((o.out * torch::randn_like(o.out)).sum() + 0.5 * o.aux_loss).backward();
  std::vector<torch::Tensor> r{o.out.detach().clone(), o.aux_loss.detach().clone()};
  for (const auto& p : m->parameters())
    if (p.grad().defined()) r.push_back(p.grad().clone());
  return r;
}

TEST(FusedBlock, WholeNetworkEqualsTheOfficialSequence) {
  for (const bool moh : {true, false}) {
    DiT m = tiny_dit(3, moh);
    m->train();
    m->to(test::device());
    const auto dev = torch::TensorOptions().device(test::device());
    torch::manual_seed(2);
    const torch::Tensor x = torch::randn({5, 3, 8, 8}, dev), t = torch::randint(0, 1000, {5}, dev.dtype(torch::kLong));
    const torch::Tensor y = torch::randint(0, 10, {5}, dev.dtype(torch::kLong));
    if (!moh) {  // no routing: no load-balance term
      m->set_fused_ops(FusedMode::off);
      ASSERT_FALSE(m->forward(x, t, y).aux_loss.defined());
      continue;
    }
    const auto plain = forward_backward(m, FusedMode::off, x, t, y),
               fused = forward_backward(m, FusedMode::on, x, t, y);
    ASSERT_EQ(plain.size(), fused.size());
    // Two blocks of fused ops, each within a few fp32 ulps of the official one (tests/vision/nn/test_fused.cpp),
    // and the products between them: the network's results within 5e-6 of their largest value.
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_LE(rel_err(fused[i], plain[i]), 5e-6) << "tensor " << i << " (output, aux, then gradients)";
  }
}

// Losses of the metrics lines of a run directory, in order.
std::vector<double> logged_losses(const std::string& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

std::vector<double> train_losses(const test::TempDir& d, const std::string& precision, const std::string& fused,
                                 int64_t examples) {
  const std::string name = precision + "_" + fused;
  experiments::ExperimentConfig cfg = experiments::load_experiment(d.write(name + ".yaml",
                                                                           R"(
model: {name: MoH-DiT-Pixel/4-75, num_classes: 10, fused: )" + fused + R"(}
data: {batch_size: 8, limit_train: )" + std::to_string(examples) + R"(}
optim: {lr: 3.0e-4, weight_decay: 0.0, clip_grad: 1.0}
schedule: {kind: constant, warmup_epochs: 0}
train: {epochs: 4, ema_decay: 0.0, log_every_steps: 1, seed: 7, precision: )" + precision +
                                                                               ", " + test::train_device_keys() +
                                                                               "}\n"));
  experiments::train_experiment(cfg, {d.file(name), ""});
  return logged_losses(d.file(name));
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

// fp32: 100 steps (4 epochs of 25) whose losses stay within 1e-6 of each other: the two paths differ by rounding
// only, and fp32 rounding does not grow into the losses over a run this short.
TEST(FusedBlock, Fp32TrainingWithFusedOnEqualsOffOver100Steps) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  const std::vector<double> off = train_losses(d, "fp32", "off", 200), on = train_losses(d, "fp32", "on", 200);
  ASSERT_EQ(off.size(), 100u);
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < off.size(); ++i) EXPECT_LE(std::abs(on[i] - off[i]), 1e-6 * std::abs(off[i])) << "step " << i;
}

// bf16 (autocast, the weights' working copies): the paths round intermediate tensors differently, and bf16 rounding
// differences grow from step to step as any two bf16 runs' do (measured on the CPU: 1e-6 of the loss over the first
// 10 steps, up to 1 % at single steps near step 80, the means of 20-step windows within 1e-3). Checked: the first
// steps within bf16's rounding of the loss (2^-8) and every 20-step window's mean within it. On the CPU 40 steps
// (bf16 autocast is slow there), on a GPU (MOH_TEST_DEVICE=cuda) 100.
TEST(FusedBlock, Bf16TrainingWithFusedOnFollowsOff) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  const int64_t examples = test::device().is_cuda() ? 200 : 80;  // 4 epochs of batch 8
  const std::vector<double> off = train_losses(d, "bf16", "off", examples),
                            on = train_losses(d, "bf16", "on", examples);
  ASSERT_EQ(off.size(), static_cast<size_t>(examples / 2));
  ASSERT_EQ(on.size(), off.size());
  constexpr double kBf16 = 1.0 / 256;
  for (size_t i = 0; i < 10; ++i) EXPECT_LE(std::abs(on[i] - off[i]), kBf16 * std::abs(off[i])) << "step " << i;
  for (size_t w = 0; w + 20 <= off.size(); w += 20)
    EXPECT_LE(std::abs(mean(on, w, w + 20) - mean(off, w, w + 20)), kBf16 * mean(off, w, w + 20)) << "steps " << w;
}

// Three bf16 autocast steps of AdamW with and without working copies: the same weights, bit for bit.
TEST(WorkingCopies, StepsEqualAutocastsOwnCastsBitForBit) {
  const RunContext ctx = RunContext::create(test::device_name(), Precision::bf16, 0);
  const auto run = [&](bool copies) {
    DiT m = tiny_dit(3, /*moh=*/true);
    m->train();
    m->to(ctx.device);
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
    std::unique_ptr<WorkingCopies> wc;
    if (copies) wc = std::make_unique<WorkingCopies>(m->parameters(), at::kBFloat16);
    GradScaler scaler(Precision::bf16);
    const GaussianDiffusion chain = GaussianDiffusion::base(1000);
    const auto dev = torch::TensorOptions().device(ctx.device);
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(10 + step);
      const torch::Tensor x0 = torch::randn({4, 3, 8, 8}, dev);
      const torch::Tensor y = torch::randint(0, 10, {4}, dev.dtype(torch::kLong));
      {
        const WorkingCopyScope scope(wc.get());
        diffusion_backward(m, chain, x0, y, 0.01, ctx, scaler);
      }
      finish_optimizer_step(opt, m->parameters(), scaler, 0.0, OptimImpl::for_loop);
      if (wc) wc->refresh();
    }
    std::vector<torch::Tensor> w;
    for (const auto& p : m->parameters()) w.push_back(p.detach().clone());
    return w;
  };
  const auto a = run(false), b = run(true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  // The weights moved (the steps did something for the copies to follow).
  EXPECT_FALSE(torch::equal(a.back(), tiny_dit(3, true)->parameters().back().to(ctx.device)));
}

TEST(WorkingCopies, AStaleCopyIsNeverRead) {
  const torch::Tensor w = torch::randn({4, 4}).requires_grad_(true);
  WorkingCopies wc({w}, at::kBFloat16);
  EXPECT_TRUE(wc.get(w).defined());
  {
    torch::NoGradGuard ng;
    w.add_(1.0);  // changed without a refresh: the copy is stale
  }
  EXPECT_FALSE(wc.get(w).defined());
  wc.refresh();
  ASSERT_TRUE(wc.get(w).defined());
  EXPECT_TRUE(torch::equal(wc.get(w), w.detach().to(at::kBFloat16)));
  // Read only under autocast in the copy's type.
  const WorkingCopyScope scope(&wc);
  EXPECT_EQ(working_weight(w).scalar_type(), at::kFloat);
  AutocastScope autocast(RunContext::create("cpu", Precision::bf16, 0));
  EXPECT_EQ(working_weight(w).scalar_type(), at::kBFloat16);
}

}  // namespace
}  // namespace moh::diffusion
