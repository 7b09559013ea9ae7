// `moh eval CONFIG.yaml --checkpoint PATH [--json]`: top-1 / top-5 / loss of a trained classifier on the
// configured validation split.
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/checkpoint.h"
#include "vision/classification_trainer.h"

namespace moh::apps {

int cmd_eval(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Evaluate a classifier checkpoint on the configured validation split");
  opts.add_options()("config", "experiment YAML", cxxopts::value<std::string>())(
      "set", "override a key (repeatable)", cxxopts::value<std::vector<std::string>>())(
      "checkpoint", "checkpoint directory or run directory", cxxopts::value<std::string>())(
      "json", "print JSON")("h,help", "show this help");
  opts.parse_positional({"config"});
  opts.positional_help("CONFIG.yaml");
  auto args = parse_or_throw(opts, argc, argv);
  if (args.count("help")) {
    std::cout << opts.help() << std::endl;
    return 0;
  }
  if (!args.count("config") || !args.count("checkpoint"))
    throw UserError(argv[0], "needs CONFIG.yaml and --checkpoint PATH", "see --help");
  std::vector<std::string> sets;
  if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
  ExperimentConfig cfg = load_experiment(args["config"].as<std::string>(), sets);
  Checkpoint ckpt = load_checkpoint(args["checkpoint"].as<std::string>());
  RunContext ctx = RunContext::create(cfg.train.device, Precision::fp32, 0);
  vision::TransNeXtOptions mo = vision::classifier_options_for(cfg);
  vision::TransNeXt model(mo);
  load_module_tensors(*model, ckpt.model, ckpt.dir);
  model->to(ctx.device);
  vision::EvalResult r = vision::evaluate_classifier(model, vision::load_split(cfg, false),
                                                     vision::transform_for(cfg, mo), cfg.data.eval_batch_size, ctx);
  if (args.count("json")) {
    std::cout << nlohmann::json{{"checkpoint", ckpt.dir}, {"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss},
                                {"count", r.count}}.dump(1)
              << std::endl;
  } else {
    std::cout << ckpt.dir << ": top-1 " << r.top1 << " %, top-5 " << r.top5 << " %, loss " << r.loss << " over "
              << r.count << " images\n";
  }
  return 0;
}

}  // namespace moh::apps
