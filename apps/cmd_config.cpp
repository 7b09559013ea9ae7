// `moh config CONFIG.yaml [--set k=v]...` validates an experiment file and prints the resolved YAML;
// `moh config --schema [--markdown]` prints every key with type, default and meaning.
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/experiment_config.h"

namespace moh::apps {

static void print_schema(bool markdown) {
  auto rows = config::list_schema<ExperimentConfig>();
  if (markdown) {
    std::cout << "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const auto& r : rows) {
      if (r.type == "section") {
        std::cout << "| **" << r.key << "** | section | | " << r.help << " |\n";
        continue;
      }
      std::cout << "| `" << r.key << "` | " << r.type << " | " << (r.required ? "*required*" : "`" + r.default_value + "`")
                << " | " << r.help << " |\n";
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
  cxxopts::Options opts(argv[0], "Validate an experiment YAML (base: inheritance, --set overrides) and print it resolved");
  opts.add_options()("config", "experiment YAML file", cxxopts::value<std::string>())(
      "set", "override a key: --set optim.lr=5e-4 (repeatable)", cxxopts::value<std::vector<std::string>>())(
      "schema", "print every key with type, default and meaning")("markdown", "with --schema: a Markdown table")(
      "h,help", "show this help");
  opts.parse_positional({"config"});
  opts.positional_help("CONFIG.yaml");
  auto args = parse_or_throw(opts, argc, argv);
  if (args.count("help")) {
    std::cout << opts.help() << std::endl;
    return 0;
  }
  if (args.count("schema")) {
    print_schema(args.count("markdown") > 0);
    return 0;
  }
  if (!args.count("config")) throw UserError(argv[0], "missing CONFIG.yaml", "e.g. moh config configs/fashion_mnist/moh_vit_nano.yaml");
  std::vector<std::string> sets;
  if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
  ExperimentConfig cfg = load_experiment(args["config"].as<std::string>(), sets);
  std::cout << to_yaml(cfg);
  return 0;
}

}  // namespace moh::apps
