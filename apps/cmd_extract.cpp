// `moh extract-latents CONFIG.yaml --out DIR [--split train] [--shard-size 4096] [--batch 16]`: encodes the configured
// dataset once with the experiment's VAE (diffusion.vae: sd or vavae, weights diffusion.vae_weights) into latent
// shards; train on them with
// `--set data.dataset=latents --set data.root=DIR` (format: datasets/latents.h, docs/FORMATS.md).
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/platform/run_context.h"
#include "experiments/latent_extract.h"

namespace moh::apps {

int cmd_extract_latents(int argc, char** argv) {
  cxxopts::Options opts(argv[0],
                        "Encode a dataset split with the SD-VAE or VA-VAE into latent shards for DiT training");
  add_config_args(opts);
  auto flag = opts.add_options();
  flag("out", "directory to write (shards already there from an interrupted run are kept)",
       cxxopts::value<std::string>());
  flag("split", "train or val", cxxopts::value<std::string>()->default_value("train"));
  flag("shard-size", "images per shard", cxxopts::value<int64_t>()->default_value("4096"));
  flag("batch", "images per VAE forward", cxxopts::value<int64_t>()->default_value("16"));
  flag("device", "cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("cpu"));
  flag("keep-images",
       "store each encoded image (uint8, model.img_size²) beside its latents: what train.repa's encoder reads "
       "(ImageNet 256 px: ~250 GB more)");
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  if (!args.count("out")) throw UserError(argv[0], "missing --out DIR", "the latent directory to create");
  experiments::ExperimentConfig cfg = config_from_args(args, argv[0], experiments::ExperimentUse::extract_latents);
  if (cfg.diffusion.vae == VaeKind::none)
    throw UserError("config: diffusion.vae", "is none", "latents need vae: sd or vavae");
  const diffusion::VaeSpec& spec = diffusion::vae_spec(cfg.diffusion.vae);
  if (cfg.diffusion.vae_weights.empty())
    throw UserError("config: diffusion.vae_weights", "is empty", spec.weights_hint);
  experiments::ExtractOptions o;
  o.out = args["out"].as<std::string>();
  check_output_dir(o.out, "--out " + o.out);
  o.split = args["split"].as<std::string>();
  if (o.split != "train" && o.split != "val") throw UserError("--split " + o.split, "must be train or val", "");
  o.shard_size = args["shard-size"].as<int64_t>();
  o.batch_size = args["batch"].as<int64_t>();
  o.keep_images = args.count("keep-images") > 0;
  o.channel_stats = spec.channel_stats;
  RunContext ctx = RunContext::create(args["device"].as<std::string>(), Precision::fp32, 0);
  diffusion::AutoencoderKL vae = diffusion::load_vae(cfg.diffusion.vae, cfg.diffusion.vae_weights, spec.weights_hint);
  const datasets::LatentMeta meta = experiments::extract_latents(cfg, vae, cfg.diffusion.vae_weights, o, ctx);
  std::cout << "wrote " << o.out << ": " << meta.count << " images in " << meta.num_shards() << " shards, latents "
            << meta.channels << "x" << meta.size << "x" << meta.size << (meta.images ? ", with the images" : "")
            << std::endl;
  return kExitOk;
}

}  // namespace moh::apps
