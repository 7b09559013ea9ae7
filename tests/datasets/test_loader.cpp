// Loaders of datasets/: deterministic order and augmentation of the in-memory loader, the latent loader's epoch,
// mirrors, limit and its data-parallel shares.
#include <algorithm>

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "datasets/latents.h"
#include "datasets/loader.h"
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

// A run resumed inside an epoch: the loader skips its first batches without drawing from the global generator, so
// with the generator state of the uninterrupted epoch at that batch it serves exactly that epoch's remaining batches.
TEST(Latents, StartBatchServesTheRestOfTheEpochWithTheSameDraws) {
  test::TempDir d;
  write_toy_shards(d.path.string());
  const datasets::LatentMeta meta = datasets::read_latent_meta(d.path.string());
  at::Tensor z, y;
  torch::manual_seed(9);
  datasets::LatentLoader full(d.path.string(), meta, /*batch=*/1, 3, 2, 0, /*window=*/1);
  std::vector<at::Tensor> zs, ys;
  at::Tensor state_after_two;
  for (int b = 0; full.next(z, y); ++b) {
    zs.push_back(z), ys.push_back(y);
    if (b == 1) state_after_two = cpu_rng_state();
  }
  ASSERT_EQ(zs.size(), 5u);
  set_cpu_rng_state(state_after_two);
  datasets::LatentLoader resumed(d.path.string(), meta, 1, 3, 2, 0, 1, 0, 1, /*start_batch=*/2);
  EXPECT_EQ(resumed.num_batches(), 5);
  size_t i = 2;
  for (; resumed.next(z, y); ++i) {
    ASSERT_LT(i, zs.size());
    EXPECT_TRUE(torch::equal(z, zs[i])) << i;
    EXPECT_TRUE(torch::equal(y, ys[i])) << i;
  }
  EXPECT_EQ(i, 5u);
  datasets::LatentLoader past_end(d.path.string(), meta, 1, 3, 2, 0, 1, 0, 1, /*start_batch=*/7);
  EXPECT_FALSE(past_end.next(z, y));
}

TEST(Loader, DeterministicOrderAndAugmentation) {
  auto o1 = datasets::epoch_order(100, 7, 3, true), o2 = datasets::epoch_order(100, 7, 3, true);
  EXPECT_EQ(o1, o2);
  EXPECT_NE(o1, datasets::epoch_order(100, 7, 4, true));
  std::vector<int64_t> sorted = o1;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);
  auto r0 = datasets::epoch_order(10, 1, 0, true, 0, 2), r1 = datasets::epoch_order(10, 1, 0, true, 1, 2);
  EXPECT_EQ(r0.size() + r1.size(), 10u);
  datasets::ImageSet set{torch::randint(0, 255, {6, 28, 28}, torch::kByte), torch::arange(6)};
  datasets::ClassifierTransform tf;
  tf.shift = 2, tf.hflip = true;
  auto [x1, y1] = datasets::make_batch(set, {5, 2, 0}, tf, true, 11, 1);
  auto [x2, y2] = datasets::make_batch(set, {5, 2, 0}, tf, true, 11, 1);
  EXPECT_TRUE(torch::equal(x1, x2));
  EXPECT_EQ(x1.sizes(), (std::vector<int64_t>{3, 1, 32, 32}));
  EXPECT_TRUE(torch::equal(y1, torch::tensor({5, 2, 0})));
  auto [e1, ey] = datasets::make_batch(set, {5}, tf, false, 11, 1);  // eval: centred, no randomness
  const float v = (set.images[5][0][0].item<float>() / 255.f - datasets::kFashionMnistMean) / datasets::kFashionMnistStd;
  EXPECT_NEAR(e1[0][0][2][2].item<float>(), v, 1e-5);
  EXPECT_NEAR(e1[0][0][0][0].item<float>(), -datasets::kFashionMnistMean / datasets::kFashionMnistStd, 1e-6);
}

// Data parallel: rank r of w serves rows r, r + w, ... of the global batch one process draws (same generator state).
TEST(Latents, RankSharesAreTheGlobalBatchRows) {
  test::TempDir d;
  write_toy_shards(d.path.string());
  const datasets::LatentMeta meta = datasets::read_latent_meta(d.path.string());
  at::Tensor z, y, zr, yr;
  torch::manual_seed(5);
  datasets::LatentLoader one(d.path.string(), meta, /*batch=*/4, 3, 0, 0);
  ASSERT_TRUE(one.next(z, y));
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(5);
    datasets::LatentLoader rank(d.path.string(), meta, 4, 3, 0, 0, 4, r, 2);
    EXPECT_EQ(rank.num_batches(), one.num_batches());
    ASSERT_TRUE(rank.next(zr, yr));
    EXPECT_TRUE(torch::equal(zr, z.slice(0, r, 4, 2)));
    EXPECT_TRUE(torch::equal(yr, y.slice(0, r, 4, 2)));
  }
}

}  // namespace
}  // namespace moh
