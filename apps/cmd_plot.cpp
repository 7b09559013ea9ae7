// `moh plot RUN_DIR... [--out DIR]`: loss curves (and their parts), learning rate and top-1 against the optimizer step
// for one or several runs (overlaid, with a legend; the losses of classifier and DiT runs in separate panels, as they
// measure different things) as DIR/curves.svg and .png, and a Markdown table across the runs (final/best metrics,
// images per second, wall time, active heads) as DIR/summary.md, also printed.
// `moh plot --fid-curve curve.jsonl [--out DIR]`: FID against network evaluations per image and against seconds, one
// series per model (the rows studies/fid_curve/run.sh writes), as DIR/fid_curve.svg and .png.
// `moh plot --fid-steps rows.jsonl [--out DIR]`: FID against optimizer steps, one series per model × recipe (the
// rows studies/recipes/run.sh writes), as DIR/fid_steps.svg and .png.
// `moh plot --head-load [LABEL=]PATH... [--out DIR]`: the head load of several evaluations of one model side by side
// (PATH: a head_load.json of moh eval --out / moh sample --head-load, or its directory), e.g. before and after
// continue-tuning, as DIR/head_load_compare.png and a Markdown table DIR/head_load_compare.md, also printed.
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/progress.h"
#include "eval/line_chart.h"
#include "eval/report.h"
#include "experiments/registry.h"
#include "vision/head_load.h"

namespace moh::apps {

namespace {

// One run's metrics.jsonl, by key: (step, value) in file order; wall time summed over its starts.
struct RunCurves {
  std::string name, model, family = "run", active = "–";
  std::map<std::string, std::vector<std::pair<double, double>>> train, eval;
  std::vector<double> img_per_s;
  double wall_s = 0;
  bool timed = false;
};

// An evaluation's head load (per routed layer, the shares of its routed heads) as two numbers: the mean over layers of
// the load entropy / ln E (1 = balanced) and the weakest head of any layer as a multiple of the uniform share 1/E
// (0 = a head no token picks).
void add_balance(RunCurves& r, double step, const nlohmann::json& layers) {
  if (!layers.is_array() || layers.empty()) return;
  double entropy_share = 0, weakest = 1e9;
  for (const auto& shares : layers) {
    if (!shares.is_array() || shares.size() < 2) return;
    double h = 0, low = 1e9;
    for (const auto& p : shares) {
      const double v = p.is_number() ? p.get<double>() : 0.0;
      if (v > 0) h -= v * std::log(v);
      low = std::min(low, v);
    }
    const auto e = static_cast<double>(shares.size());
    entropy_share += h / std::log(e) / static_cast<double>(layers.size());
    weakest = std::min(weakest, low * e);
  }
  r.eval["load_entropy"].emplace_back(step, entropy_share);
  r.eval["weakest_head"].emplace_back(step, weakest);
}

RunCurves read_run(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(dir + "/metrics.jsonl"))
    throw UserError("run " + dir, "has no metrics.jsonl", "give run directories written by moh train");
  RunCurves r;
  r.name = fs::path(dir).filename().string();
  if (r.name.empty()) r.name = fs::path(dir).parent_path().filename().string();
  if (fs::is_regular_file(dir + "/config.resolved.yaml")) {
    const experiments::ExperimentConfig cfg =
        experiments::parse_experiment(read_file(dir + "/config.resolved.yaml"), dir + "/config.resolved.yaml");
    r.model = cfg.model.name;
    r.family = experiments::experiment_family(cfg).id;
    const double ratio = experiments::experiment_family(cfg).active_ratio(cfg);
    r.active = eval::format_metric("top1", ratio * 100) + " %";
  }
  std::istringstream in(read_file(dir + "/metrics.jsonl", "metrics"));
  double last_elapsed = 0, session_max = 0;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut by a kill
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) continue;
    if (j.contains("event")) continue;  // a mark such as {"event": "restart"}, not a curve
    const double step = j["step"].get<double>();
    if (j.contains("elapsed_s") && j["elapsed_s"].is_number()) {  // elapsed_s restarts at every resume
      const double e = j["elapsed_s"].get<double>();
      if (e < last_elapsed) {
        r.wall_s += session_max;
        session_max = 0;
      }
      session_max = std::max(session_max, e);
      last_elapsed = e;
      r.timed = true;
    }
    if (j.contains("head_load")) add_balance(r, step, j["head_load"]);
    const bool training = j.contains("loss");
    for (const auto& [k, v] : j.items()) {
      if (!v.is_number() || k == "step" || k == "epoch" || k == "elapsed_s") continue;
      if (k == "img_per_s") {
        r.img_per_s.push_back(v.get<double>());
        continue;
      }
      (training ? r.train : r.eval)[k].emplace_back(step, v.get<double>());
    }
  }
  r.wall_s += session_max;
  (void)line_no;
  return r;
}

eval::Series series(const std::string& name, const std::vector<std::pair<double, double>>& pts) {
  eval::Series s;
  s.name = name;
  for (const auto& [x, y] : pts) s.x.push_back(x), s.y.push_back(y);
  return s;
}

std::string last_of(const std::map<std::string, std::vector<std::pair<double, double>>>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() || it->second.empty() ? "–" : eval::format_metric(k, it->second.back().second);
}

// "wrote DIR/x.svg, DIR/x.png" (or why there is no PNG).
std::string wrote(const eval::ChartFiles& f) {
  if (f.svg.empty()) return "no chart: no point to draw";
  return "wrote " + f.svg + (f.png.empty() ? " (no PNG: built without OpenCV)" : ", " + f.png);
}

// "a, b and c" for a figure title.
std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

// One model's settings on one axis: every setting as a dot and, as the line, the best FID reached at that cost or
// less (settings are not a sequence: joined in cost order they would zigzag and read as a trend).
void add_fid_series(eval::ChartPanel& panel, const std::string& label, int colour, const std::vector<double>& cost,
                    const std::vector<double>& fid) {
  eval::Series best = eval::running_best(label, cost, fid);
  best.colour = colour;
  panel.series.push_back(best);
  panel.series.push_back(eval::Series{"", cost, fid, true, colour});
}

// FID against NFE and against seconds, one colour per "label", from studies/fid_curve/run.sh's JSON lines.
int plot_fid_curve(const std::string& path, const std::string& out) {
  std::map<std::string, std::vector<std::array<double, 3>>> rows;  // label → (nfe, seconds, fid)
  std::stringstream lines(read_file(path, "--fid-curve"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (!j.value("nfe", nlohmann::json()).is_number() || !j.value("seconds", nlohmann::json()).is_number() ||
        !j.value("fid", nlohmann::json()).is_number() || j["nfe"].get<double>() <= 0 || j["seconds"].get<double>() <= 0)
      continue;
    rows[j.value("label", std::string("run"))].push_back(
        {j["nfe"].get<double>(), j["seconds"].get<double>(), j["fid"].get<double>()});
  }
  if (rows.empty())
    throw UserError("--fid-curve " + path, "holds no JSON line with numbers nfe > 0, seconds > 0 and fid",
                    "write it with studies/fid_curve/run.sh");
  check_output_dir(out, "--out " + out);
  eval::ChartPanel by_nfe{"FID vs network evaluations per image (dots: settings; line: the best at that cost or less)",
                          "NFE per image",
                          "FID",
                          {},
                          false};
  eval::ChartPanel by_time{"FID vs sampling time of the whole set", "seconds", "FID", {}, false};
  by_nfe.log_x = by_time.log_x = true;
  std::vector<std::string> labels;
  for (const auto& [label, points] : rows) {
    std::vector<double> nfe, seconds, fid;
    for (const auto& p : points) nfe.push_back(p[0]), seconds.push_back(p[1]), fid.push_back(p[2]);
    add_fid_series(by_nfe, label, static_cast<int>(labels.size()), nfe, fid);
    add_fid_series(by_time, label, static_cast<int>(labels.size()), seconds, fid);
    labels.push_back(label);
  }
  std::filesystem::create_directories(out);
  std::cout << wrote(eval::write_line_chart(out + "/fid_curve", "FID against compute: " + joined(labels),
                                            {by_nfe, by_time}))
            << "\n";
  return kExitOk;
}

// The figure title of plot_fid_steps: the legend names the series (six names would not fit a title).
std::string steps_title(size_t series) {
  return "FID against training steps: " + std::to_string(series) + " model × recipe series";
}

using FidSteps = std::map<std::string, std::map<std::string, std::map<double, std::vector<double>>>>;

// studies/recipes/run.sh's JSON lines as model → recipe → step → FIDs over seeds (other lines skipped).
FidSteps read_fid_steps(const std::string& path) {
  FidSteps rows;
  std::stringstream lines(read_file(path, "--fid-steps"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.value("step", nlohmann::json()).is_number() ||
        !j.value("fid", nlohmann::json()).is_number())
      continue;
    rows[j.value("model", std::string("model"))][j.value("recipe", std::string("run"))][j["step"].get<double>()]
        .push_back(j["fid"].get<double>());
  }
  if (rows.empty())
    throw UserError("--fid-steps " + path, "holds no JSON line with numbers step and fid",
                    "write it with studies/recipes/run.sh");
  return rows;
}

// FID against optimizer steps from studies/recipes/run.sh's JSON lines: per model × recipe, the mean over seeds
// at each step as the line, every seed's measurement as a dot of the same colour. One colour per recipe, one line
// style per model (solid, dashed, dotted), so the same recipe reads across models.
int plot_fid_steps(const std::string& path, const std::string& out) {
  const FidSteps rows = read_fid_steps(path);
  check_output_dir(out, "--out " + out);
  std::vector<std::string> recipes;  // sorted, each once: a recipe's colour is its position
  for (const auto& by_model : rows)
    for (const auto& by_recipe : by_model.second) recipes.push_back(by_recipe.first);
  std::sort(recipes.begin(), recipes.end());
  recipes.erase(std::unique(recipes.begin(), recipes.end()), recipes.end());
  eval::ChartPanel panel{
      "FID vs optimizer steps (line: mean over seeds; dots: each seed)", "optimizer steps", "FID", {}, false};
  panel.integer_x = true;
  int model = 0;
  for (const auto& [name, by_recipe] : rows) {
    for (const auto& [recipe, by_step] : by_recipe) {
      const int colour = static_cast<int>(std::find(recipes.begin(), recipes.end(), recipe) - recipes.begin());
      eval::Series mean{name + " " + recipe, {}, {}, false, colour, model}, seeds{"", {}, {}, true, colour, model};
      for (const auto& [step, fids] : by_step) {
        double sum = 0;
        for (double f : fids) sum += f, seeds.x.push_back(step), seeds.y.push_back(f);
        mean.x.push_back(step), mean.y.push_back(sum / static_cast<double>(fids.size()));
      }
      panel.series.push_back(mean);
      panel.series.push_back(seeds);
    }
    ++model;
  }
  std::filesystem::create_directories(out);
  std::cout << wrote(eval::write_line_chart(out + "/fid_steps", steps_title(panel.series.size() / 2), {panel})) << "\n";
  return kExitOk;
}

// Head loads side by side: each argument [LABEL=]PATH, the label defaulting to the path's directory name.
int plot_head_loads(const std::vector<std::string>& args, const std::string& out) {
  std::vector<std::pair<std::string, nlohmann::json>> inputs;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    std::string path = eq == std::string::npos ? a : a.substr(eq + 1);
    if (std::filesystem::is_directory(path)) path += "/head_load.json";
    const std::filesystem::path p(path);
    const std::string label = eq != std::string::npos ? a.substr(0, eq) : p.parent_path().filename().string();
    const nlohmann::json j = nlohmann::json::parse(read_file(path, "--head-load " + a), nullptr, false);
    if (j.is_discarded()) throw UserError("--head-load " + path, "not JSON", "give a head_load.json");
    inputs.emplace_back(label.empty() ? path : label, j);
  }
  const vision::HeadLoadComparison c = vision::compare_head_loads(inputs);
  check_output_dir(out, "--out " + out);
  std::filesystem::create_directories(out);
  write_file_atomic(out + "/head_load_compare.md", c.markdown);
  std::cout << c.markdown << "wrote " << out << "/head_load_compare.md\n";
  if (vision::write_head_load_png(out + "/head_load_compare.png", "share of each evaluation's routed picks per head,",
                                  c.panels))
    std::cout << "wrote " << out << "/head_load_compare.png\n";
  return kExitOk;
}

// The panels of several runs: loss and its parts per family (a classifier's cross-entropy and a DiT's mse + vb do not
// share an axis), learning rate (log scale unless a schedule reaches 0) and validation top-1.
eval::ChartFiles draw_runs(const std::vector<RunCurves>& runs, const std::string& out) {
  std::vector<std::string> families, names;
  for (const auto& r : runs) {
    names.push_back(r.name);
    if (std::find(families.begin(), families.end(), r.family) == families.end()) families.push_back(r.family);
  }
  std::vector<eval::ChartPanel> panels;
  for (const auto& f : families) {
    const std::string of = families.size() > 1 ? " of the " + f + " runs" : "";
    eval::ChartPanel loss{"training loss" + of + " (mean over each logging window)", "optimizer step", "loss", {}};
    eval::ChartPanel parts{"loss parts" + of + " (aux: MoH load balance, before beta)", "optimizer step", "value", {}};
    for (const auto& r : runs) {
      if (r.family != f) continue;
      if (r.train.count("loss")) loss.series.push_back(series(r.name, r.train.at("loss")));
      for (const char* k : {"mse", "vb", "aux"})
        if (r.train.count(k)) parts.series.push_back(series(r.name + " " + k, r.train.at(k)));
    }
    panels.push_back(loss);
    panels.push_back(parts);
  }
  eval::ChartPanel lr{"learning rate", "optimizer step", "lr (log scale)", {}, true};
  eval::ChartPanel top1{"validation top-1 (a run with an EMA adds '<run> ema')", "optimizer step", "top-1 (%)", {}};
  for (const auto& r : runs) {
    if (r.train.count("lr")) lr.series.push_back(series(r.name, r.train.at("lr")));
    for (const char* k : {"top1", "top1_ema"})
      if (r.eval.count(k))
        top1.series.push_back(series(r.name + (std::string(k) == "top1" ? "" : " ema"), r.eval.at(k)));
  }
  for (const auto& s : lr.series)
    if (std::any_of(s.y.begin(), s.y.end(), [](double v) { return v <= 0; })) lr.log_y = false;
  if (!lr.log_y) lr.y_label = "lr (linear: a schedule reaches 0)";
  panels.push_back(lr);
  panels.push_back(top1);
  eval::ChartPanel balance{"head load per evaluation: mean entropy / ln E (1 = even), weakest head x E",
                           "optimizer step",
                           "share of uniform",
                           {}};
  for (const auto& r : runs)
    for (const char* k : {"load_entropy", "weakest_head"})
      if (r.eval.count(k))
        balance.series.push_back(
            series(r.name + (std::string(k) == "load_entropy" ? " entropy" : " weakest head"), r.eval.at(k)));
  if (!balance.series.empty()) panels.push_back(balance);
  for (auto& p : panels) p.integer_x = true;
  std::filesystem::create_directories(out);
  return eval::write_line_chart(out + "/curves", "Training curves: " + joined(names), panels);
}

}  // namespace

int cmd_plot(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Loss / lr / top-1 curves of one or more runs (PNG) and a Markdown table across them");
  auto flag = opts.add_options();
  flag("runs", "run directories", cxxopts::value<std::vector<std::string>>());
  flag("out", "output directory (default: <run>/plots for one run, plots/ for several)", cxxopts::value<std::string>());
  flag("fid-curve", "FID against NFE and seconds from studies/fid_curve/run.sh's curve.jsonl (instead of runs)",
       cxxopts::value<std::string>());
  flag("fid-steps", "FID against optimizer steps from studies/recipes/run.sh's rows.jsonl (instead of runs)",
       cxxopts::value<std::string>());
  flag("head-load", "compare the head load of evaluations given as [LABEL=]PATH (head_load.json or its directory)");
  flag("h,help", "show this help");
  opts.parse_positional({"runs"});
  opts.positional_help("RUN_DIR...");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  if (args.count("fid-curve"))
    return plot_fid_curve(args["fid-curve"].as<std::string>(),
                          args.count("out") ? args["out"].as<std::string>() : "plots");
  if (args.count("fid-steps"))
    return plot_fid_steps(args["fid-steps"].as<std::string>(),
                          args.count("out") ? args["out"].as<std::string>() : "plots");
  if (!args.count("runs")) throw UserError(argv[0], "missing RUN_DIR", "e.g. moh plot runs/nano runs/mha_nano");
  if (args.count("head-load"))
    return plot_head_loads(args["runs"].as<std::vector<std::string>>(),
                           args.count("out") ? args["out"].as<std::string>() : "plots");
  const auto dirs = args["runs"].as<std::vector<std::string>>();
  const std::string out = args.count("out")  ? args["out"].as<std::string>()
                          : dirs.size() == 1 ? dirs[0] + "/plots"
                                             : "plots";
  check_output_dir(out, "--out " + out);
  std::vector<RunCurves> runs;
  for (const auto& d : dirs) runs.push_back(read_run(d));

  const eval::ChartFiles chart = draw_runs(runs, out);

  std::ostringstream md;
  md << "| run | model | active heads | steps | final loss | final top-1 (%) | best top-1 (%) | img/s | wall time |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : runs) {
    double steps = 0, best = -1;
    for (const auto& [k, v] : r.train)
      for (const auto& p : v) steps = std::max(steps, p.first);
    if (r.eval.count("top1"))
      for (const auto& p : r.eval.at("top1")) best = std::max(best, p.second);
    double rate = 0;
    for (double v : r.img_per_s) rate += v / static_cast<double>(r.img_per_s.size());
    md << "| " << r.name << " | " << (r.model.empty() ? "–" : r.model) << " | " << r.active << " | "
       << static_cast<int64_t>(steps) << " | " << last_of(r.train, "loss") << " | " << last_of(r.eval, "top1") << " | "
       << (best >= 0 ? eval::format_metric("top1", best) : "–") << " | "
       << (r.img_per_s.empty() ? "–" : eval::format_metric("top1", rate)) << " | "
       << (r.timed ? Progress::format_duration(r.wall_s) : "–") << " |\n";
  }
  write_file_atomic(out + "/summary.md", md.str());
  std::cout << md.str() << "wrote " << out << "/summary.md\n" << wrote(chart) << "\n";
  return kExitOk;
}

}  // namespace moh::apps
