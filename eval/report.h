#pragma once
// One report writer for every evaluation (generative metrics, classifier top-1/top-5): `report.json` (the full record,
// machine-readable) and `report.md` (a metrics table and the details), written atomically into a directory.
#include <nlohmann/json.hpp>

#include <string>

namespace moh::eval {

/// A metric as people quote it: FID / sFID / IS and percentages (top-1, top-5, accuracy) with 2 decimals, precision
/// and recall (fractions) with 3, losses with 4; anything else in its shortest exact form. report.json keeps every
/// digit.
std::string format_metric(const std::string& key, double value);

/// Markdown rendering of a report: `title`, a table of report["metrics"], then every other field as a dotted list.
std::string report_markdown(const nlohmann::json& report, const std::string& title);

/// Writes DIR/report.json and DIR/report.md (creating DIR); each file appears only when complete.
void write_report(const std::string& dir, const nlohmann::json& report, const std::string& title);

}  // namespace moh::eval
