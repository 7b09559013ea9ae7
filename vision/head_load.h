#pragma once
// Head-load statistics of MoH classifiers (paper Figure 3): for every routed layer, how often each routed head is
// selected, over all tokens and per class of the image the token belongs to. Collected during evaluation, saved as
// JSON and drawn as a heat map (one panel per layer: rows = classes, columns = routed heads, colour = share of the
// layer's selections).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/dist/distributed.h"
#include "vision/transnext.h"

namespace moh::vision {

/// Accumulates head selections.
class HeadLoadStats {
 public:
  HeadLoadStats(const TransNeXtOptions& model, int64_t num_classes);
  /// Adds one batch: `routed` as in ClassifierOutput (per block, (B·N, K) routed-pool indices), labels (B).
  void add(const std::vector<at::Tensor>& routed, const at::Tensor& labels);
  /// {"layers": [{"name", "stage", "block", "shared", "routed_pool", "topk", "selections", "overall": [E shares],
  ///   "entropy", "entropy_share", "per_class": [[E shares] × classes]}]}; shares of a row sum to 1; entropy of
  ///   "overall" in nats, entropy_share = entropy / ln E (1 = balanced).
  nlohmann::json to_json() const;
  /// Sums the counts over data-parallel ranks (a collective), so every rank holds the whole split's statistics.
  void reduce(dist::Group& group);
  /// Heat map PNG (needs OpenCV; returns false without it).
  bool write_png(const std::string& path, const std::vector<std::string>& class_names) const;

 private:
  struct Layer {
    std::string name;
    int64_t stage = 0, block = 0, shared = 0, pool = 0, topk = 0;
    at::Tensor counts;  ///< (classes, E) float64
  };
  std::vector<Layer> layers_;  // one per block, in ClassifierOutput order (pool 0 = not routed)
  int64_t classes_ = 0;
};

/// Rows of a count matrix as shares summing to 1 (all-zero rows stay zero).
at::Tensor row_shares(const at::Tensor& counts);
/// A tensor's values as doubles (for JSON).
std::vector<double> to_doubles(const at::Tensor& t);
/// Entropy in nats of a vector of shares (0·ln 0 = 0): ln E for a load spread evenly over E heads.
double load_entropy(const at::Tensor& shares);
/// The fields of one routed layer that every head-load JSON has, whatever the model: {"name", "block", "shared",
/// "routed_pool", "topk", "selections", "overall": [E shares], "entropy", "entropy_share"}, from the layer's
/// (rows, E) selection counts (rows: classes, timestep buckets, ...). The model's own fields are added by its writer.
nlohmann::json routed_layer_json(const std::string& name, int64_t block, int64_t shared, int64_t pool, int64_t topk,
                                 const at::Tensor& counts);

/// One heat-map panel of head load: labelled rows (classes, timestep ranges) × the routed heads of one layer, each
/// cell the share of the row's routed selections that went to that head (rows sum to 1).
struct HeadLoadPanel {
  std::string title;
  std::vector<std::string> row_labels;
  at::Tensor shares;  ///< (rows, E)
};
/// Draws the panels one under another below one colour bar (0 … twice each layer's uniform share 1/E) and a caption
/// line, as a PNG (needs OpenCV; returns false without it or without panels).
bool write_head_load_png(const std::string& path, const std::string& caption, const std::vector<HeadLoadPanel>& panels);

/// Head loads of several evaluations side by side, e.g. a converted model right after `moh convert --to-moh` and after
/// continue-tuning: `inputs` are (label, head_load.json of `moh eval --out` or `moh sample --head-load`). One panel per
/// routed layer, one row per input (its "overall" shares); the layers must be the same in every input (UserError
/// naming the first that differs). `markdown` is a table of load entropy / ln E and the weakest head × E per layer.
struct HeadLoadComparison {
  std::vector<HeadLoadPanel> panels;
  std::string markdown;
};
HeadLoadComparison compare_head_loads(const std::vector<std::pair<std::string, nlohmann::json>>& inputs);

}  // namespace moh::vision
