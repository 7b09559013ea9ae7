// `moh train CONFIG.yaml [--set k=v]... [--run-dir DIR] [--resume auto|DIR]`: trains the configured classifier or
// diffusion model (the family follows from model.name). Ctrl-C / SIGTERM stop it at the next step with a checkpoint
// and print the command that resumes it (exit 130 / 143); a second Ctrl-C exits at once.
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/dist/launcher.h"
#include "core/platform/blas_core.h"
#include "core/platform/run_context.h"
#include "core/train/train_loop.h"
#include "experiments/registry.h"

namespace moh::apps {

int cmd_train(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Train a model from an experiment YAML");
  add_config_args(opts);
  auto flag = opts.add_options();
  flag("run-dir", "run directory (default runs/<config name>)", cxxopts::value<std::string>()->default_value(""));
  flag("resume", "auto (latest checkpoint of the run dir, if any) or a checkpoint/run directory",
       cxxopts::value<std::string>()->default_value(""));
  flag("allow-config-change", "resume although data.* / batch / seed settings differ from the checkpoint's");
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  experiments::ExperimentConfig cfg = config_from_args(args, argv[0]);
  if (cfg.train.processes > 1 && !launched_world()) {
    // train.processes: run as that many data-parallel processes here, exactly as `moh launch --nproc N -- train ...`.
    // Their devices are checked here, before any process starts (device: cuda with more processes than GPUs).
    const int n = static_cast<int>(cfg.train.processes);
    choose_device(cfg.train.device, n - 1, n, cuda_available() ? cuda_device_count() : 0);
    LaunchPlan plan;
    plan.program = invoked_as();
    plan.nproc = n;
    plan.args = {"train"};
    for (int i = 1; i < argc; ++i) plan.args.emplace_back(argv[i]);
    return launch_local(plan);
  }
  reexec_for_cpu();  // the input is valid and the run computes: with what the CPU path needs
                     // (core/platform/blas_core.h)
  const TrainArgs ta{args["run-dir"].as<std::string>(), args["resume"].as<std::string>(),
                     args.count("allow-config-change") > 0};
  const LoopResult r = experiments::train_experiment(cfg, ta);
  const char* rank = std::getenv("RANK");
  const bool main_rank = !rank || std::string(rank) == "0";
  if (r.stop_signal != 0) {  // Ctrl-C / SIGTERM: the checkpoint is saved; say how to go on (exit 128 + signal)
    if (main_rank)
      std::cerr << "stopped at step " << r.steps << ": checkpoint " << r.checkpoint
                << "\nresume with: " << resume_command(invoked_as(), argc, argv, r.run_dir) << std::endl;
    return 128 + r.stop_signal;
  }
  if (!main_rank) return 0;  // only rank 0 prints the result line
  nlohmann::json out{{"run_dir", r.run_dir}, {"steps", r.steps}, {"seconds", r.seconds}};
  if (!r.losses.empty()) out["loss"] = r.losses.front().second;
  for (const auto& [k, v] : r.final_eval) out[k] = v;
  for (const auto& [k, v] : r.final_eval_ema) out[k + "_ema"] = v;
  if (!r.final_eval.empty()) out["best_" + r.final_eval.front().first] = r.best_metric;
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace moh::apps
