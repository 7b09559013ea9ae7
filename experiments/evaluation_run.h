#pragma once
// The measurements behind `moh eval` and `moh fid` as library calls, and the one `moh ema sweep` makes of each point:
// a classifier checkpoint's top-1 / top-5 / loss on its validation split, a sample set's FID / sFID / IS / precision /
// recall / KID (or FD on DINOv2 features), and a checkpoint measured either way.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eval/ema_sweep.h"
#include "eval/generative.h"
#include "experiments/classifier_experiment.h"
#include "experiments/sampling_run.h"

namespace moh::experiments {

/// A classifier measured on the configured validation split.
struct ClassifierEvalRequest {
  std::string program = "moh eval";  ///< what the errors name
  std::string checkpoint;            ///< checkpoint or run directory ("" = config + model.weights)
  std::string config;                ///< CONFIG.yaml ("" = the checkpoint's own)
  std::vector<std::string> sets;     ///< --set overrides (data.eval_batch_size among them)
  std::string device;                ///< "" = the config's train.device
  bool ema = false;                  ///< the checkpoint's EMA weights
  std::string out;                   ///< report.json / report.md (+ head load) into this directory, "" = none
};

/// What it measured: the report (written to out when given) and its parts.
struct ClassifierEvalResult {
  nlohmann::json report;
  EvalResult result;
  std::string source, weights, head_load_png;  ///< where the weights came from; the heat map written ("" = none)
  int64_t step = -1;                           ///< the checkpoint's step (−1 for a weights file)
  bool main = true;                            ///< rank 0 (the one that wrote and reports)
};

/// The metrics of its report ("metrics": top-1, top-5, the loss), the keys of their records (eval/metric_record.h).
const std::vector<std::string>& classifier_eval_metrics();

/// Checks the request (the output directory first), loads the weights, evaluates every rank's share of the split and
/// returns the report (rank 0 writes it).
ClassifierEvalResult evaluate_classifier_checkpoint(const ClassifierEvalRequest& request);

/// A sample set against reference statistics on a feature network (`moh fid`): the report, written to `out` when
/// given.
nlohmann::json evaluate_sample_set(const eval::GenerativeEvalOptions& options, const std::string& device,
                                   const std::string& out);
/// The same on samples a caller streams (options.samples names them): moh_torch's fid_report on an in-memory array.
nlohmann::json evaluate_sample_set(const eval::GenerativeEvalOptions& options, const std::string& device,
                                   const std::string& out, std::unique_ptr<datasets::ImageSource> samples);

/// How a sweep point is measured: a classifier by `eval`, a DiT by `sample` then `fid` (each request's checkpoint,
/// weights, output paths and sample file set per point).
struct CheckpointMeasure {
  std::optional<ClassifierEvalRequest> eval;
  std::optional<SamplingRequest> sample;
  std::optional<eval::GenerativeEvalOptions> fid;
  std::string fid_device = "auto";
  bool keep_samples = false;  ///< keep each point's samples.npz
};

/// The measure `moh ema sweep` runs at each point: the report of evaluate_classifier_checkpoint, or of
/// evaluate_sample_set over run_sampling's samples with sampling.json as "sampling" and its step as "step".
eval::SweepMeasure checkpoint_measurer(const CheckpointMeasure& measure);

}  // namespace moh::experiments
