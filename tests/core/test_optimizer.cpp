// AdamW, gradient clipping and the EMA over many tensors (core/train/optimizer.h, core/train/ema.h): the multi-tensor
// (foreach) and fused implementations against LibTorch's own per-tensor torch::optim::AdamW and clip_grad_norm_ (the
// reference), on the device of MOH_TEST_DEVICE. On the CPU foreach runs the reference's ops tensor by tensor, so the
// results are bit for bit the same; on CUDA the multi-tensor kernels may round differently (within fp32 rounding).
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "core/error.h"
#include "core/train/checkpoint.h"
#include "core/train/ema.h"
#include "core/train/optimizer.h"
#include "tests/test_util.h"

namespace moh {
namespace {

// Five parameters of assorted shapes (a matrix, vectors, a 3-d tensor, a scalar-like one) on the test device.
std::vector<at::Tensor> make_params(const torch::Device& dev) {
  at::Generator g = at::detail::createCPUGenerator(21);
  std::vector<at::Tensor> ps;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{64, 33}, {33}, {7, 5, 3}, {1}, {128}})
    ps.push_back(at::randn(shape, g).to(dev).set_requires_grad(true));
  return ps;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

// Two groups as the training loop builds them: the first three decayed, the rest with weight_decay 0.
torch::optim::AdamW make_adamw(const std::vector<at::Tensor>& ps) {
  const auto base = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.05);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>(ps.begin(), ps.begin() + 3),
                      std::make_unique<torch::optim::AdamWOptions>(base));
  groups.emplace_back(std::vector<at::Tensor>(ps.begin() + 3, ps.end()),
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0)));
  return torch::optim::AdamW(std::move(groups), base);
}

// Step `step` of a short run: the learning rate moves every step (as a schedule does), the gradients are drawn from
// a fixed generator, and parameter 3 has no gradient at step 2 (its state falls one step behind the others').
void set_step(torch::optim::AdamW& opt, std::vector<at::Tensor>& ps, int step) {
  for (auto& g : opt.param_groups())
    static_cast<torch::optim::AdamWOptions&>(g.options()).lr(1e-2 * (1.0 - 0.1 * step));
  at::Generator gen = at::detail::createCPUGenerator(100 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < ps.size(); ++i) {
    const at::Tensor g = at::randn(ps[i].sizes(), gen).to(ps[i].device());
    ps[i].mutable_grad() = (i == 3 && step == 2) ? at::Tensor() : g;
  }
}

int64_t state_step(torch::optim::AdamW& opt, const at::Tensor& p) {
  auto& state = opt.state();
  return static_cast<torch::optim::AdamWParamState&>(*state.at(optimizer_state_key(state, p))).step();
}

// Equal bit for bit on the CPU, within fp32 rounding elsewhere (or `tol` for an implementation that rounds otherwise).
void expect_same(const at::Tensor& got, const at::Tensor& want, bool exact, double tol, const std::string& what) {
  if (exact)
    EXPECT_TRUE(torch::equal(got, want)) << what << ": max diff " << (got - want).abs().max().item<double>();
  else
    EXPECT_LE(test::rel_err(got.to(at::kDouble), want.to(at::kDouble)), tol) << what;
}

void check_adamw(OptimImpl impl, bool exact, double tol) {
  const torch::Device dev = test::device();
  std::vector<at::Tensor> ref = make_params(dev), got = clones(ref);
  const std::vector<at::Tensor> start = clones(ref);
  torch::optim::AdamW ref_opt = make_adamw(ref), got_opt = make_adamw(got);
  for (int step = 0; step < 6; ++step) {
    set_step(ref_opt, ref, step);
    set_step(got_opt, got, step);
    adamw_step(ref_opt, OptimImpl::for_loop);
    adamw_step(got_opt, impl);
  }
  auto& rs = ref_opt.state();
  auto& gs = got_opt.state();
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::string name = config::to_string(impl) + " param " + std::to_string(i);
    EXPECT_FALSE(torch::equal(got[i], start[i])) << name << " did not move";
    expect_same(got[i], ref[i], exact, tol, name);
    auto& r = static_cast<torch::optim::AdamWParamState&>(*rs.at(optimizer_state_key(rs, ref[i])));
    auto& g = static_cast<torch::optim::AdamWParamState&>(*gs.at(optimizer_state_key(gs, got[i])));
    EXPECT_EQ(g.step(), r.step()) << name;
    expect_same(g.exp_avg(), r.exp_avg(), exact, tol, name + " exp_avg");
    expect_same(g.exp_avg_sq(), r.exp_avg_sq(), exact, tol, name + " exp_avg_sq");
  }
  EXPECT_EQ(state_step(got_opt, got[3]), 5);  // the parameter without a gradient at step 2 is one step behind
  EXPECT_EQ(state_step(got_opt, got[0]), 6);
}

TEST(Optimizer, ForeachAdamWEqualsLibTorchAdamW) {
  check_adamw(OptimImpl::foreach, test::device().is_cpu(), test::tolerance(at::kFloat));
}

TEST(Optimizer, FusedAdamWEqualsLibTorchAdamWWithinFp32Rounding) {
  if (!fused_adamw_available(test::device())) GTEST_SKIP() << "no _fused_adamw_ in this LibTorch for this device";
  check_adamw(OptimImpl::fused, false, test::tolerance(at::kFloat));
}

TEST(Optimizer, AutoResolvesByDeviceAndBuild) {
  EXPECT_EQ(resolve_optim_impl(OptimImpl::automatic, torch::Device("cpu")), OptimImpl::foreach);
  EXPECT_EQ(resolve_optim_impl(OptimImpl::for_loop, torch::Device("cpu")), OptimImpl::for_loop);
  EXPECT_EQ(resolve_optim_impl(OptimImpl::automatic, torch::Device("cuda:0")),
            fused_adamw_available(torch::Device("cuda:0")) ? OptimImpl::fused : OptimImpl::foreach);
  if (!fused_adamw_available(torch::Device("cpu"))) {
    EXPECT_THROW(resolve_optim_impl(OptimImpl::fused, torch::Device("cpu")), UserError);
  }
}

// The device-side clip equals LibTorch's clip_grad_norm_ when it clips and when it does not.
TEST(Optimizer, ClipGradNormOnTheDeviceEqualsLibTorch) {
  const torch::Device dev = test::device();
  for (double max_norm : {0.5, 1e4}) {
    std::vector<at::Tensor> ref = make_params(dev), got = clones(ref);
    at::Generator gen = at::detail::createCPUGenerator(5);
    for (size_t i = 0; i < ref.size(); ++i) {
      const at::Tensor g = at::randn(ref[i].sizes(), gen).to(dev);
      ref[i].mutable_grad() = g.clone();
      got[i].mutable_grad() = g.clone();
    }
    const at::Tensor before = got[0].grad().clone();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref, max_norm);
    const at::Tensor norm = clip_grad_norm(got, max_norm, OptimImpl::foreach);
    EXPECT_EQ(norm.device(), dev);
    EXPECT_NEAR(norm.item<double>(), ref_norm, 1e-5 * ref_norm);
    EXPECT_EQ(torch::equal(got[0].grad(), before), max_norm > 100) << "clipped only when the norm exceeds it";
    for (size_t i = 0; i < ref.size(); ++i)
      expect_same(got[i].grad(), ref[i].grad(), dev.is_cpu(), test::tolerance(at::kFloat), "grad " + std::to_string(i));
  }
}

TEST(Optimizer, ForeachEmaEqualsThePerTensorEma) {
  const torch::Device dev = test::device();
  torch::manual_seed(8);
  torch::nn::Linear model(16, 8), a(16, 8), b(16, 8);
  model->to(dev), a->to(dev), b->to(dev);
  {
    torch::NoGradGuard ng;
    b->weight.copy_(a->weight), b->bias.copy_(a->bias);
  }
  ModelEma ref(a.ptr(), 0.99, /*warmup=*/true, OptimImpl::for_loop), got(b.ptr(), 0.99, true, OptimImpl::foreach);
  const at::Tensor w0 = a->weight.detach().clone();
  for (int64_t step = 0; step < 4; ++step) {
    {
      torch::NoGradGuard ng;
      model->weight.add_(0.1), model->bias.sub_(0.05);
    }
    ref.update(*model, step);
    got.update(*model, step);
  }
  EXPECT_FALSE(torch::equal(a->weight, w0));
  expect_same(b->weight, a->weight, dev.is_cpu(), test::tolerance(at::kFloat), "ema weight");
  expect_same(b->bias, a->bias, dev.is_cpu(), test::tolerance(at::kFloat), "ema bias");
}

// The state stays LibTorch's: a checkpoint's optimizer tensors taken under foreach resume under for_loop (and the
// other way round) exactly as an uninterrupted run continues.
TEST(Optimizer, StateResumesAcrossImplementations) {
  const torch::Device dev = test::device();
  auto net = [&] {
    torch::manual_seed(9);
    torch::nn::Sequential s(torch::nn::Linear(6, 5), torch::nn::Linear(5, 3));
    s->to(dev);
    return s;
  };
  auto train = [&](torch::nn::Sequential& s, torch::optim::AdamW& opt, OptimImpl impl, int from, int to) {
    for (int step = from; step < to; ++step) {
      opt.zero_grad();
      at::Generator gen = at::detail::createCPUGenerator(40 + static_cast<uint64_t>(step));
      s->forward(at::randn({4, 6}, gen).to(dev)).pow(2).sum().backward();
      clip_grad_norm(s->parameters(), 0.5, impl);
      adamw_step(opt, impl);
    }
  };
  torch::nn::Sequential full = net(), split = net();
  torch::optim::AdamW full_opt(full->parameters(), torch::optim::AdamWOptions(1e-2));
  train(full, full_opt, OptimImpl::foreach, 0, 6);
  {
    torch::optim::AdamW opt(split->parameters(), torch::optim::AdamWOptions(1e-2));
    train(split, opt, OptimImpl::foreach, 0, 3);
    const TensorMap saved = optimizer_tensors(opt, *split);
    torch::optim::AdamW resumed(split->parameters(), torch::optim::AdamWOptions(1e-2));
    load_optimizer_tensors(resumed, *split, saved, "test");
    train(split, resumed, OptimImpl::for_loop, 3, 6);
  }
  const auto a = full->named_parameters(), b = split->named_parameters();
  for (const auto& p : a) expect_same(b[p.key()], p.value(), dev.is_cpu(), test::tolerance(at::kFloat), p.key());
}

}  // namespace
}  // namespace moh
