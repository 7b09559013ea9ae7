#include "diffusion/head_load.h"

#include <cmath>
#include <cstdio>

#include "vision/head_load.h"

namespace moh::diffusion {

namespace {

using vision::load_entropy;
using vision::row_shares;
using vision::to_doubles;

nlohmann::json rows(const at::Tensor& counts) {
  nlohmann::json out = nlohmann::json::array();
  const at::Tensor s = row_shares(counts);
  for (int64_t r = 0; r < s.size(0); ++r) out.push_back(to_doubles(s[r]));
  return out;
}

}  // namespace

DiTHeadLoadStats::DiTHeadLoadStats(const DiTOptions& model, int64_t buckets, int64_t timesteps)
    : buckets_(buckets), timesteps_(timesteps), classes_(model.num_classes) {
  for (int64_t i = 0; i < model.depth; ++i) {
    const nn::MoHAttentionOptions a = model.layer(i);
    Layer l;
    l.block = i;
    l.shared = a.shared_heads;
    l.topk = a.topk;
    l.pool = a.topk > 0 ? a.routed_pool() : 0;
    if (l.pool > 0) {
      l.by_bucket = at::zeros({buckets_, l.pool}, at::kDouble);
      l.by_class = at::zeros({classes_ + 1, l.pool}, at::kDouble);
    }
    layers_.push_back(l);
  }
}

void DiTHeadLoadStats::add(const std::vector<at::Tensor>& routed, const at::Tensor& t, const at::Tensor& labels) {
  const at::Tensor tt = t.to(at::kCPU, at::kDouble), y = labels.to(at::kCPU, at::kLong).clamp(0, classes_);
  const int64_t N = tt.size(0);
  const at::Tensor bucket = (tt * buckets_ / timesteps_).floor().to(at::kLong).clamp(0, buckets_ - 1);  // (N)
  // The next step of the same batch: the same number of images, every one at a smaller t.
  const bool adjacent = previous_t_.defined() && previous_t_.size(0) == N && (tt < previous_t_).all().item<bool>();
  for (size_t i = 0; i < layers_.size() && i < routed.size(); ++i) {
    Layer& l = layers_[i];
    if (l.pool == 0 || !routed[i].defined()) continue;
    const at::Tensor sel = routed[i].to(at::kCPU, at::kLong);                                       // (N·T, K)
    const at::Tensor picked = at::zeros({sel.size(0), l.pool}, at::kDouble).scatter_(1, sel, 1.0);  // (N·T, E)
    const at::Tensor per_image = picked.view({N, -1, l.pool}).sum(1);                               // (N, E)
    l.by_bucket.index_add_(0, bucket, per_image);
    l.by_class.index_add_(0, y, per_image);
    const at::Tensor now = picked.to(at::kBool);
    if (adjacent && l.previous.defined() && l.previous.sizes() == now.sizes()) {
      l.changed += (now != l.previous).any(1).sum().item<double>();
      l.compared += static_cast<double>(now.size(0));
    }
    l.previous = now;
  }
  previous_t_ = tt;
  ++evaluations_;
}

void DiTHeadLoadStats::reduce(dist::Group& group) {
  std::vector<at::Tensor> counts;
  std::vector<double> changes;
  for (auto& l : layers_)
    if (l.pool > 0)
      counts.push_back(l.by_bucket), counts.push_back(l.by_class), changes.push_back(l.changed),
          changes.push_back(l.compared);
  group.allreduce_sum_(counts);  // in place: the tensors are the layers' own
  changes.push_back(static_cast<double>(evaluations_));
  changes = group.sum(changes);
  size_t k = 0;
  for (auto& l : layers_)
    if (l.pool > 0) l.changed = changes[k++], l.compared = changes[k++];
  evaluations_ = static_cast<int64_t>(changes[k]);
}

nlohmann::json DiTHeadLoadStats::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const Layer& l : layers_) {
    if (l.pool == 0) continue;
    nlohmann::json layer = vision::routed_layer_json("blocks." + std::to_string(l.block) + ".attn", l.block, l.shared,
                                                     l.pool, l.topk, l.by_bucket);
    layer["by_timestep"] = rows(l.by_bucket);
    layer["by_class"] = rows(l.by_class);
    layer["topk_change_share"] = l.compared > 0 ? nlohmann::json(l.changed / l.compared) : nlohmann::json();
    layer["compared_tokens"] = l.compared;
    layers.push_back(layer);
  }
  nlohmann::json ranges = nlohmann::json::array(), class_rows = nlohmann::json::array();
  for (int64_t b = 0; b < buckets_; ++b) ranges.push_back({b * timesteps_ / buckets_, (b + 1) * timesteps_ / buckets_});
  for (int64_t c = 0; c < classes_; ++c) class_rows.push_back(std::to_string(c));
  class_rows.push_back("null");
  return {{"layers", layers},
          {"evaluations", evaluations_},
          {"timestep_buckets", ranges},
          {"class_rows", class_rows},
          {"note",
           "shares of the routed heads' selections (each row sums to 1; shared heads are always on); "
           "entropy of the overall load in nats, entropy_share = entropy / ln E; topk_change_share = share "
           "of tokens whose top-K set differs from the previous sampling step of the same images"}};
}

std::string DiTHeadLoadStats::summary() const {
  double share = 0, change = 0, compared = 0;
  int64_t n = 0;
  for (const Layer& l : layers_) {
    if (l.pool == 0) continue;
    const double h = load_entropy(row_shares(l.by_bucket.sum(0)));
    share += l.pool > 1 ? h / std::log(static_cast<double>(l.pool)) : 1.0;
    change += l.changed, compared += l.compared, ++n;
  }
  char line[200];
  std::snprintf(line, sizeof line,
                "head load: %lld routed layers, %lld network evaluations; mean load entropy %.3f of uniform; top-K set "
                "changed for %.1f %% of tokens between adjacent steps",
                static_cast<long long>(n), static_cast<long long>(evaluations_), n ? share / n : 0.0,
                compared > 0 ? 100.0 * change / compared : 0.0);
  return line;
}

bool DiTHeadLoadStats::write_pngs(const std::string& by_timestep, const std::string& by_class,
                                  const std::vector<std::string>& class_names) const {
  std::vector<vision::HeadLoadPanel> steps, classes;
  for (const Layer& l : layers_) {
    if (l.pool == 0) continue;
    const std::string title =
        "blocks." + std::to_string(l.block) + " (top-" + std::to_string(l.topk) + " of " + std::to_string(l.pool) + ")";
    vision::HeadLoadPanel s{title, {}, row_shares(l.by_bucket)}, c{title, {}, row_shares(l.by_class)};
    for (int64_t b = 0; b < buckets_; ++b)
      s.row_labels.push_back("t " + std::to_string(b * timesteps_ / buckets_) + "-" +
                             std::to_string((b + 1) * timesteps_ / buckets_ - 1));
    for (int64_t k = 0; k < classes_; ++k)
      c.row_labels.push_back(static_cast<size_t>(k) < class_names.size() ? class_names[static_cast<size_t>(k)]
                                                                         : std::to_string(k));
    c.row_labels.emplace_back("null (CFG)");
    steps.push_back(std::move(s)), classes.push_back(std::move(c));
  }
  const bool a = vision::write_head_load_png(by_timestep, "share of a noise level's routed picks per head,", steps);
  if (classes_ > kMaxClassRows) return a;  // ImageNet's 1,000 rows per layer: the JSON holds them
  return vision::write_head_load_png(by_class, "share of a class's routed picks per head,", classes) && a;
}

}  // namespace moh::diffusion
