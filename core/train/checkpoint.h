#pragma once
// Run directories and checkpoints. A run directory holds config.resolved.yaml, metrics.jsonl and
// checkpoints/<step:07d>/ with model.safetensors (official key names), optimizer.safetensors (AdamW moments by
// parameter name), trainer_state.json (step, epoch, RNG, format version) and config.resolved.yaml. Each checkpoint
// directory is written atomically and `checkpoints/latest` (a file naming it) is replaced last, so a run killed at
// any moment resumes from the last complete checkpoint.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/io/progress.h"
#include "core/io/safetensors.h"
#include "core/platform/rng_state.h"

namespace moh {

/// Version of the checkpoint layout written by this toolkit.
constexpr int kCheckpointFormat = 1;

/// Named parameters and buffers of a module as a TensorMap (CPU copies, official names).
TensorMap module_tensors(const torch::nn::Module& module);
/// The same as detached views of the live tensors (on their device, no copy): for writing a checkpoint at once.
TensorMap module_tensor_views(const torch::nn::Module& module);

/// Loads tensors into a module by name. Missing/unexpected names and shape mismatches are UserErrors naming them
/// (unless allow_missing, which tolerates missing entries).
void load_module_tensors(torch::nn::Module& module, const TensorMap& tensors, const std::string& origin,
                         bool allow_missing = false);

/// Loads a .safetensors file into a module by name, one tensor at a time (peak memory: the module plus its largest
/// tensor, not the module plus the file); the same errors as load_module_tensors.
/// `rename` maps the file's names to the module's (e.g. an older naming scheme).
void load_module_file(torch::nn::Module& module, const std::string& path, bool allow_missing = false,
                      const std::function<std::string(const std::string&)>& rename = {});

/// AdamW/Adam state by parameter name: "<name>.exp_avg", "<name>.exp_avg_sq" (views of the live state, on its device:
/// write them before the next step), "<name>.step".
TensorMap optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& module);
/// Restores optimizer_tensors() output into an optimizer built over the same module.
void load_optimizer_tensors(torch::optim::Optimizer& optimizer, const torch::nn::Module& module, const TensorMap& t,
                            const std::string& origin);

/// Everything a checkpoint holds besides tensors.
struct TrainerState {
  int64_t step = 0, epoch = 0;  ///< optimizer steps done; epoch to run next
  int64_t batch = 0;            ///< batches of `epoch` already done (a checkpoint taken inside an epoch: interrupt)
  int64_t skipped = 0;          ///< of those, batches whose optimizer step was skipped (fp16 overflow)
  double best_metric = 0;       ///< best value of the task's first evaluation metric (classifiers: top-1)
  /// provenance() of the process that wrote the checkpoint (null when unknown: conversions, older checkpoints); a
  /// record, never compared on resume: a run may continue on another device.
  nlohmann::json written_by;
};

/// Writes checkpoints/<step>/ atomically (model, optimizer, rng and, if given, ema .safetensors) and then updates
/// checkpoints/latest.
/// `extra`: more tensor files of the run's state, written as NAME.safetensors beside them (the post-hoc EMA profiles).
std::string save_checkpoint(const std::string& run_dir, const TrainerState& state, const TensorMap& model,
                            const TensorMap& optimizer, const std::string& config_yaml, const TensorMap& rng,
                            const TensorMap& ema = {},
                            const std::vector<std::pair<std::string, TensorMap>>& extra = {});

/// A loaded checkpoint.
struct Checkpoint {
  std::string dir;
  TrainerState state;
  TensorMap model, optimizer, rng;
  TensorMap ema;         ///< EMA weights (official names), empty if the run keeps none or they were not loaded
  bool has_ema = false;  ///< the checkpoint holds ema.safetensors
  std::string config_yaml;
};

/// Which weights of a checkpoint were loaded: "ema" or "model", and the .safetensors file.
struct CheckpointWeights {
  std::string which, file;
};
/// Loads a checkpoint's EMA weights into `module` when `ema` is asked for and the checkpoint kept one, else its
/// trained weights; with `require_ema` a checkpoint without EMA is a UserError instead. A checkpoint opened without
/// its tensors reads that one file, tensor by tensor.
CheckpointWeights load_checkpoint_weights(torch::nn::Module& module, const Checkpoint& ckpt, bool ema,
                                          bool require_ema);

/// The directory named by <run_dir>/checkpoints/latest, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
/// Loads a checkpoint directory (or a run directory: its latest checkpoint). Truncated/corrupt files are UserErrors.
/// `tensors` = false reads only its state and config (sampling and evaluation then load the one weights file they
/// use with load_checkpoint_weights: an XL/2 training state is ~4× its EMA weights).
Checkpoint load_checkpoint(const std::string& path, bool tensors = true);

/// The resume decision of a trainer, taken before anything touches the run directory: "auto" = its latest checkpoint
/// if any (a damaged `latest`, or checkpoints without one, is a UserError: never a silent restart), a path = that
/// checkpoint (or run), "" = a fresh run (UserError if the directory already holds one).
std::optional<Checkpoint> resolve_resume(const std::string& run_dir, const std::string& resume);

/// The exclusive lock of a run directory (flock on the empty file `<run_dir>/.lock`): a second training process on
/// the same run directory is refused. Released when the object is destroyed or the process ends in any way (kill -9
/// included). Creates the directory if needed.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

/// Starts writing into a run directory once every input has been checked: creates it, prints and saves
/// config.resolved.yaml, and opens metrics.jsonl (a fresh file, or cut back to `resumed_step` when resuming). With
/// `tensorboard`, metrics.jsonl is mirrored into a new event file in RUN/tb, which starts with the resolved config as
/// text (and, resumed, with the restart mark that drops what the killed process logged past `resumed_step`).
MetricsWriter start_run_dir(const std::string& run_dir, const std::string& config_yaml,
                            std::optional<int64_t> resumed_step, bool tensorboard = false);

/// The named tensors of a weights source: a .safetensors or torch.save file (`key` selects an entry of a nested
/// torch.save checkpoint), or one of this toolkit's checkpoint/run directories (`key` = model (default) or ema).
TensorMap load_weights_tensors(const std::string& path, const std::string& key);

/// Initialises a module from `model.weights`: a .safetensors file or a torch.save file (.pt/.pth/.bin, zip or legacy;
/// `key` picks the entry of a nested checkpoint, e.g. ema, model, state_dict), both with official key names; or one
/// of this toolkit's checkpoint/run directories (`key` = model (default) or ema). Missing, unexpected and
/// wrongly-shaped tensors are UserErrors naming the tensor; `allow_missing` tolerates missing ones (e.g. pos_embed).
void load_initial_weights(torch::nn::Module& module, const std::string& path, const std::string& key,
                          bool allow_missing = false);

}  // namespace moh
