#pragma once
// Head-load statistics of MoH classifiers (paper Figure 3): for every routed layer, how often each routed head is
// selected, over all tokens and per class of the image the token belongs to. Collected during evaluation, saved as
// JSON and drawn as a heat map (one panel per layer: rows = classes, columns = routed heads, colour = share of the
// layer's selections).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/distributed.h"
#include "vision/transnext.h"

namespace moh::vision {

/// Accumulates head selections.
class HeadLoadStats {
 public:
  HeadLoadStats(const TransNeXtOptions& model, int64_t num_classes);
  /// Adds one batch: `routed` as in ClassifierOutput (per block, (B·N, K) routed-pool indices), labels (B).
  void add(const std::vector<at::Tensor>& routed, const at::Tensor& labels);
  /// {"layers": [{"name", "stage", "block", "shared", "routed_pool", "topk", "selections", "overall": [E shares],
  ///   "per_class": [[E shares] × classes]}]}; shares of a row sum to 1.
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

}  // namespace moh::vision
