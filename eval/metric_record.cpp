#include "eval/metric_record.h"

#include "core/error.h"

namespace moh::eval {

const std::vector<MetricRecord>& metric_records() {
  using G = MetricGroup;
  static const std::vector<MetricRecord> table{
      {"fid", "FID", 2, true, G::fid, "FD-DINOv2", true},
      {"sfid", "sFID", 2, true, G::sfid, nullptr, true},
      {"inception_score", "IS", 2, false, G::is, nullptr, true},
      {"inception_score_std", "IS std", 2, false, G::is},
      {"precision", "precision", 3, false, G::pr, nullptr, true},
      {"recall", "recall", 3, false, G::pr, nullptr, true},
      {"kid_mean", "KID", 6, true, G::kid, nullptr, true},
      {"kid_std", "KID std", 6, false, G::kid},
      {"top1", "top-1", 2, false, G::classification},
      {"top5", "top-5", 2, false, G::classification},
      {"val_loss", "val loss", 4, true, G::classification, nullptr, false, false},
      {"loss", "loss", 4, true, G::classification},
      {"sample_accuracy", "sample accuracy", 2, false, G::classification, nullptr, false, false},
  };
  return table;
}

const MetricRecord* find_metric(const std::string& key) {
  for (const MetricRecord& r : metric_records())
    if (r.key == key) return &r;
  static const std::string kEma = "_ema";
  if (key.size() > kEma.size() && key.compare(key.size() - kEma.size(), kEma.size(), kEma) == 0)
    return find_metric(key.substr(0, key.size() - kEma.size()));
  return nullptr;
}

const MetricRecord& metric_record(const std::string& key, const std::string& what) {
  if (const MetricRecord* r = find_metric(key)) return *r;
  std::string keys;
  for (const MetricRecord& r : metric_records()) keys += (keys.empty() ? "" : ", ") + std::string(r.key);
  throw UserError(what + " " + key, "is not a metric of the reports", "one of " + keys);
}

const char* group_word(MetricGroup group) {
  switch (group) {
    case MetricGroup::fid:
      return "fid";
    case MetricGroup::sfid:
      return "sfid";
    case MetricGroup::is:
      return "is";
    case MetricGroup::pr:
      return "pr";
    case MetricGroup::kid:
      return "kid";
    case MetricGroup::classification:
      return "";
  }
  return "";
}

std::string metric_label(const std::string& key, bool dinov2) {
  const MetricRecord* r = find_metric(key);
  if (!r) return key;
  return dinov2 && r->dinov2_label ? r->dinov2_label : r->label;
}

}  // namespace moh::eval
