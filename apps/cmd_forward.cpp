// `moh forward --model NAME --weights W --input IN.safetensors --output OUT.safetensors`: one fp32 eval-mode forward
// pass of a registered network, every output tensor written — the tensor-in/tensor-out check of a port against PyTorch.
//   classifier (moh info --list):  x (B,3,H,W)            → logits, features
//   DiT / MoH-DiT:                 x (B,C,I,I), t, y (B)  → out (B,C_out,I,I)
//   sd-vae (AutoencoderKL kl-f8):  x (B,3,H,W) in [−1,1]  → latent_mean, latent_logvar, recon (decode of the mean)
//   fid-inception:                 x (B,3,299,299)        → pool, spatial, logits
// Each family's forward is its registry entry's (experiments/registry.h).
#include <torch/utils.h>

#include <filesystem>
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "experiments/registry.h"

namespace moh::apps {

int cmd_forward(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "One fp32 eval-mode forward pass of a network on tensors from a safetensors file");
  auto flag = opts.add_options();
  flag("model", "a name of moh info --list (classifier or DiT variant, sd-vae, fid-inception)",
       cxxopts::value<std::string>());
  flag("weights", "torch.save .pt/.pth/.bin, .safetensors, or a checkpoint/run directory",
       cxxopts::value<std::string>());
  flag("weights-key", "entry of a nested checkpoint (ema, model, state_dict)",
       cxxopts::value<std::string>()->default_value(""));
  flag("allow-missing", "keep initialised values for tensors the weights lack");
  flag("input", "safetensors file with the inputs (names above)", cxxopts::value<std::string>());
  flag("output", "safetensors file to write the outputs to", cxxopts::value<std::string>());
  flag("router", "MoH layers' router: learned (official) or query_norm (parameter-free; dense weights into MoH)",
       cxxopts::value<std::string>()->default_value("learned"));
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"model", "weights", "input", "output"})
    if (!args.count(required)) throw UserError(argv[0], std::string("missing --") + required, "see --help");
  experiments::ForwardRequest r;
  r.model.name = args["model"].as<std::string>();
  r.inputs_origin = args["input"].as<std::string>();
  const std::string weights_path = args["weights"].as<std::string>(), out_path = args["output"].as<std::string>();
  const std::string key = args["weights-key"].as<std::string>();
  r.weights_origin = weights_path + (key.empty() ? "" : " [" + key + "]");
  r.model.weights_allow_missing = args.count("allow-missing") > 0;
  r.model.router = config::enum_from_string<RouterKind>(args["router"].as<std::string>(), "--router");

  check_output_file(out_path, "--output " + out_path);
  const std::string model_flag = "--model " + r.model.name;
  const experiments::ModelFamily& family = experiments::find_model_family(r.model.name, model_flag);
  r.inputs = load_safetensors(r.inputs_origin).tensors;
  r.weights = load_weights_tensors(weights_path, key);
  torch::NoGradGuard no_grad;
  const TensorMap out = family.forward(r);
  if (auto parent = std::filesystem::path(out_path).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent);
  save_safetensors(out_path, out, {{"model", r.model.name}});
  for (const auto& [n, t] : out) std::cout << n << " " << c10::str(t.sizes()) << "\n";
  std::cout << "wrote " << out_path << std::endl;
  return kExitOk;
}

}  // namespace moh::apps
