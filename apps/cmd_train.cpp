// `moh train CONFIG.yaml [--set k=v]... [--run-dir DIR] [--resume auto|DIR]`: trains the configured classifier or
// diffusion model (the family follows from model.name).
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "diffusion/diffusion_trainer.h"
#include "vision/classification_trainer.h"

namespace moh::apps {

int cmd_train(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Train a model from an experiment YAML");
  add_config_args(opts);
  opts.add_options()("run-dir", "run directory (default runs/<config name>)",
                     cxxopts::value<std::string>()->default_value(""))(
      "resume", "auto (latest checkpoint of the run dir, if any) or a checkpoint/run directory",
      cxxopts::value<std::string>()->default_value(""))("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  ExperimentConfig cfg = config_from_args(args, argv[0]);
  if (cfg.train.processes > 1 && !std::getenv("WORLD_SIZE") && !std::getenv("SLURM_NTASKS")) {
    // train.processes: run as that many data-parallel processes here, exactly as `moh launch --nproc N -- train ...`.
    std::vector<std::string> child{"train"};
    for (int i = 1; i < argc; ++i) child.emplace_back(argv[i]);
    return launch_local(static_cast<int>(cfg.train.processes), 0, child);
  }
  vision::TrainArgs ta{args["run-dir"].as<std::string>(), args["resume"].as<std::string>()};
  const char* rank = std::getenv("RANK");
  const bool main_rank = !rank || std::string(rank) == "0";  // only rank 0 prints the result line
  if (diffusion::is_diffusion_model(cfg.model.name) || cfg.model.name.find("DiT") != std::string::npos) {
    diffusion::DiffusionTrainResult r = diffusion::train_diffusion(cfg, ta);
    if (main_rank)
      std::cout << nlohmann::json{{"run_dir", r.run_dir}, {"steps", r.steps}, {"loss", r.loss}, {"seconds", r.seconds}}.dump()
              << std::endl;
    return 0;
  }
  vision::TrainResult r = vision::train_classifier(cfg, ta);
  nlohmann::json out{{"run_dir", r.run_dir}, {"steps", r.steps}, {"top1", r.final_eval.top1},
                     {"top5", r.final_eval.top5}, {"val_loss", r.final_eval.loss},
                     {"best_top1", r.best_top1}, {"seconds", r.seconds}};
  if (cfg.train.ema_decay > 0) out["top1_ema"] = r.final_eval_ema.top1;
  if (main_rank) std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace moh::apps
