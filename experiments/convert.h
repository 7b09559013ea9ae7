#pragma once
// Dense → MoH conversion (`moh convert --to-moh`), for every trainable family through the registry: a dense DiT or
// TransNeXt checkpoint (a toolkit run or an official file) is mapped onto a MoH target experiment by name. Every
// dense tensor is reused; the learned routers (`wg`, `wg_0`, `wg_1`) are new and start at zero, which gives every
// kept head a gate of exactly 1 (softmax of zeros, renormalised, × K, × h_s, α = softmax(0) × 2 = 1), and the
// parameter-free query_norm router has no tensors at all — so with K = every routed head the converted model is the
// dense model. Which heads become the always-on shared ones: `first` (the official order), `importance` (ranked by
// each head's mean contribution norm through the output projection on calibration batches of the training data) or
// `learned` (a short phase learning one score per head with the weights frozen: the forward keeps only the h_s
// top-scored heads of each layer — a binary mask — and the gradient reaches the scores straight through
// sigmoid(score); the mask is then frozen). Chosen heads are permuted to the front with their Q/K/V rows, projection
// columns and per-head parameters, which leaves the dense function unchanged.
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/platform/run_context.h"
#include "experiments/experiment_config.h"

namespace moh::experiments {

/// How the shared heads of each MoH layer are chosen among the dense heads.
enum class SharedChoice { first, importance, learned };
SharedChoice shared_choice_from(const std::string& name);  ///< "first" | "importance" | "learned" (UserError)
const char* to_string(SharedChoice c);

/// What to convert and how.
struct ConvertOptions {
  std::string source;  ///< dense weights: .safetensors, torch.save file, or a toolkit checkpoint/run directory
  std::string key;     ///< entry of a nested file (model, ema, state_dict) or of a run (model | ema)
  SharedChoice shared = SharedChoice::first;
  int64_t calib_batches = 8;  ///< training batches for importance (each once) or for the mask phase (cycled)
  int64_t mask_steps = 50;    ///< optimizer steps of the learned-mask phase
  double mask_lr = 0.05;      ///< Adam learning rate of the mask scores
};

/// The choice made in one MoH layer.
struct LayerConversion {
  std::string name;  ///< module name, e.g. "blocks.3.attn"
  int64_t heads = 0, shared = 0, topk = 0;
  std::vector<int64_t> shared_heads;  ///< dense head indices that became heads [0, h_s)
  std::vector<double> scores;         ///< per dense head: importance or learned score (empty for `first`)
};

/// A converted model: the target's tensors by official name, and what each came from.
struct ConvertResult {
  TensorMap weights;
  std::vector<std::string> reused, created;  ///< tensor names taken from the dense weights / new (zero routers)
  std::vector<LayerConversion> layers;       ///< MoH layers with a choice (0 < h_s < h)
  std::string target;                        ///< the target model's description
};

/// Converts `opts.source` into the MoH model of `target` (an experiment: its model section is the target, its data
/// the calibration batches). UserErrors (before any work) for a source that is not a dense model of the target's
/// widths and depths, naming the first tensor that differs.
ConvertResult convert_to_moh(const ExperimentConfig& target, const ConvertOptions& opts, const RunContext& ctx);

/// Writes `out` as a run directory holding checkpoint 0 (model and EMA = the converted weights, the target
/// experiment as its config) and conversion.json, so `moh sample/eval --checkpoint OUT` use it and
/// `moh train TARGET --set model.weights=OUT` continue-tunes it.
void write_conversion(const std::string& out, const ExperimentConfig& target, const ConvertOptions& opts,
                      const ConvertResult& result);

}  // namespace moh::experiments
