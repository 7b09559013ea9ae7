// `moh eval CONFIG.yaml --checkpoint PATH [--json] [--out DIR]`: top-1 / top-5 / loss of a trained classifier on the
// configured validation split.
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/checkpoint.h"
#include "core/atomic_io.h"
#include "eval/report.h"
#include "vision/classifier_experiment.h"

namespace moh::apps {

int cmd_eval(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Evaluate a classifier checkpoint on the configured validation split");
  add_config_args(opts);
  opts.add_options()("checkpoint", "checkpoint directory or run directory (or give --weights FILE)", cxxopts::value<std::string>())(
      "json", "print JSON")("ema", "evaluate the checkpoint's EMA weights (train.ema_decay > 0)")("out", "write report.json and report.md into this directory",
                            cxxopts::value<std::string>()->default_value(""))("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  ExperimentConfig cfg = config_from_args(args, argv[0]);
  if (!args.count("checkpoint") && cfg.model.weights.empty())
    throw UserError(argv[0], "missing --checkpoint PATH", "a checkpoint or run directory, or --weights FILE (e.g. an official .pth)");
  const std::string out = args["out"].as<std::string>();
  if (!out.empty()) check_output_dir(out, "--out " + out);
  RunContext ctx = RunContext::create(cfg.train.device, Precision::fp32, 0);
  vision::TransNeXt model{nullptr};
  std::string source, weights = "model", model_name = cfg.model.name;
  int64_t step = -1;  // unknown for --weights files
  if (args.count("checkpoint")) {
    vision::LoadedClassifier c = vision::load_classifier_checkpoint(args["checkpoint"].as<std::string>(), args.count("ema") > 0);
    model = c.model, source = c.dir, weights = c.weights, step = c.step, model_name = c.cfg.model.name;
  } else {  // official or converted weights, e.g. a TransNeXt / MoH-ViT .pth with --weights-key model
    model = vision::TransNeXt(vision::classifier_options_for(cfg));
    load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
    source = cfg.model.weights, weights = cfg.model.weights_key.empty() ? "file" : cfg.model.weights_key;
  }
  const vision::TransNeXtOptions mo = model->options;
  model->to(ctx.device);
  vision::HeadLoadStats head_load(mo, mo.num_classes);
  const vision::ClassifierSplit val(cfg, mo, /*train=*/false);
  const auto group = dist::Group::join(ctx);  // `moh launch -- eval ...`: each rank evaluates its share
  vision::EvalResult r = vision::evaluate_sharded(model, val, cfg.data.eval_batch_size, ctx, *group, &head_load);
  if (!group->is_main()) return kExitOk;  // rank 0 reports
  nlohmann::json report{{"metrics", {{"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss}}},
                        {"checkpoint", source},
                        {"weights", weights},
                        {"model", model_name},
                        {"count", r.count}};
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
    nlohmann::json j{{"checkpoint", source}, {"weights", weights}, {"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss},
                     {"count", r.count}};
    if (step >= 0) j["step"] = step;
    std::cout << j.dump(1) << std::endl;
  } else {
    std::cout << source << " (" << weights << " weights" << (step >= 0 ? ", step " + std::to_string(step) : "")
              << "): top-1 " << r.top1 << " %, top-5 " << r.top5 << " %, loss " << r.loss << " over " << r.count
              << " images\n";
  }
  return 0;
}

}  // namespace moh::apps
