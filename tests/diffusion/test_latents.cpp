// Latent pre-extraction (moh extract-latents) and DiT training from the shards.
#include <numeric>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/platform/run_context.h"
#include "core/train/checkpoint.h"
#include "datasets/fashion_mnist.h"
#include "datasets/latents.h"
#include "experiments/experiment_config.h"
#include "experiments/latent_extract.h"
#include "experiments/registry.h"
#include "experiments/repa_encoders.h"
#include "tests/test_util.h"
#include "vision/dinov2.h"

namespace moh {
namespace {

// A DiT-S/2 on 16 px Fashion-MNIST images (2×2×4 SD-VAE latents): 5 images, batch 2.
constexpr const char* kTinyLatentDiT = R"(
model: {name: DiT-S/2, num_classes: 10, img_size: 16}
data: {dataset: fashion_mnist, batch_size: 2, limit_train: 5}
optim: {lr: 1.0e-4, weight_decay: 0.0, clip_grad: 0.0}
schedule: {kind: constant, warmup_epochs: 0}
train: {epochs: 1, ema_decay: 0.9999, log_every_steps: 1}
diffusion: {vae: sd}
)";

TEST(Latents, ExtractThenTrainDiT) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  const std::string yaml = kTinyLatentDiT;
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

// A latent directory written by hand: each image's latent is its 8×8-pooled RGB (channel 3 zero), the mirror's that of
// the mirrored image, std 0 — so a batch's z says which copy it drew, and its images can be checked against it.
std::string pooled_latents(const test::TempDir& d, int64_t n) {
  const std::string dir = d.file("pooled");
  std::filesystem::create_directories(dir);
  torch::manual_seed(3);
  const at::Tensor images = at::randint(0, 256, {n, 16, 16, 3}).to(at::kByte);
  auto pooled = [](const at::Tensor& im) {  // (n, 16, 16, 3) → (n, 4, 2, 2)
    const at::Tensor p = at::avg_pool2d(im.permute({0, 3, 1, 2}).to(at::kFloat), {8, 8});
    return at::cat({p, at::zeros({p.size(0), 1, 2, 2})}, 1).to(at::kHalf);
  };
  TensorMap t{{"mean", pooled(images)},
              {"std", at::zeros({n, 4, 2, 2}, at::kHalf)},
              {"mean_flip", pooled(images.flip({2}))},
              {"std_flip", at::zeros({n, 4, 2, 2}, at::kHalf)},
              {"labels", at::arange(n, at::kLong) % 10},
              {"images", images}};
  save_safetensors(datasets::latent_shard_path(dir, 0), t);
  datasets::LatentMeta m;
  m.count = n, m.channels = 4, m.size = 2, m.image_size = 16, m.shards = {n}, m.scale = 1.0, m.images = true;
  m.classes = std::vector<std::string>(10, "c");
  datasets::write_latent_meta(dir, m);
  return dir;
}

TEST(Latents, KeptImagesComeMirroredWithTheirLatents) {
  test::TempDir d;
  const std::string dir = pooled_latents(d, 24);
  auto store = std::make_shared<const datasets::LatentStore>(dir, datasets::read_latent_meta(dir));
  int64_t mirrored = 0, rows = 0;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    datasets::LatentLoader loader(store, 8, 1, epoch, 0, 0, 1, 0, /*with_images=*/true);
    at::Tensor z, y;
    while (loader.next(z, y)) {
      const at::Tensor im = loader.side();  // (B, 3, 16, 16) in [-1, 1]
      ASSERT_EQ(im.sizes(), at::IntArrayRef({8, 3, 16, 16}));
      const at::Tensor pixels = (im + 1.0) * 127.5;
      const at::Tensor pooled = at::avg_pool2d(pixels, {8, 8});                // what the drawn latent must be
      EXPECT_LT((pooled - z.slice(1, 0, 3)).abs().max().item<double>(), 0.3);  // fp16 storage of 0..255 values
      rows += im.size(0);
    }
  }
  EXPECT_EQ(rows, 48);
  // Both copies are drawn (the check above would also hold if neither images nor latents were ever mirrored).
  datasets::LatentLoader loader(store, 24, 1, 0, 0, 0, 1, 0, true);
  at::Tensor z, y;
  ASSERT_TRUE(loader.next(z, y));
  at::Tensor m, s, mf, sf;
  std::vector<int64_t> all(24);
  std::iota(all.begin(), all.end(), 0);
  store->read(all, m, s, mf, sf);
  for (int64_t j = 0; j < 24; ++j) {
    const at::Tensor zj = z[j].to(at::kHalf);
    bool plain = false, flip = false;
    for (int64_t i = 0; i < 24; ++i) plain |= at::equal(zj, m[i]), flip |= at::equal(zj, mf[i]);
    mirrored += flip && !plain ? 1 : 0;
  }
  EXPECT_GT(mirrored, 3);
  EXPECT_LT(mirrored, 21);
  datasets::LatentLoader plain_loader(store, 8, 1, 0, 0);
  ASSERT_TRUE(plain_loader.next(z, y));
  EXPECT_FALSE(plain_loader.side().defined());  // images only when asked for
}

TEST(Latents, RepaTrainsFromLatentsWithTheirImages) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  test::TempDir d;
  const std::string yaml = kTinyLatentDiT;
  experiments::ExperimentConfig cfg = experiments::load_experiment(d.write("x.yaml", yaml));
  torch::manual_seed(0);
  diffusion::AutoencoderKL vae;
  const RunContext ctx = RunContext::create("cpu", Precision::fp32, 0);
  experiments::ExtractOptions o;
  o.out = d.file("plain");
  experiments::extract_latents(cfg, vae, "", o, ctx);
  o.out = d.file("kept");
  o.keep_images = true;
  const datasets::LatentMeta meta = experiments::extract_latents(cfg, vae, "", o, ctx);
  EXPECT_TRUE(meta.images);
  // The stored images are the ones encoded: encoding them again gives the stored posterior means.
  const SafetensorsFile s0 = load_safetensors(datasets::latent_shard_path(o.out, 0));
  const at::Tensor im = s0.tensors.at("images").permute({0, 3, 1, 2}).to(at::kFloat) / 127.5 - 1.0;
  {
    torch::NoGradGuard ng;
    vae->eval();
    EXPECT_TRUE(at::allclose(vae->encode(im).mean.to(at::kHalf).to(at::kFloat), s0.tensors.at("mean").to(at::kFloat),
                             1e-2, 1e-2));
  }
  // A tiny DINOv2 (one 64-wide head) as the encoder: 16 px → 2×2 latents → one DiT token → a 14 px encoder input.
  vision::DinoV2Options dino;
  dino.embed_dim = 64, dino.depth = 1, dino.num_heads = 1, dino.pos_grid = 2;
  torch::manual_seed(1);
  vision::DinoV2 enc(dino);
  save_safetensors(d.file("dino.safetensors"), module_tensors(*enc));
  const std::vector<std::string> repa{"data.dataset=latents", "train.repa.encoder=" + d.file("dino.safetensors"),
                                      "train.repa.depth=1", "train.repa.projector_dim=16"};
  std::vector<std::string> with = repa, without = repa;
  with.push_back("data.root=" + d.file("kept"));
  without.push_back("data.root=" + d.file("plain"));
  const LoopResult r =
      experiments::train_experiment(experiments::load_experiment(d.file("x.yaml"), with), {d.file("run"), ""});
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(std::isfinite(scalar(r.losses, "repa")));
  EXPECT_NE(
      test::user_error_of([&] {
        experiments::train_experiment(experiments::load_experiment(d.file("x.yaml"), without), {d.file("run2"), ""});
      }).find("hold no images for the encoder"),
      std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(d.file("run2")));
}

}  // namespace
}  // namespace moh
