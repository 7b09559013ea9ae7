// The model registry (experiments/registry.h): one decision of a model name's family with one "did you mean" over
// every variant table, every family complete, and one semantic validation that refuses what training would refuse
// (what `moh config` runs).
#include <set>

#include "core/error.h"
#include "experiments/dit_experiment.h"
#include "experiments/registry.h"
#include "tests/test_util.h"

namespace moh {
namespace {

TEST(Experiment, OneFamilyDecisionForEveryName) {
  EXPECT_EQ(experiments::find_model_family("MoH-ViT-S-75").id, "classifier");
  EXPECT_EQ(experiments::find_model_family("TransNeXt-Tiny").id, "classifier");
  EXPECT_EQ(experiments::find_model_family("MoH-DiT-XL/2-90").id, "dit");
  EXPECT_EQ(experiments::find_model_family("DiT-S/2").id, "dit");
  EXPECT_EQ(experiments::find_model_family("sd-vae").id, "sd-vae");
  EXPECT_EQ(experiments::find_model_family("fid-inception").id, "fid-inception");
  for (const auto& n : experiments::all_model_names()) EXPECT_NO_THROW(experiments::find_model_family(n)) << n;
  // one "did you mean" across the tables: a near DiT name from a classifier-looking typo and back
  EXPECT_NE(test::user_error_of([] {
              experiments::find_model_family("MoH-DiT-XL/2-9");
            }).find("did you mean 'MoH-DiT-XL/2-90'"),
            std::string::npos);
  EXPECT_NE(
      test::user_error_of([] { experiments::find_model_family("MoH-ViT-S-7"); }).find("did you mean 'MoH-ViT-S-75'"),
      std::string::npos);
  EXPECT_NE(test::user_error_of([] { experiments::find_model_family("sd-va"); }).find("did you mean 'sd-vae'"),
            std::string::npos);
  // "DiT" in a name decides nothing
  EXPECT_THROW(experiments::find_model_family("MyDiT"), UserError);
}

experiments::ExperimentConfig config(const std::string& yaml) {
  test::TempDir d;
  return experiments::load_experiment(d.write("c.yaml", yaml));
}

TEST(Registry, EveryFamilyIsCompleteAndNamesAreUnique) {
  std::set<std::string> ids, names;
  for (const experiments::ModelFamily& f : experiments::model_families()) {
    EXPECT_TRUE(ids.insert(f.id).second) << f.id;
    ASSERT_TRUE(f.names && f.summarize && f.forward) << f.id;
    EXPECT_FALSE(f.names().empty()) << f.id;
    EXPECT_FALSE(f.forward_inputs.empty()) << f.id;
    for (const auto& n : f.names()) EXPECT_TRUE(names.insert(n).second) << n << " registered twice";
    if (f.trainable()) {  // an experiment family supplies every experiment hook
      EXPECT_TRUE(f.validate && f.active_ratio && f.bench_step && f.attention_path_rows) << f.id;
    } else {
      EXPECT_FALSE(f.validate || f.active_ratio || f.bench_step) << f.id;
    }
  }
  EXPECT_EQ(ids, (std::set<std::string>{"classifier", "dit", "sd-vae", "vavae-f16d32", "fid-inception"}));
  EXPECT_THROW(experiments::experiment_family(config("model: {name: sd-vae}")),
               UserError);  // a fixed network trains nothing
}

TEST(Registry, FixedNetworksCountTheParametersOfTheRealPackages) {
  // diffusers AutoencoderKL with the sd-vae-ft-mse config; torchvision inception_v3(num_classes=1008,
  // aux_logits=False), whose blocks pytorch-fid's FID-Inception replaces with same-sized ones.
  EXPECT_EQ(experiments::find_model_family("sd-vae").summarize("sd-vae").params, 83653863);
  // diffusers AutoencoderKL in VA-VAE f16d32's configuration (tests/diffusion/ref_sd_vae.py --vavae asserts the same).
  EXPECT_EQ(experiments::find_model_family("vavae-f16d32").summarize("vavae-f16d32").params, 69836067);
  EXPECT_EQ(experiments::find_model_family("fid-inception").summarize("fid-inception").params, 23850960);
  const experiments::ModelSummary s = experiments::find_model_family("MoH-DiT-S/2-75").summarize("MoH-DiT-S/2-75");
  EXPECT_EQ(s.family, "dit");
  EXPECT_EQ(s.moh_layers, 12);
}

TEST(Experiment, ValidationRefusesWhatTrainingRefuses) {
  const std::string cls = "model: {name: MoH-ViT-Nano}\n";
  const std::string dit = "model: {name: MoH-DiT-Pixel/4-75, num_classes: 10}\n";
  EXPECT_NO_THROW(experiments::validate_experiment(config(cls)));
  EXPECT_NO_THROW(experiments::validate_experiment(config(dit)));
  EXPECT_NO_THROW(experiments::validate_experiment(config("model: {name: MoH-ViT-Nano, attention_path: sparse}")));
  const std::vector<std::pair<std::string, std::string>> bad{
      {"model: {name: MoH-ViT-Nano, attention: [moh, moh]}", "model.attention"},
      {"model: {name: TransNeXt-Micro, attention: [moh, mha, mha, mha]}", "no MoH head split"},
      {cls + "data: {dataset: image_folder, root: /x, loader: stream}\naugment: {rand_augment: rand-m9-q1}",
       "unknown RandAugment part"},
      {"model: {name: MoH-DiT-Pixel/4-75, attention: [moh, moh, moh, moh]}", "model.attention"},
      {dit + "train: {accum_steps: 2}\ndata: {batch_size: 64}", "train.accum_steps"},
      {"model: {name: DiT-S/2}\ndiffusion: {vae: sd}\ndata: {dataset: fashion_mnist}", "pre-extracted latents"},
      {"model: {name: DiT-S/2}\ndiffusion: {vae: none}\ndata: {dataset: latents, root: /x}",
       "needs the VAE they were encoded with"},
      {dit + "sampling: {steps: ddim7777}", "timestep respacing"},
      {"model: {name: sd-vae}", "fixed network"},
      {"model: {name: MoH-ViT-Nanoo}", "did you mean 'MoH-ViT-Nano'"},
  };
  for (const auto& [yaml, why] : bad) {
    std::string e;
    try {
      experiments::validate_experiment(config(yaml));
    } catch (const UserError& err) {
      e = err.what();
    }
    EXPECT_NE(e.find(why), std::string::npos) << yaml << "\n  gave: '" << e << "'";
  }
  // Guidance rules apply when sampling: a 1-channel pixel model trains with the defaults but cannot guide 3 channels.
  const std::string three = dit + "sampling: {cfg_scale: 4.0, cfg_channels: three}";
  EXPECT_NO_THROW(experiments::validate_experiment(config(three)));
  EXPECT_NE(test::user_error_of([&] {
              experiments::validate_experiment(config(three), experiments::ExperimentUse::sample);
            }).find("needs at least 3 channels"),
            std::string::npos);
  // extract-latents reads images for a vae: sd config
  EXPECT_NO_THROW(experiments::validate_experiment(
      config("model: {name: DiT-S/2}\ndiffusion: {vae: sd}\ndata: {dataset: fashion_mnist}"),
      experiments::ExperimentUse::extract_latents));
}

// The embedded data's fixed shape (28 px, grey) against the model, when the config is checked: before, a 3-channel
// classifier met the grey images at its first step (a LibTorch error, exit 1) and a 32-px DiT was refused only after
// `precision: auto` had timed its training step (minutes on a fresh machine).
TEST(Experiment, ValidationRefusesAModelTheEmbeddedDataCannotFeed) {
  const auto error = [](const std::string& yaml, experiments::ExperimentUse use = experiments::ExperimentUse::train) {
    return test::user_error_of([&] { experiments::validate_experiment(config(yaml), use); });
  };
  const auto npos = std::string::npos;
  EXPECT_NE(error("model: {name: MoH-ViT-S-75}").find("MoH-ViT-S-75 takes 3 channels, the data has 1"), npos);
  EXPECT_EQ(error("model: {name: MoH-ViT-Nano, img_size: 32}"), "");  // smaller images are placed in the input
  EXPECT_NE(error("model: {name: MoH-DiT-S/2-90}").find("MoH-DiT-S/2-90 takes 32 px images, the data is 28 px"), npos);
  EXPECT_NE(error("model: {name: DiT-S/2, img_size: 28}").find("DiT-S/2 takes 4 channels, the data has 1"), npos);
  EXPECT_EQ(error("model: {name: MoH-DiT-Pixel/4-75}"), "");
  // Sampling reads no data, but pixel-space samples are images: a latent variant needs its VAE.
  EXPECT_NE(error("model: {name: MoH-DiT-S/2-90}", experiments::ExperimentUse::sample)
                .find("MoH-DiT-S/2-90 samples 4-channel latents, but diffusion.vae is none"),
            npos);
  EXPECT_EQ(error("model: {name: MoH-DiT-S/2-90}\ndiffusion: {vae: sd}\ndata: {dataset: latents, root: /x}",
                  experiments::ExperimentUse::sample),
            "");
  EXPECT_EQ(error("model: {name: MoH-ViT-S-75}\ndata: {dataset: image_folder, root: /x}"), "");  // checked when read
}

// The memory guard counts the widest layer's heads (MoH-DiT-XL/2-90's top layers have 24 heads, num_heads says 16)
// against the memory of the device the run trains on (a GPU's is smaller than its host's).
TEST(Experiment, MemoryGuardUsesTheWidestLayerAndTheDevice) {
  diffusion::DiTOptions o = diffusion::dit_options("MoH-DiT-XL/2-90");
  o.input_size = 64;                              // 512 px: 1,024 tokens
  const double per_head = 1024.0 * 1024.0 * 4.0;  // one image, one head
  EXPECT_DOUBLE_EQ(experiments::attention_map_bytes(o, 1), 24 * per_head);
  const auto budget = static_cast<int64_t>(20 * per_head * 32);  // fits 16 heads × 32 images, not 24 heads
  EXPECT_NE(test::user_error_of([&] {
              experiments::check_attention_memory(o, 32, {budget, "GPU cuda:0"});
            }).find("GiB of GPU cuda:0"),
            std::string::npos);
  EXPECT_EQ(test::user_error_of([&] { experiments::check_attention_memory(o, 16, {budget, "GPU cuda:0"}); }), "");
  EXPECT_EQ(device_memory("cpu").bytes, physical_memory_bytes());
  EXPECT_EQ(device_memory("cpu").name, "this machine");
}

}  // namespace
}  // namespace moh
