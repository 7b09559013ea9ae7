#pragma once
// The one training loop (guided-diffusion's TrainLoop, timm's model-agnostic loop): it owns the run directory,
// resume, random state, optimizer (AdamW), AMP scaler, EMA, learning-rate schedule, gradient averaging across ranks,
// metrics, progress, evaluation cadence and checkpoints. A model family supplies a TrainTask: build the model,
// batches for (epoch, rank, world), forward/backward → named losses, evaluate → named metrics. The loop knows no
// model family.
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/batch_stream.h"
#include "core/dist/distributed.h"
#include "core/platform/amp.h"
#include "core/platform/memory_preflight.h"
#include "core/platform/run_context.h"
#include "core/train/checkpoint.h"
#include "core/train/ema.h"
#include "core/train_config.h"

namespace moh {

/// Where a training run lives and whether to continue one.
struct TrainArgs {
  std::string run_dir;  ///< "" = runs/<config name>
  std::string resume;   ///< "" (fresh; refuses an existing run), "auto" (latest checkpoint if any) or a directory
  bool allow_config_change = false;  ///< resume although the data or batch settings differ from the checkpoint's
  /// The process group to train in instead of joining the one the environment describes (tests: a group that
  /// records what its collectives are handed).
  std::shared_ptr<dist::Group> group = nullptr;
  /// What decides `precision: auto` on a CPU: the experiment's own training step (set by moh train; without it, a
  /// generic transformer block).
  std::shared_ptr<const PrecisionProbe> precision_probe = nullptr;
  /// One step of the run's model at a batch: the memory check before any work (core/platform/memory_preflight.h; none =
  /// no check).
  std::shared_ptr<const MemoryProbe> memory_probe = nullptr;
};

/// The loop's own keys a resumed run changes only when asked (`--allow-config-change`: the ranks, the accumulation
/// and the seed, so the run is no longer the same run); LoopConfig names the other sections' and the family's.
const std::vector<std::string>& config_keys_guarded_on_resume();

/// Named scalars in a fixed order: the mean losses of a logging window ("loss" first), the metrics of an evaluation.
using Scalars = std::vector<std::pair<std::string, double>>;
/// The losses of one step as named 0-dim tensors on the run's device, detached ("loss" first). The loop sums them
/// there and reads them only when it writes a metrics line, so no step waits for the device between its forward
/// and its backward (DiT's train.py reads its loss once per step, after the optimizer step).
using LossTensors = std::vector<std::pair<std::string, at::Tensor>>;
/// The value named `name` (0 if absent).
double scalar(const Scalars& s, const std::string& name);

/// Learning rate at (fractional) epoch t: timm CosineLRScheduler as the official TransNeXt recipe configures it
/// (t_initial = epochs, warm-up from warmup_lr over warmup_epochs, cosine to min_lr over t / epochs), or constant
/// (DiT).
double learning_rate_at(const LoopConfig& cfg, double t);

/// The learning rate for batch `batch` of `epoch` (of `steps_per_epoch`), when `skipped` of the epoch's earlier
/// optimizer steps were skipped (fp16 overflow): a step-unit schedule advances with the steps taken, not the batches.
double step_learning_rate(const LoopConfig& cfg, int64_t epoch, int64_t batch, int64_t skipped,
                          int64_t steps_per_epoch);

/// The optimizer half of a training step: unscale, clip and step (finish_optimizer_step, core/train/optimizer.h); then,
/// only when the step was taken, the EMA update and state.step += 1 — a skipped step (inf/NaN gradients under fp16 loss
/// scaling) adds to state.skipped and changes nothing else (guided-diffusion: `if took_step: update_ema(); ...`).
/// Returns whether the step was taken.
bool complete_optimizer_step(torch::optim::AdamW& optimizer, torch::nn::Module& model, GradScaler& scaler, double clip,
                             OptimImpl impl, ModelEma* ema, TrainerState& state);

/// Where in the run a training step is.
struct StepInfo {
  int64_t epoch = 0, batch = 0;  ///< epoch and batch index within it
  int64_t step = 0;              ///< optimizer steps taken before this one (steps skipped by fp16 overflow excluded)
  at::Tensor side;               ///< the batch's BatchStream::side() (undefined for most streams)
};

/// What a model family supplies to the loop. Built after the run context and the resume decision, before the model.
class TrainTask {
 public:
  virtual ~TrainTask() = default;
  /// A freshly initialised model (CPU) drawn from the global generator; called once for the trained model and, when
  /// an EMA is kept, once more for its copy.
  virtual std::shared_ptr<torch::nn::Module> build_model() = 0;
  /// The start-line description of the model ("MoH-ViT-Nano: 75 % active heads").
  virtual std::string describe() const = 0;
  /// Whether a parameter takes weight decay (the others form a second AdamW group with weight_decay 0).
  virtual bool decays(const std::string& name, const at::Tensor& param) const {
    (void)name, (void)param;
    return true;
  }
  /// Whether each rank draws its own random numbers (dropout, drop path) or every rank follows one common generator
  /// (a task that makes the global batch's draws on every rank and takes its rows).
  virtual bool per_rank_rng() const = 0;
  /// This rank's share of an epoch's training batches (rank-local batch size, CPU tensors), from batch `start_batch`
  /// on (a run resumed inside an epoch): the batches it yields, and the global random draws it makes, are those an
  /// uninterrupted epoch makes from that batch on.
  virtual std::unique_ptr<BatchStream> train_batches(int64_t epoch, int rank, int world, int64_t start_batch) const = 0;
  /// Training examples per epoch (before the split over ranks): the loop refuses a batch larger than this.
  virtual int64_t train_examples() const = 0;
  /// Forward and scaled backward of one optimizer step on the rank's batch (gradients accumulate in the model's
  /// parameters); returns the step's losses ("loss" first), means over the rank's batch, without reading them.
  virtual LossTensors backward(torch::nn::Module& model, at::Tensor x, at::Tensor y, const StepInfo& at,
                               const GradScaler& scaler) = 0;
  /// Metrics on held-out data, the same on every rank (the first is the one a run's best checkpoint maximises);
  /// empty = the family does not evaluate during training.
  virtual Scalars evaluate(const std::shared_ptr<torch::nn::Module>& model, dist::Group& group) {
    (void)model, (void)group;
    return {};
  }
  /// Whether the model's products read low-precision working copies of its weights under autocast
  /// (core/train/working_copies.h), refreshed after every optimizer step instead of cast in every forward pass.
  virtual bool working_copies() const { return false; }
  /// The routed heads' picks of every routed MoH layer ((E) counts each) since the last call, reset: logged at each
  /// evaluation as the run's head load; none for a model without routing.
  virtual std::vector<at::Tensor> take_head_load(torch::nn::Module& model) {
    (void)model;
    return {};
  }
  /// The console line after an evaluation ("epoch 3: top-1 ..."); `ema` is empty without an EMA.
  virtual std::string eval_message(int64_t epoch, const Scalars& model, const Scalars& ema) const {
    (void)epoch, (void)model, (void)ema;
    return "";
  }
};

/// What a training run ends with.
struct LoopResult {
  std::string run_dir;
  int64_t steps = 0;
  double seconds = 0;
  Scalars losses;                      ///< means over the last logging window
  Scalars final_eval, final_eval_ema;  ///< the last evaluation (empty when the task does not evaluate / no EMA)
  double best_metric = 0;              ///< best value of final_eval's first metric over the run
  int stop_signal = 0;     ///< SIGINT/SIGTERM when the run stopped early on a signal (its checkpoint is saved)
  std::string checkpoint;  ///< the checkpoint written when stopping on a signal
};

/// Builds the task once the run context exists (data loading and data-vs-model checks happen there).
using TaskFactory = std::function<std::unique_ptr<TrainTask>(const RunContext&)>;

/// Runs (or resumes) training as configured. SIGINT/SIGTERM during the run stop it at the next step boundary with a
/// checkpoint (result.stop_signal set; `--resume auto` continues exactly, inside the epoch); a second one exits at
/// once.
LoopResult run_training(const LoopConfig& cfg, const TrainArgs& args, const TaskFactory& make_task);

}  // namespace moh
