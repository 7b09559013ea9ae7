#include "experiments/dit_family.h"

#include <torch/optim/adamw.h>

#include <cstdio>

#include "core/error.h"
#include "core/platform/amp.h"
#include "core/train/checkpoint.h"
#include "core/train/working_copies.h"
#include "diffusion/autoencoder_kl.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/dit.h"
#include "experiments/dit_experiment.h"
#include "experiments/train_tasks.h"
#include "vision/nn/attention_core.h"

namespace moh::experiments {

namespace {

ModelSummary summarize(const std::string& name) {
  const diffusion::DiTOptions o = diffusion::dit_options(name);
  ModelSummary s = parameter_summary(name, "dit", *diffusion::DiT(o));
  s.layers = o.depth;
  s.moh_layers = o.attention == AttentionMode::mha ? 0 : o.depth;
  s.routed_layers = o.routed_layers();
  s.active_ratio = o.active_ratio();
  return s;
}

// t as DiT's timestep embedding reads it (t.float()): a DDPM timestep 0…T−1 or a flow model's time in [0, 1].
constexpr const char* kForwardInputs = "x (B,C,I,I) float, t (B) int or float, y (B) int";

// The weights decide input size, channels and classes (an official DiT-XL-2-512x512.pt builds a 64-token-wide model).
TensorMap forward(const ForwardRequest& r) {
  check_forward_inputs(r, {"x", "t", "y"}, {"out"}, kForwardInputs);
  diffusion::DiTOptions o = diffusion::dit_options_for_weights(dit_options_for(r.model, 0), r.weights);
  o.validate();
  diffusion::DiT model(o);
  load_module_tensors(*model, r.weights, r.weights_origin, r.model.weights_allow_missing);
  model->eval();
  const at::Tensor x = forward_input(r, "x", at::kFloat, 4, kForwardInputs);
  if (x.size(1) != o.in_channels || x.size(2) != o.input_size || x.size(3) != o.input_size)
    throw UserError("--input " + r.inputs_origin, "x has shape " + c10::str(x.sizes()),
                    "the weights are for (B, " + std::to_string(o.in_channels) + ", " + std::to_string(o.input_size) +
                        ", " + std::to_string(o.input_size) + ")");
  const at::Tensor t = forward_input(r, "t", at::kFloat, 1, kForwardInputs);
  const at::Tensor y = forward_input(r, "y", at::kLong, 1, kForwardInputs);
  return {{"out", model->forward(x, t, y).out}};
}

BenchStep bench_step(const BenchRequest& r) {
  diffusion::DiTOptions o = r.experiment ? dit_options_for(*r.experiment) : diffusion::dit_options(r.name);
  if (!r.experiment) {
    if (r.img_size > 0) o.input_size = r.img_size;
    o.path = r.path;
    o.grad_checkpoint = r.grad_checkpoint;
    o.fused = r.fused;
  }
  diffusion::DiT model(o);
  model->to(r.ctx.device);
  model->train();
  nn::set_plain_routers(*model, r.plain_router);
  auto opt = std::make_shared<BenchOptimizer>(*model, r, 1e-4, 0.0, 0.0, [&] {  // DiT's train.py: no clipping
    diffusion::DiT copy(o);
    copy->to(r.ctx.device);
    return copy.ptr();
  });
  const auto dev = at::TensorOptions().device(r.ctx.device);
  const at::Tensor x0 = at::randn({r.batch, o.in_channels, o.input_size, o.input_size}, dev);
  const at::Tensor y = at::randint(0, o.num_classes, {r.batch}, dev.dtype(at::kLong));
  const at::Tensor t = at::randint(0, 1000, {r.batch}, dev.dtype(at::kLong));
  const RunContext ctx = r.ctx;
  auto chain = std::make_shared<diffusion::GaussianDiffusion>(diffusion::GaussianDiffusion::base(1000));
  BenchStep b;
  b.step = [=]() mutable {
    {
      const WorkingCopyScope copies(opt->copies());
      diffusion_backward(model, *chain, x0, y, 0.01, ctx, opt->scaler());
    }
    opt->step(*model);
  };
  b.forward = [=]() mutable { model->forward(x0, t, y); };
  b.attention_path = config::to_string(o.path);
  b.input = {o.in_channels, o.input_size, o.input_size};
  return b;
}

std::string path_word(AttentionPath p) {
  return p == AttentionPath::sparse ? "**sparse**" : "dense";
}

// Rows of a DiT variant at `image_px`: consecutive layers with the same heads and active heads share a row.
std::string path_rows(const std::string& name, int64_t image_px, int64_t latent_factor) {
  diffusion::DiTOptions o = diffusion::dit_options(name);
  o.input_size = image_px / latent_factor;
  const int64_t tokens = o.num_patches();
  std::string rows;
  for (int64_t i = 0; i < o.depth;) {
    const nn::MoHAttentionOptions a = o.layer(i);
    int64_t j = i + 1;
    while (j < o.depth && o.layer(j).num_heads == a.num_heads && o.layer(j).active_heads() == a.active_heads()) ++j;
    const double active = static_cast<double>(a.active_heads()) / static_cast<double>(a.num_heads);
    const auto word = [&](nn::PathTarget target) { return path_word(nn::auto_attention_path(active, tokens, target)); };
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %lld px, %lld tokens | %lld–%lld | %lld of %lld (%.2f) | %s | %s | %s |\n",
                  name.c_str(), static_cast<long long>(image_px), static_cast<long long>(tokens),
                  static_cast<long long>(i), static_cast<long long>(j - 1), static_cast<long long>(a.active_heads()),
                  static_cast<long long>(a.num_heads), active, word(nn::PathTarget::cpu_libtorch2).c_str(),
                  word(nn::PathTarget::cpu_libtorch1).c_str(), word(nn::PathTarget::cuda).c_str());
    rows += line;
    i = j;
  }
  return rows;
}

// The latent variants at 256 px (SD-VAE latents 32², VA-VAE's 16²: the variant's own input side), XL at 512 px, and
// the Fashion-MNIST pixel model.
std::string attention_path_rows() {
  std::string rows;
  for (const auto& [name, o] : diffusion::dit_variants())
    if (o.attention == AttentionMode::moh && name.find("Pixel") == std::string::npos)
      rows += path_rows(name, 256, 256 / o.input_size);
  rows += path_rows("MoH-DiT-XL/2-90", 512, 8) + path_rows("MoH-DiT-XL/2-75", 512, 8);
  return rows + path_rows("MoH-DiT-Pixel/4-75", 28, 1);
}

std::string vae_inputs(VaeKind kind) {
  return "x (B,3,H,W) in [-1,1], H and W multiples of " + std::to_string(diffusion::vae_spec(kind).options.factor());
}

TensorMap vae_forward(VaeKind kind, const ForwardRequest& r) {
  const std::string needs = vae_inputs(kind);
  check_forward_inputs(r, {"x"}, {"latent_mean", "latent_logvar", "recon"}, needs);
  const diffusion::SdVaeOptions& kind_options = diffusion::vae_spec(kind).options;
  const TensorMap named =
      diffusion::diffusers_vae_tensors(r.weights, static_cast<int64_t>(kind_options.block_out_channels.size()));
  diffusion::AutoencoderKL vae(diffusion::vae_options_from_tensors(named, kind_options, r.weights_origin));
  load_module_tensors(*vae, named, r.weights_origin, r.model.weights_allow_missing);
  vae->eval();
  const at::Tensor x = forward_input(r, "x", at::kFloat, 4, needs);
  const int64_t f = vae->options.factor();
  if (x.size(1) != 3 || x.size(2) % f || x.size(3) % f)
    throw UserError("--input " + r.inputs_origin, "x has shape " + c10::str(x.sizes()), needs);
  const diffusion::LatentPosterior post = vae->encode(x);
  return {{"latent_mean", post.mean}, {"latent_logvar", post.logvar}, {"recon", vae->decode(post.mean)}};
}

}  // namespace

ModelFamily dit_family() {
  ModelFamily f;
  f.id = "dit";
  f.measure = ModelFamily::Measure::sample_fid;
  f.fixed_on_resume = {"model.name", "model.attention", "model.num_classes", "model.img_size", "diffusion.vae"};
  f.guarded_on_resume = {"diffusion.steps"};
  f.title = "DiT / MoH-DiT (diffusion)";
  f.names = [] { return names_of(diffusion::dit_variants()); };
  f.summarize = summarize;
  f.forward = forward;
  f.forward_inputs = kForwardInputs;
  f.validate = [](const ExperimentConfig& cfg, ExperimentUse use) {
    validate_dit_experiment(cfg, use != ExperimentUse::extract_latents, use == ExperimentUse::sample);
  };
  f.task = experiments::make_dit_task;
  f.active_ratio = [](const ExperimentConfig& cfg) { return dit_options_for(cfg).active_ratio(); };
  f.bench_step = bench_step;
  f.attention_path_rows = attention_path_rows;
  return f;
}

ModelFamily vae_family(VaeKind kind) {
  const std::string name = kind == VaeKind::sd ? kSdVaeName : kVaVaeName;
  ModelFamily f;
  f.id = name;
  f.title = kind == VaeKind::sd ? "SD-VAE (fixed: latent encoder/decoder of latent DiTs)"
                                : "VA-VAE f16d32 (fixed: latent encoder/decoder of LightningDiT)";
  f.names = [name] { return std::vector<std::string>{name}; };
  f.summarize = [kind](const std::string& n) { return parameter_summary(n, n, *diffusion::make_vae(kind)); };
  f.forward = [kind](const ForwardRequest& r) { return vae_forward(kind, r); };
  f.forward_inputs = vae_inputs(kind);
  return f;
}

}  // namespace moh::experiments
