#include "core/train_loop.h"

#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <csignal>

#include "core/atomic_io.h"
#include "core/checkpoint.h"
#include "core/ema.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/progress.h"

namespace moh {

namespace fs = std::filesystem;

namespace {

constexpr double kPi = 3.14159265358979323846;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// AdamW over the model's parameters: those the task decays, then (if any) the rest with weight_decay 0.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const ExperimentConfig& cfg, torch::nn::Module& model,
                                                    const TrainTask& task) {
  std::vector<at::Tensor> decay, plain;
  for (const auto& p : model.named_parameters()) (task.decays(p.key(), p.value()) ? decay : plain).push_back(p.value());
  const auto base = torch::optim::AdamWOptions(cfg.optim.lr)
                        .betas({cfg.optim.betas[0], cfg.optim.betas[1]})
                        .eps(cfg.optim.eps)
                        .weight_decay(cfg.optim.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(base));
  if (!plain.empty())
    groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), base);
}

// Sums named values over ranks and divides by the world size (rank means → global means).
Scalars global_mean(dist::Group& group, const Scalars& sums, double count) {
  std::vector<double> v;
  for (const auto& [k, x] : sums) v.push_back(x);
  v = group.sum(v);
  Scalars out;
  for (size_t i = 0; i < sums.size(); ++i) out.emplace_back(sums[i].first, v[i] / group.world() / count);
  return out;
}

}  // namespace

double scalar(const Scalars& s, const std::string& name) {
  for (const auto& [k, v] : s)
    if (k == name) return v;
  return 0.0;
}

double learning_rate_at(const ExperimentConfig& cfg, double t) {
  const double base = cfg.optim.lr;
  if (cfg.schedule.kind == LrSchedule::constant) return base;
  const double warm = cfg.schedule.warmup_epochs;
  if (t < warm) return cfg.schedule.warmup_lr + t * (base - cfg.schedule.warmup_lr) / warm;
  const double T = static_cast<double>(cfg.train.epochs);
  return cfg.schedule.min_lr + 0.5 * (base - cfg.schedule.min_lr) * (1.0 + std::cos(kPi * std::min(t, T) / T));
}

const std::vector<std::string>& config_keys_fixed_on_resume() {
  static const std::vector<std::string> keys{"model.name", "model.attention", "model.num_classes", "model.img_size",
                                             "diffusion.vae"};
  return keys;
}

const std::vector<std::string>& config_keys_guarded_on_resume() {
  static const std::vector<std::string> keys{"data.dataset", "data.root", "data.batch_size", "data.limit_train",
                                             "train.processes", "train.accum_steps", "train.seed", "diffusion.steps"};
  return keys;
}

namespace {

// Refuses what a resumed run cannot (or should not silently) change against its checkpoint's config, and returns the
// line that lists the other changes ("" if none), printed once the run starts. Runs before anything is written.
std::string check_resume_config(const std::string& checkpoint_yaml, const std::string& run_yaml, const std::string& dir,
                                bool allow_change, const TrainerState& at) {
  auto in = [](const std::vector<std::string>& keys, const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) != keys.end();
  };
  const std::vector<ConfigChange> changes = config_changes(checkpoint_yaml, run_yaml);
  for (const auto& c : changes) {
    if (in(config_keys_fixed_on_resume(), c.key))
      throw UserError("--resume " + dir, c.key + " differs from the checkpoint's (" + c.before + " -> " + c.after + ")",
                      "a checkpoint resumes only with its own model; start a new run with --weights " + dir);
    if (in(config_keys_guarded_on_resume(), c.key) && !allow_change)
      throw UserError("--resume " + dir, c.key + " differs from the checkpoint's (" + c.before + " -> " + c.after + ")",
                      "the run would no longer be the same run; pass --allow-config-change to resume anyway");
    if (in(config_keys_guarded_on_resume(), c.key) && at.batch > 0)  // batch b of another data stream means nothing
      throw UserError("--resume " + dir, c.key + " differs from the checkpoint's (" + c.before + " -> " + c.after +
                                             "), and the checkpoint was taken inside epoch " + std::to_string(at.epoch + 1),
                      "data and batch settings change only at an epoch's end: resume unchanged to its end first");
  }
  if (changes.empty()) return "";
  std::string line = "resume: " + std::to_string(changes.size()) + " config change" + (changes.size() > 1 ? "s" : "") +
                     " since " + dir + ":";
  for (const auto& c : changes) line += " " + c.key + " " + c.before + " -> " + c.after + ";";
  return line;
}

}  // namespace

LoopResult run_training(const ExperimentConfig& cfg, const TrainArgs& args, const TaskFactory& make_task) {
  const auto t_start = Clock::now();
  RunContext ctx = RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed));
  const std::string run_dir = args.run_dir.empty() ? "runs/" + cfg.name : args.run_dir;
  check_output_dir(run_dir, "--run-dir " + run_dir);
  const int64_t world = ctx.world, local_batch = cfg.data.batch_size / world;
  if (cfg.data.batch_size % world != 0 || local_batch % cfg.train.accum_steps != 0)
    throw UserError("config: data.batch_size", std::to_string(cfg.data.batch_size) + " does not split into " +
                                                   std::to_string(world) + " ranks × " +
                                                   std::to_string(cfg.train.accum_steps) + " accumulation steps",
                    "use a multiple of world size × train.accum_steps");

  // Resume decision before anything touches the run directory (every rank decides alike, then rank 0 writes).
  std::optional<Checkpoint> resume = resolve_resume(run_dir, args.resume);
  const std::string changes =
      resume ? check_resume_config(resume->config_yaml, to_yaml(cfg), resume->dir, args.allow_config_change, resume->state)
             : "";
  // One writer per run directory: an existing one is locked at once (a second process is refused before it loads
  // any data); a new one only once every input has been checked (below), so a refused run creates nothing.
  std::unique_ptr<RunDirLock> lock;
  if (ctx.is_main() && fs::exists(run_dir)) lock = std::make_unique<RunDirLock>(run_dir);
  const std::shared_ptr<dist::Group> group = dist::Group::join(ctx);
  group->barrier();
  const std::unique_ptr<TrainTask> task = make_task(ctx);
  if (task->train_examples() < cfg.data.batch_size)
    throw UserError("config: data.batch_size", std::to_string(cfg.data.batch_size) + " is larger than the training set (" +
                                                   std::to_string(task->train_examples()) + " examples)",
                    "lower data.batch_size or raise data.limit_train");

  torch::manual_seed(cfg.train.seed);
  const std::shared_ptr<torch::nn::Module> model = task->build_model();
  model->to(ctx.device);
  const std::unique_ptr<torch::optim::AdamW> optimizer = make_optimizer(cfg, *model, *task);
  TrainerState state;
  GradScaler scaler(ctx.precision);
  std::unique_ptr<ModelEma> ema;  // only when the run keeps one (train.ema_decay > 0)
  if (cfg.train.ema_decay > 0) {
    ema = std::make_unique<ModelEma>(task->build_model(), cfg.train.ema_decay, cfg.train.ema_warmup);
    ema->module().to(ctx.device);
  }
  if (!resume && !cfg.model.weights.empty())
    load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
  const bool resumed_ema = resume && ema && !resume->ema.empty();
  if (resume) {
    load_module_tensors(*model, resume->model, resume->dir);
    load_optimizer_tensors(*optimizer, *model, resume->optimizer, resume->dir);
    if (resume->rng.count("amp_scaler")) scaler.load_state(resume->rng.at("amp_scaler"));
    if (resumed_ema) load_module_tensors(ema->module(), resume->ema, resume->dir + "/ema.safetensors");
    state = resume->state;
  }
  group->broadcast_module(*model);  // every rank starts from rank 0's weights
  if (ema && !resumed_ema) ema->copy_from(*model);
  const bool per_rank = task->per_rank_rng();
  dist::restore_rank_rng(*group, resume ? &resume->rng : nullptr, static_cast<uint64_t>(cfg.train.seed), state.step,
                         per_rank);
  // The first epoch's batches start before the run directory is written: data errors found in the first batch (e.g.
  // damaged files of a streamed tree beyond data.max_bad_fraction) refuse the run without touching it. The loaders
  // draw from the global generator only in next(), so the order of random draws is that of a loop without this.
  std::unique_ptr<BatchStream> first_loader;
  at::Tensor first_x, first_y;
  bool first_pending = false;
  if (state.epoch < cfg.train.epochs) {
    first_loader = task->train_batches(state.epoch, ctx.rank, ctx.world, state.batch);
    if (state.batch > first_loader->num_batches())
      throw UserError("--resume " + resume->dir, "taken at batch " + std::to_string(state.batch) + " of epoch " +
                                                     std::to_string(state.epoch + 1) + ", which has only " +
                                                     std::to_string(first_loader->num_batches()) + " batches",
                      "the training data changed since the checkpoint");
    first_pending = first_loader->next(first_x, first_y);
  }
  // Every input has been checked: from here on only runtime failures remain.
  const std::string config_yaml = to_yaml(cfg);
  MetricsWriter metrics;
  std::unique_ptr<ConsoleLog> console;  // the run's log.txt mirrors what rank 0 prints from here on
  if (group->is_main()) {
    if (!lock) lock = std::make_unique<RunDirLock>(run_dir);
    const bool restart = !resume && args.resume == "auto" && fs::exists(run_dir + "/metrics.jsonl");
    metrics = start_run_dir(run_dir, config_yaml, resume ? std::optional<int64_t>(state.step) : std::nullopt);
    console = std::make_unique<ConsoleLog>(run_dir + "/log.txt");
    std::cerr << "[" << utc_timestamp() << "] moh train " << cfg.name << "\n";
    if (resume) std::cerr << "resuming " << resume->dir << " at epoch " << state.epoch << ", step " << state.step << "\n";
    if (!changes.empty()) std::cerr << changes << "\n";
    if (restart)
      std::cerr << "note: " << run_dir << " has no checkpoint yet (stopped before its first one): starting at step 0\n";
    if (const std::string w = slow_bf16_warning(ctx); !w.empty()) std::cerr << "warning: " << w << "\n";
    std::cerr << "model " << task->describe() << ", " << precision_summary(cfg.train.precision, ctx) << ", run dir "
              << run_dir << (world > 1 ? ", " + std::to_string(world) + " data-parallel ranks" : std::string()) << "\n";
  }

  // Every rank takes part (the per-rank RNG gather is a collective); rank 0 writes, atomically.
  auto checkpoint = [&]() -> std::string {
    TensorMap rng{{"cpu", cpu_rng_state()}, {"amp_scaler", scaler.state()}};
    if (per_rank) rng["cpu_ranks"] = dist::gather_rank_rng(*group);
    if (!group->is_main()) return "";
    return save_checkpoint(run_dir, state, module_tensors(*model), optimizer_tensors(*optimizer, *model), config_yaml,
                           rng, ema ? module_tensors(ema->module()) : TensorMap{});
  };
  LoopResult result;
  result.run_dir = run_dir;
  result.best_metric = state.best_metric;
  bool stop = false;
  // One bar for the whole run: global step s/S (S = epochs × steps per epoch, capped by train.max_steps), the rate of
  // this process's steps, and the ETA of the rest of the run.
  int64_t total_steps = first_loader ? cfg.train.epochs * first_loader->num_batches() : state.step;
  if (cfg.train.max_steps > 0) total_steps = std::min(total_steps, cfg.train.max_steps);
  Progress progress("", total_steps, "step", group->is_main() ? -1 : 2, state.step);
  // Ctrl-C / SIGTERM: every rank learns of a request at the same step (a collective), and all stop there together.
  const StopOnSignal stop_on_signal(/*quiet=*/!group->is_main());
  auto stop_requested = [&] { return group->sum({StopOnSignal::requested() != 0 ? 1.0 : 0.0})[0] > 0; };
  bool interrupted = false;
  for (int64_t epoch = state.epoch; epoch < cfg.train.epochs && !stop; ++epoch) {
    const int64_t first_batch = first_loader ? state.batch : 0;  // a run resumed inside an epoch
    const std::unique_ptr<BatchStream> loader =
        first_loader ? std::move(first_loader) : task->train_batches(epoch, ctx.rank, ctx.world, 0);
    const int64_t steps_per_epoch = loader->num_batches();
    if (steps_per_epoch == 0) throw UserError("config: data.batch_size", "larger than the training set", "");
    progress.set_label("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg.train.epochs) + " step");
    model->train();
    Scalars sums;  // losses summed over the logging window
    int64_t logged = 0, images = 0;
    auto t_log = Clock::now();
    double lr = 0;
    // The metrics line of the window so far (every log_every_steps steps, and the partial window at an epoch's end).
    auto log_window = [&] {
      const double secs = seconds_since(t_log);
      result.losses = global_mean(*group, sums, static_cast<double>(logged));
      nlohmann::json line{{"step", state.step}, {"epoch", epoch}, {"lr", lr}, {"img_per_s", images / std::max(secs, 1e-9)}};
      for (const auto& [k, v] : result.losses) line[k] = v;
      metrics.write(line);
      sums.clear(), logged = images = 0;
      t_log = Clock::now();
    };
    at::Tensor x, y;
    auto next_batch = [&] {
      if (!first_pending) return loader->next(x, y);
      x = std::move(first_x), y = std::move(first_y), first_pending = false;
      return true;
    };
    int64_t batches_done = steps_per_epoch;  // where in this epoch a stop on a signal leaves it
    for (int64_t b = first_batch; next_batch(); ++b) {
      const double t = cfg.schedule.unit == ScheduleUnit::epoch ? static_cast<double>(epoch)
                                                                 : epoch + static_cast<double>(b) / steps_per_epoch;
      lr = learning_rate_at(cfg, t);
      for (auto& g : optimizer->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      const int64_t batch = x.size(0);
      const Scalars losses = task->backward(*model, std::move(x), std::move(y), {epoch, b, state.step}, scaler);
      group->average_gradients(model->parameters());  // no-op on one process
      finish_optimizer_step(*optimizer, model->parameters(), scaler, cfg.optim.clip_grad);
      if (ema) ema->update(*model, state.step);
      ++state.step;
      if (sums.empty()) sums = losses;
      else
        for (size_t i = 0; i < sums.size(); ++i) sums[i].second += losses[i].second;
      ++logged, images += batch * world;
      char status[96];
      std::snprintf(status, sizeof status, "loss=%.4f lr=%.2e", scalar(losses, "loss"), lr);
      progress.advance(1, status);
      if (state.step % cfg.train.log_every_steps == 0) log_window();
      if (cfg.train.max_steps > 0 && state.step >= cfg.train.max_steps) {
        stop = true;
        break;
      }
      if (stop_requested()) {
        stop = interrupted = true, batches_done = b + 1;
        break;
      }
    }
    if (logged > 0) log_window();  // every run with a step has a metrics line, and the summary its real loss
    progress.end_line();
    if (interrupted) {  // resume continues at batch b + 1 of this epoch (its end-of-epoch work still to come)
      state.epoch = epoch, state.batch = batches_done;
      result.checkpoint = checkpoint();
      group->barrier();
      break;
    }
    const bool last = stop || epoch + 1 == cfg.train.epochs;
    state.epoch = epoch + 1, state.batch = 0;
    bool best = false;
    if (last || (epoch + 1) % cfg.train.eval_every_epochs == 0) {
      const Scalars ev = task->evaluate(model, *group);
      if (!ev.empty()) {
        result.final_eval = ev;
        nlohmann::json line{{"step", state.step}, {"epoch", epoch}};
        for (const auto& [k, v] : ev) line[k] = v;
        if (ema) {
          result.final_eval_ema = task->evaluate(ema->ptr(), *group);
          for (const auto& [k, v] : result.final_eval_ema) line[k + "_ema"] = v;
        }
        metrics.write(line);
        if (group->is_main()) std::cerr << task->eval_message(epoch, ev, result.final_eval_ema) << "\n";
        best = ev.front().second > state.best_metric;
        if (best) state.best_metric = ev.front().second;
      }
    }
    std::string saved;
    if (best || last || (epoch + 1) % cfg.train.ckpt_every_epochs == 0) {
      saved = checkpoint();
      if (best && group->is_main()) write_file_atomic(run_dir + "/checkpoints/best", fs::path(saved).filename().string() + "\n");
    }
    if (!last && stop_requested()) {  // a signal during the evaluation or the checkpoint: stop at the epoch's end
      stop = interrupted = true;
      result.checkpoint = saved.empty() ? checkpoint() : saved;
    }
    group->barrier();  // no rank runs ahead of the checkpoint it may resume from
  }
  if (interrupted) result.stop_signal = StopOnSignal::requested() != 0 ? StopOnSignal::requested() : SIGINT;
  result.steps = state.step;
  result.best_metric = state.best_metric;
  result.seconds = seconds_since(t_start);
  return result;
}

}  // namespace moh
