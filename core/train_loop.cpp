#include "core/train_loop.h"

#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "core/atomic_io.h"
#include "core/checkpoint.h"
#include "core/ema.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/optimizer.h"
#include "core/phema_run.h"
#include "core/progress.h"
#include "core/retention.h"
#include "core/sha256.h"
#include "core/step_guard.h"
#include "core/working_copies.h"

namespace moh {

namespace fs = std::filesystem;

namespace {

constexpr double kPi = 3.14159265358979323846;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// AdamW over the model's parameters: those the task decays, then (if any) the rest with weight_decay 0.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const LoopConfig& cfg, torch::nn::Module& model,
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
    groups.emplace_back(
        plain, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(base).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), base);
}

}  // namespace

double scalar(const Scalars& s, const std::string& name) {
  for (const auto& [k, v] : s)
    if (k == name) return v;
  return 0.0;
}

double learning_rate_at(const LoopConfig& cfg, double t) {
  const double base = cfg.optim.lr;
  if (cfg.schedule.kind == LrSchedule::constant) return base;
  const double warm = cfg.schedule.warmup_epochs;
  if (t < warm) return cfg.schedule.warmup_lr + t * (base - cfg.schedule.warmup_lr) / warm;
  const double T = static_cast<double>(cfg.train.epochs);
  return cfg.schedule.min_lr + 0.5 * (base - cfg.schedule.min_lr) * (1.0 + std::cos(kPi * std::min(t, T) / T));
}

double step_learning_rate(const LoopConfig& cfg, int64_t epoch, int64_t batch, int64_t skipped,
                          int64_t steps_per_epoch) {
  if (cfg.schedule.unit == ScheduleUnit::epoch) return learning_rate_at(cfg, static_cast<double>(epoch));
  return learning_rate_at(
      cfg, static_cast<double>(epoch) + static_cast<double>(batch - skipped) / static_cast<double>(steps_per_epoch));
}

bool complete_optimizer_step(torch::optim::AdamW& optimizer, torch::nn::Module& model, GradScaler& scaler, double clip,
                             OptimImpl impl, ModelEma* ema, TrainerState& state) {
  const bool took = finish_optimizer_step(optimizer, model.parameters(), scaler, clip, impl);
  if (!took) {
    ++state.skipped;
    return false;
  }
  if (ema) ema->update(model, state.step);
  ++state.step;
  return true;
}

const std::vector<std::string>& config_keys_guarded_on_resume() {
  static const std::vector<std::string> keys{"train.processes", "train.accum_steps", "train.seed"};
  return keys;
}

namespace {

// Refuses what a resumed run cannot (or should not silently) change against its checkpoint's config, and returns the
// line that lists the other changes ("" if none), printed once the run starts. Runs before anything is written.
std::string check_resume_config(const LoopConfig& cfg, const std::string& checkpoint_yaml, const std::string& dir,
                                bool allow_change, const TrainerState& at) {
  auto in = [](const std::vector<std::string>& keys, const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) != keys.end();
  };
  std::vector<std::string> guarded = cfg.guarded_on_resume;
  guarded.insert(guarded.end(), config_keys_guarded_on_resume().begin(), config_keys_guarded_on_resume().end());
  const std::vector<ConfigChange> changes = config_changes(checkpoint_yaml, cfg.yaml);
  for (const auto& c : changes) {
    if (in(cfg.fixed_on_resume, c.key))
      throw UserError("--resume " + dir, c.key + " differs from the checkpoint's (" + c.before + " -> " + c.after + ")",
                      "a checkpoint resumes only with its own model; start a new run with --weights " + dir);
    if (in(guarded, c.key) && !allow_change)
      throw UserError("--resume " + dir, c.key + " differs from the checkpoint's (" + c.before + " -> " + c.after + ")",
                      "the run would no longer be the same run; pass --allow-config-change to resume anyway");
    if (in(guarded, c.key) && at.batch > 0)  // batch b of another data stream means nothing
      throw UserError("--resume " + dir,
                      c.key + " differs from the checkpoint's (" + c.before + " -> " + c.after +
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

namespace {

// One training run from its config to its last checkpoint, laid out as guided-diffusion's TrainLoop: the constructor
// checks and loads everything before the run directory is touched; run() → run_epoch → run_step → optimize,
// log_window, end_epoch (evaluate, best, save).
class TrainLoop {
 public:
  TrainLoop(const LoopConfig& cfg, const TrainArgs& args, const TaskFactory& make_task);
  LoopResult run();

 private:
  void build_model_and_optimizer();
  void load_start_state();
  void take_first_batch();
  void start_writing();
  void run_epoch(int64_t epoch);
  void run_step(at::Tensor x, at::Tensor y, at::Tensor side, int64_t epoch, int64_t batch, int64_t steps_per_epoch);
  bool optimize_on_host(const at::Tensor& finite);
  bool optimize_on_device(const at::Tensor& finite);
  void resolve_pending();
  void count_outcome(bool finite, int64_t batch);
  [[noreturn]] void report_divergence();
  void add_to_window(const LossTensors& losses, const at::Tensor& finite, int64_t images, int64_t classes, bool took);
  void log_window(int64_t epoch);
  void end_epoch(int64_t epoch);
  void save_inside_epoch(int64_t epoch, int64_t next_batch);
  std::string save();
  void write_phema_snapshot();
  nlohmann::json head_load_shares();
  bool stop_requested();

  const LoopConfig& cfg_;
  const TrainArgs& args_;
  RunContext ctx_;
  std::string run_dir_, config_changes_;
  std::optional<Checkpoint> resume_;
  std::unique_ptr<RunDirLock> lock_;
  std::shared_ptr<dist::Group> group_;
  std::unique_ptr<TrainTask> task_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  OptimImpl optim_impl_ = OptimImpl::for_loop;  // optim.impl resolved for the run's device
  std::unique_ptr<ModelEma> ema_;               // only when the run keeps one (train.ema_decay > 0)
  std::unique_ptr<phema::RunProfiles> phema_;   // only with train.phema.sigma_rels
  int64_t last_snapshot_ = -1;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<WorkingCopies> copies_;  // the weights' autocast casts, when the task asks for them
  TrainerState state_;
  bool per_rank_ = false;
  std::unique_ptr<BatchStream> first_loader_;  // the first epoch's loader and batch, taken before anything is written
  at::Tensor first_x_, first_y_, first_side_;
  bool first_pending_ = false;
  MetricsWriter metrics_;
  std::unique_ptr<ConsoleLog> console_;  // the run's log.txt mirrors what rank 0 prints from start_writing on
  std::unique_ptr<Progress> progress_;
  LossTensors window_;        // losses of the logging window's finite steps, summed on the device
  at::Tensor window_finite_;  // how many of the window's steps were finite (on the device)
  int64_t window_steps_ = 0, window_images_ = 0, window_skipped_ = 0, window_classes_ = 0;
  // The non-finite guard (core/step_guard.h): with fused AdamW the skip happens on the device and the host learns of
  // it one step later (pending_); otherwise the host reads each step's flag before the optimizer.
  bool device_skip_ = false;
  DeferredFlag pending_;
  std::vector<at::Tensor> pending_params_;        // the parameters the pending step stepped (their counts come back)
  int64_t pending_batch_ = 0, batch_of_run_ = 0;  // batches of the run so far (what the divergence line names)
  std::unique_ptr<NonFiniteRun> nonfinite_;
  bool diverged_ = false;
  Clock::time_point window_start_;
  double lr_ = 0;
  std::string status_;       // the bar's "loss=… lr=…", refreshed at each metrics line
  std::string memory_line_;  // the memory check's verdict, for the log's first lines
  bool stop_ = false, interrupted_ = false;
  LoopResult result_;
  const Clock::time_point start_ = Clock::now();
};

TrainLoop::TrainLoop(const LoopConfig& cfg, const TrainArgs& args, const TaskFactory& make_task)
    : cfg_(cfg),
      args_(args),
      ctx_(RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed),
                              args.precision_probe.get())) {
  run_dir_ = args.run_dir.empty() ? "runs/" + cfg.name : args.run_dir;
  check_output_dir(run_dir_, "--run-dir " + run_dir_);
  if (cfg.log.tensorboard) check_output_dir(run_dir_ + "/tb", "log.tensorboard: " + run_dir_ + "/tb");
  if (cfg.train.deterministic) use_deterministic_kernels();
  const int64_t world = ctx_.world, local_batch = cfg.batch_size / world;
  if (cfg.batch_size % world != 0 || local_batch % cfg.train.accum_steps != 0)
    throw UserError("config: data.batch_size",
                    std::to_string(cfg.batch_size) + " does not split into " + std::to_string(world) + " ranks × " +
                        std::to_string(cfg.train.accum_steps) + " accumulation steps",
                    "use a multiple of world size × train.accum_steps");
  // Resume decision before anything touches the run directory (every rank decides alike, then rank 0 writes).
  resume_ = resolve_resume(run_dir_, args.resume);
  if (resume_)
    config_changes_ =
        check_resume_config(cfg, resume_->config_yaml, resume_->dir, args.allow_config_change, resume_->state);
  // One writer per run directory: an existing one is locked at once (a second process is refused before it loads
  // any data); a new one only once every input has been checked (start_writing), so a refused run creates nothing.
  if (ctx_.is_main() && fs::exists(run_dir_)) lock_ = std::make_unique<RunDirLock>(run_dir_);
  // Every machine must run this run: the same resolved config and the same starting checkpoint (a run directory
  // that is not shared between machines would start one afresh and resume the other).
  const dist::Agreement agree{{"config (sha256 of the resolved YAML)", sha256_hex(cfg.yaml)},
                              {"starting point", resume_ ? "step " + std::to_string(resume_->state.step) : "step 0"}};
  group_ = args.group ? args.group : dist::Group::join(ctx_, agree);
  group_->barrier();
  task_ = make_task(ctx_);
  if (task_->train_examples() < cfg.batch_size)
    throw UserError("config: data.batch_size",
                    std::to_string(cfg.batch_size) + " is larger than the training set (" +
                        std::to_string(task_->train_examples()) + " examples)",
                    "lower data.batch_size or raise data.limit_train");
  // Whether the run fits, once its inputs are checked and before the model is built: one step of the real model at
  // small batches, extrapolated.
  if (args.memory_probe) {
    MemoryPlan plan;
    plan.batch = local_batch / cfg.train.accum_steps;
    plan.per_batch = world * cfg.train.accum_steps;
    plan.sharing = ctx_.device.is_cuda() ? 1 : ctx_.local_world;
    plan.setting = "data.batch_size";
    memory_line_ = preflight_memory(*args.memory_probe, ctx_, plan);
  }
  build_model_and_optimizer();
  load_start_state();
  take_first_batch();
}

void TrainLoop::build_model_and_optimizer() {
  torch::manual_seed(cfg_.train.seed);
  model_ = task_->build_model();
  model_->to(ctx_.device);
  optimizer_ = make_optimizer(cfg_, *model_, *task_);
  optim_impl_ = resolve_optim_impl(cfg_.optim.impl, ctx_.device);
  device_skip_ = optim_impl_ == OptimImpl::fused && ctx_.precision != Precision::fp16;  // fp16: the scaler reads anyway
  nonfinite_ = std::make_unique<NonFiniteRun>(cfg_.train.max_nonfinite_steps);
  scaler_ = std::make_unique<GradScaler>(ctx_.precision);
  if (cfg_.train.ema_decay > 0) {
    ema_ = std::make_unique<ModelEma>(task_->build_model(), cfg_.train.ema_decay, cfg_.train.ema_warmup, optim_impl_);
    ema_->module().to(ctx_.device);
  }
  if (!cfg_.train.phema.sigma_rels.empty()) phema_ = std::make_unique<phema::RunProfiles>(cfg_.train.phema, *model_);
}

// Initial weights or the checkpoint's state, rank 0's weights on every rank, and the random state.
void TrainLoop::load_start_state() {
  if (!resume_ && !cfg_.weights.path.empty())
    load_initial_weights(*model_, cfg_.weights.path, cfg_.weights.key, cfg_.weights.allow_missing);
  const bool resumed_ema = resume_ && ema_ && !resume_->ema.empty();
  if (resume_) {
    load_module_tensors(*model_, resume_->model, resume_->dir);
    load_optimizer_tensors(*optimizer_, *model_, resume_->optimizer, resume_->dir);
    if (resume_->rng.count("amp_scaler")) scaler_->load_state(resume_->rng.at("amp_scaler"));
    if (resumed_ema) load_module_tensors(ema_->module(), resume_->ema, resume_->dir + "/ema.safetensors");
    if (phema_) phema_->load(resume_->dir);
    state_ = resume_->state;
  }
  group_->broadcast_module(*model_);  // every rank starts from rank 0's weights
  if (ema_ && !resumed_ema) ema_->copy_from(*model_);
  if (task_->working_copies() && autocasts(ctx_.precision))
    copies_ = std::make_unique<WorkingCopies>(model_->parameters(), autocast_dtype(ctx_.precision));
  per_rank_ = task_->per_rank_rng();
  dist::restore_rank_rng(*group_, resume_ ? &resume_->rng : nullptr, static_cast<uint64_t>(cfg_.train.seed),
                         state_.step, per_rank_, ctx_.device);
}

// The first epoch's batches start before the run directory is written: data errors found in the first batch (e.g.
// damaged files of a streamed tree beyond data.max_bad_fraction) refuse the run without touching it. The loaders
// draw from the global generator only in next(), so the order of random draws is that of a loop without this.
void TrainLoop::take_first_batch() {
  if (state_.epoch >= cfg_.train.epochs) return;
  first_loader_ = task_->train_batches(state_.epoch, ctx_.rank, ctx_.world, state_.batch);
  if (state_.batch > first_loader_->num_batches())
    throw UserError("--resume " + resume_->dir,
                    "taken at batch " + std::to_string(state_.batch) + " of epoch " + std::to_string(state_.epoch + 1) +
                        ", which has only " + std::to_string(first_loader_->num_batches()) + " batches",
                    "the training data changed since the checkpoint");
  first_pending_ = first_loader_->next(first_x_, first_y_);
  if (first_pending_) first_side_ = first_loader_->side();
}

// Every input has been checked: from here on only runtime failures remain.
void TrainLoop::start_writing() {
  if (group_->is_main()) {
    if (!lock_) lock_ = std::make_unique<RunDirLock>(run_dir_);
    const bool restart = !resume_ && args_.resume == "auto" && fs::exists(run_dir_ + "/metrics.jsonl");
    metrics_ = start_run_dir(run_dir_, cfg_.yaml, resume_ ? std::optional<int64_t>(state_.step) : std::nullopt,
                             cfg_.log.tensorboard);
    console_ = std::make_unique<ConsoleLog>(run_dir_ + "/log.txt");
    std::cerr << "[" << utc_timestamp() << "] moh train " << cfg_.name << " (moh " << toolkit_version() << ", commit "
              << toolkit_commit() << ", LibTorch " << libtorch_version() << ") on " << device_line(ctx_.device) << "\n";
    print_notes();  // what the data loading had to say, now that every input is accepted
    if (resume_)
      std::cerr << "resuming " << resume_->dir << " at epoch " << state_.epoch << ", step " << state_.step << "\n";
    if (const std::string mark = run_dir_ + "/diverged.json"; resume_ && fs::exists(mark)) {
      std::cerr << "note: the run stopped diverged ("
                << nlohmann::json::parse(read_file(mark)).value("streak", std::string("?"))
                << "): resuming from its last finite checkpoint, " << resume_->dir << "\n";
      fs::remove(mark);
    }
    if (!config_changes_.empty()) std::cerr << config_changes_ << "\n";
    if (ctx_.restart > 0) {  // logged where the curves are, so a plot of the run shows where it was restarted
      std::cerr << "restart " << ctx_.restart << " of at most " << ctx_.max_restarts
                << " (moh launch --max-restarts) after a failed rank, from step " << state_.step << "\n";
      metrics_.write({{"step", state_.step},
                      {"event", "restart"},
                      {"restart", ctx_.restart},
                      {"max_restarts", ctx_.max_restarts}});
    }
    if (restart)
      std::cerr << "note: " << run_dir_
                << " has no checkpoint yet (stopped before its first one): starting at step 0\n";
    if (const std::string w = slow_bf16_warning(ctx_); !w.empty()) std::cerr << "warning: " << w << "\n";
    std::cerr << "model " << task_->describe() << ", "
              << precision_summary(cfg_.train.precision, ctx_, args_.precision_probe.get()) << ", run dir " << run_dir_
              << (ctx_.world > 1 ? ", " + std::to_string(ctx_.world) + " data-parallel ranks" : std::string()) << "\n";
    if (!memory_line_.empty()) std::cerr << memory_line_ << "\n";
  }
  // One bar for the whole run: batches b/S (S = epochs × batches per epoch, capped by train.max_steps), the rate of
  // this process's batches, and the ETA of the rest of the run.
  const int64_t done = state_.epoch * (first_loader_ ? first_loader_->num_batches() : 0) + state_.batch;
  int64_t total = first_loader_ ? cfg_.train.epochs * first_loader_->num_batches() : done;
  if (cfg_.train.max_steps > 0) total = std::min(total, cfg_.train.max_steps);
  progress_ = std::make_unique<Progress>("", total, "step", group_->is_main() ? -1 : 2, std::min(done, total));
}

LoopResult TrainLoop::run() {
  start_writing();
  result_.run_dir = run_dir_;
  result_.best_metric = state_.best_metric;
  // Ctrl-C / SIGTERM: every rank learns of a request at the same step (a collective), and all stop there together.
  const StopOnSignal stop_on_signal(/*quiet=*/!group_->is_main());
  const Tf32Scope tf32(ctx_.precision);  // precision: tf32 (the official DiT's fp32 setting on CUDA)
  for (int64_t epoch = state_.epoch; epoch < cfg_.train.epochs && !stop_; ++epoch) run_epoch(epoch);
  if (diverged_) report_divergence();
  if (interrupted_) result_.stop_signal = StopOnSignal::requested() != 0 ? StopOnSignal::requested() : SIGINT;
  result_.steps = state_.step;
  result_.best_metric = state_.best_metric;
  result_.seconds = seconds_since(start_);
  return result_;
}

void TrainLoop::run_epoch(int64_t epoch) {
  const int64_t first_batch = first_loader_ ? state_.batch : 0;  // a run resumed inside an epoch
  const std::unique_ptr<BatchStream> loader =
      first_loader_ ? std::move(first_loader_) : task_->train_batches(epoch, ctx_.rank, ctx_.world, 0);
  const int64_t steps_per_epoch = loader->num_batches();
  if (steps_per_epoch == 0) throw UserError("config: data.batch_size", "larger than the training set", "");
  if (first_batch == 0) state_.skipped = 0;
  progress_->set_label("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg_.train.epochs) + " step");
  model_->train();
  window_start_ = Clock::now();
  at::Tensor x, y, side;
  auto next_batch = [&] {
    if (!first_pending_) {
      const bool more = loader->next(x, y);
      side = more ? loader->side() : at::Tensor();
      return more;
    }
    x = std::move(first_x_);
    y = std::move(first_y_);
    side = std::move(first_side_);
    first_pending_ = false;
    return true;
  };
  int64_t batches_done = steps_per_epoch;  // where in this epoch a stop on a signal leaves it
  for (int64_t b = first_batch; next_batch(); ++b) {
    run_step(std::move(x), std::move(y), std::move(side), epoch, b, steps_per_epoch);
    if (diverged_) break;
    if (phema_ && phema_->due(state_.step) && state_.step != last_snapshot_) write_phema_snapshot();
    if (cfg_.train.max_steps > 0 && state_.step >= cfg_.train.max_steps) {
      stop_ = true;
      break;
    }
    const int64_t every = cfg_.train.ckpt_every_steps;
    if (every > 0 && state_.step % every == 0 && b + 1 < steps_per_epoch) save_inside_epoch(epoch, b + 1);
    if (diverged_) break;
    if (stop_requested()) {
      stop_ = interrupted_ = true;
      batches_done = b + 1;
      break;
    }
  }
  if (window_steps_ > 0) log_window(epoch);  // every run with a step has a metrics line, and the summary its loss
  progress_->end_line();
  if (diverged_) return;  // no evaluation, no checkpoint: run() says where the last finite one is
  if (interrupted_) {     // resume continues at batch b + 1 of this epoch (its end-of-epoch work still to come)
    resolve_pending();
    state_.epoch = epoch;
    state_.batch = batches_done;
    result_.checkpoint = save();
    group_->barrier();
    return;
  }
  end_epoch(epoch);
}

// One batch: the task's forward/backward, gradient averaging, the non-finite guard, the learning rate at this point
// and the optimizer step. EMA, schedule and step counter advance only when the step was taken (a non-finite loss or
// gradient, or an fp16 overflow, skips it), as guided-diffusion's run_step.
void TrainLoop::run_step(at::Tensor x, at::Tensor y, at::Tensor side, int64_t epoch, int64_t b,
                         int64_t steps_per_epoch) {
  const int64_t images = x.size(0) * ctx_.world;
  // Distinct classes in this rank's batch (hard labels only): a class-sorted data stream shows here at once.
  const int64_t classes = y.dim() == 1 && !y.is_floating_point() ? std::get<0>(at::_unique(y)).size(0) : 0;
  LossTensors losses;
  {
    const WorkingCopyScope copies(copies_.get());
    losses = task_->backward(*model_, std::move(x), std::move(y), {epoch, b, state_.step, std::move(side)}, *scaler_);
  }
  group_->average_gradients(model_->parameters());  // no-op on one process
  resolve_pending();  // the previous step's flag, read now that this step's work is queued
  if (stop_) return optimizer_->zero_grad();
  lr_ = step_learning_rate(cfg_, epoch, b, state_.skipped, steps_per_epoch);
  for (auto& g : optimizer_->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr_);
  // Checked after the average: every rank sees the same gradients, so every rank decides alike. Under fp16 the
  // scaled gradients overflow by design; the scaler judges them and the guard the loss alone.
  const at::Tensor finite = finite_flag(
      losses.front().second, ctx_.precision == Precision::fp16 ? std::vector<at::Tensor>{} : model_->parameters());
  batch_of_run_ = epoch * steps_per_epoch + b;
  const bool took = device_skip_ ? optimize_on_device(finite) : optimize_on_host(finite);
  if (copies_) copies_->refresh();  // the next forward reads this step's weights
  add_to_window(losses, finite, images, classes, took);
  progress_->advance(1, status_);
  if (took && state_.step % cfg_.train.log_every_steps == 0) log_window(epoch);
}

// The host reads the step's flag (free on a CPU; the fp16 scaler reads its own), then steps or skips.
bool TrainLoop::optimize_on_host(const at::Tensor& finite) {
  const bool ok = finite.item<float>() > 0;
  bool took = false;
  if (ok) {
    took =
        complete_optimizer_step(*optimizer_, *model_, *scaler_, cfg_.optim.clip_grad, optim_impl_, ema_.get(), state_);
    if (took && phema_) phema_->update(state_.step);
  } else {
    optimizer_->zero_grad();
    ++state_.skipped;
  }
  count_outcome(ok, batch_of_run_);
  return took;
}

// Fused AdamW skips on the device when the flag says so (its found_inf) and the EMA update is masked there; the host
// counts the step as taken until resolve_pending() learns otherwise.
bool TrainLoop::optimize_on_device(const at::Tensor& finite) {
  pending_params_.clear();
  for (const auto& p : model_->parameters())
    if (p.grad().defined()) pending_params_.push_back(p);
  if (cfg_.optim.clip_grad > 0) clip_grad_norm(pending_params_, cfg_.optim.clip_grad, optim_impl_);
  adamw_step(*optimizer_, optim_impl_, 1.0 - finite);
  optimizer_->zero_grad();
  if (ema_) ema_->update(*model_, state_.step, finite);
  if (phema_) phema_->update(state_.step + 1, finite);
  ++state_.step;
  pending_batch_ = batch_of_run_;
  pending_.put(finite);
  return true;
}

void TrainLoop::resolve_pending() {
  if (!pending_.pending()) return;
  const bool ok = pending_.take() > 0;
  if (!ok) {
    --state_.step;
    ++state_.skipped, ++window_skipped_;
    adamw_unstep(*optimizer_, pending_params_);
  }
  count_outcome(ok, pending_batch_);
}

// A non-finite step counted; too many in a row end the run (the message is raised once the loop has stopped).
void TrainLoop::count_outcome(bool finite, int64_t batch) {
  if (nonfinite_->record(finite, batch)) stop_ = diverged_ = true;
}

void TrainLoop::add_to_window(const LossTensors& losses, const at::Tensor& finite, int64_t images, int64_t classes,
                              bool took) {
  const at::Tensor keep = finite.to(at::kDouble) > 0;  // a skipped step's (non-finite) losses stay out of the means
  if (window_.empty()) {
    for (const auto& [name, v] : losses) window_.emplace_back(name, at::zeros({}, v.options().dtype(at::kDouble)));
    window_finite_ = at::zeros({}, finite.options().dtype(at::kDouble));
  }
  for (size_t i = 0; i < window_.size(); ++i)
    window_[i].second = window_[i].second + at::where(keep, losses[i].second.detach().to(at::kDouble), 0.0);
  window_finite_ = window_finite_ + keep.to(at::kDouble);
  ++window_steps_, window_images_ += images, window_skipped_ += took ? 0 : 1, window_classes_ += classes;
}

// The metrics line of the window so far (every log_every_steps steps, and the partial window at an epoch's end):
// the only place the losses are read from the device.
void TrainLoop::log_window(int64_t epoch) {
  resolve_pending();
  const double secs = seconds_since(window_start_);
  std::vector<at::Tensor> parts;
  for (const auto& [name, v] : window_) parts.push_back(v.reshape({1}).to(window_finite_.device()));
  parts.push_back(window_finite_.reshape({1}));
  const at::Tensor host = at::cat(parts).to(at::kCPU, at::kDouble).contiguous();
  std::vector<double> sums(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  sums = group_->sum(sums);
  const double finite_steps = sums.back();  // summed over the ranks, like the losses
  result_.losses.clear();
  for (size_t i = 0; i < window_.size(); ++i)
    result_.losses.emplace_back(window_[i].first,
                                finite_steps > 0 ? sums[i] / finite_steps : std::numeric_limits<double>::quiet_NaN());
  nlohmann::json line{
      {"step", state_.step}, {"epoch", epoch}, {"lr", lr_}, {"img_per_s", window_images_ / std::max(secs, 1e-9)}};
  for (const auto& [k, v] : result_.losses) line[k] = v;
  if (window_skipped_ > 0) line["skipped_steps"] = window_skipped_;
  if (window_classes_ > 0) line["classes_per_batch"] = static_cast<double>(window_classes_) / window_steps_;
  metrics_.write(line);
  char status[96];
  std::snprintf(status, sizeof status, "loss=%.4f lr=%.2e", scalar(result_.losses, "loss"), lr_);
  status_ = status;
  window_.clear(), window_finite_ = at::Tensor();
  window_steps_ = window_images_ = window_skipped_ = window_classes_ = 0;
  window_start_ = Clock::now();
}

// A checkpoint after batch next_batch − 1 of `epoch` (train.ckpt_every_steps): a resume continues at next_batch, as
// after a signal, and this run goes on. A step the device skipped (known only now) moves the count off the multiple.
void TrainLoop::save_inside_epoch(int64_t epoch, int64_t next_batch) {
  resolve_pending();
  if (diverged_ || state_.step % cfg_.train.ckpt_every_steps != 0) return;
  const int64_t keep_epoch = state_.epoch, keep_batch = state_.batch;
  state_.epoch = epoch;
  state_.batch = next_batch;
  save();
  state_.epoch = keep_epoch, state_.batch = keep_batch;
  group_->barrier();  // no rank runs ahead of the checkpoint it may resume from
}

// The end of an epoch: evaluation (model and EMA) at the cadence, the best pointer, the checkpoint.
void TrainLoop::end_epoch(int64_t epoch) {
  resolve_pending();
  if (diverged_) return;
  const bool last = stop_ || epoch + 1 == cfg_.train.epochs;
  state_.epoch = epoch + 1;
  state_.batch = 0;
  state_.skipped = 0;
  bool best = false;
  if (last || (epoch + 1) % cfg_.train.eval_every_epochs == 0) {
    const Scalars ev = task_->evaluate(model_, *group_);
    nlohmann::json line{{"step", state_.step}, {"epoch", epoch}};
    if (!ev.empty()) {
      result_.final_eval = ev;
      for (const auto& [k, v] : ev) line[k] = v;
      if (ema_) {
        result_.final_eval_ema = task_->evaluate(ema_->ptr(), *group_);
        for (const auto& [k, v] : result_.final_eval_ema) line[k + "_ema"] = v;
      }
      if (group_->is_main()) std::cerr << task_->eval_message(epoch, ev, result_.final_eval_ema) << "\n";
      best = std::isfinite(ev.front().second) && ev.front().second > state_.best_metric;  // NaN is never best
      if (best) state_.best_metric = ev.front().second;
    }
    if (nlohmann::json load = head_load_shares(); !load.is_null()) line["head_load"] = std::move(load);
    if (line.size() > 2) metrics_.write(line);
  }
  std::string saved;
  if (best || last || (epoch + 1) % cfg_.train.ckpt_every_epochs == 0) {
    saved = save();
    if (best && group_->is_main())
      write_file_atomic(run_dir_ + "/checkpoints/best", fs::path(saved).filename().string() + "\n");
  }
  if (!last && stop_requested()) {  // a signal during the evaluation or the checkpoint: stop at the epoch's end
    stop_ = interrupted_ = true;
    result_.checkpoint = saved.empty() ? save() : saved;
  }
  group_->barrier();  // no rank runs ahead of the checkpoint it may resume from
}

// The head load of the training steps since the last evaluation, summed over the ranks (a collective): per routed
// layer the share of its picks per routed head, to 4 decimals (compact enough to log at every evaluation); null for
// a model without routing. A run resumed inside an epoch counts from its resume.
nlohmann::json TrainLoop::head_load_shares() {
  std::vector<at::Tensor> load = task_->take_head_load(*model_);
  if (load.empty()) return nullptr;
  for (auto& l : load) l = l.to(at::kDouble);
  group_->allreduce_sum_(load);
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : load) {
    const at::Tensor shares = (l / l.sum().clamp_min(1.0)).cpu().contiguous();
    nlohmann::json row = nlohmann::json::array();
    for (int64_t e = 0; e < shares.numel(); ++e) row.push_back(std::round(shares.data_ptr<double>()[e] * 1e4) / 1e4);
    layers.push_back(std::move(row));
  }
  return layers;
}

// Every rank takes part (the per-rank generator gather is a collective); rank 0 writes, atomically.
// Every rank takes part (the per-rank generator gather is a collective); rank 0 writes, atomically, after checking
// that every tensor is finite (a non-finite checkpoint is never written, so `latest` and `best` never point at one)
// and that the disk has room; then older checkpoints go as train.keep_last / keep_every_steps say.
std::string TrainLoop::save() {
  const TensorMap model = module_tensor_views(*model_), optim = optimizer_tensors(*optimizer_, *model_),
                  ema = ema_ ? module_tensor_views(ema_->module()) : TensorMap{};
  const auto profiles = phema_ ? phema_->checkpoint_files() : std::vector<std::pair<std::string, TensorMap>>{};
  std::vector<at::Tensor> all;
  int64_t bytes = 0;
  for (const TensorMap* m : {&model, &optim, &ema})
    for (const auto& [k, t] : *m) all.push_back(t), bytes += static_cast<int64_t>(t.nbytes());
  for (const auto& [file, m] : profiles)
    for (const auto& [k, t] : m) all.push_back(t), bytes += static_cast<int64_t>(t.nbytes());
  if (!all_finite(all)) {  // the same weights on every rank: every rank stops here alike
    nonfinite_->record(false, batch_of_run_);
    stop_ = diverged_ = true;
    report_divergence();
  }
  const std::string room = group_->is_main() ? disk_room_problem(run_dir_ + "/checkpoints", bytes) : "";
  if (group_->sum({room.empty() ? 0.0 : 1.0})[0] > 0)
    throw RunStopped("checkpoint at step " + std::to_string(state_.step) + ": " +
                     (room.empty() ? "rank 0 found the disk full" : room) +
                     " (free space, or keep fewer checkpoints: train.keep_last; every earlier checkpoint is intact)");
  TensorMap rng = dist::gather_rng_states(*group_, ctx_.device, per_rank_);
  rng["amp_scaler"] = scaler_->state();
  if (!group_->is_main()) return "";
  state_.written_by = provenance(ctx_.device);
  // Views of the live tensors, streamed to disk one at a time (an XL/2 state is ~11 GB).
  const std::string dir = save_checkpoint(run_dir_, state_, model, optim, cfg_.yaml, rng, ema, profiles);
  prune_checkpoints(run_dir_, cfg_.train.keep_last, cfg_.train.keep_every_steps);
  return dir;
}

// A post-hoc EMA snapshot (train.phema) after this step, once the step is known to be taken (a step the device
// skipped is undone by resolve_pending and is then no snapshot step). Rank 0 writes; every rank holds the same.
void TrainLoop::write_phema_snapshot() {
  resolve_pending();
  if (!phema_->due(state_.step) || state_.step == last_snapshot_) return;
  last_snapshot_ = state_.step;
  if (group_->is_main()) phema_->write(run_dir_, state_.step);
}

// The one line of a run that gave up: the non-finite steps, the last finite checkpoint (what --resume auto takes up),
// and what to change; the run directory remembers it for that resume.
void TrainLoop::report_divergence() {
  const std::optional<std::string> last = latest_checkpoint(run_dir_);
  const std::string where = last ? *last : "none yet";
  if (group_->is_main())
    write_file_atomic(
        run_dir_ + "/diverged.json",
        nlohmann::json{{"streak", nonfinite_->streak()}, {"last_finite_checkpoint", where}}.dump() + "\n");
  throw RunStopped("training diverged: " + nonfinite_->streak() + " at optimizer step " + std::to_string(state_.step) +
                   " (last finite checkpoint: " + where +
                   "; lower optim.lr or raise optim.clip_grad, then --resume auto continues from it)");
}

bool TrainLoop::stop_requested() {
  return group_->sum({StopOnSignal::requested() != 0 ? 1.0 : 0.0})[0] > 0;
}

}  // namespace

LoopResult run_training(const LoopConfig& cfg, const TrainArgs& args, const TaskFactory& make_task) {
  return TrainLoop(cfg, args, make_task).run();
}

}  // namespace moh
