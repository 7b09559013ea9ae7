// Activation checkpointing (core/train/activation_checkpoint.h, train.grad_checkpoint: blocks): the gradients of a
// checkpointed MoH-DiT and MoH-ViT equal a plain run's bit for bit in fp32 on the CPU (and under bf16 autocast),
// random draws inside blocks (drop path) are replayed, the random stream after the step is the plain run's, and the
// head load is counted once per step, not once more in the recomputation.
#include "core/platform/amp.h"
#include "core/train/activation_checkpoint.h"
#include "tests/diffusion/tiny_dit.h"
#include "tests/test_util.h"
#include "vision/nn/head_surgery.h"
#include "vision/transnext.h"

namespace moh {
namespace {

using Grads = std::vector<std::pair<std::string, at::Tensor>>;

Grads grads_of(torch::nn::Module& m) {
  Grads g;
  for (const auto& p : m.named_parameters())
    if (p.value().grad().defined()) g.emplace_back(p.key(), p.value().grad().clone());
  return g;
}

void expect_equal(const Grads& a, const Grads& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second))
        << a[i].first << ": max diff " << (a[i].second - b[i].second).abs().max().item<double>();
  }
}

struct StepResult {
  Grads grads;
  std::vector<at::Tensor> load;
  at::Tensor next_draw;  // the random stream right after the step
};

StepResult dit_step(bool checkpoint, Precision precision) {
  diffusion::DiT m = diffusion::tiny_dit(4, /*moh=*/true);
  m->options.grad_checkpoint = checkpoint;
  m->train();
  torch::manual_seed(3);
  const at::Tensor x = at::randn({3, 4, 8, 8}), t = at::randint(0, 1000, {3}), y = at::randint(0, 10, {3});
  RunContext ctx;
  ctx.precision = precision;
  diffusion::DiTOutput out;
  {
    AutocastScope ac(ctx);
    out = m->forward(x, t, y);  // class dropout draws from the global generator
  }
  (out.out.to(at::kFloat).pow(2).mean() + 0.01 * out.aux_loss.to(at::kFloat)).backward();
  return {grads_of(*m), nn::take_training_load(*m), at::randn({4})};
}

TEST(GradCheckpoint, DiTGradientsEqualThePlainRunBitForBit) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(p == Precision::fp32 ? "fp32" : "bf16 autocast");
    const StepResult plain = dit_step(false, p), ckpt = dit_step(true, p);
    ASSERT_GT(plain.grads.size(), 10u);
    expect_equal(ckpt.grads, plain.grads);
    ASSERT_EQ(ckpt.load.size(), plain.load.size());
    for (size_t i = 0; i < plain.load.size(); ++i) EXPECT_TRUE(torch::equal(ckpt.load[i], plain.load[i])) << i;
    EXPECT_TRUE(torch::equal(ckpt.next_draw, plain.next_draw));
  }
}

StepResult vit_step(bool checkpoint) {
  vision::TransNeXtOptions o = vision::classifier_options("MoH-ViT-Nano");
  o.img_size = 32;
  o.num_classes = 10;
  o.drop_path_rate = 0.3;  // random draws inside every block: the recomputation must replay them
  o.grad_checkpoint = checkpoint;
  torch::manual_seed(1);
  vision::TransNeXt m(o);
  m->train();
  torch::manual_seed(4);
  const at::Tensor x = at::randn({2, o.in_chans, 32, 32});
  const vision::ClassifierOutput out = m->forward(x);
  (out.logits.pow(2).mean() + 0.01 * out.aux_loss).backward();
  return {grads_of(*m), nn::take_training_load(*m), at::randn({4})};
}

TEST(GradCheckpoint, TransNeXtWithDropPathEqualsThePlainRunBitForBit) {
  const StepResult plain = vit_step(false), ckpt = vit_step(true);
  expect_equal(ckpt.grads, plain.grads);
  ASSERT_FALSE(plain.load.empty());
  for (size_t i = 0; i < plain.load.size(); ++i) EXPECT_TRUE(torch::equal(ckpt.load[i], plain.load[i])) << i;
  EXPECT_TRUE(torch::equal(ckpt.next_draw, plain.next_draw));
}

// The recomputation really happens in the backward pass (and the test can tell): a function that counts its calls
// runs twice with grad mode on, once without, and sees recomputing() only the second time.
TEST(GradCheckpoint, RecomputesInTheBackwardPassOnly) {
  int calls = 0, recomputed = 0;
  const TensorFn fn = [&](const std::vector<at::Tensor>& in) {
    ++calls;
    recomputed += recomputing() ? 1 : 0;
    return std::vector<at::Tensor>{(in[0] * in[0]).sin()};
  };
  const at::Tensor a = torch::randn({5}, torch::requires_grad());
  at::Tensor out = checkpointed(fn, {a})[0];
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.grad_fn() == nullptr);
  out.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(recomputed, 1);
  EXPECT_TRUE(at::allclose(a.grad(), 2 * a.detach() * (a.detach() * a.detach()).cos()));
  {
    at::NoGradGuard ng;
    checkpointed(fn, {a});
  }
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace moh
