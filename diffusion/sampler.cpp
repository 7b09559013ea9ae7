#include "diffusion/sampler.h"

#include "diffusion/objective.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "diffusion/ode_solvers.h"
#include "vision/nn/head_surgery.h"

namespace moh::diffusion {

namespace {
// The guided output (2n, C_out, H, W) from the conditional and unconditional outputs (n, C_out, H, W) each:
// ε_u + s (ε_c − ε_u) on the first 3 (three) or C (all) channels, copied to both halves; the rest conditional.
at::Tensor combine_cfg(const at::Tensor& cond, const at::Tensor& uncond, double scale, CfgChannels channels,
                       int64_t in_channels) {
  // DiT guides eps[:, :3] (a quirk inherited from pixel-space GLIDE, kept for parity); "all" guides the C ε channels.
  const int64_t k = channels == CfgChannels::three ? 3 : in_channels;
  const at::Tensor e_c = cond.narrow(1, 0, k), e_u = uncond.narrow(1, 0, k);
  const at::Tensor guided = e_u + scale * (e_c - e_u);
  const at::Tensor rest = at::cat({cond, uncond}).narrow(1, k, cond.size(1) - k);
  return at::cat({at::cat({guided, guided}), rest}, 1);
}
}  // namespace

namespace {
at::Tensor forward_with_cfg(GraphedForward& net, const at::Tensor& x, const at::Tensor& t_model, const at::Tensor& y,
                            double scale, CfgChannels channels) {
  const int64_t n = x.size(0) / 2;
  const at::Tensor half = x.narrow(0, 0, n);
  const at::Tensor out = net(at::cat({half, half}), t_model, y);  // (2n, C_out, H, W)
  return combine_cfg(out.narrow(0, 0, n), out.narrow(0, n, n), scale, channels, x.size(1));
}
}  // namespace

at::Tensor forward_with_cfg(DiT& model, const at::Tensor& x, const at::Tensor& t_model, const at::Tensor& y,
                            double scale, CfgChannels channels) {
  GraphedForward eager(model, false);
  return forward_with_cfg(eager, x, t_model, y, scale, channels);
}

namespace {

// DDPM ancestral step (guided-diffusion p_sample): the posterior mean plus σ_t z, no noise at t = 0.
at::Tensor ddpm_update(const GaussianDiffusion&, const GaussianDiffusion::MeanVariance& p, const at::Tensor&,
                       const at::Tensor&, const at::Tensor& z, double, bool last) {
  return p.mean + (last ? 0.0 : 1.0) * at::exp(0.5 * p.log_variance) * z;
}

// DDIM step (guided-diffusion ddim_sample): ε from the predicted x0, then Eq. 12 of Song et al. with σ from η.
at::Tensor ddim_update(const GaussianDiffusion& chain, const GaussianDiffusion::MeanVariance& p, const at::Tensor& x,
                       const at::Tensor& t, const at::Tensor& z, double eta, bool last) {
  const auto& s = chain.schedule();
  const at::Tensor eps = (chain.extract(s.sqrt_recip_alphas_cumprod, t, x) * x - p.pred_xstart) /
                         chain.extract(s.sqrt_recipm1_alphas_cumprod, t, x);
  const at::Tensor ac = chain.extract(s.alphas_cumprod, t, x), ac_prev = chain.extract(s.alphas_cumprod_prev, t, x);
  const at::Tensor sigma = eta * at::sqrt((1.0 - ac_prev) / (1.0 - ac)) * at::sqrt(1.0 - ac / ac_prev);
  const at::Tensor mean = p.pred_xstart * at::sqrt(ac_prev) + at::sqrt(1.0 - ac_prev - sigma.pow(2)) * eps;
  return mean + (last ? 0.0 : 1.0) * sigma * z;
}

}  // namespace

namespace {

// One record: its identity, then what differs from SamplerRecord's defaults, field by field.
SamplerRecord record(SamplerKind kind, const char* name, const char* summary, SamplerGrid grid,
                     const std::function<void(SamplerRecord&)>& set) {
  SamplerRecord r{kind, name, summary, grid};
  set(r);
  return r;
}

}  // namespace

const std::vector<SamplerRecord>& samplers() {
  static const std::vector<SamplerRecord> table{
      record(SamplerKind::ddpm, "ddpm", "DDPM ancestral sampling over a respaced chain (DiT's sample.py)",
             SamplerGrid::respaced,
             [](SamplerRecord& r) {
               r.stochastic = true;
               r.update = ddpm_update;
             }),
      record(SamplerKind::ddim, "ddim", "DDIM (η configurable; 0 = deterministic) over a respaced chain",
             SamplerGrid::respaced,
             [](SamplerRecord& r) {
               r.stochastic = true;  // with η > 0; the noise is drawn either way (DiT's RNG order)
               r.update = ddim_update;
             }),
      record(SamplerKind::dpmpp_2m, "dpm++2m", "DPM-Solver++(2M), diffusers' DPMSolverMultistepScheduler",
             SamplerGrid::solver,
             [](SamplerRecord& r) {
               r.make_grid = dpm_grid;
               r.chain = dpmpp_2m_chain;
             }),
      record(SamplerKind::euler, "euler",
             "Euler on the probability-flow ODE, diffusers' EulerDiscreteScheduler; on flow models on the velocity "
             "(FlowMatchEulerDiscreteScheduler)",
             SamplerGrid::solver,
             [](SamplerRecord& r) {
               r.make_grid = karras_grid;
               r.chain = euler_chain;
               r.flow_chain = flow_euler_chain;
               r.timestep_shift = true;
             }),
      record(SamplerKind::heun, "heun",
             "Heun (Karras et al. 2022, Algorithm 1), diffusers' HeunDiscreteScheduler; on flow models "
             "FlowMatchHeunDiscreteScheduler",
             SamplerGrid::solver,
             [](SamplerRecord& r) {
               r.evals_per_step = 2;
               r.last_step_single = true;
               r.make_grid = karras_grid;
               r.chain = heun_chain;
               r.flow_chain = flow_heun_chain;
               r.timestep_shift = true;
             }),
      record(SamplerKind::dopri5, "dopri5", "adaptive Dormand-Prince 5(4) on a flow model's ODE (torchdiffeq, SiT)",
             SamplerGrid::solver,
             [](SamplerRecord& r) {
               r.runs_ddpm = false;
               r.flow_chain = dopri5_chain;
               r.adaptive = true;
             }),
      record(SamplerKind::sde, "sde", "Euler-Maruyama on a flow model's SDE with SiT's diffusion and last step",
             SamplerGrid::solver,
             [](SamplerRecord& r) {
               r.runs_ddpm = false;
               r.flow_chain = sde_chain;
               r.stochastic = true;
             }),
  };
  return table;
}

const SamplerRecord& sampler_record(SamplerKind kind) {
  for (const SamplerRecord& r : samplers())
    if (r.kind == kind) return r;
  throw std::logic_error("sampler_record: no record for sampler " + config::to_string(kind));
}

bool is_ode_sampler(SamplerKind kind) {
  return sampler_record(kind).grid == SamplerGrid::solver;
}

bool runs_on(SamplerKind kind, Objective objective) {
  return objective_record(objective).admits(sampler_record(kind));
}

std::string samplers_for(Objective objective) {
  std::vector<std::string> names;
  for (const SamplerRecord& r : samplers())
    if (runs_on(r.kind, objective)) names.emplace_back(r.name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

GaussianDiffusion sampling_chain(SamplerKind kind, int64_t T, const std::string& steps) {
  return is_ode_sampler(kind) ? GaussianDiffusion::base(T) : GaussianDiffusion::respaced(T, steps);
}

int64_t sampler_steps(const SampleOptions& o, const GaussianDiffusion& chain) {
  if (sampler_record(o.sampler).adaptive) return 100;  // dopri5 reports each percent of its time interval
  return is_ode_sampler(o.sampler) ? o.ode_steps : chain.num_steps();
}

namespace {

// The noise level u ∈ [0, 1] (1 = pure noise) of the network's time input t (the objective's record says how).
double noise_level(const SampleOptions& o, double t) {
  return objective_record(o.objective).noise_level(t, o.train_steps);
}

// Guidance at network time t: CFG on and its noise level inside the interval.
bool guided_at(const SampleOptions& o, double t) {
  const double u = noise_level(o, t);
  return o.cfg_scale > 1.0 && u >= o.cfg_interval[0] && u <= o.cfg_interval[1];
}

}  // namespace

// K of every routed MoH layer for one network evaluation, from the noise level u and the branch; the trained K of
// each layer comes back when the loop ends.
class HeadBudget {
 public:
  HeadBudget(DiT& model, const SampleOptions& o) : o_(o) {
    if (o.topk >= 0 || !o.topk_schedule.empty() || o.guide_topk >= 0)
      for (auto& [name, layer] : nn::head_controls(*model))
        if (layer->routed_topk() > 0) layers_.emplace_back(layer, layer->routed_topk());
  }
  ~HeadBudget() { set_all(-1); }
  HeadBudget(const HeadBudget&) = delete;
  HeadBudget& operator=(const HeadBudget&) = delete;

  void set(double u, bool unconditional) {
    const auto& sch = o_.topk_schedule;
    int64_t k = o_.topk;
    if (!sch.empty()) k = sch[std::min(sch.size() - 1, static_cast<size_t>(u * static_cast<double>(sch.size())))];
    if (unconditional && o_.guide_topk >= 0) k = o_.guide_topk;
    set_all(k);
  }

 private:
  void set_all(int64_t k) {  // −1: each layer's trained K
    if (k == current_) return;
    for (auto& [layer, trained] : layers_) layer->set_routed_topk(k >= 0 ? k : trained);  // 0: the shared heads alone
    current_ = k;
  }
  const SampleOptions& o_;
  std::vector<std::pair<nn::HeadControl*, int64_t>> layers_;
  int64_t current_ = -1;
};

namespace {

// The guided output (2n, C_out, H, W) for x (n, ...) at noise level u: one forward of the doubled batch, or two when
// the unconditional branch has its own head budget (guide_topk). y = [labels; null] (2n).
at::Tensor guided_output(GraphedForward& net, const at::Tensor& x, const at::Tensor& tm, const at::Tensor& y,
                         const SampleOptions& o, HeadBudget& heads, double u) {
  const int64_t n = x.size(0);
  heads.set(u, false);
  if (o.guide_topk < 0) return forward_with_cfg(net, at::cat({x, x}), tm, y, o.cfg_scale, o.cfg_channels);
  const at::Tensor cond = net(x, tm.narrow(0, 0, n), y.narrow(0, 0, n));
  heads.set(u, true);
  const at::Tensor uncond = net(x, tm.narrow(0, n, n), y.narrow(0, n, n));
  return combine_cfg(cond, uncond, o.cfg_scale, o.cfg_channels, x.size(1));
}

OdeGrid ode_grid(const SampleOptions& o, const GaussianDiffusion& chain) {
  const auto& s = chain.schedule();
  TORCH_CHECK(s.timestep_map.back() == s.num_steps() - 1 && s.num_steps() == o.train_steps,
              "sample_loop: the ODE solvers walk the base chain of T steps (sampling_chain)");
  return sampler_record(o.sampler).make_grid(s.alphas_cumprod, o.ode_steps);
}

// The model output (2n, C_out, H, W) on the doubled state x = [x_c; x_u]: guided, or outside the guidance interval
// the conditional output of the first half, copied to both halves (one forward of n).
at::Tensor doubled_output(GraphedForward& net, const at::Tensor& x, const at::Tensor& tm, const at::Tensor& y,
                          const SampleOptions& o, HeadBudget& heads, double t) {
  const int64_t n = x.size(0) / 2;
  if (guided_at(o, t)) return guided_output(net, x.narrow(0, 0, n), tm, y, o, heads, noise_level(o, t));
  heads.set(noise_level(o, t), false);
  const at::Tensor out = net(x.narrow(0, 0, n), tm.narrow(0, 0, n), y.narrow(0, 0, n));
  return at::cat({out, out});
}

// DDPM / DDIM over a respaced chain; with CFG the state stays doubled so that the per-step noise is DiT's.
at::Tensor ancestral_loop(GraphedForward& net, const GaussianDiffusion& chain, at::Tensor x, const at::Tensor& y,
                          const SampleOptions& o, HeadBudget& heads, const std::function<void()>& on_step,
                          int64_t& nfe) {
  const bool cfg = o.cfg_scale > 1.0;
  const int64_t B = x.size(0);
  const AncestralUpdate update = sampler_record(o.sampler).update;
  for (int64_t i = chain.num_steps() - 1; i >= 0; --i) {
    const at::Tensor t = at::full({B}, i, at::TensorOptions().dtype(at::kLong).device(x.device()));
    const at::Tensor tm = chain.model_timesteps(t);
    const auto t_model = static_cast<double>(chain.schedule().timestep_map[static_cast<size_t>(i)]);
    if (!cfg) heads.set(noise_level(o, t_model), false);
    const at::Tensor out = cfg ? doubled_output(net, x, tm, y, o, heads, t_model) : net(x, tm, y);
    nfe += guided_at(o, t_model) ? 2 : 1;
    const auto p = chain.p_mean_variance(out, x, t, o.clip_denoised);
    const at::Tensor z = at::randn_like(x);  // drawn every step, also at t = 0 (DiT's RNG order)
    x = update(chain, p, x, t, z, o.solver.eta, i == 0);
    if (on_step) on_step();
  }
  return cfg ? x.narrow(0, 0, x.size(0) / 2) : x;
}

// The prediction channels (n, C, H, W) the solvers integrate (ε; a flow model's velocity, noise or score): guided on
// the doubled batch inside the interval, one conditional forward outside it. y holds [labels; null] when CFG is on.
EpsModel dit_prediction(GraphedForward& net, const at::Tensor& y, const SampleOptions& o, HeadBudget& heads,
                        int64_t& nfe) {
  return [&net, y, &o, &heads, &nfe](const at::Tensor& x, double t) {
    const int64_t n = x.size(0), C = x.size(1);
    const bool guided = guided_at(o, t);
    nfe += guided ? 2 : 1;
    const at::TensorOptions f = at::TensorOptions().dtype(at::kFloat).device(x.device());
    if (!guided) {
      heads.set(noise_level(o, t), false);
      return net(x, at::full({n}, t, f), y.narrow(0, 0, n)).narrow(1, 0, C);
    }
    const at::Tensor out = guided_output(net, x, at::full({2 * n}, t, f), y, o, heads, noise_level(o, t));
    return out.narrow(0, 0, n).narrow(1, 0, C);
  };
}

// A flow chain's arguments from the options; the caller adds the noise, the prediction and the draws.
FlowChainArgs flow_args(const SampleOptions& o, const std::function<void()>& on_step) {
  FlowChainArgs a;
  a.process = &o.flow;
  a.steps = o.ode_steps;
  a.solver = o.solver;
  if (on_step) a.on_step = [on_step](int64_t, const at::Tensor&) { on_step(); };
  return a;
}

// A flow model's chain from `noise` (n, C, H, W); with CFG the SDE's draws are made for the doubled batch, of which
// the state is the first half (SiT steps [z; z] and guides from its first half).
at::Tensor flow_loop(GraphedForward& net, const at::Tensor& noise, const at::Tensor& y, const SampleOptions& o,
                     HeadBudget& heads, const std::function<void()>& on_step, int64_t& nfe) {
  FlowChainArgs a = flow_args(o, on_step);
  a.noise = noise;
  a.predict = dit_prediction(net, y, o, heads, nfe);
  a.draw = [cfg = o.cfg_scale > 1.0](const at::Tensor& x) {
    if (!cfg) return at::randn_like(x);
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] *= 2;
    return at::randn(shape, x.options()).narrow(0, 0, x.size(0));
  };
  return sampler_record(o.sampler).flow_chain(a);
}

}  // namespace

// The network evaluations per image of a flow chain, found by running it on a stand-in prediction of one element.
int64_t flow_planned_nfe(const SampleOptions& o, const GaussianDiffusion&) {
  int64_t nfe = 0;
  FlowChainArgs a = flow_args(o, {});
  a.noise = at::zeros({1, 1, 1, 1});
  a.predict = [&](const at::Tensor& x, double t) {
    nfe += guided_at(o, t) ? 2 : 1;
    return at::zeros_like(x);
  };
  a.draw = [](const at::Tensor& x) { return at::zeros_like(x); };
  sampler_record(o.sampler).flow_chain(a);
  return nfe;
}

int64_t planned_nfe(const SampleOptions& o, const GaussianDiffusion& chain) {
  if (sampler_record(o.sampler).adaptive) return -1;
  return objective_record(o.objective).planned_nfe(o, chain);
}

int64_t ddpm_planned_nfe(const SampleOptions& o, const GaussianDiffusion& chain) {
  int64_t nfe = 0;
  auto count = [&](double t) { nfe += guided_at(o, t) ? 2 : 1; };
  if (!is_ode_sampler(o.sampler)) {
    for (int64_t t : chain.schedule().timestep_map) count(static_cast<double>(t));
    return nfe;
  }
  const SamplerRecord& r = sampler_record(o.sampler);
  const OdeGrid g = ode_grid(o, chain);
  for (int64_t i = 0; i < g.steps(); ++i) {
    const bool last = i + 1 == g.steps();
    for (int e = 0; e < (last && r.last_step_single ? 1 : r.evals_per_step); ++e)
      count(g.timesteps[static_cast<size_t>(std::min(i + e, g.steps() - 1))]);  // Heun: the slope at the step's end
  }
  return nfe;
}

at::Tensor sample_loop(DiT& model, const GaussianDiffusion& chain, const at::Tensor& noise, const at::Tensor& labels,
                       const SampleOptions& o, const std::function<void()>& on_step, int64_t* nfe,
                       GraphedForward* graphs) {
  torch::NoGradGuard ng;
  const DiTOptions& mo = model->options;
  const bool cfg = o.cfg_scale > 1.0;
  // Configs are checked by validate_dit_experiment; these are the invariants forward_with_cfg relies on.
  TORCH_CHECK(!cfg || mo.class_dropout_prob > 0, "sample_loop: CFG needs a null class");
  TORCH_CHECK(!cfg || o.cfg_channels != CfgChannels::three || mo.in_channels >= 3,
              "sample_loop: cfg_channels three needs 3 channels");
  const int64_t n = noise.size(0);
  at::Tensor y = labels.to(noise.device(), at::kLong);
  if (cfg) y = at::cat({y, at::full({n}, mo.num_classes, y.options())});  // null class index = num_classes
  int64_t count = 0;
  at::Tensor x;
  HeadBudget heads(model, o);
  std::unique_ptr<GraphedForward> own;  // graphs of this call alone when the caller keeps none across calls
  if (!graphs) own = std::make_unique<GraphedForward>(model, o.cuda_graph);
  GraphedForward& net = graphs ? *graphs : *own;
  TORCH_CHECK(runs_on(o.sampler, o.objective), "sample_loop: sampler ", config::to_string(o.sampler),
              " does not run on this objective");
  x = objective_record(o.objective).reverse({net, chain, noise, y, o, heads, on_step, count});
  if (nfe) *nfe += count;
  return x;
}

at::Tensor ddpm_reverse(const ReverseArgs& a) {
  const SampleOptions& o = a.options;
  if (!is_ode_sampler(o.sampler))
    return ancestral_loop(a.net, a.chain, o.cfg_scale > 1.0 ? at::cat({a.noise, a.noise}) : a.noise, a.y, o, a.heads,
                          a.on_step, a.nfe);
  const EpsModel eps = dit_prediction(a.net, a.y, o, a.heads, a.nfe);
  const OdeGrid grid = ode_grid(o, a.chain);
  const StepHook hook = [&](int64_t, const at::Tensor&) {
    if (a.on_step) a.on_step();
  };
  return sampler_record(o.sampler).chain(eps, a.noise, grid, hook, o.clip_denoised);
}

at::Tensor flow_reverse(const ReverseArgs& a) {
  return flow_loop(a.net, a.noise, a.y, a.options, a.heads, a.on_step, a.nfe);
}

at::Tensor to_uint8_nhwc(const at::Tensor& samples) {
  return (127.5 * samples + 128.0).clamp(0.0, 255.0).permute({0, 2, 3, 1}).to(at::kCPU).to(at::kByte).contiguous();
}

}  // namespace moh::diffusion
