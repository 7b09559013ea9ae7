// `moh convert --in FILE|DIR [--key ema] --out OUT.safetensors`: any weights source this toolkit reads (torch.save zip
// or legacy .pt/.pth/.bin, .safetensors, one of our checkpoint or run directories) → one safetensors file with the
// official key names, which Python loads with `model.load_state_dict(safetensors.torch.load_file(OUT))`.
// `moh convert --to-moh TARGET.yaml --in DENSE --out DIR [--shared-heads first|importance|learned]`: a dense DiT or
// TransNeXt (toolkit run or official file) turned into the MoH model of an experiment (experiments/convert.h).
// `moh compare A B [--key K] [--tol T] [--l2]`: relative error between two weights sources, per tensor and whole.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "experiments/convert.h"

namespace moh::apps {

namespace {

// Counts of the new tensors by their last module name ("wg ×28, wg_0 ×28").
std::string created_summary(const std::vector<std::string>& names) {
  std::map<std::string, int> counts;
  for (const auto& n : names) {
    const auto end = n.rfind('.'), start = n.rfind('.', end - 1);
    ++counts[n.substr(start + 1, end - start - 1)];
  }
  std::string s;
  for (const auto& [k, c] : counts) s += (s.empty() ? "" : ", ") + k + " ×" + std::to_string(c);
  return s.empty() ? "none" : s;
}

std::string join_heads(const std::vector<int64_t>& heads) {
  std::string s = "[";
  for (int64_t h : heads) {
    if (s.size() > 1) s += ' ';
    s += std::to_string(h);
  }
  s += ']';
  return s;
}

int convert_to_moh(const cxxopts::ParseResult& args, const std::string& in, const std::string& out,
                   const std::string& key) {
  using namespace experiments;
  ConvertOptions o;
  o.source = in;
  o.key = key;
  o.shared = shared_choice_from(args["shared-heads"].as<std::string>());
  o.calib_batches = args["calib-batches"].as<int64_t>();
  o.mask_steps = args["mask-steps"].as<int64_t>();
  o.mask_lr = args["mask-lr"].as<double>();
  if (std::filesystem::exists(out) && !std::filesystem::is_empty(out))
    throw UserError("--out " + out, "exists and is not empty", "choose a new directory");
  check_output_dir(out, "--out " + out);
  const experiments::ExperimentConfig target =
      experiments::load_experiment(args["to-moh"].as<std::string>(), config_overrides(args));
  const RunContext ctx = RunContext::create(args["device"].as<std::string>(), Precision::fp32, target.train.seed);
  const ConvertResult r = experiments::convert_to_moh(target, o, ctx);
  write_conversion(out, target, o, r);
  std::cout << "converted " << in << " into " << r.target << "\n  reused: " << r.reused.size()
            << " tensors (every tensor of the dense weights)\n  new: " << created_summary(r.created)
            << (r.created.empty() ? "" : " (zero: every kept head starts with gate 1)") << "\n  shared heads ("
            << to_string(o.shared) << "):\n";
  for (const auto& l : r.layers)
    std::cout << "    " << l.name << ": " << join_heads(l.shared_heads) << " of " << l.heads << " heads shared, top-"
              << l.topk << " of the other " << l.heads - l.shared << " routed\n";
  std::cout << "wrote " << out << " (checkpoint 0, conversion.json)" << std::endl;
  return kExitOk;
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  cxxopts::Options opts(argv[0],
                        "Convert weights (torch.save file, checkpoint directory, safetensors) to safetensors, "
                        "or a dense model into MoH (--to-moh)");
  auto flag = opts.add_options();
  flag("in,ckpt", "torch.save .pt/.pth/.bin (zip or legacy), .safetensors, or a checkpoint/run directory",
       cxxopts::value<std::string>());
  flag("key", "entry of a nested checkpoint: ema, model, state_dict, ... (directories: model or ema)",
       cxxopts::value<std::string>()->default_value(""));
  flag("out", "output .safetensors file", cxxopts::value<std::string>());
  flag("h,help", "show this help");
  auto flag_dense_to_moh = opts.add_options("dense to MoH");
  flag_dense_to_moh(
      "to-moh",
      "TARGET.yaml: the MoH experiment to convert into (its model; its training data calibrate); --out is "
      "then a directory",
      cxxopts::value<std::string>());
  flag_dense_to_moh(
      "set", "override a key of TARGET.yaml (repeatable), e.g. --set model.shared_heads=[8] --set model.topk=[4]",
      cxxopts::value<std::vector<std::string>>());
  flag_dense_to_moh("shared-heads",
                    "which dense heads become shared: first (official order), importance (contribution norm on "
                    "calibration batches) or learned (binary masks learned with the weights frozen)",
                    cxxopts::value<std::string>()->default_value("first"));
  flag_dense_to_moh("calib-batches", "training batches measured (importance) or cycled (learned)",
                    cxxopts::value<int64_t>()->default_value("8"));
  flag_dense_to_moh("mask-steps", "optimizer steps of the learned masks",
                    cxxopts::value<int64_t>()->default_value("50"));
  flag_dense_to_moh("mask-lr", "Adam learning rate of the mask scores",
                    cxxopts::value<double>()->default_value("0.05"));
  flag_dense_to_moh("device", "auto, cpu, cuda or cuda:N for the calibration",
                    cxxopts::value<std::string>()->default_value("cpu"));
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"in", "out"})
    if (!args.count(required)) throw UserError(argv[0], std::string("missing --") + required, "see --help");
  const std::string in = args["in"].as<std::string>(), out = args["out"].as<std::string>(),
                    key = args["key"].as<std::string>();
  if (args.count("to-moh")) return convert_to_moh(args, in, out, key);
  for (const char* moh_only : {"set", "shared-heads", "calib-batches", "mask-steps", "mask-lr", "device"})
    if (args.count(moh_only))
      throw UserError("--" + std::string(moh_only), "belongs to the dense-to-MoH conversion",
                      "add --to-moh TARGET.yaml, or leave it out");
  if (out.size() < 12 || out.compare(out.size() - 12, 12, ".safetensors") != 0)
    throw UserError("--out " + out, "must end in .safetensors", "e.g. --out model.safetensors");
  if (std::filesystem::exists(out) && std::filesystem::exists(in) && std::filesystem::equivalent(in, out))
    throw UserError("--out " + out, "is the input file", "choose another output path");
  check_output_file(out, "--out " + out);
  TensorMap tensors = load_weights_tensors(in, key);
  if (tensors.empty()) throw UserError("--in " + in, "holds no tensors", "wrong --key?");
  int64_t params = 0;
  for (const auto& [name, t] : tensors) params += t.numel();
  if (auto parent = std::filesystem::path(out).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent);
  save_safetensors(out, tensors,
                   {{"format", "pt"}, {"source", std::filesystem::path(in).filename().string()}, {"key", key}});
  std::cout << "wrote " << out << ": " << tensors.size() << " tensors, " << params << " values" << std::endl;
  return kExitOk;
}

int cmd_compare(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Compare two weights sources tensor by tensor (max relative error in the inf-norm)");
  auto flag = opts.add_options();
  flag("a", "first weights source (file or checkpoint/run directory)", cxxopts::value<std::string>());
  flag("b", "second weights source", cxxopts::value<std::string>());
  flag("key", "entry of nested checkpoints / directories (model, ema, ...)",
       cxxopts::value<std::string>()->default_value(""));
  flag("tol", "largest accepted relative error (exit 1 above it)", cxxopts::value<double>()->default_value("0"));
  flag("worst", "also list the N tensors with the largest errors", cxxopts::value<int>()->default_value("0"));
  flag("l2", "judge --tol by the whole model's ||A − B||₂ / ||B||₂ instead of the worst tensor's max error");
  flag("h,help", "show this help");
  opts.parse_positional({"a", "b"});
  opts.positional_help("A B");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  if (!args.count("a") || !args.count("b")) throw UserError(argv[0], "needs two weights sources", "moh compare A B");
  const std::string key = args["key"].as<std::string>();
  const TensorMap a = load_weights_tensors(args["a"].as<std::string>(), key);
  const TensorMap b = load_weights_tensors(args["b"].as<std::string>(), key);
  double worst = 0;
  std::string worst_name;
  std::vector<std::pair<double, std::string>> errors;
  double diff2 = 0, norm2 = 0;  // whole-model L2
  for (const auto& [name, ta] : a) {
    const auto it = b.find(name);
    if (it == b.end() || !it->second.sizes().equals(ta.sizes())) {
      std::cout << "tensor '" << name << "' " << (it == b.end() ? "is missing in B" : "differs in shape") << "\n";
      return kExitRuntime;
    }
    const at::Tensor x = ta.to(at::kDouble), y = it->second.to(at::kDouble);
    const double denom = std::max(y.abs().max().item<double>(), 1e-30);
    const double err = x.numel() ? (x - y).abs().max().item<double>() / denom : 0.0;
    errors.emplace_back(err, name);
    diff2 += (x - y).square().sum().item<double>();
    norm2 += y.square().sum().item<double>();
    if (err > worst || worst_name.empty()) {
      worst = err;
      worst_name = name;
    }
  }
  if (b.size() != a.size()) {
    std::cout << "B has " << b.size() << " tensors, A " << a.size() << "\n";
    return kExitRuntime;
  }
  const double l2 = std::sqrt(diff2) / std::max(std::sqrt(norm2), 1e-30);
  std::cout << a.size() << " tensors, max relative error " << worst << " (" << worst_name
            << "), model L2 relative error " << l2 << "\n";
  std::sort(errors.rbegin(), errors.rend());
  for (size_t i = 0; i < errors.size() && static_cast<int>(i) < args["worst"].as<int>(); ++i)
    std::cout << "  " << errors[i].first << "  " << errors[i].second << "\n";
  return (args.count("l2") ? l2 : worst) <= args["tol"].as<double>() ? kExitOk : kExitRuntime;
}

}  // namespace moh::apps
