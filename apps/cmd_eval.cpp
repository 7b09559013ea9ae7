// `moh eval CONFIG.yaml --checkpoint PATH [--json] [--out DIR]`: top-1 / top-5 / loss of a trained classifier on the
// configured validation split.
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/checkpoint.h"
#include "core/atomic_io.h"
#include "eval/report.h"
#include "vision/classification_trainer.h"

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
  RunContext ctx = RunContext::create(cfg.train.device, Precision::fp32, 0);
  vision::TransNeXtOptions mo = vision::classifier_options_for(cfg);
  vision::TransNeXt model(mo);
  Checkpoint ckpt;
  if (args.count("checkpoint")) {
    ckpt = load_checkpoint(args["checkpoint"].as<std::string>());
    if (args.count("ema")) {
      if (ckpt.ema.empty()) throw UserError("checkpoint " + ckpt.dir, "has no EMA weights", "train with train.ema_decay > 0, or drop --ema");
      load_module_tensors(*model, ckpt.ema, ckpt.dir + "/ema.safetensors");
    } else {
      load_module_tensors(*model, ckpt.model, ckpt.dir);
    }
  } else {  // official or converted weights, e.g. a TransNeXt / MoH-ViT .pth with --weights-key model
    load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
    ckpt.dir = cfg.model.weights;
  }
  model->to(ctx.device);
  vision::HeadLoadStats head_load(mo, mo.num_classes);
  const vision::ClassifierSplit val(cfg, mo, /*train=*/false);
  const auto group = dist::Group::join(ctx);  // `moh launch -- eval ...`: each rank evaluates its share
  vision::EvalResult r = vision::evaluate_sharded(model, val, cfg.data.eval_batch_size, ctx, *group, &head_load);
  if (!group->is_main()) return kExitOk;  // rank 0 reports
  const nlohmann::json report{{"metrics", {{"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss}}},
                              {"checkpoint", ckpt.dir},
                              {"model", cfg.model.name},
                              {"count", r.count}};
  const std::string out = args["out"].as<std::string>();
  if (!out.empty()) {
    eval::write_report(out, report, "Classifier evaluation: " + cfg.model.name);
    if (mo.routed_layers() > 0) {  // MoH head load per layer and class (paper Figure 3)
      write_file_atomic(out + "/head_load.json", head_load.to_json().dump(1) + "\n");
      std::vector<std::string> names;
      if (cfg.data.dataset == DatasetKind::fashion_mnist) names = datasets::fashion_mnist_classes();
      if (head_load.write_png(out + "/head_load.png", names)) std::cout << "head load: " << out << "/head_load.png\n";
    }
  }
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
