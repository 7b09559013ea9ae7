#include "experiments/registry.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "core/dist/launcher.h"
#include "core/error.h"
#include "core/platform/amp.h"
#include "core/platform/cpu_precision.h"
#include "core/platform/run_context.h"
#include "datasets/image_decode.h"
#include "experiments/classifier_family.h"
#include "experiments/dit_family.h"
#include "experiments/inception_family.h"
#include "experiments/train_tasks.h"

namespace moh::experiments {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families{
      experiments::classifier_family(), experiments::dit_family(), experiments::vae_family(VaeKind::sd),
      experiments::vae_family(VaeKind::vavae), experiments::fid_inception_family()};
  return families;
}

std::vector<std::string> all_model_names() {
  std::vector<std::string> all;
  for (const ModelFamily& f : model_families())
    for (const std::string& n : f.names()) all.push_back(n);
  return all;
}

const ModelFamily& find_model_family(const std::string& name, const std::string& what) {
  for (const ModelFamily& f : model_families())
    for (const std::string& n : f.names())
      if (n == name) return f;
  const std::string near = nearest_name(name, all_model_names());
  throw UserError(what.empty() ? "model '" + name + "'" : what, "unknown model variant or network",
                  near.empty() ? "see `moh info --list`" : "did you mean '" + near + "'?");
}

const ModelFamily& experiment_family(const ExperimentConfig& cfg) {
  const std::string what = "config: model.name '" + cfg.model.name + "'";
  const ModelFamily& f = find_model_family(cfg.model.name, what);
  if (!f.trainable())
    throw UserError("config: model.name", cfg.model.name + " is a fixed network, not a trainable experiment",
                    "pick a classifier or DiT variant (moh info --list)");
  return f;
}

void validate_experiment(const ExperimentConfig& cfg, ExperimentUse use) {
  experiment_family(cfg).validate(cfg, use);
  // Here, not where the images are first read: in a job of several processes that is inside each one, after the
  // device choice has spoken (a second line) — and a build without OpenCV can still sample such a model.
  if (use != ExperimentUse::sample && cfg.data.dataset == DatasetKind::image_folder && !datasets::can_decode_images())
    throw UserError("data.dataset image_folder", "needs OpenCV, which this build was configured without",
                    "rebuild with -DMOH_WITH_OPENCV=ON");
}

TaskFactory task_factory(const ExperimentConfig& cfg) {
  const ModelFamily& f = experiment_family(cfg);
  return [&f, cfg](const RunContext& ctx) { return f.task(cfg, ctx); };
}

namespace {
// The largest batch `precision: auto` times (core/platform/cpu_precision.h times the largest one up to the run's whose
// steps fit its ~10 s budget): a bound on the probe's memory for a small model with a large batch.
constexpr int64_t kPrecisionProbeMaxBatch = 256;

// `precision: auto` on a CPU decided by this experiment's own training step (core/platform/cpu_precision.h): its model
// as the run builds it, at the batch one backward pass sees, with its optimizer, EMA and checkpointing, on random data.
std::shared_ptr<const PrecisionProbe> training_probe(const ExperimentConfig& cfg, int64_t world) {
  const ModelFamily& f = experiment_family(cfg);
  if (cfg.train.precision != Precision::automatic || !f.bench_step) return nullptr;
  // The batch one backward pass sees, at most kPrecisionProbeMaxBatch (the probe runs before the data are read: a
  // batch the data cannot fill is refused only then).
  const int64_t micro = cfg.data.batch_size / world / std::max<int64_t>(1, cfg.train.accum_steps);
  const int64_t batch = std::clamp<int64_t>(micro, 1, kPrecisionProbeMaxBatch);
  auto probe = std::make_shared<PrecisionProbe>();
  probe->name = "train " + cfg.model.name + ", img " + std::to_string(cfg.model.img_size) + ", batch " +
                std::to_string(batch) + ", path " + config::to_string(cfg.model.attention_path) + ", optim " +
                config::to_string(cfg.optim.impl) + ", ema " + std::to_string(cfg.train.ema_decay > 0) +
                ", checkpoint " + config::to_string(cfg.train.grad_checkpoint);
  probe->batch = batch;
  probe->build = [&f, cfg](Precision p, int64_t b) {
    BenchRequest r;
    r.name = cfg.model.name;
    r.ctx.precision = p;  // the CPU
    r.batch = b;
    r.optim = cfg.optim.impl;
    r.ema_decay = cfg.train.ema_decay;
    r.experiment = &cfg;
    return f.bench_step(r).step;
  };
  return probe;
}

// The memory check of a training run (core/platform/memory_preflight.h): the experiment's own step (model, optimizer,
// EMA, checkpointing as the run builds them) on random data, at the precision and on the device the run resolved.
std::shared_ptr<const MemoryProbe> memory_probe(const ExperimentConfig& cfg) {
  const ModelFamily& f = experiment_family(cfg);
  if (!f.bench_step) return nullptr;
  // The run's step at `batch` (with the run's optimizer and EMA when `training`).
  auto step = [&f, cfg](const RunContext& ctx, int64_t batch, bool training) {
    BenchRequest r;
    r.name = cfg.model.name;
    r.ctx = ctx;
    r.batch = batch;
    r.experiment = &cfg;
    if (training) {
      r.optim = cfg.optim.impl;
      r.ema_decay = cfg.train.ema_decay;
    }
    return f.bench_step(r);
  };
  auto probe = std::make_shared<MemoryProbe>();
  probe->what = "training " + cfg.model.name + " at " + std::to_string(cfg.model.img_size) + " px";
  probe->other = "model.img_size, or set train.grad_checkpoint: blocks";
  probe->build = [step](const RunContext& ctx, int64_t batch) { return step(ctx, batch, true).step; };
  if (f.measure == ModelFamily::Measure::eval) {  // evaluates its validation split during training, at its own batch
    probe->eval_batch = cfg.data.eval_batch_size;
    probe->eval_setting = "data.eval_batch_size";
    probe->build_eval = [step](const RunContext& ctx, int64_t batch) {
      std::function<void()> forward = step(ctx, batch, false).forward;
      return std::function<void()>([forward, ctx] {
        const torch::NoGradGuard no_grad;
        const AutocastScope autocast(ctx);  // as the run evaluates
        forward();
      });
    };
  }
  return probe;
}
}  // namespace

LoopResult train_experiment(const ExperimentConfig& cfg, const TrainArgs& args) {
  validate_experiment(cfg);
  TrainArgs a = args;
  if (!a.precision_probe) a.precision_probe = training_probe(cfg, std::max(1, launched_world().value_or(1)));
  if (!a.memory_probe) a.memory_probe = memory_probe(cfg);
  return run_training(loop_config(cfg), a, task_factory(cfg));
}

std::string run_precision(const ExperimentConfig& cfg) {
  validate_experiment(cfg);
  // Outside a launch, a config with train.processes > 1 is what `moh train` would start as that many ranks: the
  // probe then times one rank's batch on one rank's threads, the key the ranks will find in the cache.
  const std::optional<int> launched = launched_world();
  const bool launches = cfg.train.processes > 1 && !launched;
  const int64_t world = launches ? cfg.train.processes : std::max(1, launched.value_or(1));
  std::optional<ScopedCpuThreads> rank_share;
  if (launches && !std::getenv("OMP_NUM_THREADS")) rank_share.emplace(rank_threads(static_cast<int>(world)));
  const auto probe = training_probe(cfg, world);
  const RunContext ctx =
      RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed), probe.get());
  return precision_summary(cfg.train.precision, ctx, probe.get());
}

std::string attention_path_table() {
  std::string t =
      "| model | input | layers | active heads | CPU, LibTorch 2.x | CPU, LibTorch 1.13 | GPU |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const ModelFamily& f : model_families())
    if (f.attention_path_rows) t += f.attention_path_rows();
  return t;
}

}  // namespace moh::experiments
