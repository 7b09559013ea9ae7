// Loaders of datasets/: deterministic order and augmentation of the in-memory loader, the latent loader's epoch,
// mirrors, limit and its data-parallel shares.
#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "datasets/latents.h"
#include "datasets/loader.h"
#include "tests/test_util.h"

namespace moh {
namespace {

/// Two hand-made shards (3 + 2 images) whose std is zero, so every drawn latent is scale · (mean or mirror mean).
datasets::LatentMeta write_toy_shards(const std::string& dir) {
  datasets::LatentMeta m;
  m.shards = {3, 2};
  m.count = 5;
  m.channels = 4;
  m.size = 2;
  m.image_size = 16;
  m.scale = 0.5;
  m.classes = {"a", "b", "c", "d", "e"};
  for (int64_t k = 0, first = 0; k < 2; first += m.shards[static_cast<size_t>(k)], ++k) {
    const int64_t n = m.shards[static_cast<size_t>(k)];
    at::Tensor id = at::arange(first, first + n, at::kFloat).view({n, 1, 1, 1}).expand({n, 4, 2, 2});
    save_safetensors(datasets::latent_shard_path(dir, k), {{"mean", id.to(at::kHalf)},
                                                           {"std", at::zeros_like(id).to(at::kHalf)},
                                                           {"mean_flip", (-id).to(at::kHalf)},
                                                           {"std_flip", at::zeros_like(id).to(at::kHalf)},
                                                           {"labels", at::arange(first, first + n, at::kLong)}});
  }
  datasets::write_latent_meta(dir, m);
  return m;
}

std::shared_ptr<const datasets::LatentStore> open_store(const std::string& dir) {
  return std::make_shared<const datasets::LatentStore>(dir, datasets::read_latent_meta(dir));
}

TEST(Latents, LoaderVisitsEveryImageOncePerEpochWithRandomMirrors) {
  test::TempDir d;
  write_toy_shards(d.path.string());
  const auto store = open_store(d.path.string());
  EXPECT_EQ(store->count(), 5);
  torch::manual_seed(0);
  datasets::LatentLoader loader(store, /*batch=*/1, /*seed=*/3, /*epoch=*/0, /*limit=*/0);
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
  // A limit keeps a seeded subset of that size (the same every epoch); batches are full (the rest is dropped).
  const std::vector<int64_t> subset = datasets::limited_subset(5, 4, 3);
  EXPECT_EQ(subset.size(), 4u);
  EXPECT_EQ(subset, datasets::limited_subset(5, 4, 3));
  for (int64_t epoch : {1, 2}) {
    datasets::LatentLoader limited(store, 2, 3, epoch, /*limit=*/4);
    EXPECT_EQ(limited.num_batches(), 2);
    std::vector<int64_t> got;
    while (limited.next(z, y))
      for (int64_t k = 0; k < 2; ++k) got.push_back(y[k].item<int64_t>());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, subset) << epoch;
  }
  // A damaged directory is a UserError naming the fix, when the store is opened (before any training).
  std::filesystem::remove(datasets::latent_shard_path(d.path.string(), 1));
  EXPECT_THROW(open_store(d.path.string()), UserError);
  EXPECT_THROW(datasets::read_latent_meta(d.file("nothing")), UserError);
}

// data.limit_train on a class-sorted set: the subset is spread over the classes (the first N would be the first
// classes only), differs with the seed and stays within [0, n).
TEST(Latents, LimitedSubsetIsSeededAndSpreadOverASortedSet) {
  const std::vector<int64_t> a = datasets::limited_subset(1000, 100, 1), b = datasets::limited_subset(1000, 100, 2);
  EXPECT_NE(a, b);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_GE(a.front(), 0);
  EXPECT_LT(a.back(), 1000);
  std::set<int64_t> classes;  // 10 classes of 100 sorted images
  for (int64_t i : a) classes.insert(i / 100);
  EXPECT_EQ(classes.size(), 10u);
  EXPECT_EQ(datasets::limited_subset(7, 0, 1), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

// A run resumed inside an epoch: the loader skips its first batches without drawing from the global generator, so
// with the generator state of the uninterrupted epoch at that batch it serves exactly that epoch's remaining batches.
TEST(Latents, StartBatchServesTheRestOfTheEpochWithTheSameDraws) {
  test::TempDir d;
  write_toy_shards(d.path.string());
  const auto store = open_store(d.path.string());
  at::Tensor z, y;
  torch::manual_seed(9);
  datasets::LatentLoader full(store, /*batch=*/1, 3, 2, 0);
  std::vector<at::Tensor> zs, ys;
  at::Tensor state_after_two;
  for (int b = 0; full.next(z, y); ++b) {
    zs.push_back(z), ys.push_back(y);
    if (b == 1) state_after_two = cpu_rng_state();
  }
  ASSERT_EQ(zs.size(), 5u);
  set_cpu_rng_state(state_after_two);
  datasets::LatentLoader resumed(store, 1, 3, 2, 0, 0, 1, /*start_batch=*/2);
  EXPECT_EQ(resumed.num_batches(), 5);
  size_t i = 2;
  for (; resumed.next(z, y); ++i) {
    ASSERT_LT(i, zs.size());
    EXPECT_TRUE(torch::equal(z, zs[i])) << i;
    EXPECT_TRUE(torch::equal(y, ys[i])) << i;
  }
  EXPECT_EQ(i, 5u);
  datasets::LatentLoader past_end(store, 1, 3, 2, 0, 0, 1, /*start_batch=*/7);
  EXPECT_FALSE(past_end.next(z, y));
}

// Upper tail of the chi-square distribution with k degrees of freedom: Q(k/2, x/2), the regularised upper
// incomplete gamma function (series below a + 1, continued fraction above; Abramowitz & Stegun 6.5.29 / 6.5.31).
double chi_square_p(double x, double k) {
  const double a = k / 2, z = x / 2;
  if (z <= 0) return 1.0;
  const double log_front = a * std::log(z) - z - std::lgamma(a);
  if (z < a + 1) {  // P by its series, Q = 1 − P
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && term > sum * 1e-15; ++n) sum += term *= z / (a + n);
    return 1.0 - sum * std::exp(log_front);
  }
  double b = z + 1 - a, c = 1e300, dd = 1 / b, h = dd;  // Lentz's continued fraction for Q
  for (int n = 1; n < 1000; ++n) {
    const double an = -n * (n - a);
    b += 2;
    dd = an * dd + b;
    c = b + an / c;
    dd = 1 / dd;
    const double delta = dd * c;
    h *= delta;
    if (std::abs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_front) * h;
}

TEST(LatentLoader, ChiSquareTailMatchesKnownQuantiles) {  // the helper below must be right for the test to mean much
  EXPECT_NEAR(chi_square_p(3.841, 1), 0.05, 1e-4);
  EXPECT_NEAR(chi_square_p(148.23, 99), 0.001, 1e-4);  // scipy.stats.chi2.isf(0.001, 99) = 148.230
  EXPECT_NEAR(chi_square_p(98.334, 99), 0.5, 1e-3);
  EXPECT_NEAR(chi_square_p(0.0, 5), 1.0, 1e-12);
}

// The shape of ImageNet latents: an ImageFolder tree extracted in order is class-sorted, 100 classes × 64 images in
// shards of 512 (13 shards, each holding 8 classes). DiT's DistributedSampler gives every batch of 256 labels close
// to uniform over the classes; a loader that pools a few shards at a time gives batches of a handful of classes.
// Checked: a chi-square test of each batch's labels against uniform passes (p > 0.001) for ≥ 99 % of the batches
// of three epochs, every image is served exactly once per epoch on 1 and on 2 ranks (the ranks' rows together are
// the single process's batch), and a loader started at batch 7 serves what the full epoch served from there.
TEST(LatentLoader, BatchesMixClassesOfASortedSet) {
  test::TempDir d;
  constexpr int64_t kClasses = 100, kPerClass = 64, kShard = 512, kBatch = 256, kCount = kClasses * kPerClass;
  datasets::LatentMeta m;
  m.count = kCount;
  m.channels = 2;
  m.size = 1;
  m.image_size = 8;
  m.scale = 1.0;
  for (int64_t c = 0; c < kClasses; ++c) m.classes.push_back(std::string(1, 'n') += std::to_string(c));
  for (int64_t first = 0, k = 0; first < kCount; first += kShard, ++k) {
    const int64_t n = std::min(kShard, kCount - first);
    m.shards.push_back(n);
    const at::Tensor idx = at::arange(first, first + n, at::kLong);
    // The image index in two fp16-exact digits (std 0, mirror = image): z identifies the image whatever the draws.
    const at::Tensor id = at::stack({idx.remainder(64), idx.div(64, "floor")}, 1).view({n, 2, 1, 1}).to(at::kHalf);
    save_safetensors(datasets::latent_shard_path(d.path.string(), k),
                     {{"mean", id},
                      {"std", at::zeros_like(id)},
                      {"mean_flip", id},
                      {"std_flip", at::zeros_like(id)},
                      {"labels", idx.div(kPerClass, "floor")}});  // class-sorted
  }
  datasets::write_latent_meta(d.path.string(), m);
  const auto store = open_store(d.path.string());
  auto image_ids = [](const at::Tensor& z) {  // (B) int64
    return (z.select(1, 0).flatten(1).select(1, 0) + 64 * z.select(1, 1).flatten(1).select(1, 0)).round().to(at::kLong);
  };
  int64_t batches = 0, passed = 0;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    torch::manual_seed(11 + epoch);
    datasets::LatentLoader one(store, kBatch, /*seed=*/5, epoch, 0);
    ASSERT_EQ(one.num_batches(), kCount / kBatch);
    std::vector<at::Tensor> zs, ys, served;
    at::Tensor z, y, state_at_7;
    for (int64_t b = 0; one.next(z, y); ++b) {
      const at::Tensor counts = at::bincount(y, {}, kClasses).to(at::kDouble);  // (classes)
      const double expected = static_cast<double>(kBatch) / kClasses;
      const double chi2 = ((counts - expected).pow(2) / expected).sum().item<double>();
      ++batches, passed += chi_square_p(chi2, kClasses - 1) > 0.001;
      EXPECT_TRUE(torch::equal(image_ids(z).div(kPerClass, "floor"), y)) << "labels travel with their images";
      zs.push_back(z), ys.push_back(y), served.push_back(image_ids(z));
      if (b == 6) state_at_7 = cpu_rng_state();
    }
    const at::Tensor all = std::get<0>(at::cat(served).sort());
    EXPECT_TRUE(torch::equal(all, at::arange(kCount, at::kLong))) << "each image exactly once, epoch " << epoch;
    // Two ranks: their rows of each batch are the single process's rows r, r + 2, ...
    std::vector<at::Tensor> by_rank[2];
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(11 + epoch);
      datasets::LatentLoader rank(store, kBatch, 5, epoch, 0, r, 2);
      for (size_t b = 0; rank.next(z, y); ++b) {
        ASSERT_LT(b, zs.size());
        ASSERT_TRUE(torch::equal(z, zs[b].slice(0, r, kBatch, 2))) << "rank " << r << " batch " << b;
        ASSERT_TRUE(torch::equal(y, ys[b].slice(0, r, kBatch, 2)));
        by_rank[r].push_back(image_ids(z));
      }
    }
    const at::Tensor union_ranks = std::get<0>(at::cat({at::cat(by_rank[0]), at::cat(by_rank[1])}).sort());
    EXPECT_TRUE(torch::equal(union_ranks, at::arange(kCount, at::kLong)))
        << "2 ranks: each image once, epoch " << epoch;
    // Resumed at batch 7 with the generator state the full epoch had there.
    set_cpu_rng_state(state_at_7);
    datasets::LatentLoader resumed(store, kBatch, 5, epoch, 0, 0, 1, /*start_batch=*/7);
    for (size_t b = 7; resumed.next(z, y); ++b) {
      ASSERT_LT(b, zs.size());
      EXPECT_TRUE(torch::equal(z, zs[b]) && torch::equal(y, ys[b])) << "resumed batch " << b;
    }
  }
  EXPECT_GE(passed, (batches * 99 + 99) / 100) << passed << " of " << batches << " batches look uniform over classes";
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
  datasets::ImageTransform tf;
  tf.shift = 2;
  tf.hflip = true;
  auto [x1, y1] = datasets::make_batch(set, {5, 2, 0}, tf, true, 11, 1);
  auto [x2, y2] = datasets::make_batch(set, {5, 2, 0}, tf, true, 11, 1);
  EXPECT_TRUE(torch::equal(x1, x2));
  EXPECT_EQ(x1.sizes(), (std::vector<int64_t>{3, 1, 32, 32}));
  EXPECT_TRUE(torch::equal(y1, torch::tensor({5, 2, 0})));
  auto [e1, ey] = datasets::make_batch(set, {5}, tf, false, 11, 1);  // eval: centred, no randomness
  const float v =
      (set.images[5][0][0].item<float>() / 255.f - datasets::kFashionMnistMean) / datasets::kFashionMnistStd;
  EXPECT_NEAR(e1[0][0][2][2].item<float>(), v, 1e-5);
  EXPECT_NEAR(e1[0][0][0][0].item<float>(), -datasets::kFashionMnistMean / datasets::kFashionMnistStd, 1e-6);
}

// Data parallel: rank r of w serves rows r, r + w, ... of the global batch one process draws (same generator state).
TEST(Latents, RankSharesAreTheGlobalBatchRows) {
  test::TempDir d;
  write_toy_shards(d.path.string());
  at::Tensor z, y, zr, yr;
  torch::manual_seed(5);
  const auto store = open_store(d.path.string());
  datasets::LatentLoader one(store, /*batch=*/4, 3, 0, 0);
  ASSERT_TRUE(one.next(z, y));
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(5);
    datasets::LatentLoader rank(store, 4, 3, 0, 0, r, 2);
    EXPECT_EQ(rank.num_batches(), one.num_batches());
    ASSERT_TRUE(rank.next(zr, yr));
    EXPECT_TRUE(torch::equal(zr, z.slice(0, r, 4, 2)));
    EXPECT_TRUE(torch::equal(yr, y.slice(0, r, 4, 2)));
  }
}

}  // namespace
}  // namespace moh
