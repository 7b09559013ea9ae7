#pragma once
// Routing analytics of MoH-DiT while it samples (`moh sample --head-load`): which routed heads each layer picks at
// which noise level and for which class. For every routed block, over every network evaluation:
//  - head load by diffusion timestep bucket (the original t in [0, T) cut into `buckets` equal ranges) and by class
//    (CFG's unconditional half is the null class, its own last row);
//  - the entropy of the layer's overall load, in nats and as a share of the uniform maximum ln E (1 = every routed
//    head picked equally often);
//  - the share of tokens whose top-K set changes between adjacent network evaluations of the same batch (the next
//    sampling step: the same images at a smaller t).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/dist/distributed.h"
#include "diffusion/dit.h"

namespace moh::diffusion {

class DiTHeadLoadStats {
 public:
  static constexpr int64_t kMaxClassRows = 64;
  /// `timesteps` T of the training chain (1000 for DiT).
  explicit DiTHeadLoadStats(const DiTOptions& model, int64_t buckets = 10, int64_t timesteps = 1000);
  /// One network evaluation: `routed` per block ((N·T, K) routed-pool indices, undefined for unrouted blocks), the
  /// timesteps t (N) and the labels (N, num_classes = the null class) the network saw.
  void add(const std::vector<at::Tensor>& routed, const at::Tensor& t, const at::Tensor& labels);
  /// Sums every count over the data-parallel ranks (a collective).
  void reduce(dist::Group& group);
  /// {"layers": [{"name", "block", "shared", "routed_pool", "topk", "selections", "overall": [E],
  ///   "by_timestep": [[E] × buckets], "by_class": [[E] × (classes + 1)], "entropy", "entropy_share",
  ///   "topk_change_share", "compared_tokens"}], "timestep_buckets": [[lo, hi) × buckets], "class_rows": [...]}
  nlohmann::json to_json() const;
  /// One line: mean entropy share and top-K change share over the routed layers, and the evaluations counted.
  std::string summary() const;
  /// Heat maps (one panel per routed layer; rows = timestep buckets, resp. classes + null): two PNGs, the one by
  /// class only for at most kMaxClassRows classes; false without OpenCV. `class_names` label the class rows.
  bool write_pngs(const std::string& by_timestep, const std::string& by_class,
                  const std::vector<std::string>& class_names) const;
  int64_t evaluations() const { return evaluations_; }

 private:
  struct Layer {
    int64_t block = 0, shared = 0, pool = 0, topk = 0;
    at::Tensor by_bucket, by_class;  ///< (buckets, E), (classes + 1, E) float64 selection counts
    double changed = 0, compared = 0;
    at::Tensor previous;  ///< (N·T, E) bool: the last evaluation's selections
  };
  std::vector<Layer> layers_;
  int64_t buckets_, timesteps_, classes_, evaluations_ = 0;
  at::Tensor previous_t_;  ///< (N) the last evaluation's timesteps
};

}  // namespace moh::diffusion
