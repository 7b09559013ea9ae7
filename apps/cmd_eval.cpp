// `moh eval CONFIG.yaml --checkpoint PATH [--json] [--out DIR]`: top-1 / top-5 / loss of a trained classifier on the
// configured validation split.
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/cli.h"
#include "apps/commands.h"
#include "eval/report.h"
#include "experiments/evaluation_run.h"

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

experiments::ClassifierEvalRequest eval_request(const cxxopts::ParseResult& args, const std::string& program) {
  experiments::ClassifierEvalRequest r;
  r.program = program;
  r.sets = config_overrides(args);
  if (args.count("batch")) r.sets.push_back("data.eval_batch_size=" + args["batch"].as<std::string>());
  if (args.count("checkpoint")) r.checkpoint = args["checkpoint"].as<std::string>();
  for (const char* own : {"weights", "weights-key", "allow-missing"})  // a checkpoint brings its own weights
    if (args.count("checkpoint") && args.count(own))
      throw UserError("--" + std::string(own), "with --checkpoint, which brings its own weights",
                      "evaluate either --checkpoint RUN or CONFIG.yaml --weights FILE");
  if (args.count("config")) r.config = args["config"].as<std::string>();
  if (args.count("device")) r.device = args["device"].as<std::string>();
  r.ema = args.count("ema") > 0;
  r.out = args["out"].as<std::string>();
  return r;
}

int cmd_eval(int argc, char** argv) {
  cxxopts::Options opts = eval_options(argv[0]);
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  const experiments::ClassifierEvalResult e = experiments::evaluate_classifier_checkpoint(eval_request(args, argv[0]));
  if (!e.main) return kExitOk;  // rank 0 reports
  if (!e.head_load_png.empty()) std::cout << "head load: " << e.head_load_png << "\n";
  const experiments::EvalResult& r = e.result;
  if (args.count("json")) {
    nlohmann::json j{{"checkpoint", e.source}, {"weights", e.weights}, {"top1", r.top1},
                     {"top5", r.top5},         {"loss", r.loss},       {"count", r.count}};
    if (e.step >= 0) j["step"] = e.step;
    std::cout << j.dump(1) << std::endl;
  } else {
    std::cout << e.source << " (" << e.weights << " weights" << (e.step >= 0 ? ", step " + std::to_string(e.step) : "")
              << "): top-1 " << eval::format_metric("top1", r.top1) << " %, top-5 "
              << eval::format_metric("top5", r.top5) << " %, loss " << eval::format_metric("loss", r.loss) << " over "
              << r.count << " images\n";
  }
  return 0;
}

}  // namespace moh::apps
