// Gaussian diffusion tensor math (losses, posterior, learned-range variance), classifier-free guidance as DiT's
// forward_with_cfg, DDPM/DDIM sampling determinism, and the diffusion trainer's exact resume.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/platform/amp.h"
#include "core/train/checkpoint.h"
#include "datasets/fashion_mnist.h"
#include "datasets/npz.h"
#include "diffusion/autoencoder_kl.h"
#include "diffusion/cuda_graph.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/gaussian_diffusion.h"
#include "diffusion/objective.h"
#include "diffusion/sample_set.h"
#include "diffusion/sampler.h"
#include "experiments/dit_experiment.h"
#include "experiments/registry.h"
#include "tests/diffusion/tiny_dit.h"
#include "tests/test_util.h"

namespace moh::diffusion {
namespace {

TEST(DiffusionMath, DiscretisedLikelihoodSumsToOneOverBins) {
  // The 256 bin probabilities of one pixel telescope to exactly 1 (edge bins take the tails).
  at::Tensor centres = (at::arange(256, at::kDouble) / 127.5 - 1.0);
  for (double mean : {-0.3, 0.0, 0.9})
    for (double log_scale : {-3.0, -1.0}) {
      at::Tensor lp =
          discretized_gaussian_log_likelihood(centres, at::full_like(centres, mean), at::full_like(centres, log_scale));
      EXPECT_NEAR(lp.exp().sum().item<double>(), 1.0, 1e-9) << mean << " " << log_scale;
    }
  // KL of a Gaussian with itself is 0 up to fp32 rounding: the official formula sums −1 + lv₂ − lv₁ + exp(lv₁ − lv₂),
  // so its residual is the rounding of (−1 + lv), at most a few ulps of 1 + |lv| (halved by the 0.5 in front).
  torch::manual_seed(11);
  at::Tensor m = torch::randn({64}), lv = torch::randn({64});
  const double bound = 2.0 * std::numeric_limits<float>::epsilon() * (1.0 + lv.abs().max().item<double>());
  EXPECT_LT(normal_kl(m, lv, m, lv).abs().max().item<double>(), bound);
  EXPECT_NEAR(normal_kl(at::zeros({1}), at::zeros({1}), at::ones({1}), at::zeros({1})).item<double>(), 0.5, 1e-7);
}

TEST(DiffusionMath, OracleEpsRecoversX0AndPosteriorIsConsistent) {
  const GaussianDiffusion d = GaussianDiffusion::base(1000);
  torch::manual_seed(1);
  at::Tensor x0 = torch::rand({4, 1, 6, 6}) * 2 - 1, noise = torch::randn({4, 1, 6, 6});
  at::Tensor t = torch::tensor({0, 10, 499, 999});
  at::Tensor xt = d.q_sample(x0.to(at::kDouble), t, noise.to(at::kDouble));
  // Model output = [true ε, v = 1] → pred_xstart = x0 and log σ² = log β_t (top of the learned range).
  at::Tensor out = at::cat({noise.to(at::kDouble), at::ones_like(xt)}, 1);
  auto p = d.p_mean_variance(out, xt, t);
  EXPECT_LT((p.pred_xstart - x0.to(at::kDouble)).abs().max().item<double>(), 1e-8);
  EXPECT_NEAR(p.log_variance[2][0][0][0].item<double>(), std::log(d.schedule().betas[499]), 1e-12);
  auto q = d.q_posterior(x0.to(at::kDouble), xt, t);
  EXPECT_LT((p.mean - q.mean).abs().max().item<double>(), 1e-8);
}

TEST(DiffusionMath, HybridLossTermsAndDetachedMean) {
  const GaussianDiffusion d = GaussianDiffusion::base(1000);
  torch::manual_seed(2);
  at::Tensor x0 = torch::rand({3, 1, 4, 4}) * 2 - 1, noise = torch::randn({3, 1, 4, 4});
  at::Tensor t = torch::tensor({0, 5, 700});
  at::Tensor xt = d.q_sample(x0, t, noise);
  at::Tensor out = torch::zeros({3, 2, 4, 4}, torch::requires_grad());
  auto l = d.training_losses(out, x0, xt, t, noise);
  // Zero output: mse = mean(ε²) per sample; loss = mse + vb; vb at t = 0 is the decoder NLL (in bits, > 0).
  EXPECT_TRUE(l.mse.allclose(noise.pow(2).mean({1, 2, 3})));
  EXPECT_TRUE(l.loss.allclose(l.mse + l.vb));
  EXPECT_GT(l.vb[0].item<double>(), 0.0);
  // The VLB reaches only the variance channels: its gradient w.r.t. the ε channels is zero.
  l.vb.sum().backward();
  EXPECT_EQ(out.grad().narrow(1, 0, 1).abs().max().item<double>(), 0.0);
  EXPECT_GT(out.grad().narrow(1, 1, 1).abs().max().item<double>(), 0.0);
}

TEST(Guidance, ThreeChannelQuirkAndAllChannels) {
  DiT m = tiny_dit(4, false);
  torch::manual_seed(3);
  at::Tensor half = torch::randn({2, 4, 8, 8});
  at::Tensor x = at::cat({half, torch::randn({2, 4, 8, 8})});  // the second half is never read
  at::Tensor t = torch::tensor({500, 500, 500, 500}), y = torch::tensor({1, 2, 10, 10});
  torch::NoGradGuard ng;
  at::Tensor both = m->forward(at::cat({half, half}), t, y).out;  // [cond; uncond]
  at::Tensor cond = both.narrow(0, 0, 2), uncond = both.narrow(0, 2, 2);
  at::Tensor g3 = forward_with_cfg(m, x, t, y, 4.0, CfgChannels::three);
  at::Tensor expect = uncond.narrow(1, 0, 3) + 4.0 * (cond.narrow(1, 0, 3) - uncond.narrow(1, 0, 3));
  EXPECT_TRUE(g3.narrow(0, 0, 2).narrow(1, 0, 3).allclose(expect, 1e-5, 1e-6));
  EXPECT_TRUE(g3.narrow(0, 2, 2).narrow(1, 0, 3).allclose(expect, 1e-5, 1e-6));  // guided ε copied to both halves
  EXPECT_TRUE(g3.narrow(1, 3, 5).equal(both.narrow(1, 3, 5)));  // ε channel 3 and variances: not guided
  at::Tensor ga = forward_with_cfg(m, x, t, y, 4.0, CfgChannels::all);
  EXPECT_FALSE(ga.narrow(0, 0, 2).narrow(1, 3, 1).allclose(cond.narrow(1, 3, 1)));
  EXPECT_TRUE(ga.narrow(1, 4, 4).equal(both.narrow(1, 4, 4)));
  // Scale 1 equals the conditional output.
  EXPECT_TRUE(forward_with_cfg(m, x, t, y, 1.0, CfgChannels::all).narrow(0, 0, 2).allclose(cond, 1e-5, 1e-6));
}

TEST(Sampling, DdimEtaZeroIsDeterministicAndDdpmFollowsTheSeed) {
  DiT m = tiny_dit(1, true);
  const GaussianDiffusion chain = GaussianDiffusion::respaced(1000, "ddim10");
  at::Tensor noise = torch::randn({3, 1, 8, 8}), labels = torch::tensor({0, 4, 9});
  SampleOptions ddim;
  ddim.sampler = SamplerKind::ddim;
  ddim.cfg_scale = 2.0;
  ddim.cfg_channels = CfgChannels::all;
  torch::manual_seed(5);
  at::Tensor a = sample_loop(m, chain, noise, labels, ddim);
  torch::manual_seed(6);  // η = 0: the per-step noise is drawn but unused
  at::Tensor b = sample_loop(m, chain, noise, labels, ddim);
  EXPECT_TRUE(a.equal(b));
  EXPECT_EQ(a.sizes(), noise.sizes());
  EXPECT_TRUE(a.isfinite().all().item<bool>());
  SampleOptions ddpm;
  ddpm.cfg_scale = 1.0;
  int steps = 0;
  torch::manual_seed(7);
  at::Tensor c = sample_loop(m, GaussianDiffusion::respaced(1000, "5"), noise, labels, ddpm, [&] { ++steps; });
  torch::manual_seed(7);
  at::Tensor d = sample_loop(m, GaussianDiffusion::respaced(1000, "5"), noise, labels, ddpm);
  EXPECT_EQ(steps, 5);
  EXPECT_TRUE(c.equal(d));
  EXPECT_FALSE(c.equal(a));
  // DiT's three-channel guidance on 1-channel data would guide a variance channel: configs are refused by
  // validate_experiment (ExperimentUse::sample, tests/diffusion/test_experiment.cpp); the loop checks its invariant.
  ddim.cfg_channels = CfgChannels::three;
  EXPECT_THROW(sample_loop(m, chain, noise, labels, ddim), c10::Error);
  // uint8 conversion as sample_ddp: clamp(127.5·x + 128) truncated.
  at::Tensor u = to_uint8_nhwc(torch::tensor({-1.0f, 0.0f, 0.999f, 2.0f}).view({1, 1, 1, 4}));
  EXPECT_TRUE(u.flatten().equal(torch::tensor({0, 128, 255, 255}, torch::kByte)));
}

// Peak resident memory since the last reset (VmHWM; writing 5 to clear_refs resets it, Linux ≥ 4.0), in bytes;
// -1 where /proc does not allow it.
int64_t reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  return clear ? 0 : -1;
}
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// Per-batch part files, a run interrupted after some of them and resumed (in another order of ranks), and the
// streamed merge: the .npz equals the images of one uninterrupted process, in uint8.
// One record per sampler (diffusion/sampler.h): every name of the schema has exactly one, complete for its kind of
// grid, and the network evaluations its record plans are the ones the loop makes (counted as it runs, with guidance
// on half of the noise levels and a second evaluation per Heun step).
TEST(Samplers, EveryKindHasOneCompleteRecordAndPlansTheEvaluationsTheLoopMakes) {
  const auto& names = enum_table(SamplerKind{});
  ASSERT_EQ(samplers().size(), names.size());
  DiT m = tiny_dit(1, true);
  const at::Tensor labels = torch::tensor({1, 3});
  for (const auto& [kind, name] : names) {
    SCOPED_TRACE(name);
    const SamplerRecord& r = sampler_record(kind);
    EXPECT_EQ(r.kind, kind);
    EXPECT_NE(std::string(r.summary), "");
    EXPECT_TRUE(r.runs_ddpm || r.flow_chain);  // runs on some model
    if (r.grid == SamplerGrid::respaced) {
      EXPECT_TRUE(r.update && !r.make_grid && !r.chain && !r.flow_chain);
    } else if (r.runs_ddpm) {
      EXPECT_TRUE(!r.update && r.make_grid && r.chain);
    }
    for (const ObjectiveRecord& obj : objectives()) {
      const Objective objective = obj.kind;
      if (!runs_on(kind, objective)) continue;
      SCOPED_TRACE(config::to_string(objective));
      SampleOptions o;
      o.sampler = kind, o.objective = objective, o.cfg_scale = 3.0, o.cfg_channels = CfgChannels::all;
      o.cfg_interval = {0.0, 0.5}, o.ode_steps = 5;
      const GaussianDiffusion chain = sampling_chain(kind, 1000, "6");
      int64_t counted = 0, steps = 0;
      torch::manual_seed(2);
      sample_loop(
          m, chain, torch::randn({2, 1, 8, 8}), labels, o, [&] { ++steps; }, &counted);
      EXPECT_EQ(counted, r.adaptive ? counted : planned_nfe(o, chain));
      EXPECT_EQ(planned_nfe(o, chain) < 0, r.adaptive);  // an adaptive sampler's count is measured
      EXPECT_EQ(steps, sampler_steps(o, chain));
      if (!r.adaptive) {
        EXPECT_GT(counted, steps);  // the guided steps count twice
      }
    }
  }
}

// One record per training objective (diffusion/objective.h): every kind has one, its time ↔ noise level is one line
// (a DDPM model's timesteps come back exactly), it admits some sampler, and its training step logs the terms it names.
TEST(Objectives, EveryKindHasOneCompleteRecordAndItsStepLogsItsTerms) {
  const auto& names = enum_table(Objective{});
  ASSERT_EQ(objectives().size(), names.size());
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  const GradScaler scaler(Precision::fp32);
  DiffusionConfig dc;
  dc.steps = 1000;
  const TrainingProcess process(dc);
  for (const auto& [kind, name] : names) {
    SCOPED_TRACE(name);
    const ObjectiveRecord& r = objective_record(kind);
    EXPECT_EQ(r.kind, kind);
    EXPECT_EQ(std::string(r.name), name);
    EXPECT_NE(std::string(r.summary), "");
    EXPECT_TRUE(r.train_step && r.admits && r.reverse && r.planned_nfe);
    EXPECT_FALSE(samplers_for(kind).empty());
    for (double t : {0.0, 0.3, 0.999, 1.0, 250.0, 999.0}) {
      const double u = r.noise_level(t, 1000);
      EXPECT_GE(u, 0.0);
      EXPECT_LE(u, 1.0);
      EXPECT_NEAR(r.chain_timestep(t, 1000), u * 999.0, 1e-9);  // the same line, scaled to the chain
    }
    DiT m = tiny_dit(1, /*moh=*/true);
    m->train();
    torch::manual_seed(4);
    const LossTensors terms =
        r.train_step(m, process, torch::randn({2, 1, 8, 8}), torch::tensor({1, 3}), 0.01, ctx, scaler, 0, 1, {});
    std::vector<std::string> got, want(r.loss_terms.begin(), r.loss_terms.end());
    for (const auto& [term, value] : terms) got.push_back(term);
    want.push_back("aux");  // the MoH layers' load-balance term
    EXPECT_EQ(got, want);
  }
  // A DDPM model's timesteps map onto the chain exactly (the head-load buckets of every DDPM run stay as they were).
  const ObjectiveRecord& ddpm = objective_record(Objective::ddpm);
  for (int64_t t = 0; t < 1000; ++t) EXPECT_EQ(ddpm.chain_timestep(static_cast<double>(t), 1000), t);
  EXPECT_EQ(ddpm.noise_level(999, 1000), 1.0);
  EXPECT_EQ(objective_record(Objective::flow).noise_level(0.0, 1000), 1.0);  // flow time 0 = noise
  EXPECT_EQ(objective_of_sampler(SamplerKind::dopri5), Objective::flow);
  EXPECT_EQ(objective_of_sampler(SamplerKind::ddpm), Objective::ddpm);
}

TEST(SampleSet, PartsResumeAndMergeExactly) {
  test::TempDir d;
  DiT model = tiny_dit(1, true);
  const GaussianDiffusion chain = GaussianDiffusion::respaced(1000, "ddim2");
  AutoencoderKL no_vae{nullptr};
  RunContext ctx;
  SampleSetOptions o;
  o.sampling.sampler = SamplerKind::ddim;
  o.batch_size = 3;
  o.seed = 9;
  const at::Tensor labels = at::arange(10, at::kLong).remainder(10);  // 4 batches: 3, 3, 3, 1
  const std::string whole = d.file("whole"), split = d.file("split");
  sample_parts(model, chain, no_vae, labels, missing_sample_batches(10, whole, 3), o, ctx, whole);
  sample_parts(model, chain, no_vae, labels, {2, 0}, o, ctx, split);  // "killed" after two batches
  EXPECT_EQ(missing_sample_batches(10, split, 3), (std::vector<int64_t>{1, 3}));
  sample_parts(model, chain, no_vae, labels, missing_sample_batches(10, split, 3), o, ctx, split);
  std::vector<at::Tensor> seen;
  merge_sample_parts(whole, labels, 3, d.file("a.npz"), [&](int64_t first, const at::Tensor& b) {
    EXPECT_EQ(first, static_cast<int64_t>(seen.size()) * 3);
    seen.push_back(b);
  });
  merge_sample_parts(split, labels, 3, d.file("b.npz"));
  datasets::NpzReader a(d.file("a.npz")), b(d.file("b.npz"));
  const at::Tensor images = a.read("arr_0");
  EXPECT_EQ(images.sizes(), (at::IntArrayRef{10, 8, 8, 3}));
  EXPECT_EQ(images.scalar_type(), at::kByte);
  EXPECT_TRUE(torch::equal(images, b.read("arr_0")));
  EXPECT_TRUE(torch::equal(images, at::cat(seen)));
  EXPECT_TRUE(torch::equal(a.read("arr_1"), labels));
  EXPECT_TRUE(torch::equal(images.select(3, 0), images.select(3, 2)));  // grey replicated to RGB
  std::filesystem::remove(sample_part_path(split, 1));
  EXPECT_THROW(merge_sample_parts(split, labels, 3, d.file("c.npz")), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(d.file("c.npz")));
}

// sampling.precision reaches the network: tf32 is exact fp32 on a CPU, bf16 autocast changes the images a little, and
// the network's output comes back as fp32 for the sampler's arithmetic (guidance, the update) either way.
TEST(SampleSet, TheNetworkRunsInTheSamplingPrecision) {
  test::TempDir d;
  DiT model = tiny_dit(1, false);
  const GaussianDiffusion chain = GaussianDiffusion::respaced(1000, "ddim10");
  AutoencoderKL no_vae{nullptr};
  SampleSetOptions o;
  o.sampling.sampler = SamplerKind::ddim;
  o.sampling.cfg_scale = 4.0;
  o.sampling.cfg_channels = CfgChannels::all;
  o.batch_size = 8;
  const at::Tensor labels = at::arange(8, at::kLong).remainder(10);
  std::map<std::string, at::Tensor> images;
  for (const Precision p : {Precision::fp32, Precision::tf32, Precision::bf16}) {
    const std::string dir = d.file(config::to_string(p));
    sample_parts(model, chain, no_vae, labels, {0}, o, RunContext::create("cpu", p, 0), dir);
    const std::string part = sample_part_path(dir, 0);
    images[config::to_string(p)] = datasets::parse_npy(read_file(part), part).to(at::kFloat);
  }
  EXPECT_TRUE(at::equal(images["tf32"], images["fp32"]));
  const double differ = images["bf16"].ne(images["fp32"]).to(at::kFloat).mean().item<double>();
  const double mean_abs = (images["bf16"] - images["fp32"]).abs().mean().item<double>();
  EXPECT_GT(differ, 0.0) << "bf16 autocast did not reach the network";
  EXPECT_LT(mean_abs, 1.0) << "of 255 levels";
  GraphedForward eager(model, false);
  const AutocastScope bf16(RunContext::create("cpu", Precision::bf16, 0));
  const at::Tensor x = at::randn({2, 1, 8, 8}), t = at::full({2}, 500, at::kLong), y = at::zeros({2}, at::kLong);
  EXPECT_EQ(model->forward(x, t, y).out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(eager(x, t, y).scalar_type(), at::kFloat);
}

// 2,000 images of 64×64×3 (24.6 MB as uint8; an int64 copy would be 197 MB) merged from batches of 100: the merge's
// peak memory stays well below the whole set, so it holds one batch at a time and never widens it.
TEST(SampleSet, MergeHoldsOneBatchAtATime) {
  test::TempDir d;
  const std::string parts = d.file("parts");
  std::filesystem::create_directories(parts);
  for (int64_t k = 0; k < 20; ++k)
    write_file_atomic(sample_part_path(parts, k),
                      datasets::npy_bytes(at::full({100, 64, 64, 3}, static_cast<int>(k), at::kByte)));
  const at::Tensor labels = at::arange(2000, at::kLong);
  if (reset_peak_rss() < 0) GTEST_SKIP() << "no /proc/self/clear_refs";
  const int64_t before = peak_rss_bytes();
  merge_sample_parts(parts, labels, 100, d.file("s.npz"));
  const int64_t growth = peak_rss_bytes() - before;
  EXPECT_LT(growth, 12 << 20) << "peak grew by " << growth << " bytes";
  datasets::NpzReader r(d.file("s.npz"));
  auto rows = r.rows("arr_0");
  for (int64_t k = 0; k < 20; ++k)
    ASSERT_TRUE(torch::equal(rows->next(100), at::full({100, 64, 64, 3}, static_cast<int>(k), at::kByte)));
}

TEST(DiffusionTrainer, ResumeIsExactWithEma) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  experiments::ExperimentConfig cfg = experiments::load_experiment(d.write("tiny.yaml", R"(
model: {name: MoH-DiT-Pixel/4-75, num_classes: 10}
data: {batch_size: 16, limit_train: 48, hflip: true}
optim: {lr: 1.0e-3, weight_decay: 0.0, clip_grad: 0.0}
schedule: {kind: constant, warmup_epochs: 0}
train: {epochs: 2, ema_decay: 0.9, log_every_steps: 1, seed: 4, )" + test::train_device_keys() +
                                                                                            "}\n"));
  const LoopResult full = experiments::train_experiment(cfg, {d.file("full"), ""});
  EXPECT_EQ(full.steps, 6);
  experiments::ExperimentConfig first = cfg;
  first.train.max_steps = 3;  // 48 / 16 = 3 steps: stop at the end of epoch 1
  experiments::train_experiment(first, {d.file("split"), ""});
  const LoopResult resumed = experiments::train_experiment(cfg, {d.file("split"), "auto"});
  EXPECT_EQ(resumed.steps, full.steps);
  EXPECT_EQ(scalar(resumed.losses, "loss"), scalar(full.losses, "loss"));
  Checkpoint a = load_checkpoint(d.file("full")), b = load_checkpoint(d.file("split"));
  ASSERT_FALSE(a.ema.empty());
  for (const auto& [k, v] : a.model) EXPECT_TRUE(torch::equal(v, b.model.at(k))) << k;
  for (const auto& [k, v] : a.ema) EXPECT_TRUE(torch::equal(v, b.ema.at(k))) << k;
  EXPECT_FALSE(torch::equal(a.ema.at("final_layer.linear.weight"), a.model.at("final_layer.linear.weight")));
  EXPECT_EQ(read_file(d.file("full") + "/metrics.jsonl").size() > 0, true);
  // The EMA weights load for sampling.
  experiments::LoadedDiT loaded = experiments::load_dit_checkpoint(d.file("full"));
  EXPECT_EQ(loaded.cfg.model.name, "MoH-DiT-Pixel/4-75");
  EXPECT_EQ(loaded.weights, "ema");
  EXPECT_EQ(loaded.step, 6);
  EXPECT_FALSE(loaded.model->is_training());
  EXPECT_TRUE(torch::equal(loaded.model->final_layer->linear->weight, a.ema.at("final_layer.linear.weight")));
  EXPECT_EQ(experiments::load_dit_checkpoint(d.file("full"), /*prefer_ema=*/false).weights, "model");
}

// train.ema_decay: 0 means no EMA: the checkpoint has no ema.safetensors and sampling uses the trained weights
// (before the one training loop, the DiT trainer saved an EMA copy of the untrained network and sampling chose it).
TEST(DiffusionTrainer, NoEmaSamplesTheTrainedWeights) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  experiments::ExperimentConfig cfg = experiments::load_experiment(d.write("tiny.yaml", R"(
model: {name: MoH-DiT-Pixel/4-75, num_classes: 10}
data: {batch_size: 16, limit_train: 32}
optim: {lr: 1.0e-3, weight_decay: 0.0, clip_grad: 0.0}
schedule: {kind: constant, warmup_epochs: 0}
train: {epochs: 1, ema_decay: 0.0, seed: 4, )" + test::train_device_keys() + "}\n"));
  experiments::train_experiment(cfg, {d.file("run"), ""});
  const Checkpoint c = load_checkpoint(d.file("run"));
  EXPECT_TRUE(c.ema.empty());
  EXPECT_FALSE(std::filesystem::exists(c.dir + "/ema.safetensors"));
  experiments::LoadedDiT loaded = experiments::load_dit_checkpoint(d.file("run"));
  EXPECT_EQ(loaded.weights, "model");
  EXPECT_EQ(loaded.step, 2);
  EXPECT_TRUE(torch::equal(loaded.model->final_layer->linear->weight, c.model.at("final_layer.linear.weight")));
  // and they are trained: the zero-initialised final layer (adaLN-Zero) has moved
  EXPECT_GT(c.model.at("final_layer.linear.weight").abs().max().item<double>(), 0.0);
}

TEST(SdVae, ParameterCountKeysAndShapes) {
  AutoencoderKL vae;
  EXPECT_EQ(test::count_params(vae), kSdVaeParams);  // 83,653,863 (spec §5.3)
  const auto params = vae->named_parameters();
  EXPECT_EQ(params.size(), 248u);
  for (const char* key :
       {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight", "encoder.down_blocks.2.downsamplers.0.conv.bias",
        "decoder.up_blocks.3.resnets.2.norm2.weight", "decoder.mid_block.attentions.0.to_out.0.weight",
        "quant_conv.weight", "post_quant_conv.bias"})
    EXPECT_TRUE(params.contains(key)) << key;
  EXPECT_FALSE(params.contains("decoder.up_blocks.3.upsamplers.0.conv.weight"));
}

TEST(SdVae, SmallRoundTripShapesAndBothNamingSchemes) {
  SdVaeOptions o;
  o.block_out_channels = {32, 32, 64, 64};  // GroupNorm(32) needs multiples of 32
  torch::manual_seed(0);
  AutoencoderKL vae(o);
  vae->eval();
  torch::NoGradGuard ng;
  at::Tensor img = torch::rand({2, 3, 16, 24}) * 2 - 1;
  LatentPosterior p = vae->encode(img);
  EXPECT_EQ(p.mean.sizes(), (at::IntArrayRef{2, 4, 2, 3}));
  EXPECT_EQ(vae->decode(p.mean).sizes(), img.sizes());
  EXPECT_THROW(vae->encode(torch::rand({1, 3, 12, 16})), UserError);
  // Downsample2D pads right/bottom only: with a summing kernel on ones, the top-left window is all inside (9) and the
  // bottom-right one reaches 2×2 real pixels (4); symmetric padding (padding = 1) would give 4 at the top-left.
  Downsample2D down(1);
  down->conv->weight.fill_(1.0), down->conv->bias.zero_();
  at::Tensor y = down->forward(torch::ones({1, 1, 4, 4}));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{1, 1, 2, 2}));
  EXPECT_FLOAT_EQ(y[0][0][0][0].item<float>(), 9.0f);
  EXPECT_FLOAT_EQ(y[0][0][1][1].item<float>(), 4.0f);
  // Saving with legacy attention names (query/key/value/proj_attn) and loading gives the same network.
  test::TempDir d;
  TensorMap legacy;
  for (auto& [k, v] : module_tensors(*vae)) {
    std::string n = k;
    for (auto [from, to] : {std::pair<std::string, std::string>{".to_q.", ".query."},
                            {".to_k.", ".key."},
                            {".to_v.", ".value."},
                            {".to_out.0.", ".proj_attn."}})
      if (auto pos = n.find(from); pos != std::string::npos) n.replace(pos, from.size(), to);
    legacy[n] = v;
  }
  ASSERT_TRUE(legacy.count("encoder.mid_block.attentions.0.query.weight"));
  save_safetensors(d.file("legacy.safetensors"), legacy);
  save_safetensors(d.file("current.safetensors"), module_tensors(*vae));
  // The file's widths (not the SD VAE's 128/256/512/512) are read from it, whichever naming it uses.
  for (const char* f : {"legacy.safetensors", "current.safetensors"}) {
    torch::manual_seed(1);
    AutoencoderKL other = load_vae(VaeKind::sd, d.file(f), "hint");
    other->eval();
    EXPECT_EQ(other->options.block_out_channels, o.block_out_channels) << f;
    EXPECT_EQ(other->latents.scale, kSdVaeLatentScale);
    EXPECT_TRUE(other->decode(p.mean).equal(vae->decode(p.mean))) << f;
  }
  legacy.erase("decoder.conv_out.bias");
  save_safetensors(d.file("missing.safetensors"), legacy);
  EXPECT_THROW(load_vae(VaeKind::sd, d.file("missing.safetensors"), "hint"), UserError);
  EXPECT_THROW(load_vae(VaeKind::sd, d.file("absent.safetensors"), "hint"), UserError);
}

// A file's widths are taken only where the latent kind allows them: its number of levels (the latent's
// downsampling) must be the kind's, and every width a multiple of the 32 GroupNorm groups; the errors name the file.
TEST(SdVae, WidthsComeFromTheFileWithinTheKindsShape) {
  const SdVaeOptions sd;
  auto shapes = [](std::vector<int64_t> widths) {
    std::map<std::string, std::vector<int64_t>> s;
    for (size_t i = 0; i < widths.size(); ++i)
      s["encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.weight"] = {widths[i], i ? widths[i - 1] : 32, 3,
                                                                                   3};
    return s;
  };
  EXPECT_EQ(vae_options_from_shapes(shapes({32, 64, 64, 96}), sd, "f").block_out_channels,
            (std::vector<int64_t>{32, 64, 64, 96}));
  EXPECT_EQ(vae_options_from_shapes({}, sd, "f").block_out_channels, sd.block_out_channels);
  for (const auto& [widths, why] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{32, 64, 64}, "has 3 encoder levels"}, {{32, 48, 64, 64}, "width 48"}}) {
    try {
      vae_options_from_shapes(shapes(widths), sd, "small.safetensors");
      ADD_FAILURE() << why;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("small.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  // VA-VAE's five levels with attention at the lowest are kept; only the widths change.
  const SdVaeOptions va = vae_options_from_shapes(shapes({32, 32, 64, 64, 64}), va_vae_f16d32_options(), "f");
  EXPECT_TRUE(va.lowest_level_attention);
  EXPECT_EQ(va.latent_channels, 32);
  EXPECT_EQ(va.factor(), 16);
}

}  // namespace
}  // namespace moh::diffusion
