#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "core/config_schema.h"
#include "core/io/atomic_io.h"
#include "eval/metric_record.h"

namespace moh::eval {

namespace {

std::string scalar_text(const nlohmann::json& v) {
  if (v.is_number_float()) return config::shortest_double(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "–";
  return v.dump();
}

void flatten(const nlohmann::json& v, const std::string& prefix, std::ostringstream& out) {
  if (v.is_object()) {
    for (const auto& [k, sub] : v.items()) flatten(sub, prefix.empty() ? k : prefix + "." + k, out);
  } else {
    out << "- `" << prefix << "`: " << scalar_text(v) << "\n";
  }
}

}  // namespace

std::string format_metric(const std::string& key, double v) {
  const MetricRecord* r = find_metric(key);
  const int digits = r ? r->digits : -1;
  if (digits < 0 || !std::isfinite(v)) return config::shortest_double(v);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  std::string text = buf;
  // A value that rounds to zero prints without a sign (the FID of identical sets comes out as -1e-13).
  if (text[0] == '-' && text.find_first_not_of("0.", 1) == std::string::npos) text.erase(0, 1);
  return text;
}

std::string report_markdown(const nlohmann::json& report, const std::string& title) {
  std::ostringstream md;
  md << "# " << title << "\n\n";
  if (report.contains("metrics")) {
    md << "| metric | value |\n|---|---|\n";
    // The usual reading order first (the metric records': FID, sFID, IS, precision, recall, KID / top-1, top-5,
    // loss), then anything else.
    static const std::vector<std::string> kOrder = [] {
      std::vector<std::string> keys;
      for (const MetricRecord& r : metric_records())
        if (r.in_reading_order) keys.emplace_back(r.key);
      return keys;
    }();
    const auto& m = report["metrics"];
    auto cell = [](const std::string& k, const nlohmann::json& v) {
      return v.is_number() ? format_metric(k, v.get<double>()) : scalar_text(v);
    };
    for (const auto& k : kOrder)
      if (m.contains(k)) md << "| " << k << " | " << cell(k, m[k]) << " |\n";
    for (const auto& [k, v] : m.items())
      if (std::find(kOrder.begin(), kOrder.end(), k) == kOrder.end()) md << "| " << k << " | " << cell(k, v) << " |\n";
    md << "\n";
  }
  md << "## Details\n\n";
  for (const auto& [k, v] : report.items())
    if (k != "metrics") flatten(v, k, md);
  return md.str();
}

void write_report(const std::string& dir, const nlohmann::json& report, const std::string& title) {
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/report.json", report.dump(2) + "\n");
  write_file_atomic(dir + "/report.md", report_markdown(report, title));
}

}  // namespace moh::eval
