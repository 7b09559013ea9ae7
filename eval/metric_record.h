#pragma once
// The metrics of the toolkit's reports, one record each: the key report.json stores it under, how it is shown
// (label, digits, the reports' reading order), which way is better, and what computes it (the word of
// `moh fid --metrics` that turns a generative metric on). The report, the charts, `moh ema sweep` and `moh fid` read
// them; adding a metric is its record here, its computation and its test.
#include <string>
#include <vector>

namespace moh::eval {

/// What computes a metric: one of `moh fid --metrics`' groups (FID; sFID; IS; precision / recall; KID), or a
/// classification evaluation (top-1, top-5, losses, accuracies).
enum class MetricGroup { fid, sfid, is, pr, kid, classification };

/// One metric.
struct MetricRecord {
  const char* key;                     ///< report.json's key
  const char* label;                   ///< how consoles and charts name it ("FID")
  int digits;                          ///< decimals where people quote it (report.md, tables, consoles)
  bool lower_is_better;                ///< the direction a sweep picks the best point by (a spread has none: false)
  MetricGroup group;                   ///< what computes it
  const char* dinov2_label = nullptr;  ///< its label on DINOv2 features ("FD-DINOv2"), where it differs
  bool on_console = false;             ///< one of `moh fid`'s console line
  bool in_reading_order = true;        ///< report.md lists it in the records' order (before other keys)
};

/// Every metric, in the reports' reading order (FID, sFID, IS, precision, recall, KID, then classification).
const std::vector<MetricRecord>& metric_records();
/// The record of report key `key`, or nullptr: its own record, or for "KEY_ema" (the same metric of a run's EMA
/// weights, as `moh train` reports it) KEY's. Keys of other numbers (lr, step, seconds) have none.
const MetricRecord* find_metric(const std::string& key);
/// The record of a metric a user named (`what`: the flag), or a UserError listing the metrics there are.
const MetricRecord& metric_record(const std::string& key, const std::string& what);
/// The word of `moh fid --metrics` for a generative group ("fid", "sfid", "is", "pr", "kid").
const char* group_word(MetricGroup group);
/// The label of `key` for charts and consoles (on DINOv2 features when `dinov2`); the key itself without a record.
std::string metric_label(const std::string& key, bool dinov2 = false);

}  // namespace moh::eval
