#include "experiments/experiment_config.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/phema.h"

namespace moh::experiments {

void ExperimentConfig::validate(const std::string& origin) const {
  auto bad = [&](const std::string& key, const std::string& why, const std::string& hint) {
    throw UserError("config " + origin + ": " + key, why, hint);
  };
  if (version != kConfigVersion)
    bad("version", "unsupported version " + std::to_string(version), "this toolkit reads version 1");
  if (train.epochs <= 0) bad("train.epochs", "must be > 0", "");
  if (!(optim.lr > 0)) bad("optim.lr", "must be > 0, got " + std::to_string(optim.lr), "e.g. 1e-3");
  if (optim.weight_decay < 0) bad("optim.weight_decay", "must be >= 0", "e.g. 0.05");
  if (optim.betas.size() != 2 || !(optim.betas[0] >= 0 && optim.betas[0] < 1) ||
      !(optim.betas[1] >= 0 && optim.betas[1] < 1))
    bad("optim.betas", "expected two numbers in [0, 1)", "e.g. [0.9, 0.999]");
  if (!(optim.eps > 0)) bad("optim.eps", "must be > 0", "e.g. 1e-8");
  if (optim.clip_grad < 0) bad("optim.clip_grad", "must be >= 0 (0 = off)", "e.g. 1.0");
  if (schedule.warmup_epochs < 0) bad("schedule.warmup_epochs", "must be >= 0", "");
  if (schedule.min_lr < 0 || schedule.min_lr > optim.lr)
    bad("schedule.min_lr", "must be in [0, optim.lr]", "e.g. 1e-5");
  if (schedule.warmup_lr < 0) bad("schedule.warmup_lr", "must be >= 0", "");
  if (schedule.warmup_epochs > static_cast<double>(train.epochs))
    bad("schedule.warmup_epochs", "longer than train.epochs", "shorten the warm-up");
  if (data.batch_size <= 0) bad("data.batch_size", "must be > 0", "e.g. 128");
  if (train.accum_steps <= 0) bad("train.accum_steps", "must be >= 1", "");
  if (train.processes < 1 || train.processes > 512)
    bad("train.processes", "must be in 1..512", "1 = this process only");
  if (data.batch_size % train.accum_steps != 0)
    bad("train.accum_steps", "must divide data.batch_size", "pick a divisor of the global batch");
  if (data.num_workers < 0) bad("data.num_workers", "must be >= 0", "");
  if (!(data.max_bad_fraction >= 0 && data.max_bad_fraction <= 1))
    bad("data.max_bad_fraction", "must be in [0, 1]", "");
  if (data.limit_train < 0 || data.limit_val < 0) bad("data.limit_train", "must be >= 0 (0 = all)", "");
  if (train.moh_loss_coeff < 0) bad("train.moh_loss_coeff", "must be >= 0", "the paper uses 0.01");
  if (!(train.ema_decay >= 0 && train.ema_decay < 1)) bad("train.ema_decay", "must be in [0, 1)", "e.g. 0.9999");
  if (train.ckpt_every_epochs <= 0) bad("train.ckpt_every_epochs", "must be >= 1", "");
  if (train.ckpt_every_steps < 0) bad("train.ckpt_every_steps", "must be >= 0 (0 = at epoch ends only)", "e.g. 50000");
  if (train.max_nonfinite_steps < 0) bad("train.max_nonfinite_steps", "must be >= 0 (0 = never stop)", "e.g. 10");
  if (train.keep_last < 0) bad("train.keep_last", "must be >= 0 (0 = keep every checkpoint)", "e.g. 3");
  if (train.keep_every_steps < 0) bad("train.keep_every_steps", "must be >= 0 (0 = no milestones)", "e.g. 50000");
  if (train.log_every_steps <= 0) bad("train.log_every_steps", "must be >= 1", "");
  if (!(train.label_smoothing >= 0 && train.label_smoothing < 1)) bad("train.label_smoothing", "must be in [0, 1)", "");
  if (train.eval_every_epochs <= 0) bad("train.eval_every_epochs", "must be >= 1", "");
  if (train.max_steps < 0) bad("train.max_steps", "must be >= 0 (0 = no limit)", "");
  if (data.eval_batch_size <= 0) bad("data.eval_batch_size", "must be > 0", "");
  if (data.shift < 0) bad("data.shift", "must be >= 0", "");
  if (model.num_classes < 0) bad("model.num_classes", "must be >= 0 (0 = variant default)", "");
  if (model.img_size < 0) bad("model.img_size", "must be >= 0 (0 = variant default)", "");
  if (model.img_size > kMaxImageSize)
    bad("model.img_size", "must be <= " + std::to_string(kMaxImageSize) + " px, got " + std::to_string(model.img_size),
        "");
  if (data.num_workers > 256) bad("data.num_workers", "must be <= 256, got " + std::to_string(data.num_workers), "");
  if (train.processes > 1 && data.batch_size % train.processes != 0)
    bad("data.batch_size",
        std::to_string(data.batch_size) + " does not split into " + std::to_string(train.processes) +
            " processes (train.processes)",
        "use a multiple of it");
  if (model.drop_path >= 1) bad("model.drop_path", "must be < 1", "e.g. 0.1");
  if (diffusion.steps < 2) bad("diffusion.steps", "must be >= 2", "DiT uses 1000");
  if (!(repa.weight >= 0) || !std::isfinite(repa.weight)) bad("train.repa.weight", "must be >= 0", "REPA: 0.5");
  if (repa.depth < 1) bad("train.repa.depth", "must be >= 1", "REPA: 8 of SiT-XL's 28 blocks");
  if (repa.projector_dim < 1) bad("train.repa.projector_dim", "must be >= 1", "REPA: 2048");
  if (repa.stage < 0 || repa.stage > 4) bad("train.repa.stage", "must be in 0..4 (0 = the last stage)", "");
  const FlowConfig& fc = diffusion.flow;
  if (fc.t_lognormal.size() != 2 || !(fc.t_lognormal[1] > 0) || !std::isfinite(fc.t_lognormal[0]))
    bad("diffusion.t_lognormal", "expected [m, s] with s > 0", "LightningDiT: [0, 1]");
  if (fc.loss == FlowLoss::mse_cosine && fc.prediction != FlowPrediction::velocity)
    bad("diffusion.loss", "mse+cosine compares velocities: it needs diffusion.prediction: velocity", "");
  if (!(sampling.atol > 0) || !(sampling.rtol > 0))
    bad(sampling.atol > 0 ? "sampling.rtol" : "sampling.atol", "must be > 0", "SiT: atol 1e-6, rtol 1e-3");
  if (sampling.steps.empty()) bad("sampling.steps", "must not be empty", "e.g. \"250\" or \"ddim50\"");
  if (!(sampling.eta >= 0)) bad("sampling.eta", "must be >= 0", "0 = deterministic DDIM");
  if (!(sampling.cfg_scale >= 1))
    bad("sampling.cfg_scale", "must be >= 1 (1 = no guidance)", "DiT's FID setting is 1.5");
  const std::vector<double>& ci = sampling.cfg_interval;
  if (ci.size() != 2 || !(ci[0] >= 0 && ci[0] <= ci[1] && ci[1] <= 1))
    bad("sampling.cfg_interval", "expected [lo, hi] with 0 <= lo <= hi <= 1 (noise level, 1 = pure noise)",
        "e.g. [0.0, 0.7]; [0, 1] guides every step");
  if (sampling.per_class <= 0) bad("sampling.per_class", "must be > 0", "");
  if (sampling.batch_size <= 0) bad("sampling.batch_size", "must be > 0", "");
  const AugmentConfig& a = augment;
  if (a.scale.size() != 2 || !(a.scale[0] > 0 && a.scale[0] <= a.scale[1] && a.scale[1] <= 1))
    bad("augment.scale", "expected [min, max] with 0 < min <= max <= 1", "e.g. [0.08, 1.0]");
  if (a.ratio.size() != 2 || !(a.ratio[0] > 0 && a.ratio[0] <= a.ratio[1]))
    bad("augment.ratio", "expected [min, max] with 0 < min <= max", "e.g. [0.75, 1.3333]");
  for (const auto& [key, p] : {std::pair<const char*, double>{"augment.hflip", a.hflip},
                               {"augment.erase_prob", a.erase_prob},
                               {"augment.mixup_prob", a.mixup_prob},
                               {"augment.mixup_switch_prob", a.mixup_switch_prob}})
    if (!(p >= 0 && p <= 1)) bad(key, "must be a probability in [0, 1]", "");
  if (a.mixup < 0 || a.cutmix < 0)
    bad(a.mixup < 0 ? "augment.mixup" : "augment.cutmix", "alpha must be >= 0 (0 = off)", "the recipe: 0.8 / 1.0");
  if (a.repeated < 1) bad("augment.repeated", "must be >= 1 (1 = off)", "the recipe uses 3");
  if (!(a.eval_crop_pct > 0 && a.eval_crop_pct <= 1)) bad("augment.eval_crop_pct", "must be in (0, 1]", "0.875");
  if (data.loader == LoaderKind::stream && data.dataset != DatasetKind::image_folder)
    bad("data.loader", "stream reads image_folder datasets",
        "use data.loader: memory for " + config::to_string(data.dataset));
  if (data.loader == LoaderKind::memory && (!a.rand_augment.empty() || a.repeated > 1))
    bad(a.repeated > 1 ? "augment.repeated" : "augment.rand_augment", "applies to data.loader: stream",
        "set data.loader: stream (image_folder) or remove it");
  if ((a.mixup > 0 || a.cutmix > 0) && data.batch_size % 2 != 0)
    bad("augment.mixup", "Mixup/CutMix pair each image with the reversed batch: data.batch_size must be even", "");
  const std::string& d = train.device;
  if (!(d == "auto" || d == "cpu" || d == "cuda" || d.rfind("cuda:", 0) == 0))
    bad("train.device", "expected auto, cpu, cuda or cuda:N, got \"" + d + "\"", "");
  phema::check_config(train.phema, "config " + origin + ": train.phema");
}

ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node tree = config::load_tree(path);
  for (const auto& o : overrides) config::apply_override(tree, o);
  auto cfg = config::read_struct<ExperimentConfig>(tree, path);
  if (cfg.name.empty()) cfg.name = std::filesystem::path(path).stem().string();
  cfg.validate(path);
  return cfg;
}

ExperimentConfig parse_experiment(const std::string& yaml_text, const std::string& origin) {
  YAML::Node tree;
  try {
    tree = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw UserError(origin, "invalid YAML: " + std::string(e.what()), "the stored config is corrupt");
  }
  config::check_tree_size(tree, origin);
  config::check_duplicate_keys(tree, origin);
  auto cfg = config::read_struct<ExperimentConfig>(tree, origin);
  cfg.validate(origin);
  return cfg;
}

ExperimentConfig with_overrides(const ExperimentConfig& cfg, const std::vector<std::string>& overrides,
                                const std::string& origin) {
  YAML::Node tree = YAML::Load(to_yaml(cfg));
  for (const auto& o : overrides) config::apply_override(tree, o);
  ExperimentConfig out = config::read_struct<ExperimentConfig>(tree, origin);
  out.validate(origin);
  return out;
}

std::string to_yaml(const ExperimentConfig& cfg) {
  return config::write_struct(cfg);
}

}  // namespace moh::experiments
