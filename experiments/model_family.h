#pragma once
// What a model family tells the rest of the toolkit about itself, once (timm's register_model): its variant names,
// the rules of its experiments, its training task, a forward pass on tensors from a file, a size summary, a
// benchmark step and its attention-path rows. Each family fills one ModelFamily
// (classifier_family.cpp, dit_family.cpp with the SD-VAE, inception_family.cpp, all in experiments/);
// experiments/registry.h lists them, and commands and benchmarks ask it instead of testing a family themselves.
// This header knows no family: every hook is a function of names, configs and tensors.
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/platform/amp.h"
#include "core/platform/run_context.h"
#include "core/train/checkpoint.h"
#include "core/train/ema.h"
#include "core/train/train_loop.h"
#include "core/train/working_copies.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

/// What an experiment file is used for: training (and `moh config`, `moh eval`), sampling (`moh sample`: the training
/// rules plus those of classifier-free guidance), or encoding its images with `moh extract-latents` (a DiT config
/// whose data are still images).
enum class ExperimentUse { train, sample, extract_latents };

/// `moh info --model NAME`: size and MoH layout of a variant (layer-weighted active heads, as the paper counts).
struct ModelSummary {
  std::string name, family;
  int64_t params = 0, trainable = 0, layers = 0, moh_layers = 0, routed_layers = 0;
  double active_ratio = 1.0;
};

/// Adds a module's parameter counts (all, trainable) to `s`.
void count_parameters(const torch::nn::Module& module, ModelSummary& s);

/// A summary with the name, family and parameter counts of `net` (a fixed network needs nothing more).
ModelSummary parameter_summary(const std::string& name, const std::string& family, const torch::nn::Module& net);

/// The names of a variant table (pairs of name and options, in table order).
template <class Table>
std::vector<std::string> names_of(const Table& table) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.first);
  return names;
}

/// A run's checkpoint, opened without its tensors, and the experiment it was trained with.
struct FamilyCheckpoint {
  Checkpoint ckpt;
  ExperimentConfig cfg;
};
/// Opens the checkpoint (or run directory) `path` for a family's loader: a UserError unless the experiment's model
/// is one of `names`, the variants of `family` ("DiT", "classifier"; `hint` says what to pass instead). The
/// checkpoint is held against pruning (core/train/retention.h) from then on.
FamilyCheckpoint open_family_checkpoint(const std::string& path, const std::vector<std::string>& names,
                                        const std::string& family, const std::string& hint);

/// A model and where its weights came from, whatever its family (LoadedClassifier, LoadedDiT): one of this toolkit's
/// checkpoints, or a config's model with its weights file (or none). Sampling, evaluation and the EMA sweep hold
/// their models as this.
template <class Model>
struct LoadedModel {
  Model model{nullptr};               ///< in eval mode, on the CPU
  ExperimentConfig cfg;               ///< the experiment it was trained with (or the config that built it)
  std::string dir;                    ///< the checkpoint directory; "" for a model built from a config
  std::string weights = "untrained";  ///< "ema" or "model" (a checkpoint's); a weights file's key, or "untrained"
  std::string weights_file;           ///< the file the weights came from ("" untrained)
  int64_t step = -1;                  ///< optimizer steps of the checkpoint (−1: not from a checkpoint)
  nlohmann::json written_by;          ///< the provenance of the process that saved it (null for older checkpoints)
  /// Where the weights came from, as reports name it: the checkpoint directory, else the weights file.
  std::string source() const { return dir.empty() ? weights_file : dir; }
};

/// Loads an opened checkpoint's weights into `model` (built for its experiment): the EMA weights when `ema` and the
/// checkpoint kept them (a UserError when it did not and `require_ema`), else the trained weights; eval mode.
template <class Model>
LoadedModel<Model> load_family_model(const FamilyCheckpoint& opened, Model model, bool ema, bool require_ema) {
  LoadedModel<Model> r;
  r.cfg = opened.cfg;
  r.model = std::move(model);
  r.dir = opened.ckpt.dir;
  r.step = opened.ckpt.state.step;
  r.written_by = opened.ckpt.state.written_by;
  const CheckpointWeights w = load_checkpoint_weights(*r.model, opened.ckpt, ema, require_ema);
  r.weights = w.which;
  r.weights_file = w.file;
  r.model->eval();
  return r;
}

/// `moh forward`: one fp32 eval-mode forward of variant `name` with `weights` on the tensors of `inputs`.
struct ForwardRequest {
  /// The network as an experiment's model section gives it: name, router, head split, weights_allow_missing (the
  /// inputs and weights decide sizes and classes).
  ModelConfig model;
  TensorMap weights, inputs;
  std::string weights_origin, inputs_origin;  ///< the files, for errors
};

/// Input `name` of a forward request as `dtype` with `dim` dimensions, or a UserError naming what the model needs.
at::Tensor forward_input(const ForwardRequest& r, const std::string& name, at::ScalarType dtype, int64_t dim,
                         const std::string& needs);

/// Refuses tensors that are neither inputs nor named like the model's outputs (a reference file holding PyTorch's
/// inputs and expected outputs can be passed as it is).
void check_forward_inputs(const ForwardRequest& r, const std::set<std::string>& inputs,
                          const std::set<std::string>& outputs, const std::string& needs);

/// `moh bench train`: one training step of a variant on random data.
struct BenchRequest {
  std::string name;
  RunContext ctx;
  int64_t batch = 1;
  int64_t img_size = 0;  ///< 0 = the variant's
  AttentionPath path = AttentionPath::automatic;
  OptimImpl optim = OptimImpl::automatic;  ///< optim.impl of the step's AdamW, clipping and EMA
  double ema_decay = 0;                    ///< > 0: the step updates an EMA copy too, as a run with train.ema_decay
  bool grad_checkpoint = false;            ///< train.grad_checkpoint: blocks
  bool plain_router = false;               ///< routers by the official op sequence (nn::HeadRouter::plain)
  FusedMode fused = FusedMode::automatic;  ///< model.fused: the fused block operations and weight working copies
  /// When set, the model is the experiment's (its options as a run builds them; name, img_size, path and
  /// grad_checkpoint above are then unused).
  const ExperimentConfig* experiment = nullptr;
};

/// The optimizer half of a benchmarked training step, as a run takes it (core/train/optimizer.h finish_optimizer_step):
/// AdamW and gradient clipping in the request's optim.impl (resolved for its device), then the EMA update when the
/// request keeps one.
class BenchOptimizer {
 public:
  /// `copy` builds a second model of the same variant on the request's device (the EMA's).
  BenchOptimizer(torch::nn::Module& model, const BenchRequest& r, double lr, double weight_decay, double clip,
                 const std::function<std::shared_ptr<torch::nn::Module>()>& copy);
  void step(torch::nn::Module& model);
  /// The loss scaler the step's backward scales by (fp16) and step() unscales by.
  GradScaler& scaler() { return *scaler_; }
  /// The weights' working copies the step's backward reads (WorkingCopyScope), as a run keeps them with model.fused;
  /// null without.
  const WorkingCopies* copies() const { return copies_.get(); }

 private:
  std::unique_ptr<torch::optim::AdamW> adamw_;
  std::unique_ptr<WorkingCopies> copies_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<ModelEma> ema_;
  OptimImpl impl_;
  double clip_;
  int64_t steps_ = 0;
};

/// The step (forward, backward, optimizer step) and a forward alone, with what they ran on. The closures own the
/// model, optimizer and batch they use.
struct BenchStep {
  std::function<void()> step, forward;
  std::string attention_path;
  std::vector<int64_t> input;  ///< C, H, W of one example
};

/// One family. Fixed networks (SD-VAE, FID-Inception) leave the experiment hooks empty.
struct ModelFamily {
  /// Keys a resumed run of this family may not change (its weights would not fit) and keys it changes only when
  /// asked (the training process), beside the data section's and the loop's.
  std::vector<std::string> fixed_on_resume, guarded_on_resume;
  std::string id;     ///< "classifier", "dit", "sd-vae", "fid-inception": JSON keys and `moh info --list`
  std::string title;  ///< heading of `moh info --list`
  std::function<std::vector<std::string>()> names;
  std::function<ModelSummary(const std::string& name)> summarize;
  std::function<TensorMap(const ForwardRequest&)> forward;
  std::string forward_inputs;  ///< what `moh forward --input` must hold, for --help and errors

  // Trainable families only.
  std::function<void(const ExperimentConfig&, ExperimentUse)> validate;
  std::function<std::unique_ptr<TrainTask>(const ExperimentConfig&, const RunContext&)> task;
  std::function<double(const ExperimentConfig&)> active_ratio;  ///< of the experiment's model, layer-weighted
  std::function<BenchStep(const BenchRequest&)> bench_step;
  std::function<std::string()> attention_path_rows;  ///< rows of the `attention_path: auto` table
  /// How a checkpoint of this family is measured: `moh eval` (a classifier: it also evaluates its validation split
  /// during training, at data.eval_batch_size) or `moh sample` + `moh fid` (a generator); `moh ema sweep`'s segments.
  enum class Measure { none, eval, sample_fid } measure = Measure::none;

  bool trainable() const { return static_cast<bool>(task); }
};

}  // namespace moh::experiments
