// Latent pre-extraction (moh extract-latents) and DiT training from the shards.
#include "core/error.h"
#include "core/experiment_config.h"
#include "core/run_context.h"
#include "core/safetensors.h"
#include "datasets/fashion_mnist.h"
#include "datasets/latents.h"
#include "diffusion/diffusion_trainer.h"
#include "diffusion/latent_extract.h"
#include "tests/test_util.h"

namespace moh {
namespace {

/// Two hand-made shards (3 + 2 images) whose std is zero, so every drawn latent is scale · (mean or mirror mean).
datasets::LatentMeta write_toy_shards(const std::string& dir) {
  datasets::LatentMeta m;
  m.shards = {3, 2};
  m.count = 5, m.channels = 4, m.size = 2, m.image_size = 16, m.scale = 0.5;
  m.classes = {"a", "b", "c", "d", "e"};
  for (int64_t k = 0, first = 0; k < 2; first += m.shards[static_cast<size_t>(k)], ++k) {
    const int64_t n = m.shards[static_cast<size_t>(k)];
    at::Tensor id = at::arange(first, first + n, at::kFloat).view({n, 1, 1, 1}).expand({n, 4, 2, 2});
    save_safetensors(datasets::latent_shard_path(dir, k),
                     {{"mean", id.to(at::kHalf)}, {"std", at::zeros_like(id).to(at::kHalf)},
                      {"mean_flip", (-id).to(at::kHalf)}, {"std_flip", at::zeros_like(id).to(at::kHalf)},
                      {"labels", at::arange(first, first + n, at::kLong)}});
  }
  datasets::write_latent_meta(dir, m);
  return m;
}

TEST(Latents, LoaderVisitsEveryImageOncePerEpochWithRandomMirrors) {
  test::TempDir d;
  write_toy_shards(d.path.string());
  const datasets::LatentMeta meta = datasets::read_latent_meta(d.path.string());
  EXPECT_EQ(meta.count, 5);
  torch::manual_seed(0);
  datasets::LatentLoader loader(d.path.string(), meta, /*batch=*/1, /*seed=*/3, /*epoch=*/0, /*limit=*/0, /*window=*/1);
  EXPECT_EQ(loader.num_batches(), 5);
  std::vector<int64_t> seen;
  int mirrored = 0;
  at::Tensor z, y;
  while (loader.next(z, y)) {
    const int64_t label = y.item<int64_t>();
    seen.push_back(label);
    const float v = z[0][0][0][0].item<float>();
    EXPECT_TRUE(v == 0.5f * label || v == -0.5f * label) << v;  // scale · (±id)
    mirrored += v < 0;
    EXPECT_TRUE(at::all(z == v).item<bool>());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // A limit keeps the first images only; batches are full (the rest is dropped).
  datasets::LatentLoader limited(d.path.string(), meta, 2, 3, 1, /*limit=*/4);
  EXPECT_EQ(limited.num_batches(), 2);
  int64_t batches = 0;
  while (limited.next(z, y)) {
    ++batches;
    EXPECT_TRUE(at::all(y < 4).item<bool>());
  }
  EXPECT_EQ(batches, 2);
  // A damaged directory is a UserError naming the fix.
  std::filesystem::remove(datasets::latent_shard_path(d.path.string(), 1));
  datasets::LatentLoader broken(d.path.string(), meta, 5, 3, 0, 0);
  EXPECT_THROW(while (broken.next(z, y)) {}, UserError);
  EXPECT_THROW(datasets::read_latent_meta(d.file("nothing")), UserError);
}

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
  ExperimentConfig cfg = load_experiment(d.write("x.yaml", yaml));
  torch::manual_seed(0);
  diffusion::AutoencoderKL vae;  // random weights: shapes and plumbing, not image quality
  diffusion::ExtractOptions o;
  o.out = d.file("lat");
  o.shard_size = 3;
  o.batch_size = 2;
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  datasets::LatentMeta meta = diffusion::extract_latents(cfg, vae, "", o, ctx);
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
  diffusion::extract_latents(cfg, vae, "", o, ctx);
  EXPECT_EQ(std::filesystem::last_write_time(datasets::latent_shard_path(o.out, 0)), stamp);
  // Training a latent DiT from the shards (16 px → 2×2×4 latents).
  ExperimentConfig train = load_experiment(d.write("t.yaml", yaml), {"data.dataset=latents", "data.root=" + o.out});
  diffusion::DiffusionTrainResult r = diffusion::train_diffusion(train, {d.file("run"), ""});
  EXPECT_EQ(r.steps, 2);  // 5 images, batch 2
  EXPECT_TRUE(std::isfinite(r.loss));
  // vae: sd without latents is refused with the command to run.
  EXPECT_THROW(diffusion::train_diffusion(cfg, {d.file("run2"), ""}), UserError);
}

}  // namespace
}  // namespace moh
