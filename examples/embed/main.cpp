// A program that embeds the toolkit through its installed CMake package: a MoH-DiT built from the registry (or the
// weights of a `moh train` run), class-conditional samples with classifier-free guidance, a PNG grid and an npz.
//   usage: embed OUT_DIR [MODEL_NAME | RUN_DIR]     (default MoH-DiT-S/2-75, untrained, on 32 px pixel images)
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "datasets/image_grid.h"
#include "datasets/npz.h"
#include "diffusion/sampler.h"
#include "experiments/dit_experiment.h"
#include "experiments/registry.h"

namespace ex = moh::experiments;
namespace df = moh::diffusion;

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::cerr << "usage: embed OUT_DIR [MODEL_NAME | RUN_DIR]\n";
    return 2;
  }
  const std::string out = argv[1], what = argc > 2 ? argv[2] : "MoH-DiT-S/2-75";
  df::DiT model{nullptr};
  if (std::filesystem::is_directory(what)) {  // a run or checkpoint of `moh train`: its EMA weights
    model = ex::load_dit_checkpoint(what).model;
  } else {  // a name of the registry (`moh info --list`), as a pixel model of 10 classes at 32 px
    if (ex::find_model_family(what, "MODEL_NAME").measure != ex::ModelFamily::Measure::sample_fid)
      throw moh::UserError("MODEL_NAME " + what, "is not a diffusion model", "e.g. MoH-DiT-S/2-75");
    moh::ModelConfig mc;
    mc.name = what, mc.num_classes = 10, mc.img_size = 32;
    torch::manual_seed(0);
    model = df::DiT(ex::dit_options_for(mc, /*latent_factor=*/1));
  }
  model->eval();
  const df::DiTOptions o = model->options;
  df::SampleOptions so;
  so.sampler = moh::SamplerKind::ddim, so.cfg_scale = 4.0;
  const df::GaussianDiffusion chain = df::sampling_chain(so.sampler, 1000, "ddim10");
  torch::manual_seed(1);
  const at::Tensor labels = at::arange(8, at::kLong).remainder(o.num_classes);
  const at::Tensor noise = at::randn({8, o.in_channels, o.input_size, o.input_size});
  const torch::NoGradGuard no_grad;
  const at::Tensor x = df::sample_loop(model, chain, noise, labels, so);  // (8, C, H, W) in [-1, 1]
  const at::Tensor images = df::to_uint8_nhwc(x.narrow(1, 0, std::min<int64_t>(3, x.size(1))));
  std::filesystem::create_directories(out);
  moh::datasets::save_npz(out + "/samples.npz", {{"arr_0", images}, {"arr_1", labels}});
  const bool png = moh::datasets::write_grid(out + "/grid.png", images, 4, 2, {});
  std::cout << "embed: " << images.size(0) << " samples of " << what << " -> " << out << "/samples.npz"
            << (png ? " and grid.png" : "") << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
