// `moh fid --samples S --ref R --features KIND:PATH [--metrics fid,sfid,is,pr,kid] [--json] [--out DIR] ...`: FID,
// sFID, IS, precision and recall (ADM evaluator) and KID (torch-fidelity) of a sample batch against a reference
// batch or reference statistics.
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/config_schema.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "eval/generative.h"
#include "eval/metric_record.h"
#include "eval/report.h"
#include "experiments/evaluation_run.h"
#include "experiments/feature_nets.h"

namespace moh::apps {

namespace {

std::string fmt(const nlohmann::json& m, const char* key) {
  return m.contains(key) ? eval::format_metric(key, m[key].get<double>()) : std::string("–");
}

}  // namespace

cxxopts::Options fid_options(const std::string& prog) {
  cxxopts::Options opts(prog, "FID / sFID / IS / precision / recall of samples against a reference (ADM evaluator)");
  auto flag = opts.add_options();
  flag("samples",
       "samples: PATH.npz (arr_0 uint8 NHWC, optional arr_1 labels), an image folder, or "
       "fashion_mnist:train|test[:N]",
       cxxopts::value<std::string>());
  flag("ref", "reference: same kinds, or an .npz with mu/sigma[/mu_s/sigma_s] statistics (moh ref-stats, ADM batches)",
       cxxopts::value<std::string>());
  flag("features",
       "feature network: inception:WEIGHTS(.pth|.safetensors), classifier:CHECKPOINT_OR_RUN_DIR or dinov2:WEIGHTS "
       "(FD-DINOv2: fid, pr and kid on DINOv2 ViT-L/14 features)",
       cxxopts::value<std::string>());
  flag("metrics", "comma list of fid,sfid,is,pr,kid (or all)", cxxopts::value<std::string>()->default_value("all"));
  flag("is-mode", "adm (splits of 5000 in order) or fidelity (torch-fidelity: 10 shuffled splits, mean ± std)",
       cxxopts::value<std::string>()->default_value("adm"));
  flag("resize", "Inception resize: tf1 (ADM / torch-fidelity) or pytorch (pytorch-fid)",
       cxxopts::value<std::string>()->default_value("tf1"));
  flag("batch,batch-size", "images per forward pass", cxxopts::value<int64_t>()->default_value("64"));
  flag("device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"));
  flag("out", "write report.json and report.md into this directory", cxxopts::value<std::string>()->default_value(""));
  flag("save-features", "store the raw feature arrays in this .npz", cxxopts::value<std::string>()->default_value(""));
  flag("json", "print the report as JSON");
  flag("h,help", "show this help");
  opts.parse_positional({"samples", "ref"});  // pytorch-fid's order: moh fid SAMPLES REF --features ...
  opts.positional_help("[SAMPLES REF]");
  return opts;
}

eval::GenerativeEvalOptions fid_request(const cxxopts::ParseResult& args) {
  eval::GenerativeEvalOptions o;
  if (args.count("samples")) o.samples = args["samples"].as<std::string>();
  if (args.count("ref")) o.reference = args["ref"].as<std::string>();
  if (args.count("features")) o.features = args["features"].as<std::string>();
  o.save_features = args["save-features"].as<std::string>();
  o.metrics = eval::parse_metric_set(args["metrics"].as<std::string>());
  o.metrics_explicit = args.count("metrics") > 0;
  o.is_mode = config::enum_from_string<eval::ISMode>(args["is-mode"].as<std::string>(), "--is-mode");
  o.resize = config::enum_from_string<eval::InceptionResize>(args["resize"].as<std::string>(), "--resize");
  o.batch_size = args["batch"].as<int64_t>();
  if (o.batch_size < 1) throw UserError("--batch", "must be at least 1", "");
  return o;
}

int cmd_fid(int argc, char** argv) {
  cxxopts::Options opts = fid_options(argv[0]);
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"samples", "ref", "features"})
    if (!args.count(required)) throw UserError(argv[0], std::string("missing --") + required, "see moh fid --help");
  const eval::GenerativeEvalOptions o = fid_request(args);
  const std::string out = args["out"].as<std::string>();
  if (!out.empty()) check_output_dir(out, "--out " + out);
  if (!o.save_features.empty()) check_output_file(o.save_features, "--save-features " + o.save_features);
  const nlohmann::json report = experiments::evaluate_sample_set(o, args["device"].as<std::string>(), out);
  if (args.count("json")) {
    std::cout << report.dump(2) << std::endl;
  } else {
    const auto& m = report["metrics"];
    const std::string net = report["feature_net"]["feature_net"].get<std::string>();
    std::string line;
    for (const eval::MetricRecord& r : eval::metric_records())
      if (r.on_console)
        line += (line.empty() ? "" : "  ") + eval::metric_label(r.key, net == "dinov2") + " " + fmt(m, r.key);
    std::cout << line << "  (" << report["samples"]["count"] << " samples, " << net << ")\n";
    if (report.contains("sample_accuracy"))
      std::cout << "sample accuracy " << eval::format_metric("top1", report["sample_accuracy"]["top1"].get<double>())
                << " %\n";
    if (!out.empty()) std::cout << "report: " << out << "/report.md\n";
  }
  return 0;
}

int cmd_ref_stats(int argc, char** argv) {
  cxxopts::Options opts(argv[0],
                        "Precompute reference statistics (mu, sigma, mu_s, sigma_s, P/R features) for moh fid");
  auto flag = opts.add_options();
  flag("images", "PATH.npz, an image folder, or fashion_mnist:train|test[:N]", cxxopts::value<std::string>());
  flag("out", "output .npz", cxxopts::value<std::string>());
  flag("features", "inception:WEIGHTS(.pth|.safetensors), classifier:CHECKPOINT_OR_RUN_DIR or dinov2:WEIGHTS",
       cxxopts::value<std::string>());
  flag("resize", "Inception resize: tf1 or pytorch", cxxopts::value<std::string>()->default_value("tf1"));
  flag("batch", "images per forward pass", cxxopts::value<int64_t>()->default_value("64"));
  flag("device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"));
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"images", "out", "features"})
    if (!args.count(required))
      throw UserError(argv[0], std::string("missing --") + required, "see moh ref-stats --help");
  const std::string out = args["out"].as<std::string>();
  const auto resize = config::enum_from_string<eval::InceptionResize>(args["resize"].as<std::string>(), "--resize");
  if (out.size() < 5 || out.compare(out.size() - 4, 4, ".npz") != 0)
    throw UserError("--out " + out, "must end in .npz", "");
  check_output_file(out, "--out " + out);
  const int64_t batch = args["batch"].as<int64_t>();
  if (batch < 1) throw UserError("--batch", "must be at least 1", "");
  RunContext ctx = RunContext::create(args["device"].as<std::string>(), Precision::fp32, 0);
  auto net = experiments::make_feature_net(args["features"].as<std::string>(), ctx, resize);
  auto images = datasets::open_image_source(args["images"].as<std::string>());
  const eval::FeatureSet f = eval::extract_features(*net, *images, batch, "reference");
  eval::ReferenceStats stats = eval::reference_stats_from(f, *net);
  stats.meta["images"] = args["images"].as<std::string>();
  eval::save_reference_stats(out, stats);
  std::cout << "wrote " << out << " (" << stats.count << " images, " << net->name() << ")\n";
  return 0;
}

}  // namespace moh::apps
