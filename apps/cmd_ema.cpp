// `moh ema list RUN`: the post-hoc EMA snapshots of a run trained with train.phema.
// `moh ema reconstruct RUN --sigma-rel S [--step N] --out DIR`: the EMA of σ_rel S at step N (default: the last
// snapshot) as the least-squares combination of the snapshots (EDM2, core/train/phema.h), written as a run directory
// that moh sample / moh eval / moh fid read with --checkpoint DIR. `moh ema sweep RUN --sigma-rels a:b:n --out DIR
// [--baselines] -- eval [FLAGS]` or `... -- fid FLAGS [-- sample FLAGS]`: reconstructs each σ_rel and measures it with
// the commands named after `--` (a classifier run by `moh eval`, a DiT run by its samples' `moh fid`), then writes
// DIR/sweep.json, sweep.md and the curve of --metric (any metric the measure computes; top1 / fid by default)
// (eval/ema_sweep.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/train/phema_run.h"
#include "eval/ema_sweep.h"
#include "eval/metric_record.h"
#include "eval/report.h"
#include "experiments/evaluation_run.h"
#include "experiments/feature_nets.h"
#include "experiments/registry.h"

namespace moh::apps {

namespace {

int ema_list(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "List the post-hoc EMA snapshots of a run (train.phema)");
  auto flag = opts.add_options();
  flag("run", "run directory", cxxopts::value<std::string>());
  flag("h,help", "show this help");
  opts.parse_positional({"run"});
  opts.positional_help("RUN");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return kExitOk;
  if (!args.count("run")) throw UserError(argv[0], "needs a run directory", "moh ema list RUN");
  for (const auto& s : phema::list_snapshots(args["run"].as<std::string>()))
    std::cout << "step " << s.step << "  sigma_rel " << s.sigma_rel << "  gamma " << std::setprecision(6) << s.gamma
              << "  " << s.file << "\n";
  return kExitOk;
}

int ema_reconstruct(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Reconstruct an EMA of any sigma_rel from a run's post-hoc EMA snapshots (EDM2)");
  auto flag = opts.add_options();
  flag("run", "run directory trained with train.phema", cxxopts::value<std::string>());
  flag("sigma-rel", "relative std of the EMA profile to reconstruct (EDM2 sweeps about 0.01-0.25)",
       cxxopts::value<double>());
  flag("step", "the EMA's end step: the last snapshot at or before it (default: the last snapshot)",
       cxxopts::value<int64_t>()->default_value("0"));
  flag("out", "output run directory (new or empty)", cxxopts::value<std::string>());
  flag("h,help", "show this help");
  opts.parse_positional({"run"});
  opts.positional_help("RUN");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return kExitOk;
  if (!args.count("run") || !args.count("sigma-rel") || !args.count("out"))
    throw UserError(argv[0], "needs RUN, --sigma-rel and --out", "moh ema reconstruct RUN --sigma-rel 0.07 --out DIR");
  const int64_t step = args["step"].as<int64_t>();
  if (step < 0) throw UserError("--step", "must be >= 0 (0 = the last snapshot)", "");
  const std::string run = args["run"].as<std::string>(), out = args["out"].as<std::string>();
  const phema::Reconstruction r = phema::reconstruct(run, args["sigma-rel"].as<double>(), step);
  phema::write_reconstruction(r, run, out);
  std::cout << "wrote " << out << ": EMA of sigma_rel " << r.sigma_rel << " (gamma " << r.gamma << ") at step "
            << r.step << " from " << r.used.size() << " snapshots (phema_reconstruction.json lists the coefficients)"
            << std::endl;
  return kExitOk;
}

// The commands after `--`: "eval FLAGS" (a classifier run), or "fid FLAGS" with an optional "sample FLAGS" (a DiT
// run); each segment starts with its command's name.
using Segments = std::map<std::string, std::vector<std::string>>;

Segments measure_segments(const std::vector<std::string>& words) {
  Segments seg;
  std::string current;
  for (const auto& w : words) {
    if (w == "--") {
      current.clear();
    } else if (current.empty()) {
      if (w != "eval" && w != "fid" && w != "sample")
        throw UserError("moh ema sweep -- " + w, "is not a measuring command", "eval, fid, or sample ... -- fid ...");
      if (seg.count(w)) throw UserError("moh ema sweep -- " + w, "is given twice", "each command once");
      current = w;
      seg[w];
    } else {
      seg[current].push_back(w);
    }
  }
  if (seg.count("eval") == seg.count("fid") || (seg.count("sample") && !seg.count("fid")))
    throw UserError("moh ema sweep", "needs `-- eval [FLAGS]` (a classifier run) or `-- fid FLAGS [-- sample FLAGS]`",
                    "e.g. -- fid --ref stats.npz --features classifier:RUN -- sample --num-samples 2000");
  return seg;
}

cxxopts::ParseResult parse_segment(const std::string& cmd, const std::vector<std::string>& words) {
  const std::string prog = "moh ema sweep -- " + cmd;
  cxxopts::Options opts = cmd == "eval" ? eval_options(prog) : cmd == "fid" ? fid_options(prog) : sample_options(prog);
  std::vector<std::string> all{prog};
  all.insert(all.end(), words.begin(), words.end());
  std::vector<char*> argv;
  for (auto& w : all) argv.push_back(w.data());
  return parse_or_throw(opts, static_cast<int>(argv.size()), argv.data());
}

// Every segment's flags parse, and none sets what the sweep sets for each point; fid's inputs exist.
void check_segments(const Segments& seg) {
  const std::map<std::string, std::vector<std::string>> reserved{
      {"eval", {"checkpoint", "out", "json", "ema", "config", "weights", "help"}},
      {"fid", {"samples", "out", "json", "help"}},
      {"sample", {"checkpoint", "out", "raw", "untrained", "config", "weights", "help"}}};
  for (const auto& [cmd, words] : seg) {
    const auto args = parse_segment(cmd, words);
    for (const auto& flag : reserved.at(cmd))
      if (args.count(flag))
        throw UserError("moh ema sweep -- " + cmd + " --" + flag, "is set by the sweep for each point", "leave it out");
    if (cmd != "fid") continue;
    if (!args.count("ref") || !args.count("features"))
      throw UserError("moh ema sweep -- fid", "needs --ref and --features", "as for moh fid");
    const std::string ref = args["ref"].as<std::string>(), features = args["features"].as<std::string>();
    const std::string feature_file = features.substr(features.find(':') + 1);
    if (ref.rfind("fashion_mnist:", 0) != 0 && !std::filesystem::exists(ref))
      throw UserError("moh ema sweep -- fid --ref " + ref, "does not exist",
                      "moh ref-stats writes reference statistics");
    if (!std::filesystem::exists(feature_file))
      throw UserError("moh ema sweep -- fid --features " + features, "names no file or run", "");
    // The feature network itself (the kind of run it names, its weights) before the first point is reconstructed
    // and sampled: built once here on the CPU and dropped.
    (void)experiments::make_feature_net(features, RunContext::create("cpu", Precision::fp32, 0));
  }
}

// The sweep's measure from the segments after `--`: the same flags, parsed into the commands' requests.
eval::SweepMeasure measurer(const Segments& seg, bool keep_samples) {
  experiments::CheckpointMeasure m;
  m.keep_samples = keep_samples;
  if (seg.count("eval")) m.eval = eval_request(parse_segment("eval", seg.at("eval")), "moh ema sweep -- eval");
  if (seg.count("sample")) m.sample = sampling_request(parse_segment("sample", seg.at("sample")));
  if (seg.count("fid")) {
    const auto args = parse_segment("fid", seg.at("fid"));
    m.fid = fid_request(args);
    m.fid_device = args["device"].as<std::string>();
  }
  return experiments::checkpoint_measurer(m);
}

std::string eta_text(double seconds);

// The curve's metric (--metric): a metric with a record that the segments' measure computes.
std::string sweep_metric(const cxxopts::ParseResult& args, const Segments& seg) {
  const bool classify = seg.count("eval") > 0;
  if (!args.count("metric")) return classify ? "top1" : "fid";
  const std::string key = args["metric"].as<std::string>();
  const eval::MetricRecord& r = eval::metric_record(key, "--metric");
  const auto& eval_keys = experiments::classifier_eval_metrics();
  if (classify) {
    if (std::find(eval_keys.begin(), eval_keys.end(), key) == eval_keys.end())
      throw UserError("--metric " + key, "is not in `-- eval`'s report", "one of top1, top5, loss");
    return key;
  }
  if (r.group == eval::MetricGroup::classification)
    throw UserError("--metric " + key, "is not computed by `-- fid`", "fid, sfid, inception_score, precision, ...");
  eval::GenerativeEvalOptions fid = fid_request(parse_segment("fid", seg.at("fid")));
  if (!fid.metrics.has(r.group))
    throw UserError("--metric " + key, "is not among the metrics `-- fid --metrics` computes",
                    std::string("add ") + eval::group_word(r.group) + " to --metrics");
  return key;
}

// The run's family must be measured the way the segments measure; its baselines: raw weights, and the fixed-decay
// EMA if it has one.
void check_family(eval::EmaSweepRequest& r, const Segments& seg, bool baselines) {
  using Measure = experiments::ModelFamily::Measure;
  phema::list_snapshots(r.run);  // a run without snapshots: its own error first
  const experiments::ExperimentConfig cfg = experiments::load_experiment(r.run + "/config.resolved.yaml");
  const experiments::ModelFamily& f = experiments::experiment_family(cfg);
  const Measure asked = seg.count("eval") ? Measure::eval : Measure::sample_fid;
  if (f.measure != asked)
    throw UserError(
        r.run, "is a " + f.id + " run, which `-- " + (asked == Measure::eval ? "eval" : "fid") + "` does not measure",
        f.measure == Measure::eval ? "measure it with -- eval" : "measure it with -- fid FLAGS");
  if (!baselines) return;
  r.baselines.push_back(eval::SweepWeights::raw);
  if (cfg.train.ema_decay > 0) r.baselines.push_back(eval::SweepWeights::fixed_ema);
}

// One line per measured point, with the time it took and the time the rest should take at the mean rate so far.
std::function<void(const nlohmann::json&, size_t, size_t)> progress_printer(const std::string& metric) {
  const auto started = std::chrono::steady_clock::now();
  auto measured = std::make_shared<size_t>(0);
  return [=](const nlohmann::json& row, size_t done, size_t total) {
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ++*measured;
    std::cout << "[" << done << "/" << total << "] " << row["id"].get<std::string>() << ": " << metric << " "
              << eval::format_metric(metric, row["metrics"][metric].get<double>()) << " ("
              << eta_text(row["seconds"].get<double>()) << "; about "
              << eta_text(spent / static_cast<double>(*measured) * static_cast<double>(total - done)) << " left)"
              << std::endl;
  };
}

std::string eta_text(double seconds) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << (seconds >= 120 ? seconds / 60 : seconds)
    << (seconds >= 120 ? " min" : " s");
  return s.str();
}

int ema_sweep(int argc, char** argv) {
  int own = 0;  // the sweep's own words end at the first `--`
  while (own < argc && std::strcmp(argv[own], "--") != 0) ++own;
  cxxopts::Options opts(argv[0], "Measure the post-hoc EMA of each sigma_rel of a range (EDM2's EMA-length sweep)");
  auto flag = opts.add_options();
  flag("run", "run directory trained with train.phema", cxxopts::value<std::string>());
  flag("sigma-rels", "a:b:n (n values from a to b) or a list a,b,c",
       cxxopts::value<std::string>()->default_value("0.02:0.20:10"));
  flag("step", "the EMAs' end step: the last snapshot at or before it (default: the last snapshot)",
       cxxopts::value<int64_t>()->default_value("0"));
  flag("baselines", "measure the run's raw weights and its fixed-decay EMA too");
  flag("keep-samples", "keep each point's samples.npz (removed once measured)");
  flag("metric",
       "the metric the curve draws and the best point is picked by: any the measure computes (default: "
       "top1 for -- eval, fid for -- fid)",
       cxxopts::value<std::string>());
  flag("out", "sweep directory (new, or an earlier start of the same sweep to continue)",
       cxxopts::value<std::string>());
  flag("h,help", "show this help");
  opts.parse_positional({"run"});
  opts.positional_help("RUN ... -- eval [FLAGS] | -- fid FLAGS [-- sample FLAGS]");
  auto args = parse_or_throw(opts, own, argv);
  if (print_help_if_asked(opts, args)) return kExitOk;
  if (!args.count("run") || !args.count("out"))
    throw UserError(argv[0], "needs RUN and --out", "moh ema sweep RUN --sigma-rels 0.02:0.20:10 --out DIR -- eval");
  const Segments seg = measure_segments(std::vector<std::string>(argv + own, argv + argc));
  check_segments(seg);
  eval::EmaSweepRequest r;
  r.run = std::filesystem::absolute(args["run"].as<std::string>()).lexically_normal().string();
  r.out = args["out"].as<std::string>();
  r.step = args["step"].as<int64_t>();
  if (r.step < 0) throw UserError("--step", "must be >= 0 (0 = the last snapshot)", "");
  r.sigma_rels = eval::parse_sigma_rels(args["sigma-rels"].as<std::string>(), "--sigma-rels");
  r.metric = sweep_metric(args, seg);
  r.measure = seg;
  check_family(r, seg, args.count("baselines") > 0);
  const auto res = eval::run_ema_sweep(r, measurer(seg, args.count("keep-samples") > 0), progress_printer(r.metric));
  std::cout << read_file(res.table, "table") << "wrote " << res.json << ", " << res.table
            << (res.chart_svg.empty() ? "" : ", " + res.chart_svg)
            << (res.resumed ? " (" + std::to_string(res.resumed) + " points resumed)" : "") << std::endl;
  return kExitOk;
}

}  // namespace

int cmd_ema(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << "usage: moh ema list RUN | moh ema reconstruct RUN --sigma-rel S [--step N] --out DIR\n"
                 "       moh ema sweep RUN --sigma-rels a:b:n --out DIR [--baselines] -- eval [FLAGS] | -- fid FLAGS "
                 "[-- sample FLAGS]\n";
    if (argc < 2) throw UserError("moh ema", "no subcommand given", "list, reconstruct or sweep; usage above");
    return kExitOk;
  }
  const std::string what = argv[1], prog = std::string(argv[0]) + " " + what;
  std::vector<char*> args(argv + 1, argv + argc);
  args[0] = const_cast<char*>(prog.c_str());
  if (what == "list") return ema_list(static_cast<int>(args.size()), args.data());
  if (what == "reconstruct") return ema_reconstruct(static_cast<int>(args.size()), args.data());
  if (what == "sweep") return ema_sweep(static_cast<int>(args.size()), args.data());
  throw UserError("moh ema", "unknown subcommand '" + what + "'", "list, reconstruct or sweep");
}

}  // namespace moh::apps
