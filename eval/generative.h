#pragma once
// The generative-model evaluation behind `moh fid` and `moh ref-stats`: features of samples and references through
// one feature net, then FID, sFID, IS, precision and recall as the ADM evaluator computes them, and (with a
// classifier feature net and labelled samples) the accuracy of the samples against their requested classes.
// Reference statistics (`mu`, `sigma`, `mu_s`, `sigma_s`) stored in an .npz are reused, as ADM does.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/platform/run_context.h"
#include "eval/features.h"
#include "eval/frechet.h"
#include "eval/metric_record.h"
#include "eval/metrics.h"

namespace moh::eval {

/// Rows of the reference set used for precision/recall (ADM's reference batches hold 10,000 images).
constexpr int64_t kPRReferenceRows = 10000;

/// Which generative groups to compute (metric_record.h): all of them unless a list says otherwise.
struct MetricSet {
  std::set<MetricGroup> on;
  MetricSet();  ///< every generative group
  bool has(MetricGroup group) const { return on.count(group) > 0; }
};
/// Parses "fid,sfid,is,pr,kid" (any subset; "all"); unknown names are UserErrors.
MetricSet parse_metric_set(const std::string& list);

/// What a group's computation reads: which features of the samples, which statistic of the reference (stored in an
/// .npz or computed from its images), how many images each set needs at least, and whether it takes a covariance of
/// the samples' features (biased high with fewer samples than dimensions: the report warns) or pairwise distances.
enum class SampleFeature { pool, spatial, logits };
enum class ReferenceStat { none, pool_stats, spatial_stats, pr_rows };
struct MetricNeeds {
  SampleFeature features = SampleFeature::pool;
  ReferenceStat reference = ReferenceStat::none;
  int64_t min_images = 1;  ///< per set: the samples, and the reference's rows where reference is pr_rows
  std::string too_few;     ///< the refusal's words before ", got N" ("FID needs at least 2 images")
  bool covariance = false;
  bool distances = false;  ///< blocks of pairwise distances between the sets (the memory check sizes the pass)
};

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

/// What a computation is handed: the samples' features, the reference statistics, the IS protocol.
struct MetricInputs {
  const FeatureSet& samples;
  const ReferenceStats& reference;
  ISMode is_mode;
};

/// One generative group of the metric records: its needs and its computation, which writes the report keys of its
/// records (each key has a MetricRecord). A new metric is its record, its line in its group's computation (or a new
/// group: its MetricGroup value, its computation here and its word in group_word) and its test.
struct MetricComputation {
  MetricGroup group;
  MetricNeeds needs;
  void (*compute)(const MetricInputs& in, nlohmann::json& out);
};
/// Every generative group's computation, in the records' order.
const std::vector<MetricComputation>& metric_computations();

/// Reference statistics from a set of features.
ReferenceStats reference_stats_from(const FeatureSet& features, const FeatureNet& net);
/// Writes reference statistics as an .npz (mu, sigma, mu_s, sigma_s float64; pr_pool float32; meta JSON bytes).
void save_reference_stats(const std::string& path, const ReferenceStats& stats);
/// Reads the stats stored in an .npz, if any (`mu`+`sigma` at least); nullopt if it holds only images.
std::optional<ReferenceStats> load_reference_stats(const std::string& path);

/// Runs the whole evaluation through `net` (built from options.features: experiments/feature_nets.h) and returns the
/// report record (also printed/written by the app).
nlohmann::json evaluate_generative(const GenerativeEvalOptions& options, FeatureNet& net);
/// The same with the samples from `samples` (options.samples only names them in the report).
nlohmann::json evaluate_generative(const GenerativeEvalOptions& options, FeatureNet& net,
                                   std::unique_ptr<datasets::ImageSource> samples);

}  // namespace moh::eval
