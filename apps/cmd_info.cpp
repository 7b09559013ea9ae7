// `moh info --attention-paths` prints which MoH layers `attention_path: auto` runs sparse; `moh info --list` lists
// every registered model variant; `moh info --model NAME [--json]` builds it and reports
// parameters, MoH layers and the active-head ratio (layer-weighted, as the paper counts "activated heads").
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/run_context.h"
#include "diffusion/dit.h"
#include "diffusion/experiment.h"
#include "vision/transnext.h"

namespace moh::apps {

namespace {

struct ModelSummary {
  std::string name, family;
  int64_t params = 0, trainable = 0, layers = 0, moh_layers = 0, routed_layers = 0;
  double active_ratio = 1.0;
};

template <class M>
void count_params(M& model, ModelSummary& s) {
  for (const auto& p : model->parameters()) {
    s.params += p.numel();
    if (p.requires_grad()) s.trainable += p.numel();
  }
}

ModelSummary summarize(const std::string& name) {
  ModelSummary s;
  s.name = name;
  const ModelFamily family = model_family(name);
  if (family == ModelFamily::classifier) {
    s.family = "classifier";
    vision::TransNeXtOptions o = vision::classifier_options(name);
    vision::TransNeXt model(o);
    count_params(model, s);
    s.layers = o.total_layers();
    for (int64_t i = 0; i < 4; ++i) s.moh_layers += o.attention[i] == AttentionMode::mha ? 0 : o.depths[i];
    s.routed_layers = o.routed_layers();
    s.active_ratio = o.active_ratio();
    return s;
  }
  if (family != ModelFamily::dit)
    throw UserError("model '" + name + "'", "is the fixed " + family_name(family) + " network, not a model variant",
                    "moh info describes classifier and DiT variants (moh info --list)");
  s.family = "dit";
  diffusion::DiTOptions o = diffusion::dit_options(name);
  diffusion::DiT model(o);
  count_params(model, s);
  s.layers = o.depth;
  s.moh_layers = o.attention == AttentionMode::mha ? 0 : o.depth;
  s.routed_layers = o.routed_layers();
  s.active_ratio = o.active_ratio();
  return s;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Model variants: list them, or build one and report its size and MoH layout");
  opts.add_options()("list", "list every registered variant")("model", "variant name, e.g. MoH-ViT-B-75 or MoH-DiT-XL/2-90",
                                                               cxxopts::value<std::string>())(
      "json", "machine-readable output")(
      "attention-paths", "the table of what attention_path: auto runs in each MoH layer of the paper variants")(
      "h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (args.count("help")) {
    std::cout << opts.help() << std::endl;
    return 0;
  }
  const bool json = args.count("json") > 0;
  if (args.count("attention-paths")) {
    std::cout << attention_path_table();
    return 0;
  }
  if (args.count("model")) {
    ModelSummary s = summarize(args["model"].as<std::string>());
    if (json) {
      std::cout << nlohmann::json{{"model", s.name}, {"family", s.family}, {"params", s.params},
                                  {"trainable_params", s.trainable}, {"layers", s.layers},
                                  {"moh_layers", s.moh_layers}, {"routed_layers", s.routed_layers},
                                  {"active_head_ratio", s.active_ratio}}.dump(1)
                << std::endl;
    } else {
      std::cout << s.name << " (" << s.family << ")\n  parameters: " << s.params << " (trainable " << s.trainable
                << ")\n  layers: " << s.layers << ", MoH layers: " << s.moh_layers
                << ", routed (top-K) layers: " << s.routed_layers << "\n  active heads: " << std::fixed
                << std::setprecision(2) << 100.0 * s.active_ratio << " % (layer-weighted)\n";
    }
    return 0;
  }
  if (args.count("list") || argc == 1) {
    std::vector<std::string> dit, cls;
    for (const auto& [n, o] : diffusion::dit_variants()) dit.push_back(n);
    for (const auto& [n, o] : vision::classifier_variants()) cls.push_back(n);
    if (json) {
      std::cout << nlohmann::json{{"classifier", cls}, {"dit", dit}}.dump(1) << std::endl;
    } else {
      std::cout << "TransNeXt / MoH-ViT (classification):\n";
      for (const auto& n : cls) std::cout << "  " << n << "\n";
      std::cout << "DiT / MoH-DiT (diffusion):\n";
      for (const auto& n : dit) std::cout << "  " << n << "\n";
    }
    return 0;
  }
  throw UserError(argv[0], "nothing to do", "use --list or --model NAME");
}

}  // namespace moh::apps
