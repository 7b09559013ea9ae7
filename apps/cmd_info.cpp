// `moh info --attention-paths` prints which MoH layers `attention_path: auto` runs sparse; `moh info --list` lists
// every registered model, family by family; `moh info --model NAME [--json]` builds it and reports
// parameters, MoH layers and the active-head ratio (layer-weighted, as the paper counts "activated heads").
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/environment.h"
#include "core/platform/run_context.h"
#include "experiments/registry.h"

namespace moh::apps {

int cmd_info(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Model variants: list them, or build one and report its size and MoH layout");
  auto flag = opts.add_options();
  flag("list", "list every registered variant");
  flag("model", "variant name, e.g. MoH-ViT-B-75 or MoH-DiT-XL/2-90", cxxopts::value<std::string>());
  flag("json", "machine-readable output");
  flag("attention-paths", "the table of what attention_path: auto runs in each MoH layer of the paper variants");
  flag("environment", "the environment variables moh reads and the values each takes (docs/ENVIRONMENT.md)");
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (args.count("help")) {
    std::cout << opts.help() << std::endl;
    return 0;
  }
  const bool json = args.count("json") > 0;
  if (args.count("attention-paths")) {
    std::cout << experiments::attention_path_table();
    return 0;
  }
  if (args.count("environment")) {
    std::cout << environment_markdown();
    return 0;
  }
  if (args.count("model")) {
    const std::string name = args["model"].as<std::string>();
    const experiments::ModelSummary s = experiments::find_model_family(name).summarize(name);
    if (json) {
      std::cout << nlohmann::json{{"model", s.name},
                                  {"family", s.family},
                                  {"params", s.params},
                                  {"trainable_params", s.trainable},
                                  {"layers", s.layers},
                                  {"moh_layers", s.moh_layers},
                                  {"routed_layers", s.routed_layers},
                                  {"active_head_ratio", s.active_ratio}}
                       .dump(1)
                << std::endl;
    } else {
      std::cout << s.name << " (" << s.family << ")\n  parameters: " << s.params << " (trainable " << s.trainable
                << ")\n";
      if (s.layers > 0)  // a transformer variant; the fixed networks have no attention layers to count
        std::cout << "  layers: " << s.layers << ", MoH layers: " << s.moh_layers
                  << ", routed (top-K) layers: " << s.routed_layers << "\n  active heads: " << std::fixed
                  << std::setprecision(2) << 100.0 * s.active_ratio << " % (layer-weighted)\n";
    }
    return 0;
  }
  if (args.count("list") || argc == 1) {
    nlohmann::json all;
    for (const experiments::ModelFamily& f : experiments::model_families()) {
      all[f.id] = f.names();
      if (json) continue;
      std::cout << f.title << ":\n";
      for (const auto& n : f.names()) std::cout << "  " << n << "\n";
    }
    if (json) std::cout << all.dump(1) << std::endl;
    return 0;
  }
  throw UserError(argv[0], "nothing to do", "use --list or --model NAME");
}

}  // namespace moh::apps
