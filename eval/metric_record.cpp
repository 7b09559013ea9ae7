#include "eval/metric_record.h"

namespace moh::eval {

const std::vector<MetricRecord>& metric_records() {
  using G = MetricGroup;
  static const std::vector<MetricRecord> table{
      {"fid", "FID", 2, true, G::fid, KeyMatch::exact, "FD-DINOv2", true},
      {"sfid", "sFID", 2, true, G::sfid, KeyMatch::exact, nullptr, true},
      {"inception_score", "IS", 2, false, G::is, KeyMatch::exact, nullptr, true},
      {"inception_score_std", "IS std", 2, false, G::is},
      {"precision", "precision", 3, false, G::pr, KeyMatch::exact, nullptr, true},
      {"recall", "recall", 3, false, G::pr, KeyMatch::exact, nullptr, true},
      {"kid_mean", "KID", 6, true, G::kid, KeyMatch::exact, nullptr, true},
      {"kid_std", "KID std", 6, false, G::kid},
      {"top1", "top-1", 2, false, G::classification, KeyMatch::prefix},
      {"top5", "top-5", 2, false, G::classification, KeyMatch::prefix},
      {"loss", "loss", 4, true, G::classification, KeyMatch::suffix},
      {"accuracy", "accuracy", 2, false, G::classification, KeyMatch::suffix, nullptr, false, false},
  };
  return table;
}

namespace {
bool matches(const MetricRecord& r, const std::string& key) {
  const std::string k = r.key;
  switch (r.match) {
    case KeyMatch::exact:
      return key == k;
    case KeyMatch::prefix:
      return key.rfind(k, 0) == 0;
    case KeyMatch::suffix:
      return key.size() >= k.size() && key.compare(key.size() - k.size(), k.size(), k) == 0;
  }
  return false;
}
}  // namespace

const MetricRecord* find_metric(const std::string& key) {
  for (const MetricRecord& r : metric_records())
    if (r.match == KeyMatch::exact && r.key == key) return &r;
  for (const MetricRecord& r : metric_records())
    if (r.match != KeyMatch::exact && matches(r, key)) return &r;
  return nullptr;
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
