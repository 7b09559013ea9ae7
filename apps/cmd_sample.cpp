// `moh sample [CONFIG.yaml] --checkpoint RUN_OR_CKPT [--cfg-scale S] [--steps 250|ddim50] [--num-samples N]
// [--labels balanced|random|1,2,3] [--seed S] [--batch B] [--set sampling.k=v]... [--out DIR]`: class-conditional samples of a trained
// DiT / MoH-DiT (EMA weights), per_class images of every class, with classifier-free guidance; writes DIR/samples.npz
// (ADM layout: arr_0 uint8 (N, H, W, 3), arr_1 int64 labels), DIR/grid.png (one row per class) and DIR/sampling.json.
// `moh sample CONFIG.yaml --untrained` samples a freshly initialised model instead (a baseline for FID reports).
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/checkpoint.h"
#include "core/atomic_io.h"
#include "core/distributed.h"
#include "core/error.h"
#include "datasets/loader.h"
#include "core/progress.h"
#include "core/run_context.h"
#include "datasets/fashion_mnist.h"
#include "datasets/npz.h"
#include "eval/image_grid.h"
#include "diffusion/dit_experiment.h"
#include "diffusion/experiment.h"
#include "diffusion/sample_set.h"
#include "diffusion/sampler.h"
#include "diffusion/sd_vae.h"

namespace moh::apps {

int cmd_sample(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Class-conditional samples of a DiT / MoH-DiT with classifier-free guidance");
  add_config_args(opts);
  opts.add_options()("checkpoint,ckpt", "DiT checkpoint or run directory (its config is used; CONFIG.yaml, if given, must "
                                   "name the same model)", cxxopts::value<std::string>())(
      "untrained", "sample a freshly initialised model of CONFIG.yaml (a baseline)")(
      "raw", "use the raw weights instead of the EMA")(
      "num-samples,num-fid-samples", "images to generate (default: every class × sampling.per_class)", cxxopts::value<int64_t>())(
      "labels", "class labels: balanced (default: rows of per_class), random, or a list 1,2,3 (cycled)",
      cxxopts::value<std::string>()->default_value("balanced"))(
      "cfg-scale", "= sampling.cfg_scale", cxxopts::value<std::string>())(
      "cfg-channels", "= sampling.cfg_channels (three|all)", cxxopts::value<std::string>())(
      "sampler", "= sampling.sampler (ddpm|ddim)", cxxopts::value<std::string>())(
      "steps,num-sampling-steps", "= sampling.steps (250, ddim50, ...; DiT's --num-sampling-steps)", cxxopts::value<std::string>())(
      "seed", "= sampling.seed", cxxopts::value<std::string>())(
      "batch,batch-size", "= sampling.batch_size", cxxopts::value<std::string>())(
      "class-names", "text file with one class name per line (label order), for the grid's captions",
      cxxopts::value<std::string>())(
      "out", "output directory", cxxopts::value<std::string>()->default_value("samples"))(
      "device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"))("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  const std::string out_dir = args["out"].as<std::string>();
  check_output_dir(out_dir, "--out " + out_dir);  // before the model is even loaded
  std::vector<std::string> class_names;  // --class-names: one per line
  if (args.count("class-names")) {
    std::stringstream lines(read_file(args["class-names"].as<std::string>(), "--class-names"));
    for (std::string l; std::getline(lines, l);) class_names.push_back(l);
  }
  std::vector<std::string> sets = config_overrides(args);
  for (const auto& [flag, key] : std::vector<std::pair<std::string, std::string>>{
           {"cfg-scale", "cfg_scale"}, {"cfg-channels", "cfg_channels"}, {"sampler", "sampler"}, {"steps", "steps"},
           {"seed", "seed"}, {"batch", "batch_size"}})
    if (args.count(flag)) sets.push_back("sampling." + key + "=" + args[flag].as<std::string>());
  ExperimentConfig cfg;
  diffusion::DiT model{nullptr};
  std::string weights_used = "untrained";  // which weights sample: "ema", "model", a weights file, or untrained
  int64_t step = -1;
  if (args.count("checkpoint")) {
    const std::string ckpt = args["checkpoint"].as<std::string>();
    diffusion::LoadedDiT loaded = diffusion::load_dit_checkpoint(ckpt, !args.count("raw"));
    model = loaded.model, cfg = loaded.cfg, weights_used = loaded.weights, step = loaded.step;
    for (const auto& s : sets)
      if (s.rfind("sampling.", 0) != 0)
        throw UserError("--set " + s, "only sampling.* can be changed when sampling a checkpoint", "e.g. sampling.cfg_scale=4");
    if (args.count("config")) {
      const ExperimentConfig named = load_experiment(args["config"].as<std::string>(), sets);
      validate_experiment(named);
      if (named.model.name != cfg.model.name)
        throw UserError("checkpoint " + ckpt, "was trained as " + cfg.model.name + ", the config describes " +
                                                  named.model.name, "pass the matching config, or only --checkpoint");
      cfg.sampling = named.sampling;
      sets.clear();
    }
    if (!sets.empty()) {
      cfg = with_overrides(cfg, sets);
      validate_experiment(cfg);
    }
  } else if (args.count("untrained") || args.count("weights")) {
    if (!args.count("config"))
      throw UserError(argv[0], "--untrained / --weights need CONFIG.yaml", "moh sample CONFIG.yaml --weights DiT-XL-2-256x256.pt");
    cfg = load_experiment(args["config"].as<std::string>(), sets);
    validate_experiment(cfg);
    if (model_family(cfg.model.name) != ModelFamily::dit)
      throw UserError("config: model.name", cfg.model.name + " is not a DiT variant", "moh info --list");
    torch::manual_seed(cfg.train.seed);
    model = diffusion::DiT(diffusion::dit_options_for(cfg));
    if (args.count("weights")) {  // e.g. the official DiT-XL-2-256x256.pt (an EMA state_dict)
      load_initial_weights(*model, cfg.model.weights, cfg.model.weights_key, cfg.model.weights_allow_missing);
      weights_used = cfg.model.weights + (cfg.model.weights_key.empty() ? "" : " [" + cfg.model.weights_key + "]");
    }
    model->eval();
  } else {
    throw UserError(argv[0], "missing --checkpoint", "pass a DiT run, or CONFIG.yaml --untrained for a baseline");
  }
  const SamplingConfig& sc = cfg.sampling;
  const diffusion::DiTOptions& mo = model->options;
  RunContext ctx = RunContext::create(args["device"].as<std::string>(), Precision::fp32, static_cast<uint64_t>(sc.seed));
  const diffusion::GaussianDiffusion chain = diffusion::GaussianDiffusion::respaced(cfg.diffusion.steps, sc.steps);
  diffusion::SampleOptions so;
  so.sampler = sc.sampler, so.eta = sc.eta, so.cfg_scale = sc.cfg_scale, so.cfg_channels = sc.cfg_channels;
  so.clip_denoised = sc.clip_denoised;
  if (so.cfg_scale > 1.0 && so.cfg_channels == CfgChannels::three && mo.in_channels < 3)
    throw UserError("sampling.cfg_channels", "three (DiT's latent quirk) needs at least 3 channels, the model has " +
                                                 std::to_string(mo.in_channels), "set sampling.cfg_channels=all");
  model->to(ctx.device);
  diffusion::AutoencoderKL vae{nullptr};  // latent models: samples are decoded from z / 0.18215 (DiT's sample.py)
  if (cfg.diffusion.vae == VaeKind::sd) {
    if (cfg.diffusion.vae_weights.empty())
      throw UserError("config: diffusion.vae_weights", "is empty, but vae: sd samples must be decoded",
                      "set it to sd-vae-ft-ema's diffusion_pytorch_model.safetensors");
    vae = diffusion::AutoencoderKL();
    diffusion::load_sd_vae(vae, cfg.diffusion.vae_weights);
    vae->eval();
    vae->to(ctx.device);
  }

  // Labels 0,0,..,1,1,.. (per_class each), or random from the seed; each batch then draws its noise first and the
  // chain's per-step noise after it (DiT order).
  torch::manual_seed(static_cast<uint64_t>(sc.seed));
  const std::string label_mode = args["labels"].as<std::string>();
  std::vector<int64_t> list;
  if (label_mode != "balanced" && label_mode != "random") {
    std::stringstream ss(label_mode);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 9 ||
          std::stoll(item) >= mo.num_classes)
        throw UserError("--labels " + label_mode, "'" + item + "' is not a class index below " + std::to_string(mo.num_classes),
                        "balanced, random or a list like 1,2,3");
      list.push_back(std::stoll(item));
    }
  }
  int64_t n = mo.num_classes * sc.per_class;
  if (!list.empty()) n = static_cast<int64_t>(list.size());
  if (args.count("num-samples")) n = args["num-samples"].as<int64_t>();
  if (n <= 0) throw UserError("--num-samples", "must be > 0", "");
  at::Tensor labels;
  if (label_mode == "random") {
    labels = at::randint(0, mo.num_classes, {n}, at::kLong);  // sample_ddp: random classes
  } else if (!list.empty()) {
    labels = at::tensor(list, at::kLong).repeat({(n + static_cast<int64_t>(list.size()) - 1) / static_cast<int64_t>(list.size())}).narrow(0, 0, n);
  } else {
    labels = at::arange(n, at::kLong).div(sc.per_class, "floor").remainder(mo.num_classes);  // rows of per_class
  }
  // Batch k is seeded by (seed, k): data-parallel ranks (`moh launch -- sample ...`) produce exactly the images of a
  // single process (diffusion/sample_set.h).
  const auto group = dist::Group::join(ctx);
  diffusion::SampleSetOptions sso;
  sso.chain = so, sso.batch_size = sc.batch_size, sso.seed = static_cast<uint64_t>(sc.seed);
  Progress progress("sampling", diffusion::sample_images_steps(n, sso, chain, *group), "step", group->is_main() ? -1 : 2);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor all = diffusion::sample_images(model, chain, vae, labels, sso, ctx, *group, [&] { progress.advance(); });
  progress.finish();
  if (!group->is_main()) return kExitOk;  // rank 0 writes the merged .npz
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (all.size(3) == 1) all = all.expand({-1, -1, -1, 3}).contiguous();  // ADM batches are RGB
  std::filesystem::create_directories(out_dir);
  datasets::save_npz(out_dir + "/samples.npz", {{"arr_0", all}, {"arr_1", labels}});
  // The grid shows at most kGridCols images of each row and kGridRows rows (10k-sample batches stay a small PNG).
  constexpr int64_t kGridCols = 16, kGridRows = 32;
  // Class names: --class-names, Fashion-MNIST's own, else the index. Balanced rows hold one class each (a row label);
  // random or listed labels mix classes in a row (a caption under every tile).
  if (class_names.empty() && cfg.data.dataset == DatasetKind::fashion_mnist && mo.num_classes == 10)
    class_names = datasets::fashion_mnist_classes();
  auto name_of = [&](int64_t k) {
    return k < static_cast<int64_t>(class_names.size()) ? class_names[static_cast<size_t>(k)] : "class " + std::to_string(k);
  };
  std::vector<std::string> row_labels, tile_labels;
  std::vector<int64_t> shown;
  const int64_t row_len = label_mode == "balanced" ? sc.per_class : kGridCols, cols = std::min(row_len, kGridCols);
  for (int64_t r = 0; r * row_len < n && r < kGridRows; ++r) {
    for (int64_t c = 0; c < cols && r * row_len + c < n; ++c) {
      shown.push_back(r * row_len + c);
      if (label_mode != "balanced") tile_labels.push_back(name_of(labels[r * row_len + c].item<int64_t>()));
    }
    if (label_mode == "balanced") row_labels.push_back(name_of(r % mo.num_classes));
  }
  const at::Tensor grid_images = all.index_select(0, at::tensor(shown, at::kLong));
  const bool grid = eval::write_grid(out_dir + "/grid.png", grid_images, cols, mo.input_size < 64 ? 3 : 1, row_labels,
                                     tile_labels);
  nlohmann::json info{{"model", cfg.model.name},
                      {"checkpoint", args.count("checkpoint") ? args["checkpoint"].as<std::string>() : "untrained"},
                      {"weights", weights_used}, {"step", step >= 0 ? nlohmann::json(step) : nlohmann::json()},
                      {"sampler", sc.sampler == SamplerKind::ddpm ? "ddpm" : "ddim"}, {"steps", sc.steps},
                      {"chain_steps", chain.num_steps()}, {"eta", sc.eta}, {"cfg_scale", sc.cfg_scale},
                      {"cfg_channels", sc.cfg_channels == CfgChannels::three ? "three" : "all"},
                      {"clip_denoised", sc.clip_denoised}, {"seed", sc.seed},
                      {"labels", label_mode}, {"count", n}, {"seconds", seconds}};
  write_file_atomic(out_dir + "/sampling.json", info.dump(1) + "\n");
  std::cout << "wrote " << out_dir << "/samples.npz (" << n << " images) from the " << weights_used << " weights"
            << (step >= 0 ? " of step " + std::to_string(step) : std::string())
            << (grid ? ", " + out_dir + "/grid.png" : std::string(" (no grid: built without OpenCV)")) << " in "
            << seconds << " s\n";
  return 0;
}

}  // namespace moh::apps
