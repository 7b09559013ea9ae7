// `moh forward --model NAME --weights W --input IN.safetensors --output OUT.safetensors`: one fp32 eval-mode forward
// pass of a registered network, every output tensor written — the tensor-in/tensor-out check of a port against PyTorch.
//   classifier (moh info --list):  x (B,3,H,W)            → logits, features
//   DiT / MoH-DiT:                 x (B,C,I,I), t, y (B)  → out (B,C_out,I,I)
//   sd-vae (AutoencoderKL kl-f8):  x (B,3,H,W) in [−1,1]  → latent_mean, latent_logvar, recon (decode of the mean)
//   fid-inception:                 x (B,3,299,299)        → pool, spatial, logits
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <filesystem>
#include <iostream>
#include <set>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/atomic_io.h"
#include "core/checkpoint.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "diffusion/dit.h"
#include "diffusion/sd_vae.h"
#include "eval/inception.h"
#include "vision/transnext.h"

namespace moh::apps {

namespace {

constexpr const char* kVae = "sd-vae";
constexpr const char* kInception = "fid-inception";

/// The input tensor `name` as `dtype`, or a UserError naming what the model needs.
at::Tensor input(const TensorMap& in, const std::string& name, at::ScalarType dtype, int64_t dim, const std::string& origin,
                 const std::string& needs) {
  auto it = in.find(name);
  if (it == in.end()) throw UserError("--input " + origin, "has no tensor '" + name + "'", "this model needs " + needs);
  if (it->second.dim() != dim)
    throw UserError("--input " + origin, "tensor '" + name + "' has shape " + c10::str(it->second.sizes()),
                    std::to_string(dim) + " dimensions expected (" + needs + ")");
  return it->second.to(dtype).contiguous();
}

/// Tensors other than the inputs are an error, except ones named like this model's outputs (a reference file holding
/// PyTorch's inputs and expected outputs can be passed as it is).
void check_inputs(const TensorMap& in, const std::set<std::string>& inputs, const std::set<std::string>& outputs,
                  const std::string& origin, const std::string& needs) {
  for (const auto& [name, t] : in)
    if (!inputs.count(name) && !outputs.count(name))
      throw UserError("--input " + origin, "unexpected tensor '" + name + "'", "this model takes " + needs);
}

}  // namespace

int cmd_forward(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "One fp32 eval-mode forward pass of a network on tensors from a safetensors file");
  opts.add_options()("model", std::string("classifier or DiT variant (moh info --list), ") + kVae + " or " + kInception,
                     cxxopts::value<std::string>())(
      "weights", "torch.save .pt/.pth/.bin, .safetensors, or a checkpoint/run directory", cxxopts::value<std::string>())(
      "weights-key", "entry of a nested checkpoint (ema, model, state_dict)", cxxopts::value<std::string>()->default_value(""))(
      "allow-missing", "keep initialised values for tensors the weights lack")(
      "input", "safetensors file with the inputs (names above)", cxxopts::value<std::string>())(
      "output", "safetensors file to write the outputs to", cxxopts::value<std::string>())("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"model", "weights", "input", "output"})
    if (!args.count(required)) throw UserError(argv[0], std::string("missing --") + required, "see --help");
  const std::string name = args["model"].as<std::string>(), weights_path = args["weights"].as<std::string>();
  const std::string in_path = args["input"].as<std::string>(), out_path = args["output"].as<std::string>();
  const std::string key = args["weights-key"].as<std::string>();
  const bool allow_missing = args.count("allow-missing") > 0;
  const std::string origin = weights_path + (key.empty() ? "" : " [" + key + "]");

  check_output_file(out_path, "--output " + out_path);
  const ModelFamily family = model_family(name, "--model " + name);
  const bool dit = family == ModelFamily::dit, classifier = family == ModelFamily::classifier;
  const TensorMap in = load_safetensors(in_path).tensors;
  TensorMap w = load_weights_tensors(weights_path, key);
  torch::NoGradGuard no_grad;
  TensorMap out;
  if (dit) {
    const std::string needs = "x (B,C,I,I) float, t (B) int, y (B) int";
    check_inputs(in, {"x", "t", "y"}, {"out"}, in_path, needs);
    diffusion::DiTOptions o = diffusion::dit_options_for_weights(diffusion::dit_options(name), w);
    diffusion::DiT model(o);
    load_module_tensors(*model, w, origin, allow_missing);
    model->eval();
    at::Tensor x = input(in, "x", at::kFloat, 4, in_path, needs);
    if (x.size(1) != o.in_channels || x.size(2) != o.input_size || x.size(3) != o.input_size)
      throw UserError("--input " + in_path, "x has shape " + c10::str(x.sizes()),
                      "the weights are for (B, " + std::to_string(o.in_channels) + ", " + std::to_string(o.input_size) +
                          ", " + std::to_string(o.input_size) + ")");
    out["out"] = model->forward(x, input(in, "t", at::kLong, 1, in_path, needs), input(in, "y", at::kLong, 1, in_path, needs)).out;
  } else if (classifier) {
    const std::string needs = "x (B,C,H,W) float";
    check_inputs(in, {"x"}, {"logits", "features"}, in_path, needs);
    at::Tensor x = input(in, "x", at::kFloat, 4, in_path, needs);
    vision::TransNeXtOptions o = vision::classifier_options(name);
    o.img_size = x.size(2);
    o.in_chans = x.size(1);
    if (auto it = w.find("head.weight"); it != w.end() && it->second.dim() == 2) o.num_classes = it->second.size(0);
    vision::TransNeXt model(o);
    load_module_tensors(*model, w, origin, allow_missing);
    model->eval();
    vision::ClassifierOutput r = model->forward(x);
    out["logits"] = r.logits;
    out["features"] = r.features;
  } else if (name == kVae) {
    const std::string needs = "x (B,3,H,W) in [-1,1], H and W multiples of 8";
    check_inputs(in, {"x"}, {"latent_mean", "latent_logvar", "recon"}, in_path, needs);
    diffusion::AutoencoderKL vae;
    load_module_tensors(*vae, diffusion::normalize_vae_keys(w), origin, allow_missing);
    vae->eval();
    at::Tensor x = input(in, "x", at::kFloat, 4, in_path, needs);
    if (x.size(1) != 3 || x.size(2) % 8 || x.size(3) % 8) throw UserError("--input " + in_path, "x has shape " + c10::str(x.sizes()), needs);
    diffusion::LatentPosterior post = vae->encode(x);
    out["latent_mean"] = post.mean;
    out["latent_logvar"] = post.logvar;
    out["recon"] = vae->decode(post.mean);
  } else {
    const std::string needs = "x (B,3,299,299), already normalised to [-1,1]";
    check_inputs(in, {"x"}, {"pool", "spatial", "logits"}, in_path, needs);
    eval::FIDInceptionV3 net;
    load_module_tensors(*net, w, origin, allow_missing);
    net->eval();
    at::Tensor x = input(in, "x", at::kFloat, 4, in_path, needs);
    if (x.size(1) != 3 || x.size(2) != 299 || x.size(3) != 299) throw UserError("--input " + in_path, "x has shape " + c10::str(x.sizes()), needs);
    eval::InceptionFeatures f = net->forward(x);
    out["pool"] = f.pool;
    out["spatial"] = f.spatial;
    out["logits"] = f.logits;
  }
  if (auto parent = std::filesystem::path(out_path).parent_path(); !parent.empty()) std::filesystem::create_directories(parent);
  save_safetensors(out_path, out, {{"model", name}});
  for (const auto& [n, t] : out) std::cout << n << " " << c10::str(t.sizes()) << "\n";
  std::cout << "wrote " << out_path << std::endl;
  return kExitOk;
}

}  // namespace moh::apps
