// The probability-flow ODE samplers (diffusion/ode_solvers.h): their grids, their accuracy on a data distribution
// whose exact ε is known, the counted network evaluations with CFG and a guidance interval, and (under
// tests/pyref_test.sh solvers, MOH_SOLVER_REF=DIR) the chains of diffusers' schedulers step by step.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "diffusion/ode_solvers.h"
#include "diffusion/sampler.h"
#include "tests/diffusion/tiny_dit.h"
#include "tests/test_util.h"
#include "vision/nn/head_surgery.h"

namespace moh::diffusion {
namespace {

const std::vector<double>& alphas_cumprod() {
  static const std::vector<double> a = GaussianDiffusion::base(1000).schedule().alphas_cumprod;
  return a;
}

// σ(t) as the grids define it: linear interpolation of √((1 − ᾱ)/ᾱ) in t.
double sigma_at(double t) {
  const auto& a = alphas_cumprod();
  const auto lo = static_cast<size_t>(std::floor(t));
  auto s = [&](size_t i) { return std::sqrt((1.0 - a[i]) / a[i]); };
  return lo + 1 >= a.size() ? s(lo) : s(lo) + (t - static_cast<double>(lo)) * (s(lo + 1) - s(lo));
}

// The exact ε of data x_0 ~ N(0, s²) at VP input x_in: E[ε | x_σ] = σ·x_σ / (s² + σ²), x_σ = x_in·√(σ² + 1).
EpsModel gaussian_eps(double s) {
  return [s](const at::Tensor& x, double t) {
    const double sig = sigma_at(t);
    return x * (sig * std::sqrt(sig * sig + 1.0) / (s * s + sig * sig));
  };
}

at::Tensor run(SamplerKind kind, const EpsModel& eps, const at::Tensor& noise, int64_t steps) {
  if (kind == SamplerKind::dpmpp_2m) return dpmpp_2m_chain(eps, noise, dpm_grid(alphas_cumprod(), steps));
  const OdeGrid g = karras_grid(alphas_cumprod(), steps);
  return kind == SamplerKind::euler ? euler_chain(eps, noise, g) : heun_chain(eps, noise, g);
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(OdeGrid, DiffusersTimestepsAndSigmas) {
  const OdeGrid k = karras_grid(alphas_cumprod(), 4);  // linspace(0, 999, 4) reversed: 999, 666, 333, 0
  EXPECT_EQ(k.timesteps, (std::vector<double>{999, 666, 333, 0}));
  ASSERT_EQ(k.sigmas.size(), 5u);
  EXPECT_NEAR(k.sigmas[0], std::sqrt((1 - alphas_cumprod()[999]) / alphas_cumprod()[999]), 1e-12);
  EXPECT_EQ(k.sigmas[4], 0.0);
  const OdeGrid f = karras_grid(alphas_cumprod(), 3);  // 999, 499.5, 0: a fractional timestep, σ interpolated
  EXPECT_EQ(f.timesteps[1], 499.5);
  EXPECT_NEAR(f.sigmas[1], 0.5 * (sigma_at(499) + sigma_at(500)), 1e-12);
  const OdeGrid d = dpm_grid(alphas_cumprod(), 4);                    // round(linspace(0, 999, 5)) reversed without 0
  EXPECT_EQ(d.timesteps, (std::vector<double>{999, 749, 500, 250}));  // 249.75 → 250, 499.5 → 500 (half to even)
  EXPECT_EQ(d.sigmas.back(), 0.0);
}

// Gaussian data: the ODE maps σ_max·ε to x_0 = ε·s·σ_max/√(s² + σ_max²) exactly; the discretisation error falls
// with the steps, faster for the second-order solvers.
TEST(OdeSolvers, ConvergeToTheExactFlowOfGaussianData) {
  const double s = 0.5, smax = sigma_at(999);
  torch::manual_seed(1);
  const at::Tensor noise = torch::randn({4, 1, 6, 6}, torch::kDouble);
  const at::Tensor sharp = noise * (s * smax / std::sqrt(s * s + smax * smax));
  const at::Tensor exact_vp = sharp * (std::sqrt(smax * smax + 1.0) / smax);  // DPM++ starts at x_T = noise (VP)
  auto err = [&](SamplerKind k, int64_t n) {
    return max_rel(run(k, gaussian_eps(s), noise, n), k == SamplerKind::dpmpp_2m ? exact_vp : sharp);
  };
  for (SamplerKind k : {SamplerKind::euler, SamplerKind::heun, SamplerKind::dpmpp_2m}) {
    EXPECT_LT(err(k, 200), 0.5 * err(k, 10)) << config::to_string(k);
    EXPECT_LT(err(k, 200), 0.02) << config::to_string(k);
  }
  EXPECT_LT(err(SamplerKind::heun, 20), 0.5 * err(SamplerKind::euler, 20));
  EXPECT_LT(err(SamplerKind::dpmpp_2m, 20), 0.5 * err(SamplerKind::euler, 20));
}

// NFE: counted at run time equals the plan (2 per guided evaluation, Heun 2N − 1 evaluations), and the interval
// switches guidance off where it should.
TEST(OdeSolvers, NetworkEvaluationsFollowGuidanceAndInterval) {
  DiT m = tiny_dit(1, false);
  const at::Tensor noise = torch::randn({2, 1, 8, 8}), labels = torch::tensor({1, 2});
  struct Case {
    SamplerKind kind;
    double scale;
    std::array<double, 2> interval;
    int64_t expect;
  };
  // dpm grid of 6: t = 999, 832, 666, 500, 333, 166 → 3 inside [0, 0.6]; euler/heun grid of 6: 999, 799.2, 599.4,
  // 399.6, 199.8, 0 → 3 inside [0, 0.5].
  for (const Case& c : {Case{SamplerKind::euler, 1.0, {0, 1}, 6}, Case{SamplerKind::euler, 3.0, {0, 1}, 12},
                        Case{SamplerKind::heun, 3.0, {0, 1}, 22}, Case{SamplerKind::heun, 1.0, {0, 1}, 11},
                        Case{SamplerKind::dpmpp_2m, 3.0, {0, 0.6}, 9}, Case{SamplerKind::euler, 3.0, {0, 0.5}, 9},
                        Case{SamplerKind::ddpm, 3.0, {0, 0.5}, 0}}) {
    SampleOptions o;
    o.sampler = c.kind;
    o.cfg_scale = c.scale;
    o.cfg_channels = CfgChannels::all;
    o.cfg_interval = c.interval;
    o.ode_steps = 6;
    const GaussianDiffusion chain = sampling_chain(c.kind, 1000, "10");
    int64_t counted = 0, steps = 0;
    sample_loop(
        m, chain, noise, labels, o, [&] { ++steps; }, &counted);
    EXPECT_EQ(counted, planned_nfe(o, chain)) << config::to_string(c.kind);
    EXPECT_EQ(steps, sampler_steps(o, chain));
    if (c.expect > 0) {
      EXPECT_EQ(counted, c.expect) << config::to_string(c.kind);
    }
  }
  // DDPM-10 over [0, 0.5]: respaced timesteps 0, 111, …, 999; those ≤ 499.5 are guided (5 of 10) → 15.
  SampleOptions o;
  o.cfg_scale = 3.0;
  o.cfg_channels = CfgChannels::all;
  o.cfg_interval = {0.0, 0.5};
  EXPECT_EQ(planned_nfe(o, GaussianDiffusion::respaced(1000, "10")), 15);
}

// Guidance everywhere, in part of the noise range and nowhere give three different samples.
TEST(OdeSolvers, GuidanceIntervalChangesTheSamples) {
  DiT m = tiny_dit(1, false);
  const at::Tensor noise = torch::randn({2, 1, 8, 8}), labels = torch::tensor({1, 2});
  SampleOptions o;
  o.sampler = SamplerKind::dpmpp_2m;
  o.cfg_scale = 4.0;
  o.cfg_channels = CfgChannels::all;
  o.ode_steps = 6;
  const GaussianDiffusion chain = sampling_chain(o.sampler, 1000, "");
  const at::Tensor all = sample_loop(m, chain, noise, labels, o);
  o.cfg_interval = {0.0, 0.6};
  const at::Tensor part = sample_loop(m, chain, noise, labels, o);
  o.cfg_scale = 1.0;
  const at::Tensor none = sample_loop(m, chain, noise, labels, o);
  EXPECT_GT((all - part).abs().max().item<double>(), 1e-4);
  EXPECT_GT((part - none).abs().max().item<double>(), 1e-4);
}

// Head budgets by noise level and branch: each setting must change the samples where it changes K, leave them
// alone where it does not, and give every layer its trained K back afterwards.
TEST(HeadBudget, ScheduleAndGuideTopkSetKWhereTheySay) {
  DiT m = tiny_dit(1, true);
  const at::Tensor noise = torch::randn({2, 1, 8, 8}), labels = torch::tensor({1, 2});
  auto sample = [&](int64_t topk, std::vector<int64_t> schedule, int64_t guide) {
    SampleOptions o;
    o.sampler = SamplerKind::euler;
    o.ode_steps = 4;
    o.cfg_scale = 3.0;
    o.cfg_channels = CfgChannels::all;
    o.topk = topk;
    o.topk_schedule = std::move(schedule);
    o.guide_topk = guide;
    return sample_loop(m, sampling_chain(o.sampler, 1000, ""), noise, labels, o);
  };
  const at::Tensor trained = sample(-1, {}, -1);
  for (auto& [name, layer] : nn::head_controls(*m)) EXPECT_EQ(layer->routed_topk(), 2) << name;
  EXPECT_TRUE(sample(2, {}, -1).equal(trained));
  EXPECT_TRUE(sample(-1, {2, 2, 2}, -1).equal(trained));
  EXPECT_TRUE(sample(1, {}, -1).equal(sample(-1, {1, 1}, -1)));
  EXPECT_FALSE(sample(1, {}, -1).allclose(trained, 1e-4, 1e-5));
  EXPECT_FALSE(sample(-1, {1, 4}, -1).allclose(sample(-1, {4, 1}, -1), 1e-4, 1e-5));
  // The unconditional branch alone: its trained K in two forwards equals the doubled batch; K = 1 there differs.
  const at::Tensor split = sample(-1, {}, 2);
  EXPECT_LE(max_rel(split, trained), 1e-5);
  EXPECT_FALSE(sample(-1, {}, 1).allclose(trained, 1e-4, 1e-5));
  // K = 0 (the shared heads alone) is a setting of its own, in both branches or in the unconditional one only.
  EXPECT_TRUE(sample(0, {}, -1).equal(sample(-1, {0, 0}, -1)));
  EXPECT_FALSE(sample(0, {}, -1).allclose(trained, 1e-4, 1e-5));
  EXPECT_FALSE(sample(-1, {}, 0).allclose(sample(0, {}, -1), 1e-4, 1e-5));
  EXPECT_FALSE(sample(-1, {}, 0).allclose(trained, 1e-4, 1e-5));
  for (auto& [name, layer] : nn::head_controls(*m)) EXPECT_EQ(layer->routed_topk(), 2) << name;
}

// diffusers' chains (tests/diffusion/ref_solvers.py), when tests/pyref_test.sh solvers points MOH_SOLVER_REF at them.
TEST(SolverReference, MatchesDiffusersAndKarrasAlgorithm1) {
  const char* dir = std::getenv("MOH_SOLVER_REF");
  if (!dir) GTEST_SKIP() << "MOH_SOLVER_REF unset (tests/pyref_test.sh solvers sets it)";
  const TensorMap ref = load_safetensors(std::string(dir) + "/solvers.safetensors").tensors;
  const at::Tensor noise = ref.at("noise"), labels = ref.at("labels");
  double worst_step = 0, worst_dit = 0;
  const EpsModel standin = [](const at::Tensor& x, double t) {
    return x + 0.3 * at::tanh(x) * std::cos(t / 300.0) + 0.05 * std::sin(t / 97.0);
  };
  for (SamplerKind k : {SamplerKind::dpmpp_2m, SamplerKind::euler, SamplerKind::heun})
    for (int64_t n : {10, 20}) {
      const std::string name = config::to_string(k) + "_standin_" + std::to_string(n);
      const at::Tensor want = ref.at(name);  // (N + 1, 2, 1, 28, 28): the initial state, then one per step
      const OdeGrid g = k == SamplerKind::dpmpp_2m ? dpm_grid(alphas_cumprod(), n) : karras_grid(alphas_cumprod(), n);
      const StepHook check = [&](int64_t i, const at::Tensor& x) {
        const double r = max_rel(x, want[i + 1]);
        worst_step = std::max(worst_step, r);
        EXPECT_LE(r, 1e-5) << name << " step " << i;
      };
      k == SamplerKind::dpmpp_2m ? dpmpp_2m_chain(standin, noise, g, check)
      : k == SamplerKind::euler  ? euler_chain(standin, noise, g, check)
                                 : heun_chain(standin, noise, g, check);
    }
  DiTOptions o = dit_options("DiT-Pixel/4");
  DiT m(o);
  load_initial_weights(*m, std::string(dir) + "/dit.safetensors", "", false);
  m->eval();
  for (SamplerKind k : {SamplerKind::dpmpp_2m, SamplerKind::euler, SamplerKind::heun})
    for (const auto& [tag, scale, hi] : std::vector<std::tuple<std::string, double, double>>{
             {"cfg1", 1.0, 1.0}, {"cfg4", 4.0, 1.0}, {"cfg4_interval", 4.0, 0.5}}) {
      SampleOptions so;
      so.sampler = k;
      so.cfg_scale = scale;
      so.cfg_channels = CfgChannels::all;
      so.cfg_interval = {0.0, hi};
      so.ode_steps = 8;
      const at::Tensor x = sample_loop(m, sampling_chain(k, 1000, ""), noise, labels, so);
      const std::string name = config::to_string(k) + "_dit_" + tag;
      worst_dit = std::max(worst_dit, max_rel(x, ref.at(name)));
      EXPECT_LE(max_rel(x, ref.at(name)), 1e-5) << name;
    }
  std::cout << "max rel vs the references: stand-in chains, every step " << worst_step << "; DiT chains, final sample "
            << worst_dit << "\n";
}

}  // namespace
}  // namespace moh::diffusion
