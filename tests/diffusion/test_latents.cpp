// Latent pre-extraction (moh extract-latents) and DiT training from the shards.
#include "core/error.h"
#include "core/run_context.h"
#include "core/safetensors.h"
#include "datasets/fashion_mnist.h"
#include "datasets/latents.h"
#include "experiments/experiment_config.h"
#include "experiments/latent_extract.h"
#include "experiments/registry.h"
#include "tests/test_util.h"

namespace moh {
namespace {

TEST(Latents, ExtractThenTrainDiT) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  const std::string yaml = R"(
model: {name: DiT-S/2, num_classes: 10, img_size: 16}
data: {dataset: fashion_mnist, batch_size: 2, limit_train: 5}
optim: {lr: 1.0e-4, weight_decay: 0.0, clip_grad: 0.0}
schedule: {kind: constant, warmup_epochs: 0}
train: {epochs: 1, ema_decay: 0.9999, log_every_steps: 1}
diffusion: {vae: sd}
)";
  experiments::ExperimentConfig cfg = experiments::load_experiment(d.write("x.yaml", yaml));
  torch::manual_seed(0);
  diffusion::AutoencoderKL vae;  // random weights: shapes and plumbing, not image quality
  experiments::ExtractOptions o;
  o.out = d.file("lat");
  o.shard_size = 3;
  o.batch_size = 2;
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  datasets::LatentMeta meta = experiments::extract_latents(cfg, vae, "", o, ctx);
  EXPECT_EQ(meta.count, 5);
  EXPECT_EQ(meta.shards, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(meta.size, 2);  // 16 px / 8
  EXPECT_EQ(meta.classes.size(), 10u);
  // The stored mirror moments are the encoding of the mirrored image.
  SafetensorsFile s0 = load_safetensors(datasets::latent_shard_path(o.out, 0));
  EXPECT_EQ(s0.tensors.at("mean").sizes(), at::IntArrayRef({3, 4, 2, 2}));
  EXPECT_FALSE(at::allclose(s0.tensors.at("mean"), s0.tensors.at("mean_flip")));
  // Re-running keeps finished shards (an interrupted extraction continues).
  const auto stamp = std::filesystem::last_write_time(datasets::latent_shard_path(o.out, 0));
  experiments::extract_latents(cfg, vae, "", o, ctx);
  EXPECT_EQ(std::filesystem::last_write_time(datasets::latent_shard_path(o.out, 0)), stamp);
  // Training a latent DiT from the shards (16 px → 2×2×4 latents).
  experiments::ExperimentConfig train =
      experiments::load_experiment(d.write("t.yaml", yaml), {"data.dataset=latents", "data.root=" + o.out});
  const LoopResult r = experiments::train_experiment(train, {d.file("run"), ""});
  EXPECT_EQ(r.steps, 2);  // 5 images, batch 2
  EXPECT_TRUE(std::isfinite(scalar(r.losses, "loss")));
  // vae: sd without latents is refused with the command to run.
  EXPECT_THROW(experiments::train_experiment(cfg, {d.file("run2"), ""}), UserError);
}

}  // namespace
}  // namespace moh
