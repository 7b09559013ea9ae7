#include "core/train/train_loop.h"
#include "core/json_read.h"

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

#include "core/error.h"
#include "core/interrupt.h"
#include "core/io/atomic_io.h"
#include "core/io/progress.h"
#include "core/io/sha256.h"
#include "core/train/checkpoint.h"
#include "core/train/ema.h"
#include "core/train/optimizer.h"
#include "core/train/phema_run.h"
#include "core/train/retention.h"
#include "core/train/step_guard.h"
#include "core/train/working_copies.h"

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

// The parts of a training run, each a handful of fields that change together; TrainLoop holds one of each.

// The streak a stopped run's diverged.json records ("" without the file); a damaged one is refused before the resume
// writes anything.
std::string read_diverged_mark(const std::string& run_dir) {
  const std::string mark = run_dir + "/diverged.json";
  if (!fs::exists(mark)) return "";
  const std::string hint = "it marks a run stopped diverged; remove it to resume";
  const nlohmann::json j = parse_json(read_file(mark, "diverged mark"), mark, hint);
  return read_json_fields(mark, "the mark of a diverged run", hint, [&] {
    if (!j.is_object()) throw UserError(mark, "is not the mark of a diverged run (not an object)", hint);
    const std::string streak = j.value("streak", std::string("?"));
    return streak.empty() ? std::string("?") : streak;
  });
}

// Where the run lives: its directory, the checkpoint it resumes (if any) and what changed since, the writer's lock.
struct RunPlace {
  std::string run_dir, config_changes;
  std::string diverged_streak;  // a resumed run's diverged.json ("" when it has none): read before anything is written
  std::optional<Checkpoint> resume;
  std::unique_ptr<RunDirLock> lock;
};

// What is trained and what follows it: the model, AdamW, the AMP scaler, the EMA and post-hoc EMA profiles, the
// weights' autocast working copies.
struct TrainedState {
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  OptimImpl optim_impl = OptimImpl::for_loop;  // optim.impl resolved for the run's device
  std::unique_ptr<ModelEma> ema;               // only when the run keeps one (train.ema_decay > 0)
  std::unique_ptr<phema::RunProfiles> phema;   // only with train.phema.sigma_rels
  int64_t last_snapshot = -1;                  // the step of the last post-hoc EMA snapshot
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<WorkingCopies> copies;  // the weights' autocast casts, when the task asks for them
};

// The first epoch's loader and batch, taken before anything is written.
struct FirstBatch {
  std::unique_ptr<BatchStream> loader;
  at::Tensor x, y, side;
  bool pending = false;
};

// What rank 0 writes and shows: metrics.jsonl, the log.txt mirror, the progress bar and its status.
struct RunOutput {
  MetricsWriter metrics;
  std::unique_ptr<ConsoleLog> console;  // the run's log.txt mirrors what rank 0 prints from start_writing on
  std::unique_ptr<Progress> progress;
  std::string status;    // the bar's "loss=… lr=…", refreshed at each metrics line
  MemoryVerdict memory;  // the memory check's verdict, for the log's first lines and the run's end
};

// The losses of the logging window's finite steps, summed on the device, and the window's counts.
struct LossWindow {
  LossTensors sums;
  at::Tensor finite;  // how many of the window's steps were finite (on the device)
  int64_t steps = 0, images = 0, skipped = 0, classes = 0;
  Clock::time_point start = Clock::now();

  void add(const LossTensors& losses, const at::Tensor& finite_flag, int64_t batch_images, int64_t batch_classes,
           bool took) {
    const at::Tensor keep = finite_flag.to(at::kDouble) > 0;  // a skipped step's (non-finite) losses stay out
    if (sums.empty()) {
      for (const auto& [name, v] : losses) sums.emplace_back(name, at::zeros({}, v.options().dtype(at::kDouble)));
      finite = at::zeros({}, finite_flag.options().dtype(at::kDouble));
    }
    for (size_t i = 0; i < sums.size(); ++i)
      sums[i].second = sums[i].second + at::where(keep, losses[i].second.detach().to(at::kDouble), 0.0);
    finite = finite + keep.to(at::kDouble);
    ++steps, images += batch_images, skipped += took ? 0 : 1, classes += batch_classes;
  }
  void reset() { *this = LossWindow(); }
};

// The non-finite guard (core/train/step_guard.h): with fused AdamW the skip happens on the device and the host learns
// of it one step later (pending); otherwise the host reads each step's flag before the optimizer.
struct SkipGuard {
  bool device_skip = false;
  DeferredFlag pending;
  std::vector<at::Tensor> params;  // the parameters the pending step stepped (their counts come back)
  int64_t batch = 0;               // the pending step's batch of the run
  std::unique_ptr<NonFiniteRun> run;
  bool diverged = false;
};

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
  void report_peak_memory();
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
  RunPlace place_;
  std::shared_ptr<dist::Group> group_;
  std::unique_ptr<TrainTask> task_;
  TrainedState net_;
  TrainerState state_;
  bool per_rank_ = false;
  FirstBatch first_;
  RunOutput out_;
  LossWindow window_;
  SkipGuard guard_;
  int64_t batch_of_run_ = 0;  // batches of the run so far (what the divergence line names)
  double lr_ = 0;
  bool stop_ = false, interrupted_ = false;
  LoopResult result_;
  const Clock::time_point start_ = Clock::now();
};

TrainLoop::TrainLoop(const LoopConfig& cfg, const TrainArgs& args, const TaskFactory& make_task)
    : cfg_(cfg),
      args_(args),
      ctx_(RunContext::create(cfg.train.device, cfg.train.precision, static_cast<uint64_t>(cfg.train.seed),
                              args.precision_probe.get())) {
  place_.run_dir = args.run_dir.empty() ? "runs/" + cfg.name : args.run_dir;
  check_output_dir(place_.run_dir, "--run-dir " + place_.run_dir);
  if (cfg.log.tensorboard) check_output_dir(place_.run_dir + "/tb", "log.tensorboard: " + place_.run_dir + "/tb");
  if (cfg.train.deterministic) use_deterministic_kernels();
  const int64_t world = ctx_.world, local_batch = cfg.batch_size / world;
  if (cfg.batch_size % world != 0 || local_batch % cfg.train.accum_steps != 0)
    throw UserError("config: data.batch_size",
                    std::to_string(cfg.batch_size) + " does not split into " + std::to_string(world) + " ranks × " +
                        std::to_string(cfg.train.accum_steps) + " accumulation steps",
                    "use a multiple of world size × train.accum_steps");
  // Resume decision before anything touches the run directory (every rank decides alike, then rank 0 writes).
  place_.resume = resolve_resume(place_.run_dir, args.resume);
  if (place_.resume) {
    place_.config_changes = check_resume_config(cfg, place_.resume->config_yaml, place_.resume->dir,
                                                args.allow_config_change, place_.resume->state);
    place_.diverged_streak = read_diverged_mark(place_.run_dir);
  }
  // One writer per run directory: an existing one is locked at once (a second process is refused before it loads
  // any data); a new one only once every input has been checked (start_writing), so a refused run creates nothing.
  if (ctx_.is_main() && fs::exists(place_.run_dir)) place_.lock = std::make_unique<RunDirLock>(place_.run_dir);
  // Every machine must run this run: the same resolved config and the same starting checkpoint (a run directory
  // that is not shared between machines would start one afresh and resume the other).
  const dist::Agreement agree{
      {"config (sha256 of the resolved YAML)", sha256_hex(cfg.yaml)},
      {"starting point", place_.resume ? "step " + std::to_string(place_.resume->state.step) : "step 0"}};
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
    out_.memory = preflight_memory(*args.memory_probe, ctx_, plan,
                                   [this](const std::vector<double>& v) { return group_->sum(v); });
  }
  build_model_and_optimizer();
  load_start_state();
  take_first_batch();
}

void TrainLoop::build_model_and_optimizer() {
  torch::manual_seed(cfg_.train.seed);
  net_.model = task_->build_model();
  net_.model->to(ctx_.device);
  net_.optimizer = make_optimizer(cfg_, *net_.model, *task_);
  net_.optim_impl = resolve_optim_impl(cfg_.optim.impl, ctx_.device);
  guard_.device_skip =
      net_.optim_impl == OptimImpl::fused && ctx_.precision != Precision::fp16;  // fp16: the scaler reads anyway
  guard_.run = std::make_unique<NonFiniteRun>(cfg_.train.max_nonfinite_steps);
  net_.scaler = std::make_unique<GradScaler>(ctx_.precision);
  if (cfg_.train.ema_decay > 0) {
    net_.ema =
        std::make_unique<ModelEma>(task_->build_model(), cfg_.train.ema_decay, cfg_.train.ema_warmup, net_.optim_impl);
    net_.ema->module().to(ctx_.device);
  }
  if (!cfg_.train.phema.sigma_rels.empty())
    net_.phema = std::make_unique<phema::RunProfiles>(cfg_.train.phema, *net_.model);
  // train.paired: the training noise from here on depends on the seed alone, not on how many numbers building this
  // variant drew (a resumed run then restores its generators from the checkpoint, as any run does).
  if (cfg_.train.paired) torch::manual_seed(cfg_.train.seed);
}

// Initial weights or the checkpoint's state, rank 0's weights on every rank, and the random state.
void TrainLoop::load_start_state() {
  if (!place_.resume && !cfg_.weights.path.empty())
    load_initial_weights(*net_.model, cfg_.weights.path, cfg_.weights.key, cfg_.weights.allow_missing);
  const bool resumed_ema = place_.resume && net_.ema && !place_.resume->ema.empty();
  if (place_.resume) {
    load_module_tensors(*net_.model, place_.resume->model, place_.resume->dir);
    load_optimizer_tensors(*net_.optimizer, *net_.model, place_.resume->optimizer, place_.resume->dir);
    if (place_.resume->rng.count("amp_scaler")) net_.scaler->load_state(place_.resume->rng.at("amp_scaler"));
    if (resumed_ema)
      load_module_tensors(net_.ema->module(), place_.resume->ema, place_.resume->dir + "/ema.safetensors");
    if (net_.phema) net_.phema->load(place_.resume->dir);
    state_ = place_.resume->state;
  }
  group_->broadcast_module(*net_.model);  // every rank starts from rank 0's weights
  if (net_.ema && !resumed_ema) net_.ema->copy_from(*net_.model);
  if (task_->working_copies() && autocasts(ctx_.precision))
    net_.copies = std::make_unique<WorkingCopies>(net_.model->parameters(), autocast_dtype(ctx_.precision));
  per_rank_ = task_->per_rank_rng();
  dist::restore_rank_rng(*group_, place_.resume ? &place_.resume->rng : nullptr, static_cast<uint64_t>(cfg_.train.seed),
                         state_.step, per_rank_, ctx_.device);
}

// The first epoch's batches start before the run directory is written: data errors found in the first batch (e.g.
// damaged files of a streamed tree beyond data.max_bad_fraction) refuse the run without touching it. The loaders
// draw from the global generator only in next(), so the order of random draws is that of a loop without this.
void TrainLoop::take_first_batch() {
  if (state_.epoch >= cfg_.train.epochs) return;
  first_.loader = task_->train_batches(state_.epoch, ctx_.rank, ctx_.world, state_.batch);
  if (state_.batch > first_.loader->num_batches())
    throw UserError("--resume " + place_.resume->dir,
                    "taken at batch " + std::to_string(state_.batch) + " of epoch " + std::to_string(state_.epoch + 1) +
                        ", which has only " + std::to_string(first_.loader->num_batches()) + " batches",
                    "the training data changed since the checkpoint");
  first_.pending = first_.loader->next(first_.x, first_.y);
  if (first_.pending) first_.side = first_.loader->side();
}

// Every input has been checked: from here on only runtime failures remain.
void TrainLoop::start_writing() {
  if (group_->is_main()) {
    if (!place_.lock) place_.lock = std::make_unique<RunDirLock>(place_.run_dir);
    const bool restart = !place_.resume && args_.resume == "auto" && fs::exists(place_.run_dir + "/metrics.jsonl");
    out_.metrics =
        start_run_dir(place_.run_dir, cfg_.yaml, place_.resume ? std::optional<int64_t>(state_.step) : std::nullopt,
                      cfg_.log.tensorboard);
    out_.console = std::make_unique<ConsoleLog>(place_.run_dir + "/log.txt");
    std::cerr << "[" << utc_timestamp() << "] moh train " << cfg_.name << " (moh " << toolkit_version() << ", commit "
              << toolkit_commit() << ", LibTorch " << libtorch_version() << ") on " << device_line(ctx_.device) << "\n";
    print_notes();  // what the data loading had to say, now that every input is accepted
    if (place_.resume)
      std::cerr << "resuming " << place_.resume->dir << " at epoch " << state_.epoch << ", step " << state_.step
                << "\n";
    if (!place_.diverged_streak.empty()) {
      std::cerr << "note: the run stopped diverged (" << place_.diverged_streak
                << "): resuming from its last finite checkpoint, " << place_.resume->dir << "\n";
      fs::remove(place_.run_dir + "/diverged.json");
    }
    if (!place_.config_changes.empty()) std::cerr << place_.config_changes << "\n";
    if (ctx_.restart > 0) {  // logged where the curves are, so a plot of the run shows where it was restarted
      std::cerr << "restart " << ctx_.restart << " of at most " << ctx_.max_restarts
                << " (moh launch --max-restarts) after a failed rank, from step " << state_.step << "\n";
      out_.metrics.write({{"step", state_.step},
                          {"event", "restart"},
                          {"restart", ctx_.restart},
                          {"max_restarts", ctx_.max_restarts}});
    }
    if (restart)
      std::cerr << "note: " << place_.run_dir
                << " has no checkpoint yet (stopped before its first one): starting at step 0\n";
    if (const std::string w = slow_bf16_warning(ctx_); !w.empty()) std::cerr << "warning: " << w << "\n";
    std::cerr << "model " << task_->describe() << ", "
              << precision_summary(cfg_.train.precision, ctx_, args_.precision_probe.get()) << ", run dir "
              << place_.run_dir
              << (ctx_.world > 1 ? ", " + std::to_string(ctx_.world) + " data-parallel ranks" : std::string()) << "\n";
    if (!out_.memory.line.empty()) std::cerr << out_.memory.line << "\n";
  }
  // One bar for the whole run: batches b/S (S = epochs × batches per epoch, capped by train.max_steps), the rate of
  // this process's batches, and the ETA of the rest of the run.
  const int64_t done = state_.epoch * (first_.loader ? first_.loader->num_batches() : 0) + state_.batch;
  int64_t total = first_.loader ? cfg_.train.epochs * first_.loader->num_batches() : done;
  if (cfg_.train.max_steps > 0) total = std::min(total, cfg_.train.max_steps);
  out_.progress = std::make_unique<Progress>("", total, "step", group_->is_main() ? -1 : 2, std::min(done, total));
}

LoopResult TrainLoop::run() {
  start_writing();
  result_.run_dir = place_.run_dir;
  result_.best_metric = state_.best_metric;
  // Ctrl-C / SIGTERM: every rank learns of a request at the same step (a collective), and all stop there together.
  const StopOnSignal stop_on_signal(/*quiet=*/!group_->is_main());
  const Tf32Scope tf32(ctx_.precision);  // precision: tf32 (the official DiT's fp32 setting on CUDA)
  for (int64_t epoch = state_.epoch; epoch < cfg_.train.epochs && !stop_; ++epoch) run_epoch(epoch);
  if (guard_.diverged) report_divergence();
  report_peak_memory();
  if (interrupted_) result_.stop_signal = StopOnSignal::requested() != 0 ? StopOnSignal::requested() : SIGINT;
  result_.steps = state_.step;
  result_.best_metric = state_.best_metric;
  result_.seconds = seconds_since(start_);
  return result_;
}

// The run's peak memory beside the check's estimate (rank 0's process), in hundredths of a GiB: what the estimate is
// judged by (docs/BENCHMARKS.md), and what a user sizing the next run reads. Not in metrics.jsonl, whose lines are the
// same whether a run was resumed or not.
void TrainLoop::report_peak_memory() {
  if (!group_->is_main()) return;
  char line[160];
  std::snprintf(line, sizeof line, "memory: peak %.2f GiB per process", peak_memory_so_far(ctx_.device) / kGiB);
  std::cerr << line;
  if (out_.memory.estimate > 0) {
    std::snprintf(line, sizeof line, " (estimated %.2f GiB before the first step)", out_.memory.estimate / kGiB);
    std::cerr << line;
  }
  std::cerr << "\n";
}

void TrainLoop::run_epoch(int64_t epoch) {
  const int64_t first_batch = first_.loader ? state_.batch : 0;  // a run resumed inside an epoch
  const std::unique_ptr<BatchStream> loader =
      first_.loader ? std::move(first_.loader) : task_->train_batches(epoch, ctx_.rank, ctx_.world, 0);
  const int64_t steps_per_epoch = loader->num_batches();
  if (steps_per_epoch == 0) throw UserError("config: data.batch_size", "larger than the training set", "");
  if (first_batch == 0) state_.skipped = 0;
  out_.progress->set_label("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg_.train.epochs) + " step");
  net_.model->train();
  window_.start = Clock::now();
  at::Tensor x, y, side;
  auto next_batch = [&] {
    if (!first_.pending) {
      const bool more = loader->next(x, y);
      side = more ? loader->side() : at::Tensor();
      return more;
    }
    x = std::move(first_.x);
    y = std::move(first_.y);
    side = std::move(first_.side);
    first_.pending = false;
    return true;
  };
  int64_t batches_done = steps_per_epoch;  // where in this epoch a stop on a signal leaves it
  for (int64_t b = first_batch; next_batch(); ++b) {
    run_step(std::move(x), std::move(y), std::move(side), epoch, b, steps_per_epoch);
    if (guard_.diverged) break;
    if (net_.phema && net_.phema->due(state_.step) && state_.step != net_.last_snapshot) write_phema_snapshot();
    if (cfg_.train.max_steps > 0 && state_.step >= cfg_.train.max_steps) {
      stop_ = true;
      break;
    }
    const int64_t every = cfg_.train.ckpt_every_steps;
    if (every > 0 && state_.step % every == 0 && b + 1 < steps_per_epoch) save_inside_epoch(epoch, b + 1);
    if (guard_.diverged) break;
    if (stop_requested()) {
      stop_ = interrupted_ = true;
      batches_done = b + 1;
      break;
    }
  }
  if (window_.steps > 0) log_window(epoch);  // every run with a step has a metrics line, and the summary its loss
  out_.progress->end_line();
  if (guard_.diverged) return;  // no evaluation, no checkpoint: run() says where the last finite one is
  if (interrupted_) {           // resume continues at batch b + 1 of this epoch (its end-of-epoch work still to come)
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
    const WorkingCopyScope copies(net_.copies.get());
    losses = task_->backward(*net_.model, std::move(x), std::move(y), {epoch, b, state_.step, std::move(side)},
                             *net_.scaler);
  }
  group_->average_gradients(net_.model->parameters());  // no-op on one process
  resolve_pending();  // the previous step's flag, read now that this step's work is queued
  if (stop_) return net_.optimizer->zero_grad();
  lr_ = step_learning_rate(cfg_, epoch, b, state_.skipped, steps_per_epoch);
  for (auto& g : net_.optimizer->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr_);
  // Checked after the average: every rank sees the same gradients, so every rank decides alike. Under fp16 the
  // scaled gradients overflow by design; the scaler judges them and the guard the loss alone.
  const at::Tensor finite = finite_flag(
      losses.front().second, ctx_.precision == Precision::fp16 ? std::vector<at::Tensor>{} : net_.model->parameters());
  batch_of_run_ = epoch * steps_per_epoch + b;
  const bool took = guard_.device_skip ? optimize_on_device(finite) : optimize_on_host(finite);
  if (net_.copies) net_.copies->refresh();  // the next forward reads this step's weights
  window_.add(losses, finite, images, classes, took);
  out_.progress->advance(1, out_.status);
  if (took && state_.step % cfg_.train.log_every_steps == 0) log_window(epoch);
}

// The host reads the step's flag (free on a CPU; the fp16 scaler reads its own), then steps or skips.
bool TrainLoop::optimize_on_host(const at::Tensor& finite) {
  const bool ok = finite.item<float>() > 0;
  bool took = false;
  if (ok) {
    took = complete_optimizer_step(*net_.optimizer, *net_.model, *net_.scaler, cfg_.optim.clip_grad, net_.optim_impl,
                                   net_.ema.get(), state_);
    if (took && net_.phema) net_.phema->update(state_.step);
  } else {
    net_.optimizer->zero_grad();
    ++state_.skipped;
  }
  count_outcome(ok, batch_of_run_);
  return took;
}

// Fused AdamW skips on the device when the flag says so (its found_inf) and the EMA update is masked there; the host
// counts the step as taken until resolve_pending() learns otherwise.
bool TrainLoop::optimize_on_device(const at::Tensor& finite) {
  guard_.params.clear();
  for (const auto& p : net_.model->parameters())
    if (p.grad().defined()) guard_.params.push_back(p);
  if (cfg_.optim.clip_grad > 0) clip_grad_norm(guard_.params, cfg_.optim.clip_grad, net_.optim_impl);
  adamw_step(*net_.optimizer, net_.optim_impl, 1.0 - finite);
  net_.optimizer->zero_grad();
  if (net_.ema) net_.ema->update(*net_.model, state_.step, finite);
  if (net_.phema) net_.phema->update(state_.step + 1, finite);
  ++state_.step;
  guard_.batch = batch_of_run_;
  guard_.pending.put(finite);
  return true;
}

void TrainLoop::resolve_pending() {
  if (!guard_.pending.pending()) return;
  const bool ok = guard_.pending.take() > 0;
  if (!ok) {
    --state_.step;
    ++state_.skipped, ++window_.skipped;
    adamw_unstep(*net_.optimizer, guard_.params);
  }
  count_outcome(ok, guard_.batch);
}

// A non-finite step counted; too many in a row end the run (the message is raised once the loop has stopped).
void TrainLoop::count_outcome(bool finite, int64_t batch) {
  if (guard_.run->record(finite, batch)) stop_ = guard_.diverged = true;
}

// The metrics line of the window so far (every log_every_steps steps, and the partial window at an epoch's end):
// the only place the losses are read from the device.
void TrainLoop::log_window(int64_t epoch) {
  resolve_pending();
  const double secs = seconds_since(window_.start);
  std::vector<at::Tensor> parts;
  for (const auto& [name, v] : window_.sums) parts.push_back(v.reshape({1}).to(window_.finite.device()));
  parts.push_back(window_.finite.reshape({1}));
  const at::Tensor host = at::cat(parts).to(at::kCPU, at::kDouble).contiguous();
  std::vector<double> sums(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  sums = group_->sum(sums);
  const double finite_steps = sums.back();  // summed over the ranks, like the losses
  result_.losses.clear();
  for (size_t i = 0; i < window_.sums.size(); ++i)
    result_.losses.emplace_back(window_.sums[i].first,
                                finite_steps > 0 ? sums[i] / finite_steps : std::numeric_limits<double>::quiet_NaN());
  nlohmann::json line{
      {"step", state_.step}, {"epoch", epoch}, {"lr", lr_}, {"img_per_s", window_.images / std::max(secs, 1e-9)}};
  for (const auto& [k, v] : result_.losses) line[k] = v;
  if (window_.skipped > 0) line["skipped_steps"] = window_.skipped;
  if (window_.classes > 0) line["classes_per_batch"] = static_cast<double>(window_.classes) / window_.steps;
  out_.metrics.write(line);
  char status[96];
  std::snprintf(status, sizeof status, "loss=%.4f lr=%.2e", scalar(result_.losses, "loss"), lr_);
  out_.status = status;
  window_.reset();
}

// A checkpoint after batch next_batch − 1 of `epoch` (train.ckpt_every_steps): a resume continues at next_batch, as
// after a signal, and this run goes on. A step the device skipped (known only now) moves the count off the multiple.
void TrainLoop::save_inside_epoch(int64_t epoch, int64_t next_batch) {
  resolve_pending();
  if (guard_.diverged || state_.step % cfg_.train.ckpt_every_steps != 0) return;
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
  if (guard_.diverged) return;
  const bool last = stop_ || epoch + 1 == cfg_.train.epochs;
  state_.epoch = epoch + 1;
  state_.batch = 0;
  state_.skipped = 0;
  bool best = false;
  if (last || (epoch + 1) % cfg_.train.eval_every_epochs == 0) {
    const Scalars ev = task_->evaluate(net_.model, *group_);
    nlohmann::json line{{"step", state_.step}, {"epoch", epoch}};
    if (!ev.empty()) {
      result_.final_eval = ev;
      for (const auto& [k, v] : ev) line[k] = v;
      if (net_.ema) {
        result_.final_eval_ema = task_->evaluate(net_.ema->ptr(), *group_);
        for (const auto& [k, v] : result_.final_eval_ema) line[k + "_ema"] = v;
      }
      if (group_->is_main()) std::cerr << task_->eval_message(epoch, ev, result_.final_eval_ema) << "\n";
      best = std::isfinite(ev.front().second) && ev.front().second > state_.best_metric;  // NaN is never best
      if (best) state_.best_metric = ev.front().second;
    }
    if (nlohmann::json load = head_load_shares(); !load.is_null()) line["head_load"] = std::move(load);
    if (line.size() > 2) out_.metrics.write(line);
  }
  std::string saved;
  if (best || last || (epoch + 1) % cfg_.train.ckpt_every_epochs == 0) {
    saved = save();
    if (best && group_->is_main())
      write_file_atomic(place_.run_dir + "/checkpoints/best", fs::path(saved).filename().string() + "\n");
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
  std::vector<at::Tensor> load = task_->take_head_load(*net_.model);
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
  const TensorMap model = module_tensor_views(*net_.model), optim = optimizer_tensors(*net_.optimizer, *net_.model),
                  ema = net_.ema ? module_tensor_views(net_.ema->module()) : TensorMap{};
  const auto profiles = net_.phema ? net_.phema->checkpoint_files() : std::vector<std::pair<std::string, TensorMap>>{};
  std::vector<at::Tensor> all;
  int64_t bytes = 0;
  for (const TensorMap* m : {&model, &optim, &ema})
    for (const auto& [k, t] : *m) all.push_back(t), bytes += static_cast<int64_t>(t.nbytes());
  for (const auto& [file, m] : profiles)
    for (const auto& [k, t] : m) all.push_back(t), bytes += static_cast<int64_t>(t.nbytes());
  if (!all_finite(all)) {  // the same weights on every rank: every rank stops here alike
    guard_.run->record(false, batch_of_run_);
    stop_ = guard_.diverged = true;
    report_divergence();
  }
  const std::string room = group_->is_main() ? disk_room_problem(place_.run_dir + "/checkpoints", bytes) : "";
  if (group_->sum({room.empty() ? 0.0 : 1.0})[0] > 0)
    throw RunStopped("checkpoint at step " + std::to_string(state_.step) + ": " +
                     (room.empty() ? "rank 0 found the disk full" : room) +
                     " (free space, or keep fewer checkpoints: train.keep_last; every earlier checkpoint is intact)");
  TensorMap rng = dist::gather_rng_states(*group_, ctx_.device, per_rank_);
  rng["amp_scaler"] = net_.scaler->state();
  if (!group_->is_main()) return "";
  state_.written_by = provenance(ctx_.device);
  // Views of the live tensors, streamed to disk one at a time (an XL/2 state is ~11 GB).
  const std::string dir = save_checkpoint(place_.run_dir, state_, model, optim, cfg_.yaml, rng, ema, profiles);
  prune_checkpoints(place_.run_dir, cfg_.train.keep_last, cfg_.train.keep_every_steps);
  return dir;
}

// A post-hoc EMA snapshot (train.phema) after this step, once the step is known to be taken (a step the device
// skipped is undone by resolve_pending and is then no snapshot step). Rank 0 writes; every rank holds the same.
void TrainLoop::write_phema_snapshot() {
  resolve_pending();
  if (!net_.phema->due(state_.step) || state_.step == net_.last_snapshot) return;
  net_.last_snapshot = state_.step;
  if (group_->is_main()) net_.phema->write(place_.run_dir, state_.step);
}

// The one line of a run that gave up: the non-finite steps, the last finite checkpoint (what --resume auto takes up),
// and what to change; the run directory remembers it for that resume.
void TrainLoop::report_divergence() {
  const std::optional<std::string> last = latest_checkpoint(place_.run_dir);
  const std::string where = last ? *last : "none yet";
  if (group_->is_main())
    write_file_atomic(
        place_.run_dir + "/diverged.json",
        nlohmann::json{{"streak", guard_.run->streak()}, {"last_finite_checkpoint", where}}.dump() + "\n");
  throw RunStopped("training diverged: " + guard_.run->streak() + " at optimizer step " + std::to_string(state_.step) +
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
