// Flow matching (diffusion/flow_matching.h) and its samplers (diffusion/flow_solvers.h): the paths and the conversions
// between predictions against the exact velocity, noise and score of Gaussian data; the samplers' convergence to the
// exact flow of that data (and the SDE's output distribution); the training loss against a direct computation; the
// DiT sampling loop on a flow model (NFE, CFG, guidance interval) and the sampler ↔ objective rule; and (under
// tests/pyref_test.sh flow, MOH_FLOW_REF=DIR) diffusers' flow-matching schedulers, torchdiffeq's dopri5 and the SiT
// formulas written out in tests/diffusion/ref_flow.py.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/flow_solvers.h"
#include "diffusion/objective.h"
#include "diffusion/sampler.h"
#include "experiments/dit_experiment.h"
#include "experiments/experiment_config.h"
#include "experiments/registry.h"
#include "tests/diffusion/tiny_dit.h"
#include "tests/test_util.h"

namespace moh::diffusion {
namespace {

FlowProcess process(FlowPath path, FlowPrediction prediction, FlowLoss loss = FlowLoss::mse) {
  FlowConfig c;
  c.path = path, c.prediction = prediction, c.loss = loss;
  return FlowProcess(c);
}

// Data x1 ~ N(0, c²): x_t ~ N(0, α²c² + σ²); E[u_t | x] = (α̇αc² + σ̇σ)/var·x, E[x0 | x] = σ/var·x, score −x/var.
struct GaussianTruth {
  double c;
  double var(const PathCoefficients& p) const {
    return p.alpha.item<double>() * p.alpha.item<double>() * c * c + p.sigma.item<double>() * p.sigma.item<double>();
  }
  at::Tensor velocity(const FlowProcess& f, const at::Tensor& x, double t) const {
    const PathCoefficients p = f.coefficients(at::full({1}, t, at::kDouble));
    const double a = p.alpha.item<double>(), da = p.d_alpha.item<double>();
    const double s = p.sigma.item<double>(), ds = p.d_sigma.item<double>();
    return x * ((da * a * c * c + ds * s) / var(p));
  }
  at::Tensor noise(const FlowProcess& f, const at::Tensor& x, double t) const {
    const PathCoefficients p = f.coefficients(at::full({1}, t, at::kDouble));
    return x * (p.sigma.item<double>() / var(p));
  }
  at::Tensor score(const FlowProcess& f, const at::Tensor& x, double t) const {
    return -x / var(f.coefficients(at::full({1}, t, at::kDouble)));
  }
  at::Tensor predict(const FlowProcess& f, const at::Tensor& x, double t) const {
    switch (f.config().prediction) {
      case FlowPrediction::velocity:
        return velocity(f, x, t);
      case FlowPrediction::noise:
        return noise(f, x, t);
      case FlowPrediction::score:
        break;
    }
    return score(f, x, t);
  }
};

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(FlowProcess, PathsAreSiTs) {
  const at::Tensor t = at::tensor({0.0, 0.3, 1.0}, at::kDouble);
  const PathCoefficients l = process(FlowPath::linear, FlowPrediction::velocity).coefficients(t);
  EXPECT_TRUE(at::allclose(l.alpha, t) && at::allclose(l.sigma, 1 - t));
  EXPECT_TRUE(at::allclose(l.d_alpha, at::ones_like(t)) && at::allclose(l.d_sigma, -at::ones_like(t)));
  const PathCoefficients g = process(FlowPath::gvp, FlowPrediction::velocity).coefficients(t);
  EXPECT_NEAR(g.alpha[1].item<double>(), std::sin(0.3 * M_PI / 2), 1e-12);
  EXPECT_NEAR(g.sigma[1].item<double>(), std::cos(0.3 * M_PI / 2), 1e-12);
  EXPECT_NEAR(g.d_alpha[1].item<double>(), M_PI / 2 * std::cos(0.3 * M_PI / 2), 1e-12);
  EXPECT_NEAR(g.d_sigma[1].item<double>(), -M_PI / 2 * std::sin(0.3 * M_PI / 2), 1e-12);
  const auto [xt, ut] =
      process(FlowPath::linear, FlowPrediction::velocity)
          .interpolate(at::full({1, 1, 1, 1}, 2.0), at::full({1, 1, 1, 1}, -1.0), at::full({1}, 0.25));
  EXPECT_NEAR(xt.item<double>(), 0.25 * 2 - 0.75, 1e-7);
  EXPECT_NEAR(ut.item<double>(), 3.0, 1e-7);
}

// Every prediction turns into the exact velocity and score of Gaussian data, on both paths, inside (0, 1).
TEST(FlowProcess, ConversionsGiveTheExactVelocityAndScore) {
  const GaussianTruth truth{0.7};
  const at::Tensor x = at::randn({3, 2, 2, 2}, at::kDouble);
  for (FlowPath path : {FlowPath::linear, FlowPath::gvp})
    for (FlowPrediction pred : {FlowPrediction::velocity, FlowPrediction::noise, FlowPrediction::score})
      for (double t : {0.05, 0.4, 0.93}) {
        const FlowProcess f = process(path, pred);
        const at::Tensor tt = at::full({3}, t, at::kDouble), out = truth.predict(f, x, t);
        EXPECT_LT(rel_err(f.velocity(out, x, tt), truth.velocity(f, x, t)), 1e-10)
            << config::to_string(path) << " " << config::to_string(pred) << " t=" << t;
        EXPECT_LT(rel_err(f.score(out, x, tt), truth.score(f, x, t)), 1e-10)
            << config::to_string(path) << " " << config::to_string(pred) << " t=" << t;
      }
}

TEST(FlowProcess, LossesAndTimes) {
  const at::Tensor x1 = at::randn({4, 3, 2, 2}), x0 = at::randn({4, 3, 2, 2}), t = at::rand({4});
  const at::Tensor out = at::randn({4, 3, 2, 2});
  const FlowProcess v = process(FlowPath::linear, FlowPrediction::velocity, FlowLoss::mse_cosine);
  const FlowProcess::Losses l = v.training_losses(out, x1, x0, t);
  const at::Tensor u = x1 - x0;  // linear path velocity
  EXPECT_TRUE(at::allclose(l.mse, (out - u).pow(2).mean({1, 2, 3})));
  const at::Tensor cos = (out * u).sum(1) / (out.norm(2, 1) * u.norm(2, 1));  // over channels, per pixel
  EXPECT_TRUE(at::allclose(l.cosine, (1 - cos).mean({1, 2}), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(l.loss, l.mse + l.cosine));
  const FlowProcess s = process(FlowPath::gvp, FlowPrediction::score);
  const at::Tensor sig = at::cos(t * M_PI / 2).reshape({4, 1, 1, 1});
  EXPECT_TRUE(at::allclose(s.training_losses(out, x1, x0, t).mse, (out * sig + x0).pow(2).mean({1, 2, 3}), 1e-5));
  EXPECT_EQ(s.train_interval(), (std::pair<double, double>{kFlowEps, 1 - kFlowEps}));
  EXPECT_EQ(v.train_interval(), (std::pair<double, double>{0.0, 1.0}));
  FlowConfig c;
  c.t_sampling = TimeSampling::lognormal, c.t_lognormal = {0.5, 2.0};
  const at::Tensor n = at::tensor({-1.0, 0.0, 3.0}, at::kDouble);
  EXPECT_TRUE(at::allclose(FlowProcess(c).training_times(n), at::sigmoid(0.5 + 2.0 * n)));
}

// Gaussian data N(0, c²) on the linear path: the ODE maps x0 to c·x0. Euler's error falls like 1/N, Heun's like
// 1/N², dopri5 meets its tolerance with few evaluations.
TEST(FlowSolvers, ConvergeToTheExactFlowOfGaussianData) {
  const GaussianTruth truth{0.5};
  const FlowProcess f = process(FlowPath::linear, FlowPrediction::velocity);
  const at::Tensor noise = at::randn({2, 1, 4, 4}, at::kDouble), exact = noise * truth.c;
  int64_t nfe = 0;
  auto args = [&](int64_t steps) {
    FlowChainArgs a;
    a.process = &f, a.noise = noise, a.steps = steps;
    a.predict = [&](const at::Tensor& x, double t) { return ++nfe, truth.predict(f, x, t); };
    return a;
  };
  const double e10 = rel_err(flow_euler_chain(args(10)), exact), e40 = rel_err(flow_euler_chain(args(40)), exact);
  const double h10 = rel_err(flow_heun_chain(args(10)), exact), h40 = rel_err(flow_heun_chain(args(40)), exact);
  EXPECT_GT(e10 / e40, 3.0) << e10 << " " << e40;   // first order: ≈ 4
  EXPECT_GT(h10 / h40, 10.0) << h10 << " " << h40;  // second order: ≈ 16
  EXPECT_LT(h40, e40);
  EXPECT_LT(h40, 2e-3);
  nfe = 0;
  FlowChainArgs a = args(0);
  a.solver.rtol = 1e-6, a.solver.atol = 1e-8;
  int64_t calls = 0;
  a.on_step = [&](int64_t, const at::Tensor&) { ++calls; };
  EXPECT_LT(rel_err(dopri5_chain(a), exact), 1e-5);
  EXPECT_EQ(calls, 100);               // one progress call per percent of [t0, t1]
  EXPECT_EQ((nfe - 2) % 6, 0) << nfe;  // f0, the initial-step probe, 6 stages per step
  EXPECT_LT(nfe, 200);
}

// The SDE's samples of N(0, c²) data have the data's spread (the last step adds no noise; 20 000 draws: ±1 %).
TEST(FlowSolvers, SdeSamplesTheDataDistribution) {
  torch::manual_seed(3);
  for (FlowPath path : {FlowPath::linear, FlowPath::gvp}) {
    const GaussianTruth truth{0.5};
    const FlowProcess f = process(path, FlowPrediction::velocity);
    FlowChainArgs a;
    a.process = &f, a.noise = at::randn({20000, 1, 1, 1}, at::kDouble), a.steps = 250;
    a.predict = [&](const at::Tensor& x, double t) { return truth.predict(f, x, t); };
    a.draw = [](const at::Tensor& x) { return at::randn_like(x); };
    const double sd = sde_chain(a).std().item<double>();
    EXPECT_NEAR(sd, truth.c, 0.03 * truth.c) << config::to_string(path);
  }
}

// The DiT loop on a flow model: every flow sampler counts the evaluations it planned (2 per guided one, none
// guided outside the interval), steps the progress as planned, and CFG, the interval and the sampler change the
// samples.
TEST(FlowSampling, DiTLoopCountsAndGuides) {
  DiT m = tiny_dit(3, true);
  const at::Tensor noise = torch::randn({2, 3, 8, 8}), labels = torch::tensor({1, 2});
  const GaussianDiffusion chain = GaussianDiffusion::base(1000);
  struct Case {
    SamplerKind kind;
    double scale;
    std::array<double, 2> interval;
    int64_t expect;  // −1: adaptive
  };
  // euler / heun grid of 6 steps: t = 0, 1/6, …, 5/6 (noise level 1 − t); [0, 0.5] guides t ≥ 0.5: 3 of 6.
  std::vector<at::Tensor> outs;
  for (const Case& c : {Case{SamplerKind::euler, 1.0, {0, 1}, 6}, Case{SamplerKind::euler, 3.0, {0, 1}, 12},
                        Case{SamplerKind::euler, 3.0, {0, 0.5}, 9}, Case{SamplerKind::heun, 3.0, {0, 1}, 22},
                        Case{SamplerKind::sde, 3.0, {0, 1}, 12}, Case{SamplerKind::dopri5, 3.0, {0, 1}, -1}}) {
    SampleOptions o;
    o.sampler = c.kind, o.objective = Objective::flow, o.cfg_scale = c.scale, o.cfg_interval = c.interval;
    o.ode_steps = 6, o.solver.rtol = 1e-2, o.solver.atol = 1e-3;
    int64_t counted = 0, steps = 0;
    torch::manual_seed(1);
    outs.push_back(sample_loop(
        m, chain, noise, labels, o, [&] { ++steps; }, &counted));
    EXPECT_EQ(steps, sampler_steps(o, chain)) << config::to_string(c.kind);
    EXPECT_EQ(planned_nfe(o, chain), c.expect) << config::to_string(c.kind);
    if (c.expect > 0) {
      EXPECT_EQ(counted, c.expect) << config::to_string(c.kind);
    } else {
      EXPECT_EQ(counted % 2, 0) << counted;  // every evaluation guided, stages past t = 1 too (SiT guides everywhere)
      EXPECT_GE(counted, 2 * (2 + 6)) << counted;  // f0, the probe and at least one step of 6 stages
    }
    EXPECT_TRUE(outs.back().isfinite().all().item<bool>());
  }
  EXPECT_GT((outs[0] - outs[1]).abs().max().item<double>(), 1e-3);  // CFG
  EXPECT_GT((outs[1] - outs[2]).abs().max().item<double>(), 1e-3);  // the interval
  EXPECT_GT((outs[1] - outs[3]).abs().max().item<double>(), 1e-3);  // Euler vs Heun
}

// The sampler ↔ objective rule: flow-only samplers refuse DDPM models and DDPM-only ones refuse flow models, as a
// one-line config error naming the samplers that would run.
TEST(FlowSampling, SamplersRefuseTheOtherObjective) {
  EXPECT_TRUE(runs_on(SamplerKind::euler, Objective::flow) && runs_on(SamplerKind::euler, Objective::ddpm));
  EXPECT_FALSE(runs_on(SamplerKind::sde, Objective::ddpm) || runs_on(SamplerKind::dopri5, Objective::ddpm));
  EXPECT_FALSE(runs_on(SamplerKind::ddpm, Objective::flow) || runs_on(SamplerKind::dpmpp_2m, Objective::flow));
  EXPECT_EQ(samplers_for(Objective::flow), "euler, heun, dopri5 or sde");
  const std::string base = MOH_SOURCE_DIR "/configs/fashion_mnist/moh_dit_pixel.yaml";
  auto message = [&](const std::vector<std::string>& sets) {
    try {
      experiments::sample_options_for(experiments::load_experiment(base, sets));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({"sampling.sampler=sde", "sampling.steps=50"}).find("does not run on a DDPM model"),
            std::string::npos);
  const std::string m = message({"diffusion.objective=flow", "sampling.sampler=ddpm"});
  EXPECT_NE(m.find("does not run on a flow model"), std::string::npos) << m;
  EXPECT_NE(m.find("euler, heun, dopri5 or sde"), std::string::npos) << m;
  EXPECT_EQ(message({"diffusion.objective=flow", "sampling.sampler=sde", "sampling.steps=250"}), "");
}

// One flow training step on a tiny DiT: finite loss terms, gradients on the prediction channels' weights, none on a
// learned-σ model's variance channels (SiT discards them).
TEST(FlowTraining, BackwardTrainsThePredictionChannels) {
  DiT m = tiny_dit(3, true);
  m->train();
  FlowConfig c;
  c.loss = FlowLoss::mse_cosine, c.t_sampling = TimeSampling::lognormal;
  const FlowProcess f(c);
  RunContext ctx;
  const GradScaler scaler(Precision::fp32);
  const LossTensors r = flow_backward(m, f, torch::randn({4, 3, 8, 8}), torch::tensor({0, 1, 2, 3}), 0.01, ctx, scaler);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[2].first, "cosine");
  for (const auto& [name, v] : r) EXPECT_TRUE(std::isfinite(v.item<double>())) << name;
  EXPECT_GT(r[2].second.item<double>(), 0.0);
  const at::Tensor g = m->final_layer->linear->weight.grad();  // rows: (p, p, C_out) with C_out = 2C
  ASSERT_TRUE(g.defined());
  const int64_t p = m->options.patch_size, cout = 6;
  const at::Tensor rows = g.reshape({p * p, cout, -1});
  EXPECT_GT(rows.narrow(1, 0, 3).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(rows.narrow(1, 3, 3).abs().sum().item<double>(), 0.0);
}

// LightningDiT's cosine term over one channel is ±1 (gradient 0, or unbounded at the zero-initialised output): a grey
// model refuses it, a three-channel one takes it.
TEST(FlowTraining, CosineTermNeedsSeveralChannels) {
  const std::string base = MOH_SOURCE_DIR "/configs/fashion_mnist/moh_dit_pixel.yaml";
  const std::vector<std::string> sets{"diffusion.objective=flow", "sampling.sampler=heun", "sampling.steps=6",
                                      "diffusion.loss=mse+cosine"};
  const std::string m =
      test::user_error_of([&] { experiments::validate_experiment(experiments::load_experiment(base, sets)); });
  EXPECT_NE(m.find("MoH-DiT-Pixel/4-75 has 1 (the cosine of one channel is ±1"), std::string::npos) << m;
  EXPECT_EQ(test::user_error_of([&] {
              experiments::validate_experiment(experiments::load_experiment(
                  MOH_SOURCE_DIR "/configs/imagenet/lightningdit_xl_1.yaml", {"data.batch_size=8"}));
            }),
            "");
}

// The written-out SiT formulas, diffusers' flow-matching chains and torchdiffeq's dopri5 (tests/diffusion/ref_flow.py),
// when tests/pyref_test.sh flow points MOH_FLOW_REF at them: every formula ≤ 1e-10 in fp64, every chain step ≤ 1e-5,
// dopri5 with the same number of evaluations.
class FlowReference : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("MOH_FLOW_REF");
    if (!dir) GTEST_SKIP() << "MOH_FLOW_REF unset (tests/pyref_test.sh flow sets it)";
    dir_ = dir;
    ref_ = load_safetensors(dir_ + "/flow.safetensors").tensors;
  }
  void expect_close(const at::Tensor& got, const std::string& key, double tol, double& worst) {
    const double r = rel_err(got, ref_.at(key));
    worst = std::max(worst, r);
    EXPECT_LE(r, tol) << key;
  }
  FlowChainArgs standin_args(const FlowProcess& f, int64_t steps) {
    FlowChainArgs a;
    a.process = &f, a.noise = ref_.at("noise"), a.steps = steps;
    a.predict = [](const at::Tensor& x, double t) {  // ref_flow.py standin, a velocity field
      return -x * (0.6 + 0.3 * std::cos(2 * t)) + 0.2 * at::tanh(x) * std::sin(3 * t) + 0.1 * t;
    };
    return a;
  }
  std::string dir_;
  TensorMap ref_;
};

TEST_F(FlowReference, FormulasAreSiTs) {
  const at::Tensor x1 = ref_.at("f_x1"), x0 = ref_.at("f_x0"), out = ref_.at("f_out"), t = ref_.at("f_t");
  double worst = 0;
  for (FlowPath path : {FlowPath::linear, FlowPath::gvp})
    for (FlowPrediction pred : {FlowPrediction::velocity, FlowPrediction::noise, FlowPrediction::score}) {
      const std::string tag = "f_" + config::to_string(path) + "_" + config::to_string(pred);
      const FlowProcess f =
          process(path, pred, pred == FlowPrediction::velocity ? FlowLoss::mse_cosine : FlowLoss::mse);
      const FlowProcess::Losses l = f.training_losses(out, x1, x0, t);
      expect_close(l.mse, tag + "_mse", 1e-10, worst);
      if (pred == FlowPrediction::velocity) expect_close(l.cosine, tag + "_cos", 1e-10, worst);
      expect_close(f.velocity(out, x1, t), tag + "_velocity", 1e-10, worst);
      expect_close(f.score(out, x1, t), tag + "_score", 1e-10, worst);
    }
  std::cout << "max rel vs the written-out SiT formulas (fp64): " << worst << "\n";
}

TEST_F(FlowReference, ChainsMatchDiffusersTorchdiffeqAndTheSDE) {
  double worst = 0;
  const FlowProcess f = process(FlowPath::linear, FlowPrediction::velocity);
  for (int64_t n : {10, 20})
    for (SamplerKind k : {SamplerKind::euler, SamplerKind::heun}) {
      const std::string key = config::to_string(k) + "_standin_" + std::to_string(n);
      FlowChainArgs a = standin_args(f, n);
      a.on_step = [&](int64_t i, const at::Tensor& x) { expect_close(x, key, 1e-5, worst), (void)i; };
      const at::Tensor want = ref_.at(key);  // (n + 1, ...): the noise, then one state per step
      a.on_step = [&](int64_t i, const at::Tensor& x) {
        const double r = rel_err(x, want[i + 1]);
        worst = std::max(worst, r);
        EXPECT_LE(r, 1e-5) << key << " step " << i;
      };
      k == SamplerKind::euler ? flow_euler_chain(a) : flow_heun_chain(a);
    }
  for (SamplerKind k : {SamplerKind::euler, SamplerKind::heun}) {  // LightningDiT's timestep shift 0.3
    const std::string key = config::to_string(k) + "_standin_10_shift";
    FlowChainArgs a = standin_args(f, 10);
    a.solver.timestep_shift = 0.3;
    const at::Tensor want = ref_.at(key);
    a.on_step = [&](int64_t i, const at::Tensor& x) {
      const double r = rel_err(x, want[i + 1]);
      worst = std::max(worst, r);
      EXPECT_LE(r, 1e-5) << key << " step " << i;
    };
    k == SamplerKind::euler ? flow_euler_chain(a) : flow_heun_chain(a);
  }
  for (const auto& [tag, atol, rtol] :
       std::vector<std::tuple<std::string, double, double>>{{"sit", 1e-6, 1e-3}, {"tight", 1e-8, 1e-7}}) {
    int64_t nfe = 0;
    FlowChainArgs a = standin_args(f, 0);
    a.solver.atol = atol, a.solver.rtol = rtol;
    const auto v = a.predict;
    a.predict = [&](const at::Tensor& x, double t) { return ++nfe, v(x, t); };
    expect_close(dopri5_chain(a), "dopri5_standin_" + tag, 1e-5, worst);
    EXPECT_EQ(nfe, ref_.at("dopri5_standin_" + tag + "_nfe").item<int64_t>()) << tag;
  }
  const at::Tensor draws = ref_.at("sde_draws");
  for (const auto& [path, pred] :
       std::vector<std::pair<FlowPath, FlowPrediction>>{{FlowPath::linear, FlowPrediction::velocity},
                                                        {FlowPath::gvp, FlowPrediction::score},
                                                        {FlowPath::linear, FlowPrediction::noise}}) {
    const std::string key = "sde_" + config::to_string(path) + "_" + config::to_string(pred);
    const FlowProcess p = process(path, pred), linear_v = process(FlowPath::linear, FlowPrediction::velocity);
    FlowChainArgs a = standin_args(p, 12);
    a.noise = ref_.at("sde_noise");  // fp64
    const auto v = a.predict;
    // The prediction of kind `pred` whose velocity is the stand-in's: through the score, as ref_flow.py does.
    a.predict = [&, v](const at::Tensor& x, double t) {
      if (pred == FlowPrediction::velocity) return v(x, t);
      const at::Tensor tt = at::full({x.size(0)}, t, x.options());
      const PathCoefficients c = p.coefficients(tt.reshape({-1, 1, 1, 1}));
      const at::Tensor r = c.d_alpha / c.alpha;
      const at::Tensor score = (v(x, t) - r * x) / (r * c.sigma * c.sigma - c.sigma * c.d_sigma);
      return pred == FlowPrediction::score ? score : -c.sigma * score;
    };
    int64_t drawn = 0;
    a.draw = [&](const at::Tensor&) { return draws[drawn++]; };
    const at::Tensor want = ref_.at(key);
    a.on_step = [&](int64_t i, const at::Tensor& x) {
      const double r = rel_err(x, want[i + 1]);
      worst = std::max(worst, r);
      EXPECT_LE(r, 1e-5) << key << " step " << i;
    };
    sde_chain(a);
    EXPECT_EQ(drawn, 11);
  }
  std::cout << "max rel vs diffusers / torchdiffeq / the SDE reference, every step: " << worst << "\n";
}

TEST_F(FlowReference, DiTChainsWithGuidance) {
  DiT m(dit_options("DiT-Pixel/4"));
  load_initial_weights(*m, dir_ + "/dit.safetensors", "", false);
  m->to(at::kDouble);  // as ref_flow.py: in fp64 dopri5's error estimates stay far above rounding
  m->eval();
  double worst = 0;
  for (SamplerKind k : {SamplerKind::euler, SamplerKind::heun, SamplerKind::dopri5})
    for (const auto& [tag, scale, hi] : std::vector<std::tuple<std::string, double, double>>{
             {"cfg1", 1.0, 1.0}, {"cfg4", 4.0, 1.0}, {"cfg4_interval", 4.0, 0.5}}) {
      SampleOptions so;
      so.sampler = k, so.objective = Objective::flow, so.cfg_scale = scale, so.cfg_channels = CfgChannels::all;
      so.cfg_interval = {0.0, hi}, so.ode_steps = 8;  // dopri5: SiT's atol 1e-6, rtol 1e-3
      int64_t calls = 0;
      const at::Tensor x = sample_loop(m, GaussianDiffusion::base(1000), ref_.at("dit_noise"), ref_.at("dit_labels"),
                                       so, {}, k == SamplerKind::dopri5 ? &calls : nullptr);
      if (k == SamplerKind::dopri5) {  // the same steps: the same evaluations, 2 per guided one
        EXPECT_EQ(calls, ref_.at("dopri5_dit_" + tag + "_nfe").item<int64_t>()) << tag;
      }
      expect_close(x, config::to_string(k) + "_dit_" + tag, 1e-5, worst);
    }
  std::cout << "max rel vs the DiT chains (final sample): " << worst << "\n";
}

}  // namespace
}  // namespace moh::diffusion
