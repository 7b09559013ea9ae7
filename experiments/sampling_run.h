#pragma once
// `moh sample` as library code: which model (a checkpoint's EMA weights, a weights file, or untrained), which labels,
// the chain, the per-rank part files and their merge into ADM's samples.npz, the grid and sampling.json.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "experiments/experiment_config.h"

namespace moh::experiments {

/// What the user asked for (DiT sample.py / sample_ddp.py flags, as `moh sample` spells them).
struct SamplingRequest {
  std::string checkpoint;         ///< a DiT run or checkpoint directory ("" = config + weights or untrained)
  std::string config;             ///< CONFIG.yaml (needed without a checkpoint; must name the checkpoint's model)
  std::vector<std::string> sets;  ///< --set overrides (only sampling.* with a checkpoint) and the flag shorthands
  bool untrained = false;         ///< sample a freshly initialised model (a baseline)
  bool weights = false;           ///< CONFIG.yaml's model.weights (--weights) initialise the model
  bool raw = false;               ///< a checkpoint's trained weights instead of its EMA
  std::optional<int64_t> num_samples;
  std::string labels = "balanced";  ///< balanced (rows of per_class), random, or a list 1,2,3 (cycled)
  std::string out = "samples";
  std::string device = "auto";
  std::string class_names_file;  ///< one class name per line, for the grid's captions
  bool head_load = false;        ///< routing analytics of a MoH-DiT (diffusion/head_load.h) into DIR/head_load.*
};

/// What was written.
struct SamplingSummary {
  std::string out, weights;     ///< the output directory; which weights sampled ("ema", "model", a file, "untrained")
  int64_t step = -1;            ///< the checkpoint's step (−1 without one)
  int64_t count = 0;            ///< images in samples.npz
  int64_t resumed_batches = 0;  ///< batches found on disk from an interrupted run
  bool grid = false;            ///< grid.png written (not in a build without OpenCV)
  double seconds = 0;
  int64_t nfe = 0;          ///< network evaluations per image
  bool main = true;         ///< this process wrote the outputs (rank 0)
  std::string head_load{};  ///< the routing summary and files with --head-load ("" without)
  std::string precision{};  ///< the network's precision as computed ("tf32", "tf32 (fp32 on a CPU)", "bf16")
};

/// Checks every input (before any work), samples on this process's rank, merges and writes DIR/samples.npz (arr_0
/// uint8 (N, H, W, 3), arr_1 labels), DIR/grid.png (one row per class, at most 32 × 16 tiles) and DIR/sampling.json.
/// Part files under DIR/parts/ let an interrupted run resume (DIR/parts/plan.json must describe the same sampling)
/// and are removed after the merge.
SamplingSummary run_sampling(const SamplingRequest& request);

/// The labels of a sampling run: "balanced" (0,0,…,1,1,… per_class each, cycling through the classes), "random"
/// (uniform, drawn from the global generator) or a list "1,7,3" (cycled to n). A bad list is a UserError.
at::Tensor sampling_labels(const std::string& mode, int64_t n, int64_t num_classes, int64_t per_class);

}  // namespace moh::experiments
