// VA-VAE f16d32 (LightningDiT's latent space): the autoencoder's shape and LDM names, the latents' per-channel
// standardisation from extraction through training and sampling. Its outputs against diffusers' AutoencoderKL: the
// pyref_vae test (tests/diffusion/ref_sd_vae.py --vavae).
#include <filesystem>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/platform/run_context.h"
#include "core/train/checkpoint.h"
#include "datasets/fashion_mnist.h"
#include "datasets/latents.h"
#include "diffusion/autoencoder_kl.h"
#include "experiments/dit_experiment.h"
#include "experiments/experiment_config.h"
#include "experiments/latent_extract.h"
#include "tests/test_util.h"

namespace moh {
namespace {

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(VaVae, ShapeAndLdmNames) {
  diffusion::AutoencoderKL vae = diffusion::make_vae(VaeKind::vavae);
  EXPECT_EQ(parameter_count(*vae), diffusion::kVaVaeParams);
  EXPECT_EQ(parameter_count(*diffusion::make_vae(VaeKind::sd)), diffusion::kSdVaeParams);
  EXPECT_EQ(vae->options.factor(), 16);
  EXPECT_DOUBLE_EQ(vae->latents.scale, 1.0);  // LightningDiT's latent_multiplier
  const std::vector<std::pair<std::string, std::string>> names{
      {"encoder.down.1.block.0.nin_shortcut.weight", "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"},
      {"encoder.down.4.attn.1.proj_out.bias", "encoder.down_blocks.4.attentions.1.to_out.0.bias"},
      {"encoder.down.3.downsample.conv.weight", "encoder.down_blocks.3.downsamplers.0.conv.weight"},
      {"encoder.mid.attn_1.norm.weight", "encoder.mid_block.attentions.0.group_norm.weight"},
      {"encoder.mid.block_2.conv1.bias", "encoder.mid_block.resnets.1.conv1.bias"},
      {"encoder.norm_out.weight", "encoder.conv_norm_out.weight"},
      {"decoder.up.4.attn.2.q.weight", "decoder.up_blocks.0.attentions.2.to_q.weight"},  // levels reversed
      {"decoder.up.1.upsample.conv.bias", "decoder.up_blocks.3.upsamplers.0.conv.bias"},
      {"decoder.up.0.block.2.norm2.weight", "decoder.up_blocks.4.resnets.2.norm2.weight"},
      {"post_quant_conv.weight", "post_quant_conv.weight"},
      {"decoder.up_blocks.0.resnets.0.conv1.weight", "decoder.up_blocks.0.resnets.0.conv1.weight"},  // diffusers
      {"loss.discriminator.main.0.weight", ""},
      {"foundation_model.model.cls_token", ""},
      {"encoder.down.7.block.0.conv1.weight", ""}};  // no such level
  for (const auto& [ldm, diffusers] : names) EXPECT_EQ(diffusion::ldm_vae_key(ldm, 5), diffusers) << ldm;
  // Every tensor of the model is reached from its LDM name, the 1×1-conv attention weights reshaped to Linear.
  TensorMap ldm;
  for (const auto& p : vae->named_parameters()) {
    std::string n = p.key();
    for (const auto& [from, to] :
         std::vector<std::pair<std::string, std::string>>{{"down_blocks.4.attentions.0.to_q", "down.4.attn.0.q"},
                                                          {"up_blocks.0.attentions.1.to_k", "up.4.attn.1.k"}})
      if (n.rfind("encoder." + from, 0) == 0 || n.rfind("decoder." + from, 0) == 0)
        n.replace(n.find(from), from.size(), to);
    ldm[n] = n.find(".attn.") != std::string::npos && p.value().dim() == 2 ? p.value().unsqueeze(-1).unsqueeze(-1)
                                                                           : p.value();
  }
  const TensorMap back = diffusion::ldm_vae_tensors(ldm, 5);
  EXPECT_EQ(back.size(), ldm.size());
  EXPECT_EQ(back.at("encoder.down_blocks.4.attentions.0.to_q.weight").sizes(), at::IntArrayRef({512, 512}));
  EXPECT_TRUE(at::equal(back.at("decoder.up_blocks.0.attentions.1.to_k.weight"),
                        vae->named_parameters()["decoder.up_blocks.0.attentions.1.to_k.weight"]));
}

// 32 px Fashion-MNIST images through a random VA-VAE: 2×2×32 latents.
constexpr const char* kVaVaeDiT = R"(
model: {name: LightningDiT-B/1, num_classes: 10, img_size: 32}
data: {dataset: fashion_mnist, batch_size: 4, limit_train: 7}
optim: {lr: 1.0e-4, weight_decay: 0.0, clip_grad: 0.0}
schedule: {kind: constant, warmup_epochs: 0}
train: {epochs: 1, ema_decay: 0.9999, log_every_steps: 1}
diffusion: {objective: flow, vae: vavae, vae_weights: absent.pt}
sampling: {sampler: euler, steps: "4", timestep_shift: 0.3, cfg_scale: 1.0}
)";

TEST(VaVae, LatentsAreStandardisedPerChannel) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  const experiments::ExperimentConfig cfg = experiments::load_experiment(d.write("x.yaml", kVaVaeDiT));
  torch::manual_seed(0);
  diffusion::AutoencoderKL vae = diffusion::make_vae(VaeKind::vavae);
  experiments::ExtractOptions o;
  o.out = d.file("lat");
  o.shard_size = 4, o.batch_size = 4, o.channel_stats = true;
  const datasets::LatentMeta meta =
      experiments::extract_latents(cfg, vae, "", o, RunContext::create("cpu", Precision::fp32, 0));
  ASSERT_EQ(meta.size, 2);
  ASSERT_EQ(meta.channel_mean.size(), 32u);
  // The statistics of z = mean + std·ε over the images: E[mean] and Var(mean) + E[std²], per channel.
  at::Tensor m = at::cat({load_safetensors(datasets::latent_shard_path(o.out, 0)).tensors.at("mean"),
                          load_safetensors(datasets::latent_shard_path(o.out, 1)).tensors.at("mean")})
                     .to(at::kDouble);
  at::Tensor s = at::cat({load_safetensors(datasets::latent_shard_path(o.out, 0)).tensors.at("std"),
                          load_safetensors(datasets::latent_shard_path(o.out, 1)).tensors.at("std")})
                     .to(at::kDouble);
  const at::Tensor mc = m.transpose(0, 1).reshape({32, -1}), sc = s.transpose(0, 1).reshape({32, -1});
  const at::Tensor want_mean = mc.mean(1), want_std = (mc.var(1, /*unbiased=*/false) + sc.square().mean(1)).sqrt();
  const datasets::LatentMeta read = datasets::read_latent_meta(o.out);  // through meta.json
  EXPECT_TRUE(at::allclose(at::tensor(read.channel_mean, at::kDouble), want_mean, 1e-9, 1e-12));
  EXPECT_TRUE(at::allclose(at::tensor(read.channel_std, at::kDouble), want_std, 1e-9, 1e-12));
  // The loader serves (z − mean_c) / std_c of its draw; the sampler's decoder gets z back.
  auto store = std::make_shared<const datasets::LatentStore>(o.out, read);
  torch::manual_seed(11);
  datasets::LatentLoader loader(store, 7, 1, 0, 0);
  at::Tensor x, y;
  ASSERT_TRUE(loader.next(x, y));
  datasets::LatentMeta plain = read;  // the same draws without the statistics
  plain.channel_mean.clear(), plain.channel_std.clear();
  torch::manual_seed(11);
  datasets::LatentLoader raw_loader(std::make_shared<const datasets::LatentStore>(o.out, plain), 7, 1, 0, 0);
  at::Tensor z, y_raw;
  ASSERT_TRUE(raw_loader.next(z, y_raw));
  EXPECT_GT((x - z).abs().max().item<double>(), 1e-2);  // the standardisation did something
  const at::Tensor mu = want_mean.to(at::kFloat).view({1, 32, 1, 1}), sd = want_std.to(at::kFloat).view({1, 32, 1, 1});
  EXPECT_TRUE(at::allclose(x, (z - mu) / sd, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(read.norm().to_vae(x), z, 1e-5, 1e-5));
}

TEST(VaVae, TrainingAndSamplingRefuseLatentsWithoutStatistics) {
  test::TempDir d;
  const std::string dir = d.file("lat");
  std::filesystem::create_directories(dir);
  TensorMap t{{"mean", at::zeros({2, 32, 2, 2}, at::kHalf)},
              {"std", at::ones({2, 32, 2, 2}, at::kHalf)},
              {"mean_flip", at::zeros({2, 32, 2, 2}, at::kHalf)},
              {"std_flip", at::ones({2, 32, 2, 2}, at::kHalf)},
              {"labels", at::zeros({2}, at::kLong)}};
  save_safetensors(datasets::latent_shard_path(dir, 0), t);
  datasets::LatentMeta m;
  m.count = 2, m.channels = 32, m.size = 2, m.image_size = 32, m.shards = {2}, m.scale = 1.0;
  m.classes = std::vector<std::string>(10, "c");
  datasets::write_latent_meta(dir, m);
  const experiments::ExperimentConfig cfg =
      experiments::load_experiment(d.write("x.yaml", kVaVaeDiT), {"data.dataset=latents", "data.root=" + dir});
  const diffusion::DiTOptions o = experiments::dit_options_for(cfg);
  EXPECT_EQ(o.input_size, 2);  // 32 px / 16
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  EXPECT_NE(test::user_error_of([&] { experiments::DiTTrainData data(cfg, o); }).find("channel statistics"),
            std::string::npos);
  EXPECT_NE(test::user_error_of([&] { experiments::load_sampling_vae(cfg, ctx); }).find("channel statistics"),
            std::string::npos);
  // With them, training data opens and sampling goes on to the weights (absent here).
  m.channel_mean.assign(32, 0.1), m.channel_std.assign(32, 2.0);
  datasets::write_latent_meta(dir, m);
  EXPECT_NO_THROW(experiments::DiTTrainData(cfg, o));
  EXPECT_NE(test::user_error_of([&] { experiments::load_sampling_vae(cfg, ctx); }).find("no such file"),
            std::string::npos);
  // With weights (random, diffusers names) the sampling VAE decodes with the latents' statistics: x = 0 is the mean.
  save_safetensors(d.file("vae.safetensors"), module_tensors(*diffusion::make_vae(VaeKind::vavae)));
  const experiments::ExperimentConfig with_weights = experiments::load_experiment(
      d.write("w.yaml", kVaVaeDiT),
      {"data.dataset=latents", "data.root=" + dir, "diffusion.vae_weights=" + d.file("vae.safetensors")});
  diffusion::AutoencoderKL vae = experiments::load_sampling_vae(with_weights, ctx);
  EXPECT_EQ(vae->latents.mean, m.channel_mean);
  EXPECT_EQ(vae->latents.std, m.channel_std);
  EXPECT_TRUE(at::allclose(vae->latents.to_vae(at::zeros({1, 32, 2, 2})), at::full({1, 32, 2, 2}, 0.1)));
  m.channel_std[3] = 0.0;  // a malformed meta.json
  datasets::write_latent_meta(dir, m);
  EXPECT_NE(test::user_error_of([&] { datasets::read_latent_meta(dir); }).find("one value per channel"),
            std::string::npos);
}

}  // namespace
}  // namespace moh
