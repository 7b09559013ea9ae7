#include "eval/report.h"

#include <filesystem>
#include <algorithm>
#include <sstream>
#include <vector>

#include "core/atomic_io.h"
#include "core/config_schema.h"

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

std::string report_markdown(const nlohmann::json& report, const std::string& title) {
  std::ostringstream md;
  md << "# " << title << "\n\n";
  if (report.contains("metrics")) {
    md << "| metric | value |\n|---|---|\n";
    // The usual reading order first (FID, sFID, IS, precision, recall / top-1, top-5), then anything else.
    static const std::vector<std::string> kOrder{"fid", "sfid", "inception_score", "inception_score_std", "precision",
                                                 "recall", "top1", "top5", "loss"};
    const auto& m = report["metrics"];
    for (const auto& k : kOrder)
      if (m.contains(k)) md << "| " << k << " | " << scalar_text(m[k]) << " |\n";
    for (const auto& [k, v] : m.items())
      if (std::find(kOrder.begin(), kOrder.end(), k) == kOrder.end()) md << "| " << k << " | " << scalar_text(v) << " |\n";
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
