#include "diffusion/diffusion_trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include <optional>

#include "core/atomic_io.h"
#include "core/amp.h"
#include "core/checkpoint.h"
#include "core/distributed.h"
#include "core/ema.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/run_context.h"
#include "datasets/latents.h"
#include "datasets/loader.h"
#include "diffusion/diffusion_process.h"

namespace moh::diffusion {

namespace fs = std::filesystem;

bool is_diffusion_model(const std::string& name) {
  for (const auto& [n, o] : dit_variants())
    if (n == name) return true;
  return false;
}

DiTOptions dit_options_for(const ExperimentConfig& cfg) {
  DiTOptions o = dit_options(cfg.model.name);
  if (cfg.model.num_classes > 0) o.num_classes = cfg.model.num_classes;
  if (cfg.model.img_size > 0) {  // pixel space: image side = input side; SD latents: image side / 8
    const bool latent = cfg.diffusion.vae == VaeKind::sd;
    if (latent && cfg.model.img_size % 8 != 0)
      throw UserError("config: model.img_size", "must be a multiple of 8 with vae: sd", "e.g. 256 (32×32 latents)");
    o.input_size = latent ? cfg.model.img_size / 8 : cfg.model.img_size;
  }
  if (!cfg.model.attention.empty())
    throw UserError("config: model.attention", "per-stage overrides are for classifiers", "pick a DiT or MoH-DiT variant");
  o.path = cfg.model.attention_path;
  o.validate();
  return o;
}

namespace {

// Pixels → [−1, 1] (DiT: ToTensor + Normalize(0.5, 0.5)), optional horizontal flip; no padding (side = input size).
datasets::ClassifierTransform pixel_transform(const ExperimentConfig& cfg, const DiTOptions& mo) {
  datasets::ClassifierTransform tf;
  tf.size = mo.input_size;
  tf.hflip = cfg.data.hflip;
  tf.shift = 0;
  tf.mean = 0.5, tf.std = 0.5;
  return tf;
}

}  // namespace

DiffusionStepLosses diffusion_backward(DiT& model, const GaussianDiffusion& diffusion, const at::Tensor& x0,
                                       const at::Tensor& y, double beta, const RunContext& ctx, const GradScaler& scaler,
                                       int rank, int world) {
  const int64_t B = x0.size(0), G = B * world;  // local and global batch
  auto mine = [&](const at::Tensor& global) { return world == 1 ? global : global.slice(0, rank, G, world); };
  std::vector<int64_t> shape = x0.sizes().vec();
  shape[0] = G;
  const at::Tensor t = mine(at::randint(0, diffusion.num_steps(), {G}, at::kLong)).to(x0.device());  // (B)
  const at::Tensor noise = mine(at::randn(shape, x0.options()));
  at::Tensor drop;  // DiT's token_drop, drawn here so every rank sees its rows of the global draw
  const double p = model->y_embedder->dropout_prob;
  if (model->is_training() && p > 0) drop = mine(at::rand({G}, at::kFloat) < p).to(x0.device());
  const at::Tensor xt = diffusion.q_sample(x0, t, noise);
  DiTOutput out;
  {
    AutocastScope autocast(ctx);  // bf16/fp16 forward; the losses below are fp32
    out = model->forward(xt, t, y, drop);
  }
  const GaussianDiffusion::Losses l = diffusion.training_losses(out.out.to(at::kFloat), x0, xt, t, noise);
  at::Tensor loss = l.loss.mean();
  DiffusionStepLosses r;
  r.loss = loss.item<double>(), r.mse = l.mse.mean().item<double>(), r.vb = l.vb.mean().item<double>();
  if (out.aux_loss.defined()) {
    r.aux = out.aux_loss.item<double>();
    loss = loss + beta * out.aux_loss.to(at::kFloat);
  }
  scaler.scale(loss).backward();
  return r;
}

DiffusionTrainResult train_diffusion(const ExperimentConfig& cfg, const vision::TrainArgs& args) {
  const auto t_start = std::chrono::steady_clock::now();
  RunContext ctx = RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed));
  if (cfg.train.accum_steps != 1) throw UserError("config: train.accum_steps", "must be 1 for diffusion training", "");
  const DiTOptions mo = dit_options_for(cfg);
  const std::string run_dir = args.run_dir.empty() ? "runs/" + cfg.name : args.run_dir;
  const int world = ctx.world;
  if (cfg.data.batch_size % world != 0)
    throw UserError("config: data.batch_size", std::to_string(cfg.data.batch_size) + " does not split into " +
                                                   std::to_string(world) + " ranks", "use a multiple of the world size");
  std::optional<Checkpoint> resume = resolve_resume(run_dir, args.resume);
  const std::shared_ptr<dist::Group> group = dist::Group::join(ctx);
  group->barrier();  // every rank has decided about the run directory before rank 0 writes to it

  const bool latent = cfg.data.dataset == DatasetKind::latents;
  if (cfg.diffusion.vae == VaeKind::sd && !latent)
    throw UserError("config: data.dataset", "vae: sd trains from pre-extracted latents",
                    "run `moh extract-latents CONFIG.yaml --out DIR`, then set data.dataset: latents and data.root: DIR");
  if (latent && cfg.diffusion.vae != VaeKind::sd)
    throw UserError("config: diffusion.vae", "data.dataset: latents needs vae: sd", "set diffusion.vae: sd");
  datasets::LatentMeta latent_meta;
  datasets::ImageSet train_set;
  if (latent) {
    latent_meta = datasets::read_latent_meta(cfg.data.root);
    if (latent_meta.channels != mo.in_channels || latent_meta.size != mo.input_size)
      throw UserError("config: model", cfg.model.name + " takes " + std::to_string(mo.in_channels) + "×" +
                                           std::to_string(mo.input_size) + "² latents, " + cfg.data.root + " holds " +
                                           std::to_string(latent_meta.channels) + "×" + std::to_string(latent_meta.size) + "²",
                      "set model.img_size to " + std::to_string(latent_meta.image_size));
    if (static_cast<int64_t>(latent_meta.classes.size()) > mo.num_classes)
      throw UserError("config: model.num_classes", std::to_string(mo.num_classes) + " classes, the latents have " +
                                                       std::to_string(latent_meta.classes.size()), "");
  } else {
    train_set = vision::load_split(cfg, true, mo.in_channels);
  }
  const datasets::ClassifierTransform tf = pixel_transform(cfg, mo);
  if (!latent && (train_set.images.size(1) != mo.input_size || train_set.images.size(2) != mo.input_size))
    throw UserError("config: model", cfg.model.name + " takes " + std::to_string(mo.input_size) + " px images, the data is " +
                                         std::to_string(train_set.images.size(1)) + " px", "choose a matching variant");
  const int64_t channels = latent ? mo.in_channels : train_set.images.dim() == 4 ? train_set.images.size(3) : 1;
  if (channels != mo.in_channels)
    throw UserError("config: model", cfg.model.name + " takes " + std::to_string(mo.in_channels) + " channels, the data has " +
                                         std::to_string(channels), "choose a matching variant");
  const int64_t labels_max = latent ? 0 : train_set.labels.max().item<int64_t>();
  if (labels_max >= mo.num_classes)
    throw UserError("config: model.num_classes", std::to_string(mo.num_classes) + " classes, the data has labels up to " +
                                                     std::to_string(labels_max), "");

  torch::manual_seed(cfg.train.seed);
  DiT model(mo), ema(mo);
  const GaussianDiffusion diffusion = GaussianDiffusion::base(cfg.diffusion.steps);
  model->to(ctx.device);
  ema->to(ctx.device);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(cfg.optim.lr)
                                                         .betas({cfg.optim.betas[0], cfg.optim.betas[1]})
                                                         .eps(cfg.optim.eps)
                                                         .weight_decay(cfg.optim.weight_decay));
  TrainerState state;
  GradScaler scaler(ctx.precision);
  if (!resume && !cfg.model.weights.empty()) load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
  if (resume) {
    load_module_tensors(*model, resume->model, resume->dir);
    load_optimizer_tensors(optimizer, *model, resume->optimizer, resume->dir);
    if (!resume->ema.empty()) load_module_tensors(*ema, resume->ema, resume->dir + "/ema.safetensors");
    if (resume->rng.count("amp_scaler")) scaler.load_state(resume->rng.at("amp_scaler"));
    state = resume->state;
    if (group->is_main())
      std::cerr << "resuming " << resume->dir << " at epoch " << state.epoch << ", step " << state.step << "\n";
  }
  group->broadcast_module(*model);  // every rank starts from rank 0's weights
  if (!resume) ema_update(*ema, *model, 0.0);  // DiT: the EMA starts as a copy
  // One common generator on every rank: the step's draws are made for the global batch (diffusion_backward).
  dist::restore_rank_rng(*group, resume ? &resume->rng : nullptr, static_cast<uint64_t>(cfg.train.seed), state.step,
                         /*per_rank=*/false);
  ema->eval();
  for (auto& p : ema->parameters()) p.set_requires_grad(false);

  const std::string config_yaml = to_yaml(cfg);
  MetricsWriter metrics;
  if (group->is_main()) {
    metrics = start_run_dir(run_dir, config_yaml, resume ? std::optional<int64_t>(state.step) : std::nullopt);
    if (const std::string w = slow_bf16_warning(ctx); !w.empty()) std::cerr << "warning: " << w << "\n";
    std::cerr << "model " << cfg.model.name << ": " << mo.active_ratio() * 100 << " % active heads, "
              << precision_summary(cfg.train.precision, ctx) << ", run dir " << run_dir
              << (world > 1 ? ", " + std::to_string(world) + " data-parallel ranks" : std::string()) << "\n";
  }

  const double beta = cfg.train.moh_loss_coeff, decay = cfg.train.ema_decay;
  auto checkpoint = [&] {
    if (group->is_main())
      save_checkpoint(run_dir, state, module_tensors(*model), optimizer_tensors(optimizer, *model), config_yaml,
                      {{"cpu", cpu_rng_state()}, {"amp_scaler", scaler.state()}}, module_tensors(*ema));
    group->barrier();
  };
  DiffusionTrainResult result;
  result.run_dir = run_dir;
  bool stop = false;
  for (int64_t epoch = state.epoch; epoch < cfg.train.epochs && !stop; ++epoch) {
    // Pixels (in memory) or pre-extracted latents (streamed shard by shard).
    std::optional<datasets::EpochLoader> pixels;
    std::optional<datasets::LatentLoader> latents;
    if (latent) {
      latents.emplace(cfg.data.root, latent_meta, cfg.data.batch_size, static_cast<uint64_t>(cfg.train.seed), epoch,
                      cfg.data.limit_train);
    } else {
      pixels.emplace(train_set, tf, cfg.data.batch_size / world, /*train=*/true, static_cast<uint64_t>(cfg.train.seed),
                     epoch, 0, true, 2, ctx.rank, world);  // the rank's strided share of every global batch
    }
    const int64_t num_batches = latent ? latents->num_batches() : pixels->num_batches();
    if (num_batches == 0) throw UserError("config: data.batch_size", "larger than the training set", "");
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg.train.epochs), num_batches, "step",
                      group->is_main() ? -1 : 2);
    model->train();
    double loss_acc = 0, mse_acc = 0, vb_acc = 0, aux_acc = 0;
    int64_t logged = 0, images = 0;
    auto t_log = std::chrono::steady_clock::now();
    at::Tensor x0, y;
    for (int64_t b = 0; latent ? latents->next(x0, y) : pixels->next(x0, y); ++b) {
      const double lr = vision::learning_rate_at(
          cfg, cfg.schedule.unit == ScheduleUnit::epoch ? epoch : epoch + static_cast<double>(b) / num_batches);
      for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      if (latent && world > 1) {  // every rank streams the global batch and keeps its rows r, r + world, ...
        x0 = x0.slice(0, ctx.rank, x0.size(0), world), y = y.slice(0, ctx.rank, y.size(0), world);
      }
      x0 = x0.to(ctx.device), y = y.to(ctx.device);
      const DiffusionStepLosses sl = diffusion_backward(model, diffusion, x0, y, beta, ctx, scaler, ctx.rank, world);
      group->average_gradients(model->parameters());  // no-op on one process
      finish_optimizer_step(optimizer, model->parameters(), scaler, cfg.optim.clip_grad);
      // A constant decay keeps decay^t of the random initialisation in the average, which ruins short runs
      // (0.999^937 = 39 %); the optional warm-up ramps the decay up with the step.
      if (decay > 0) ema_update(*ema, *model, ema_decay_at(decay, cfg.train.ema_warmup, state.step));
      ++state.step;
      loss_acc += sl.loss, mse_acc += sl.mse, vb_acc += sl.vb, aux_acc += sl.aux;
      ++logged, images += x0.size(0) * world;
      char status[64];
      std::snprintf(status, sizeof status, "loss=%.4f", sl.loss);
      progress.advance(1, status);
      if (state.step % cfg.train.log_every_steps == 0) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_log).count();
        const std::vector<double> m = group->sum({loss_acc, mse_acc, vb_acc, aux_acc});  // global means
        loss_acc = m[0] / world, mse_acc = m[1] / world, vb_acc = m[2] / world, aux_acc = m[3] / world;
        result.loss = loss_acc / logged;
        metrics.write({{"step", state.step}, {"epoch", epoch}, {"loss", result.loss}, {"mse", mse_acc / logged},
                       {"vb", vb_acc / logged}, {"aux", aux_acc / logged}, {"lr", lr},
                       {"img_per_s", images / std::max(secs, 1e-9)}});
        loss_acc = mse_acc = vb_acc = aux_acc = 0, logged = images = 0;
        t_log = std::chrono::steady_clock::now();
      }
      if (cfg.train.max_steps > 0 && state.step >= cfg.train.max_steps) stop = true;
      if (stop) break;
    }
    progress.finish();
    state.epoch = epoch + 1;
    if (stop || epoch + 1 == cfg.train.epochs || (epoch + 1) % cfg.train.ckpt_every_epochs == 0) checkpoint();
  }
  result.steps = state.step;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return result;
}

std::pair<DiT, ExperimentConfig> load_dit_checkpoint(const std::string& path, bool prefer_ema) {
  Checkpoint ckpt = load_checkpoint(path);
  ExperimentConfig cfg = parse_experiment(ckpt.config_yaml, ckpt.dir + "/config.resolved.yaml");
  if (!is_diffusion_model(cfg.model.name))
    throw UserError("checkpoint " + ckpt.dir, "holds a " + cfg.model.name + " classifier, not a DiT", "pass a DiT run");
  DiT model(dit_options_for(cfg));
  const bool use_ema = prefer_ema && !ckpt.ema.empty();
  if (use_ema) {
    load_module_tensors(*model, ckpt.ema, ckpt.dir + "/ema.safetensors", /*allow_missing=*/false);
  } else {
    load_module_tensors(*model, ckpt.model, ckpt.dir);
  }
  model->eval();
  return {model, cfg};
}

}  // namespace moh::diffusion
