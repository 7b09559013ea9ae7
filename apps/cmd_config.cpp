// `moh config CONFIG.yaml [--set k=v]...` validates an experiment file and prints the resolved YAML;
// `moh config --schema [--markdown]` prints every key with type, default and meaning; `moh config CONFIG.yaml
// --precision` prints the precision its run would train in on this machine (`auto` decided, as moh train decides it).
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/platform/blas_core.h"
#include "experiments/experiment_config.h"
#include "experiments/registry.h"

namespace moh::apps {

static void print_schema(bool markdown) {
  auto rows = config::list_schema<experiments::ExperimentConfig>();
  if (markdown) {
    std::cout << "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const auto& r : rows) {
      if (r.type == "section") {
        std::cout << "| **" << r.key << "** | section | | " << r.help << " |\n";
        continue;
      }
      std::cout << "| `" << r.key << "` | " << r.type << " | "
                << (r.required ? "*required*" : "`" + r.default_value + "`") << " | " << r.help << " |\n";
    }
    return;
  }
  for (const auto& r : rows) {
    if (r.type == "section") {
      std::cout << r.key << ":  # " << r.help << "\n";
      continue;
    }
    std::cout << "  " << r.key << " (" << r.type << ") = " << (r.required ? "<required>" : r.default_value) << "  # "
              << r.help << "\n";
  }
}

int cmd_config(int argc, char** argv) {
  cxxopts::Options opts(argv[0],
                        "Validate an experiment YAML (base: inheritance, --set overrides) and print it resolved");
  add_config_args(opts);
  auto flag = opts.add_options();
  flag("schema", "print every key with type, default and meaning");
  flag("markdown", "with --schema: a Markdown table");
  flag("precision",
       "print only the precision the run would train in here and why (auto: measured as moh train measures it, once "
       "per machine and cached; the first word is fp32 or bf16)");
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  if (args.count("schema")) {
    print_schema(args.count("markdown") > 0);
    return 0;
  }
  experiments::ExperimentConfig cfg = config_from_args(args, argv[0]);
  if (args.count("precision")) {
    reexec_for_cpu();  // the input is valid and the probe computes: with what the CPU path needs
                       // (core/platform/blas_core.h)
    std::cout << experiments::run_precision(cfg) << std::endl;
    return 0;
  }
  std::cout << experiments::to_yaml(cfg);
  return 0;
}

}  // namespace moh::apps
