// `moh convert --in FILE|DIR [--key ema] --out OUT.safetensors`: any weights source this toolkit reads (torch.save zip
// or legacy .pt/.pth/.bin, .safetensors, one of our checkpoint or run directories) → one safetensors file with the
// official key names, which Python loads with `model.load_state_dict(safetensors.torch.load_file(OUT))`.
#include <filesystem>
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/checkpoint.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace moh::apps {

int cmd_convert(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Convert weights (torch.save file, checkpoint directory, safetensors) to safetensors");
  opts.add_options()("in", "torch.save .pt/.pth/.bin (zip or legacy), .safetensors, or a checkpoint/run directory",
                     cxxopts::value<std::string>())(
      "key", "entry of a nested checkpoint: ema, model, state_dict, ... (directories: model or ema)",
      cxxopts::value<std::string>()->default_value(""))("out", "output .safetensors file", cxxopts::value<std::string>())(
      "h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"in", "out"})
    if (!args.count(required)) throw UserError(argv[0], std::string("missing --") + required, "see --help");
  const std::string in = args["in"].as<std::string>(), out = args["out"].as<std::string>(), key = args["key"].as<std::string>();
  if (out.size() < 12 || out.compare(out.size() - 12, 12, ".safetensors") != 0)
    throw UserError("--out " + out, "must end in .safetensors", "e.g. --out model.safetensors");
  if (std::filesystem::exists(out) && std::filesystem::exists(in) && std::filesystem::equivalent(in, out))
    throw UserError("--out " + out, "is the input file", "choose another output path");
  TensorMap tensors = load_weights_tensors(in, key);
  if (tensors.empty()) throw UserError("--in " + in, "holds no tensors", "wrong --key?");
  int64_t params = 0;
  for (const auto& [name, t] : tensors) params += t.numel();
  if (auto parent = std::filesystem::path(out).parent_path(); !parent.empty()) std::filesystem::create_directories(parent);
  save_safetensors(out, tensors, {{"format", "pt"}, {"source", std::filesystem::path(in).filename().string()},
                                  {"key", key}});
  std::cout << "wrote " << out << ": " << tensors.size() << " tensors, " << params << " values" << std::endl;
  return kExitOk;
}

}  // namespace moh::apps
