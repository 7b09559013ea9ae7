#pragma once
// The generative-model evaluation behind `moh fid` and `moh ref-stats`: features of samples and references through
// one feature net, then FID, sFID, IS, precision and recall as the ADM evaluator computes them, and (with a
// classifier feature net and labelled samples) the accuracy of the samples against their requested classes.
// Reference statistics (`mu`, `sigma`, `mu_s`, `sigma_s`) stored in an .npz are reused, as ADM does.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "core/run_context.h"
#include "eval/features.h"
#include "eval/frechet.h"
#include "eval/metric_record.h"
#include "eval/metrics.h"

namespace moh::eval {

/// Which numbers to compute.
struct MetricSet {
  bool fid = true, sfid = true, is = true, pr = true, kid = true;
  /// The flag of a generative group (metric_record.h).
  bool& operator[](MetricGroup group);
};
/// Parses "fid,sfid,is,pr,kid" (any subset; "all"); unknown names are UserErrors.
MetricSet parse_metric_set(const std::string& list);

/// Rows of the reference set used for precision/recall (ADM's reference batches hold 10,000 images).
constexpr int64_t kPRReferenceRows = 10000;

/// Everything `moh fid` needs.
struct GenerativeEvalOptions {
  std::string samples, reference, features, save_features;
  MetricSet metrics;
  bool metrics_explicit = false;  ///< the user listed them: one a net cannot give (sFID, IS of DINOv2) is an error
  ISMode is_mode = ISMode::adm;
  InceptionResize resize = InceptionResize::tf1;
  int64_t batch_size = 64;
};

/// Statistics of a reference set as `moh ref-stats` stores them.
struct ReferenceStats {
  GaussianStats pool, spatial;  ///< undefined tensors when not available
  at::Tensor pr_features;       ///< (≤10000, D) pool features for precision/recall, undefined if not stored
  int64_t count = 0;
  nlohmann::json meta;  ///< feature net name / sha256 / preprocessing (empty for foreign files)
};

/// Reference statistics from a set of features.
ReferenceStats reference_stats_from(const FeatureSet& features, const FeatureNet& net);
/// Writes reference statistics as an .npz (mu, sigma, mu_s, sigma_s float64; pr_pool float32; meta JSON bytes).
void save_reference_stats(const std::string& path, const ReferenceStats& stats);
/// Reads the stats stored in an .npz, if any (`mu`+`sigma` at least); nullopt if it holds only images.
std::optional<ReferenceStats> load_reference_stats(const std::string& path);

/// Runs the whole evaluation through `net` (built from options.features: experiments/feature_nets.h) and returns the
/// report record (also printed/written by the app).
nlohmann::json evaluate_generative(const GenerativeEvalOptions& options, FeatureNet& net);

}  // namespace moh::eval
