// `moh sample [CONFIG.yaml] --checkpoint RUN_OR_CKPT [--cfg-scale S] [--steps 250|ddim50] [--num-samples N]
// [--labels balanced|random|1,2,3] [--seed S] [--batch B] [--set sampling.k=v]... [--out DIR]`: class-conditional
// samples of a trained DiT / MoH-DiT (EMA weights) with classifier-free guidance, as DiT's sample.py /
// sample_ddp.py: DIR/samples.npz (ADM layout), DIR/grid.png, DIR/sampling.json. Under `moh launch` (or torchrun)
// every rank samples its batches into DIR/parts/ and rank 0 merges them; an interrupted run resumes from its parts.
// `moh sample CONFIG.yaml --untrained` samples a freshly initialised model (a baseline for FID reports).
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "experiments/sampling_run.h"

namespace moh::apps {

cxxopts::Options sample_options(const std::string& prog) {
  cxxopts::Options opts(prog, "Class-conditional samples of a DiT / MoH-DiT with classifier-free guidance");
  add_config_args(opts);
  auto flag = opts.add_options();
  flag("checkpoint,ckpt",
       "DiT checkpoint or run directory (its config is used; CONFIG.yaml, if given, must "
       "name the same model)",
       cxxopts::value<std::string>());
  flag("untrained", "sample a freshly initialised model of CONFIG.yaml (a baseline)");
  flag("raw", "use the raw weights instead of the EMA");
  flag("num-samples,num-fid-samples", "images to generate (default: every class × sampling.per_class)",
       cxxopts::value<int64_t>());
  flag("labels", "class labels: balanced (default: rows of per_class), random, or a list 1,2,3 (cycled)",
       cxxopts::value<std::string>()->default_value("balanced"));
  flag("cfg-scale", "= sampling.cfg_scale", cxxopts::value<std::string>());
  flag("cfg-channels", "= sampling.cfg_channels (three|all)", cxxopts::value<std::string>());
  flag("cfg-interval", "= sampling.cfg_interval as LO,HI (noise level; CFG only inside)",
       cxxopts::value<std::string>());
  flag("sampler", "= sampling.sampler (ddpm|ddim|dpm++2m|euler|heun; flow models: euler|heun|dopri5|sde)",
       cxxopts::value<std::string>());
  flag("steps,num-sampling-steps", "= sampling.steps (250, ddim50, ...; DiT's --num-sampling-steps)",
       cxxopts::value<std::string>());
  flag("seed", "= sampling.seed", cxxopts::value<std::string>());
  flag("topk", "= sampling.topk: routed heads per token of every routed MoH layer (the head budget at inference)",
       cxxopts::value<std::string>());
  flag("guide-topk", "= sampling.guide_topk: K of the unconditional CFG branch (guide with fewer heads)",
       cxxopts::value<std::string>());
  flag("precision", "= sampling.precision: tf32 (default; DiT's sample.py, fp32 on a CPU), fp32, bf16, fp16 (CUDA)",
       cxxopts::value<std::string>());
  flag("batch,batch-size", "= sampling.batch_size (per batch file; every rank samples whole batches)",
       cxxopts::value<std::string>());
  flag("class-names", "text file with one class name per line (label order), for the grid's captions",
       cxxopts::value<std::string>());
  flag("head-load",
       "MoH-DiT routing analytics: head load by timestep and class, entropy, top-K "
       "changes between steps → DIR/head_load.json and heat maps");
  flag("out", "output directory", cxxopts::value<std::string>()->default_value("samples"));
  flag("device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"));
  flag("h,help", "show this help");
  return opts;
}

experiments::SamplingRequest sampling_request(const cxxopts::ParseResult& args) {
  experiments::SamplingRequest r;
  r.sets = config_overrides(args);
  for (const auto& [flag, key] : std::vector<std::pair<std::string, std::string>>{{"cfg-scale", "cfg_scale"},
                                                                                  {"cfg-channels", "cfg_channels"},
                                                                                  {"cfg-interval", "cfg_interval"},
                                                                                  {"sampler", "sampler"},
                                                                                  {"steps", "steps"},
                                                                                  {"seed", "seed"},
                                                                                  {"topk", "topk"},
                                                                                  {"guide-topk", "guide_topk"},
                                                                                  {"precision", "precision"},
                                                                                  {"batch", "batch_size"}})
    if (args.count(flag)) {
      const std::string v = args[flag].as<std::string>();
      r.sets.push_back("sampling." + key + "=" + (flag == "cfg-interval" && v.rfind('[', 0) != 0 ? "[" + v + "]" : v));
    }
  if (args.count("checkpoint")) r.checkpoint = args["checkpoint"].as<std::string>();
  if (args.count("config")) r.config = args["config"].as<std::string>();
  if (args.count("num-samples")) r.num_samples = args["num-samples"].as<int64_t>();
  if (args.count("class-names")) r.class_names_file = args["class-names"].as<std::string>();
  r.untrained = args.count("untrained") > 0;
  r.weights = args.count("weights") > 0;
  r.raw = args.count("raw") > 0;
  r.head_load = args.count("head-load") > 0;
  r.labels = args["labels"].as<std::string>();
  r.out = args["out"].as<std::string>();
  r.device = args["device"].as<std::string>();
  return r;
}

int cmd_sample(int argc, char** argv) {
  cxxopts::Options opts = sample_options(argv[0]);
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  const experiments::SamplingSummary s = experiments::run_sampling(sampling_request(args));
  if (!s.main) return kExitOk;  // rank 0 wrote the merged .npz
  std::cout << "wrote " << s.out << "/samples.npz (" << s.count << " images) from the " << s.weights << " weights"
            << (s.step >= 0 ? " of step " + std::to_string(s.step) : std::string())
            << (s.grid ? ", " + s.out + "/grid.png" : std::string(" (no grid: built without OpenCV)"))
            << (s.resumed_batches > 0 ? ", " + std::to_string(s.resumed_batches) + " batches resumed from parts"
                                      : std::string())
            << " in " << s.seconds << " s, "
            << (s.nfe >= 0 ? std::to_string(s.nfe) : std::string("unmeasured (every batch resumed)"))
            << " network evaluations per image\n";
  if (!s.head_load.empty()) std::cout << s.head_load << "\n";
  return 0;
}

}  // namespace moh::apps
