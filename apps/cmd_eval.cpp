// `moh eval CONFIG.yaml --checkpoint PATH [--json] [--out DIR]`: top-1 / top-5 / loss of a trained classifier on the
// configured validation split.
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/atomic_io.h"
#include "core/checkpoint.h"
#include "core/sha256.h"
#include "eval/report.h"
#include "experiments/classifier_experiment.h"

namespace moh::apps {

cxxopts::Options eval_options(const std::string& prog) {
  cxxopts::Options opts(prog, "Evaluate a classifier checkpoint on the configured validation split");
  add_config_args(opts);
  auto flag = opts.add_options();
  flag("checkpoint,ckpt",
       "checkpoint or run directory (its config is used when CONFIG.yaml is not "
       "given), or give CONFIG.yaml --weights FILE",
       cxxopts::value<std::string>());
  flag("device", "auto, cpu, cuda or cuda:N (default: the config's train.device)", cxxopts::value<std::string>());
  flag("batch,batch-size", "= data.eval_batch_size", cxxopts::value<std::string>());
  flag("json", "print JSON");
  flag("ema", "evaluate the checkpoint's EMA weights (train.ema_decay > 0)");
  flag("out", "write report.json and report.md into this directory", cxxopts::value<std::string>()->default_value(""));
  flag("h,help", "show this help");
  return opts;
}

int cmd_eval(int argc, char** argv) {
  cxxopts::Options opts = eval_options(argv[0]);
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  const std::string out = args["out"].as<std::string>();
  if (!out.empty()) check_output_dir(out, "--out " + out);
  std::vector<std::string> sets = config_overrides(args);
  if (args.count("batch")) sets.push_back("data.eval_batch_size=" + args["batch"].as<std::string>());
  std::optional<experiments::LoadedClassifier> loaded;
  if (args.count("checkpoint"))
    loaded = experiments::load_classifier_checkpoint(args["checkpoint"].as<std::string>(), args.count("ema") > 0);
  experiments::ExperimentConfig cfg;
  if (args.count("config")) {
    cfg = experiments::load_experiment(args["config"].as<std::string>(), sets);
  } else if (loaded) {  // the run's own experiment: its validation split, with --set / --batch applied
    cfg = experiments::with_overrides(loaded->cfg, sets, "checkpoint " + loaded->dir + "/config.resolved.yaml");
  } else {
    throw UserError(argv[0], "missing --checkpoint PATH",
                    "a checkpoint or run directory, or CONFIG.yaml --weights FILE (e.g. an official .pth)");
  }
  experiments::validate_experiment(cfg, experiments::ExperimentUse::train);
  if (!loaded && cfg.model.weights.empty())
    throw UserError(argv[0], "missing --checkpoint PATH",
                    "a checkpoint or run directory, or --weights FILE (e.g. an official .pth)");
  RunContext ctx = RunContext::create(args.count("device") ? args["device"].as<std::string>() : cfg.train.device,
                                      Precision::fp32, 0);
  vision::TransNeXt model{nullptr};
  std::string source, weights = "model", model_name = cfg.model.name, weights_file = cfg.model.weights;
  int64_t step = -1;  // unknown for --weights files
  if (loaded) {
    model = loaded->model;
    source = loaded->dir;
    weights = loaded->weights;
    weights_file = loaded->weights_file;
    step = loaded->step;
    model_name = loaded->cfg.model.name;
  } else {  // official or converted weights, e.g. a TransNeXt / MoH-ViT .pth with --weights-key model
    model = vision::TransNeXt(experiments::classifier_options_for(cfg));
    load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
    source = cfg.model.weights;
    weights = cfg.model.weights_key.empty() ? "file" : cfg.model.weights_key;
  }
  const vision::TransNeXtOptions mo = model->options;
  model->to(ctx.device);
  vision::HeadLoadStats head_load(mo, mo.num_classes);
  const experiments::ClassifierSplit val(cfg, mo, /*train=*/false);
  // `moh launch -- eval ...`: each rank evaluates its share of the same model and split
  const auto group =
      dist::Group::join(ctx, {{"config (sha256 of the resolved YAML)", sha256_hex(experiments::to_yaml(cfg))},
                              {"weights", source + " " + weights}});
  experiments::EvalResult r =
      experiments::evaluate_sharded(model, val, cfg.data.eval_batch_size, ctx, *group, &head_load);
  if (!group->is_main()) return kExitOk;  // rank 0 reports
  nlohmann::json report{{"metrics", {{"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss}}},
                        {"checkpoint", source},
                        {"weights", weights},
                        {"model", model_name},
                        {"count", r.count},
                        {"weights_sha256", sha256_file(weights_file)},
                        {"provenance", provenance(ctx.device)}};
  if (step >= 0) report["step"] = step;
  if (!out.empty()) {
    eval::write_report(out, report, "Classifier evaluation: " + model_name);
    if (mo.routed_layers() > 0) {  // MoH head load per layer and class (paper Figure 3)
      write_file_atomic(out + "/head_load.json", head_load.to_json().dump(1) + "\n");
      std::vector<std::string> names;
      if (cfg.data.dataset == DatasetKind::fashion_mnist) names = datasets::fashion_mnist_classes();
      if (head_load.write_png(out + "/head_load.png", names)) std::cout << "head load: " << out << "/head_load.png\n";
    }
  }
  if (args.count("json")) {
    nlohmann::json j{{"checkpoint", source}, {"weights", weights}, {"top1", r.top1},
                     {"top5", r.top5},       {"loss", r.loss},     {"count", r.count}};
    if (step >= 0) j["step"] = step;
    std::cout << j.dump(1) << std::endl;
  } else {
    std::cout << source << " (" << weights << " weights" << (step >= 0 ? ", step " + std::to_string(step) : "")
              << "): top-1 " << eval::format_metric("top1", r.top1) << " %, top-5 "
              << eval::format_metric("top5", r.top5) << " %, loss " << eval::format_metric("loss", r.loss) << " over "
              << r.count << " images\n";
  }
  return 0;
}

}  // namespace moh::apps
