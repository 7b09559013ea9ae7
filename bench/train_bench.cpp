#include "bench/train_bench.h"

#include "bench/common.h"

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cxxopts.hpp>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/op_profile.h"
#include "core/error.h"
#include "core/parse.h"
#include "core/platform/amp.h"
#include "core/platform/run_context.h"
#include "core/train/optimizer.h"
#include "diffusion/objective.h"
#include "diffusion/sampler.h"
#include "experiments/dit_experiment.h"
#include "experiments/registry.h"
#include "vision/nn/fused_ops.h"

namespace moh::bench {

namespace {

using Clock = std::chrono::steady_clock;

void sync(const RunContext& ctx) {
  if (ctx.device.is_cuda()) at::zeros({1}, at::TensorOptions().device(ctx.device)).cpu();  // waits for the stream
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A product this long is long enough to time (and the largest size is not tried once one takes longer).
constexpr double kGemmProbeSeconds = 0.05;

// Rate of an n×n×n matrix product in `dtype` on the context's device (TFLOP/s, median of 5), n doubling from 256 up
// to `n_max` while one product takes under kGemmProbeSeconds: where LibTorch has no fast kernel for the dtype (bf16
// on a CPU without AVX-512 runs a scalar fallback ~100x slower than fp32) a fixed 2048³ product would take minutes.
double gemm_tflops(const RunContext& ctx, at::ScalarType dtype, int64_t n_max) {
  const auto opts = at::TensorOptions().device(ctx.device).dtype(dtype);
  for (int64_t n = 256;; n *= 2) {
    const at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
    at::mm(a, b);
    sync(ctx);
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      const auto s = Clock::now();
      at::mm(a, b);
      sync(ctx);
      t.push_back(seconds_since(s));
      if (t.back() > kGemmProbeSeconds && n < n_max) break;  // long enough: time this size properly
    }
    if (t.size() == 5 && (median(t) >= kGemmProbeSeconds || n >= n_max))
      return 2.0 * static_cast<double>(n * n * n) / median(t) / 1e12;
    if (t.size() < 5) {  // the probe was long: five products at this size, no larger one
      n_max = n;
      n /= 2;
    }
  }
}

struct Common {
  std::string model;
  std::vector<int64_t> batches{8};  ///< --batch: one size, or a list to sweep (moh bench train)
  int64_t batch = 8, steps = 5, warmup = 2, profile = 0;
  double peak_tflops = 0;
  bool json = false;
  RunContext ctx;
  cxxopts::ParseResult args;
};

// "32,64,128" -> {32, 64, 128}: positive sizes, ascending (a sweep stops at the first that does not fit).
std::vector<int64_t> parse_batches(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const std::optional<int64_t> v = parse_int(item);
    if (!v || *v < 1 || (!out.empty() && *v <= out.back()))
      throw UserError("--batch " + text, "expected positive sizes in ascending order", "e.g. --batch 32,64,128");
    out.push_back(*v);
  }
  if (out.empty()) throw UserError("--batch", "no size given", "e.g. --batch 32");
  return out;
}

Common parse_common(cxxopts::Options& opts, int argc, char** argv, bool& help) {
  auto flag = opts.add_options();
  flag("model", "registry name (moh info --list)", cxxopts::value<std::string>());
  flag("batch", "images per step; moh bench train takes a list (32,64,128,256) and reports the best that fits",
       cxxopts::value<std::string>()->default_value("8"));
  flag("steps", "timed repetitions (median reported)", cxxopts::value<int64_t>()->default_value("5"));
  flag("warmup", "untimed repetitions first", cxxopts::value<int64_t>()->default_value("2"));
  flag("precision",
       "fp32, tf32 (fp32 with TF32 products on CUDA), bf16 (autocast), fp16 (CUDA, loss scaling) or auto (bf16 on "
       "CUDA; measured on a CPU)",
       cxxopts::value<std::string>()->default_value("fp32"));
  flag("attention-path", "MoH path of the attention layers: auto, dense or sparse",
       cxxopts::value<std::string>()->default_value("auto"));
  flag("img-size", "input side in pixels/latents (0 = the variant's)", cxxopts::value<int64_t>()->default_value("0"));
  flag("device", "auto, cpu or cuda[:N]", cxxopts::value<std::string>()->default_value("auto"));
  flag("peak-tflops", "device peak for MFU (0 = a GEMM measured in this run)",
       cxxopts::value<double>()->default_value("0"));
  flag("profile",
       "profile one more step: time per op class and the N operators that took most of it (CUDA: kernels' "
       "device time)",
       cxxopts::value<int64_t>()->default_value("0"));
  flag("json", "print one JSON object");
  flag("h,help", "show this help");
  Common c;
  help = !parse_bench_flags(opts, argc, argv, c.args);
  if (help) return c;
  if (!c.args.count("model")) throw UserError(argv[0], "--model is required", "e.g. --model MoH-DiT-S/2-90");
  c.model = c.args["model"].as<std::string>();
  c.batches = parse_batches(c.args["batch"].as<std::string>());
  c.batch = c.batches.front();
  c.steps = c.args["steps"].as<int64_t>();
  c.warmup = c.args["warmup"].as<int64_t>();
  c.profile = c.args["profile"].as<int64_t>();
  c.peak_tflops = c.args["peak-tflops"].as<double>();
  c.json = c.args.count("json") > 0;
  if (c.batch < 1 || c.steps < 1 || c.warmup < 0 || c.profile < 0 || c.peak_tflops < 0)
    throw UserError(argv[0], "--batch and --steps must be positive, --warmup/--profile/--peak-tflops not negative", "");
  const Precision p = config::enum_from_string<Precision>(c.args["precision"].as<std::string>(), "--precision");
  c.ctx = RunContext::create(c.args["device"].as<std::string>(), p, 0);
  configure_cpu_threads();
  return c;
}

// One more call of `step` recorded by StepProfiler: time per op class (device time of its kernels on CUDA, host self
// time on the CPU) and the `c.profile` operators that took most of it.
template <class F>
nlohmann::json profile_step(const Common& c, F&& step) {
  StepProfiler prof(c.ctx.device.is_cuda());
  sync(c.ctx);
  const auto s = Clock::now();
  prof.start();
  step();
  sync(c.ctx);
  const std::vector<ProfileEvent> events = prof.stop();
  const double wall_ms = seconds_since(s) * 1e3;
  const ClassProfile p = classify_profile(events);
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < p.ops.size() && static_cast<int64_t>(i) < c.profile; ++i)
    top.push_back({{"op", p.ops[i].name}, {"ms", p.ops[i].self_ms}, {"calls", p.ops[i].calls}});
  return {{"time", p.device ? "device (kernels, Kineto)" : "host self time"},
          {"wall_ms", wall_ms},
          {"classes_ms", p.ms},
          {"busy_ms", p.busy_ms},
          {"span_ms", p.span_ms},
          {"top_ops", top}};
}

// Times `step` (warm-up first), optionally profiles one more call; fills the common JSON fields.
template <class F>
nlohmann::json time_steps(const Common& c, F&& step) {
  const Tf32Scope tf32(c.ctx.precision);
  for (int64_t i = 0; i < c.warmup; ++i) step();
  sync(c.ctx);
  std::vector<double> t;
  for (int64_t i = 0; i < c.steps; ++i) {
    const auto s = Clock::now();
    step();
    sync(c.ctx);
    t.push_back(seconds_since(s));
  }
  nlohmann::json out{{"machine", machine_record()},
                     {"model", c.model},
                     {"batch", c.batch},
                     {"device", c.ctx.device.str()},
                     {"precision", config::to_string(c.ctx.precision)},
                     {"threads", at::get_num_threads()},
                     {"libtorch", libtorch_version()},
                     {"step_s", median(t)},
                     {"step_s_min", *std::min_element(t.begin(), t.end())},
                     {"img_per_s", static_cast<double>(c.batch) / median(t)}};
  if (c.profile > 0) out["profile"] = profile_step(c, step);
  return out;
}

// Adds FLOP and MFU fields: fwd_flops counted on one forward pass of the batch.
void add_flops(nlohmann::json& out, const Common& c, double fwd_flops, double step_flops) {
  const at::ScalarType dt = c.ctx.precision == Precision::bf16   ? at::kBFloat16
                            : c.ctx.precision == Precision::fp16 ? at::kHalf
                                                                 : at::kFloat;  // fp32, tf32
  const Tf32Scope tf32(c.ctx.precision);  // the measured peak of a tf32 run is TF32's
  double peak = c.peak_tflops;
  std::string source = "--peak-tflops";
  // Without native bf16, LibTorch's bf16 product is a scalar fallback that the step's own (smaller, transposed)
  // products outrun (an MFU against it came out above 100 %): the fp32 product is what this machine's GEMMs can do.
  const bool bf16_fallback = dt == at::kBFloat16 && !c.ctx.device.is_cuda() && !cpu_has_native_bf16();
  if (peak <= 0) {
    peak = gemm_tflops(c.ctx, bf16_fallback ? at::kFloat : dt, c.ctx.device.is_cuda() ? 8192 : 2048);
    source = bf16_fallback ? "measured fp32 GEMM (no native bf16 on this CPU)" : "measured GEMM";
  }
  const double img_s = out["img_per_s"].get<double>();
  out["fwd_gflops_per_img"] = fwd_flops / static_cast<double>(c.batch) / 1e9;
  out["step_gflops_counted"] = step_flops / 1e9;
  out["achieved_tflops"] = 3.0 * fwd_flops / static_cast<double>(c.batch) * img_s / 1e12;
  out["peak_tflops"] = peak;
  out["peak_source"] = source;
  out["mfu"] = out["achieved_tflops"].get<double>() / peak;
}

// Times the training `step` (time_steps), then counts the FLOPs of one `forward` of the batch (no grad, under
// autocast) and of one whole step, and adds the FLOP / MFU fields.
template <class Step, class Fwd>
nlohmann::json time_and_count(const Common& c, Step&& step, Fwd&& forward) {
  nlohmann::json out = time_steps(c, step);
  double fwd = 0, all = 0;
  {
    torch::NoGradGuard ng;
    FlopCounter fc;
    AutocastScope ac(c.ctx);
    forward();
    fwd = fc.flops();
  }
  {
    FlopCounter fc;
    step();
    all = fc.flops();
  }
  add_flops(out, c, fwd, all);
  return out;
}

void print_profile(const nlohmann::json& p) {
  double total = 0;
  for (const auto& [k, v] : p["classes_ms"].items()) total += v.get<double>();
  std::cout << "  profile of one step (" << p["time"].get<std::string>() << "; wall " << std::fixed
            << std::setprecision(2) << p["wall_ms"].get<double>() << " ms):\n";
  for (const auto& [k, v] : p["classes_ms"].items())
    std::cout << "  " << std::right << std::setw(10) << v.get<double>() << " ms " << std::setw(5)
              << std::setprecision(1) << 100.0 * v.get<double>() / std::max(total, 1e-9) << " %  " << k << "\n"
              << std::setprecision(2);
  for (const auto& r : p["top_ops"])
    std::cout << "  " << std::right << std::setw(10) << r["ms"].get<double>() << " ms " << std::setw(6)
              << r["calls"].get<int64_t>() << "x  " << r["op"].get<std::string>() << "\n";
}

void print(const nlohmann::json& out, bool json) {
  if (json) {
    std::cout << out.dump() << std::endl;
    return;
  }
  std::cout << out["model"].get<std::string>() << "  batch " << out["batch"] << "  " << out["device"].get<std::string>()
            << " " << out["precision"].get<std::string>() << "\n";
  for (const char* k : {"step_s", "img_per_s", "fwd_gflops_per_img", "achieved_tflops", "peak_tflops", "mfu"})
    if (out.contains(k)) std::cout << "  " << std::left << std::setw(20) << k << out[k].get<double>() << "\n";
  if (out.contains("profile")) print_profile(out["profile"]);
}

int64_t resolved_size(const Common& c, int64_t variant) {
  const int64_t s = c.args["img-size"].as<int64_t>();
  return s > 0 ? s : variant;
}

}  // namespace

namespace {

// An allocation that failed on the device (a batch that does not fit), not a bug.
bool out_of_memory(const c10::Error& e) {
  const std::string m = e.what();
  return m.find("out of memory") != std::string::npos || m.find("Tried to allocate") != std::string::npos;
}

nlohmann::json train_row(Common& c, experiments::BenchRequest r, const experiments::ModelFamily& family) {
  c.batch = r.batch;
  const experiments::BenchStep b = family.bench_step(r);
  nlohmann::json out = time_and_count(c, b.step, b.forward);
  out["attention_path"] = b.attention_path;
  out["input"] = b.input;
  out["optim_impl"] = config::to_string(r.optim);
  out["ema_decay"] = r.ema_decay;
  out["grad_checkpoint"] = r.grad_checkpoint ? "blocks" : "none";
  out["router"] = r.plain_router ? "plain" : "compact";
  out["fused"] = config::to_string(r.fused);
  out["fused_resolved"] = nn::use_fused_ops(r.fused, r.ctx.device);
  out["what"] = "train_step";
  return out;
}

// The sweep's summary: the batch with the most images/s among those that fit.
nlohmann::json best_of(const std::vector<nlohmann::json>& rows, int64_t first_oom) {
  const nlohmann::json* best = nullptr;
  for (const auto& r : rows)
    if (!best || r["img_per_s"].get<double>() > (*best)["img_per_s"].get<double>()) best = &r;
  nlohmann::json s{{"what", "train_batch_sweep"}, {"batches_fitting", rows.size()}};
  if (best)
    s["best_batch"] = (*best)["batch"], s["best_img_per_s"] = (*best)["img_per_s"], s["best_mfu"] = (*best)["mfu"];
  if (first_oom > 0) s["first_batch_out_of_memory"] = first_oom;
  return s;
}

}  // namespace

int train_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "One training step on random data: step time, images/s, FLOPs, MFU");
  auto flag = opts.add_options();
  flag("optim-impl", "AdamW, clipping and EMA over the parameters: auto, for_loop, foreach or fused",
       cxxopts::value<std::string>()->default_value("auto"));
  flag("ema", "EMA decay updated every step as a run with train.ema_decay (0 = no EMA; DiT's train.py: 0.9999)",
       cxxopts::value<double>()->default_value("0"));
  flag("grad-checkpoint", "activation checkpointing as train.grad_checkpoint: none or blocks",
       cxxopts::value<std::string>()->default_value("none"));
  flag("router", "MoH routers: compact (what runs train) or plain (the official op sequence, the reference)",
       cxxopts::value<std::string>()->default_value("compact"));
  flag("fused", "the fused block operations and weight working copies, as model.fused: auto, on or off",
       cxxopts::value<std::string>()->default_value("auto"));
  bool help = false;
  Common c = parse_common(opts, argc, argv, help);
  if (help) return 0;
  experiments::BenchRequest r;
  r.name = c.model;
  r.ctx = c.ctx;
  r.img_size = c.args["img-size"].as<int64_t>();
  r.path = config::enum_from_string<AttentionPath>(c.args["attention-path"].as<std::string>(), "--attention-path");
  r.optim = resolve_optim_impl(
      config::enum_from_string<OptimImpl>(c.args["optim-impl"].as<std::string>(), "--optim-impl"), c.ctx.device);
  r.ema_decay = c.args["ema"].as<double>();
  if (!(r.ema_decay >= 0 && r.ema_decay < 1)) throw UserError("--ema", "must be in [0, 1)", "e.g. 0.9999");
  r.grad_checkpoint = config::enum_from_string<GradCheckpoint>(c.args["grad-checkpoint"].as<std::string>(),
                                                               "--grad-checkpoint") == GradCheckpoint::blocks;
  const std::string router = c.args["router"].as<std::string>();
  if (router != "compact" && router != "plain") throw UserError("--router " + router, "unknown", "compact or plain");
  r.plain_router = router == "plain";
  r.fused = config::enum_from_string<FusedMode>(c.args["fused"].as<std::string>(), "--fused");
  nn::use_fused_ops(r.fused, c.ctx.device);  // `on` where no kernels serve the device: refused before any work
  const experiments::ModelFamily& family = experiments::find_model_family(c.model, "--model " + c.model);
  if (!family.bench_step)
    throw UserError("--model", c.model + " is a fixed network", "pick a classifier or DiT variant");
  std::vector<nlohmann::json> rows;
  int64_t first_oom = 0;
  for (int64_t batch : c.batches) {
    torch::manual_seed(0);
    r.batch = batch;
    try {
      rows.push_back(train_row(c, r, family));
    } catch (const c10::Error& e) {
      if (!out_of_memory(e) || c.batches.size() == 1) throw;
      first_oom = batch;  // larger batches do not fit either
      break;
    }
    print(rows.back(), c.json);
  }
  if (c.batches.size() > 1) {
    const nlohmann::json s = best_of(rows, first_oom);
    if (c.json)
      std::cout << s.dump() << std::endl;
    else
      std::cout << "best batch " << s.value("best_batch", nlohmann::json()).dump() << ": "
                << s.value("best_img_per_s", nlohmann::json()).dump() << " img/s"
                << (first_oom > 0 ? " (batch " + std::to_string(first_oom) + " does not fit)" : "") << "\n";
  }
  return 0;
}

namespace {
int64_t parse_solver_steps(const std::string& spec) {
  const std::optional<int64_t> n = parse_int(spec);
  if (!n || *n < 2) throw UserError("--chain " + spec, "an ODE solver takes a step count >= 2", "e.g. --chain 12");
  return *n;
}

std::array<double, 2> parse_interval(const std::string& text) {
  const size_t comma = text.find(',');
  const std::optional<double> lo = parse_double(text.substr(0, comma));
  const std::optional<double> hi = comma == std::string::npos ? std::nullopt : parse_double(text.substr(comma + 1));
  if (!lo || !hi || !(0 <= *lo && *lo <= *hi && *hi <= 1))
    throw UserError("--cfg-interval " + text, "expected lo,hi with 0 <= lo <= hi <= 1", "e.g. --cfg-interval 0,0.5");
  return {*lo, *hi};
}
}  // namespace

int sample_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Class-conditional DiT sampling on random weights: images/s of a whole reverse chain");
  auto flag = opts.add_options();
  flag("chain", "timestep respacing of the chain (\"250\" = DiT's DDPM default, \"ddim50\", ...)",
       cxxopts::value<std::string>()->default_value("250"));
  flag("cfg-scale", "guidance scale (1 = no batch doubling)", cxxopts::value<double>()->default_value("4.0"));
  flag("topk", "routed heads per token of every routed MoH layer (the head budget at inference; -1 = as trained)",
       cxxopts::value<int64_t>()->default_value("-1"));
  flag("sampler", "ddpm or ddim over --chain, or an ODE solver (dpm++2m, euler, heun) with --chain solver steps",
       cxxopts::value<std::string>()->default_value(""));
  flag("cfg-interval", "guide only where lo <= t / (T - 1) <= hi", cxxopts::value<std::string>()->default_value("0,1"));
  flag("cuda-graph", "replay the network evaluations as CUDA graphs: auto or off",
       cxxopts::value<std::string>()->default_value("auto"));
  bool help = false;
  Common c = parse_common(opts, argc, argv, help);
  if (help) return 0;
  if (c.batches.size() > 1) throw UserError("--batch", "moh bench sample takes one size", "e.g. --batch 64");
  diffusion::DiTOptions o = diffusion::dit_options(c.model);  // a UserError for any other name
  o.input_size = resolved_size(c, o.input_size);
  o.path = config::enum_from_string<AttentionPath>(c.args["attention-path"].as<std::string>(), "--attention-path");
  torch::manual_seed(0);
  diffusion::DiT model(o);
  model->to(c.ctx.device);
  model->eval();
  const std::string spec = c.args["chain"].as<std::string>(), sampler = c.args["sampler"].as<std::string>();
  diffusion::SampleOptions so;
  so.sampler = !sampler.empty()             ? config::enum_from_string<SamplerKind>(sampler, "--sampler")
               : spec.rfind("ddim", 0) == 0 ? SamplerKind::ddim
                                            : SamplerKind::ddpm;
  so.objective = diffusion::objective_of_sampler(so.sampler);  // dopri5, sde: flow models
  if (diffusion::is_ode_sampler(so.sampler)) so.ode_steps = parse_solver_steps(spec);
  const diffusion::GaussianDiffusion chain = diffusion::sampling_chain(so.sampler, 1000, spec);
  so.cfg_interval = parse_interval(c.args["cfg-interval"].as<std::string>());
  so.cuda_graph = config::enum_from_string<CudaGraphMode>(c.args["cuda-graph"].as<std::string>(), "--cuda-graph") ==
                  CudaGraphMode::automatic;
  so.cfg_scale = c.args["cfg-scale"].as<double>();
  so.topk = c.args["topk"].as<int64_t>();
  experiments::check_sampling_topk(o, so.topk, "--topk");
  // DiT's guidance of the first 3 channels (latents); pixel models with fewer channels guide every ε channel.
  so.cfg_channels = o.in_channels >= 3 ? CfgChannels::three : CfgChannels::all;
  const auto dev = at::TensorOptions().device(c.ctx.device);
  const at::Tensor labels = at::randint(0, o.num_classes, {c.batch}, dev.dtype(at::kLong));
  diffusion::GraphedForward graphs(model, so.cuda_graph);  // kept across the repetitions, as across a run's batches
  int64_t nfe = 0;                                         // the last repetition's (an adaptive sampler's varies)
  auto run = [&] {
    torch::NoGradGuard ng;
    AutocastScope ac(c.ctx);
    const at::Tensor noise = at::randn({c.batch, o.in_channels, o.input_size, o.input_size}, dev);
    nfe = 0;
    diffusion::sample_loop(model, chain, noise, labels, so, {}, &nfe, &graphs);
  };
  nlohmann::json out = time_steps(c, run);
  out["what"] = "sample";
  out["sampler"] = config::to_string(so.sampler);
  out["chain"] = spec;
  out["cfg_scale"] = so.cfg_scale;
  out["cfg_interval"] = so.cfg_interval;
  out["topk"] = so.topk;
  out["nfe"] = nfe;
  out["cuda_graphs"] = graphs.graphs();
  if (!graphs.fallback_reason().empty()) out["cuda_graph_fallback"] = graphs.fallback_reason();
  out["network_evals_per_s"] = static_cast<double>(nfe) / out["step_s"].get<double>();
  out["attention_path"] = config::to_string(o.path);
  print(out, c.json);
  return 0;
}

}  // namespace moh::bench
