#include "eval/ema_sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/progress.h"
#include "core/json_read.h"
#include "core/parse.h"
#include "core/platform/run_context.h"
#include "core/train/phema.h"
#include "core/train/phema_run.h"
#include "eval/line_chart.h"
#include "eval/metric_record.h"
#include "eval/report.h"

namespace moh::eval {

namespace fs = std::filesystem;

namespace {

double parse_number(const std::string& text, const std::string& what) {
  if (const std::optional<double> v = parse_double(text)) return *v;
  throw UserError(what, "'" + text + "' is not a number", "a:b:n (n values from a to b) or a list 0.05,0.1");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

// "sigma_0.07": six significant digits, as the σ_rel was typed or spaced (0.060000000000000005 → 0.06).
std::string point_id(double sigma_rel) {
  std::ostringstream s;
  s << "sigma_" << sigma_rel;
  return s.str();
}

bool lower_is_better(const std::string& metric) {
  const MetricRecord* r = find_metric(metric);
  return r && r->lower_is_better;
}

const char* weights_name(SweepWeights w) {
  return w == SweepWeights::raw ? "raw" : w == SweepWeights::fixed_ema ? "fixed-decay EMA" : "post-hoc EMA";
}

// The reconstructions' end step: the last snapshot at or before `step` (0 = the last one).
int64_t resolve_step(const std::string& run, int64_t step) {
  int64_t found = -1;
  for (const auto& s : phema::list_snapshots(run))
    if (step == 0 || s.step <= step) found = std::max(found, s.step);
  if (found < 0)
    throw UserError("--step " + std::to_string(step), "is before the run's first post-hoc EMA snapshot",
                    "moh ema list " + run + " shows the snapshot steps");
  return found;
}

// The rows of an earlier start of the same sweep in `out` (none for a new or empty directory).
std::vector<nlohmann::json> resume_rows(const std::string& out, const nlohmann::json& identity) {
  if (!fs::exists(out) || fs::is_empty(out)) {
    check_output_dir(out, "--out " + out);
    return {};
  }
  const std::string file = out + "/sweep.json";
  if (!fs::exists(file))
    throw UserError("--out " + out, "exists, is not empty and holds no sweep.json", "choose a new directory");
  const std::string hint = "choose a new --out directory";
  const nlohmann::json j = parse_json(read_file(file, "sweep"), file, hint);
  return read_json_fields(file, "a sweep record", hint, [&] {
    if (j.value("sweep", nlohmann::json()) != identity)
      throw UserError("--out " + out, "holds a sweep of another run, step or measure",
                      "choose a new directory, or repeat that sweep's command to continue it");
    std::vector<nlohmann::json> rows = j.value("rows", std::vector<nlohmann::json>{});
    for (const nlohmann::json& row : rows) (void)row.at("id").get<std::string>();  // what resuming reads of each
    return rows;
  });
}

struct Point {
  std::string id;
  SweepWeights weights;
  double sigma_rel;  // NaN for baselines
};

std::vector<Point> sweep_points(const EmaSweepRequest& r) {
  std::vector<Point> points;
  for (SweepWeights w : r.baselines) points.push_back({w == SweepWeights::raw ? "raw" : "fixed_ema", w, std::nan("")});
  for (double s : r.sigma_rels) points.push_back({point_id(s), SweepWeights::reconstructed, s});
  return points;
}

// Measures one point in OUT/ID (started afresh: a point cut short is measured again).
nlohmann::json measure_point(const EmaSweepRequest& r, int64_t step, const Point& p, const SweepMeasure& measure) {
  const std::string dir = r.out + "/" + p.id;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json row{{"id", p.id}, {"weights", weights_name(p.weights)}, {"run", r.run}};
  nlohmann::json report;
  if (p.weights == SweepWeights::reconstructed) {
    const phema::Reconstruction rec = phema::reconstruct(r.run, p.sigma_rel, step);
    phema::write_reconstruction(rec, r.run, dir + "/ema");
    report = measure(dir + "/ema", p.weights, dir);
    fs::remove_all(dir + "/ema/checkpoints");  // model-sized; phema_reconstruction.json says how to rebuild it
    row.update({{"sigma_rel", p.sigma_rel}, {"gamma", rec.gamma}, {"step", rec.step}});
  } else {
    report = measure(r.run, p.weights, dir);
    row.update({{"sigma_rel", nullptr}, {"step", report.value("step", nlohmann::json())}});
  }
  if (!report.contains("metrics") || !report["metrics"].contains(r.metric))
    throw std::runtime_error("ema sweep: the measure of " + p.id + " reported no " + r.metric);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  row.update({{"metrics", report["metrics"]},
              {"report", report},
              {"seconds", seconds},
              {"time", utc_timestamp()},
              {"libtorch", libtorch_version()},
              {"commit", toolkit_commit()}});
  return row;
}

bool better(double a, double b, const std::string& metric) {
  return lower_is_better(metric) ? a < b : a > b;
}

// Raw weights, the fixed-decay EMA, then the reconstructions by σ_rel.
std::vector<nlohmann::json> ordered(std::vector<nlohmann::json> rows) {
  auto key = [](const nlohmann::json& row) {
    if (row["sigma_rel"].is_null()) return std::make_pair(row["id"] == "raw" ? 0 : 1, 0.0);
    return std::make_pair(2, row["sigma_rel"].get<double>());
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const nlohmann::json& a, const nlohmann::json& b) { return key(a) < key(b); });
  return rows;
}

ChartFiles write_chart(const EmaSweepRequest& r, const std::vector<nlohmann::json>& rows) {
  ChartPanel panel;
  panel.title = r.metric + " of the reconstructed EMA";
  panel.x_label = "σ_rel (EMA length relative to the training time)";
  panel.y_label = metric_label(r.metric);
  Series curve{"post-hoc EMA", {}, {}};
  for (const auto& row : ordered(rows))
    if (!row["sigma_rel"].is_null()) {
      curve.x.push_back(row["sigma_rel"].get<double>());
      curve.y.push_back(row["metrics"][r.metric].get<double>());
    }
  if (curve.x.empty()) return {};
  const double lo = curve.x.front(), hi = curve.x.back();
  panel.series.push_back(curve);
  for (const auto& row : rows)
    if (row["sigma_rel"].is_null()) {  // a baseline: a level line across the swept range
      const double v = row["metrics"][r.metric].get<double>();
      const std::string w = row["weights"].get<std::string>();
      panel.series.push_back({w == "raw" ? "raw weights" : w, {lo, hi}, {v, v}});
    }
  const std::string title = "Post-hoc EMA sweep of " + fs::path(r.run).filename().string();
  return write_line_chart(r.out + "/sweep", title, {panel});
}

}  // namespace

std::vector<double> parse_sigma_rels(const std::string& spec, const std::string& what) {
  std::vector<double> values;
  const std::vector<std::string> range = split(spec, ':');
  if (range.size() == 3) {
    const double a = parse_number(range[0], what), b = parse_number(range[1], what);
    const double n = parse_number(range[2], what);
    if (n < 1 || n != std::floor(n) || n > 1000)
      throw UserError(what, "the count '" + range[2] + "' is not a whole number from 1 to 1000", "e.g. 0.02:0.20:10");
    for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
      values.push_back(n == 1 ? a : std::round((a + (b - a) * static_cast<double>(i) / (n - 1)) * 1e9) / 1e9);
  } else if (range.size() == 1) {
    for (const auto& part : split(spec, ',')) values.push_back(parse_number(part, what));
  } else {
    throw UserError(what, "'" + spec + "' is neither a:b:n nor a list", "e.g. 0.02:0.20:10 or 0.05,0.1");
  }
  for (double v : values) phema::gamma_of(v, what);  // the profiles' range
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (point_id(values[i]) == point_id(values[j]))
        throw UserError(what, "lists " + point_id(values[i]).substr(6) + " twice", "each sigma_rel once");
  return values;
}

EmaSweepResult run_ema_sweep(const EmaSweepRequest& r, const SweepMeasure& measure,
                             const std::function<void(const nlohmann::json&, size_t, size_t)>& on_row) {
  EmaSweepResult res;
  res.step = resolve_step(r.run, r.step);
  // Every row holds every metric of its report: the curve's metric is not part of what a restart must match, so a
  // finished sweep is redrawn by another --metric without measuring again.
  const nlohmann::json identity{{"run", r.run}, {"step", res.step}, {"measure", r.measure}};
  std::map<std::string, nlohmann::json> done;
  for (auto& row : resume_rows(r.out, identity)) done[row["id"].get<std::string>()] = row;
  const std::vector<Point> points = sweep_points(r);
  for (const Point& p : points) {
    if (done.count(p.id)) {
      ++res.resumed;
      continue;
    }
    nlohmann::json row = measure_point(r, res.step, p, measure);
    done[p.id] = row;
    std::vector<nlohmann::json> record;  // every row so far, σ_rels an earlier start listed included
    for (const auto& [id, kept] : done) record.push_back(kept);
    write_file_atomic(
        r.out + "/sweep.json",
        nlohmann::json{{"sweep", identity}, {"metric", r.metric}, {"rows", ordered(record)}}.dump(1) + "\n");
    if (on_row)
      on_row(row,
             static_cast<size_t>(
                 std::count_if(points.begin(), points.end(), [&](const Point& q) { return done.count(q.id) > 0; })),
             points.size());
  }
  for (const auto& [id, kept] : done) res.rows.push_back(kept);
  res.rows = ordered(res.rows);
  res.json = r.out + "/sweep.json";
  res.table = r.out + "/sweep.md";
  write_file_atomic(res.table, sweep_table(res.rows, r.metric));
  const ChartFiles chart = write_chart(r, res.rows);
  res.chart_svg = chart.svg;
  res.chart_png = chart.png;
  return res;
}

std::string sweep_table(const std::vector<nlohmann::json>& rows, const std::string& metric) {
  if (rows.empty()) return "";
  std::vector<std::string> keys{metric};
  for (const auto& [k, v] : rows.front()["metrics"].items())
    if (k != metric && v.is_number()) keys.push_back(k);
  std::string text = "| weights | σ_rel | step |", rule = "|---|---:|---:|";
  for (const auto& k : keys) text += " " + k + " |", rule += "---:|";
  text += "\n" + rule + "\n";
  const std::vector<nlohmann::json> sorted = ordered(rows);
  const nlohmann::json* best = nullptr;
  for (const auto& row : sorted) {
    const bool baseline = row["sigma_rel"].is_null();
    text += "| " + row["weights"].get<std::string>() + " | " +
            (baseline ? std::string("–") : point_id(row["sigma_rel"].get<double>()).substr(6)) + " | " +
            (row["step"].is_null() ? std::string("–") : row["step"].dump()) + " |";
    for (const auto& k : keys) {
      text += ' ';
      text += row["metrics"].contains(k) ? format_metric(k, row["metrics"][k].get<double>()) : "–";
      text += " |";
    }
    text += "\n";
    const double v = row["metrics"][metric].get<double>();
    if (!baseline && (!best || better(v, (*best)["metrics"][metric].get<double>(), metric))) best = &row;
  }
  if (best)
    text += "\nBest post-hoc EMA by " + metric + ": sigma_rel " +
            point_id((*best)["sigma_rel"].get<double>()).substr(6) + " (" +
            format_metric(metric, (*best)["metrics"][metric].get<double>()) + ").\n";
  return text;
}

}  // namespace moh::eval
