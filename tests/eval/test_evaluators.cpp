// Generative metrics (IS, precision/recall), npz IO, the FID Inception network and its TF1 resize, SHA-256.
// Reference values: closed forms and numpy 1.24 for the permutation and the npz fixtures
// (tests/fixtures/gen/make_npz.py), hand computation for the resize.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/io/sha256.h"
#include "datasets/image_source.h"
#include "datasets/npz.h"
#include "eval/generative.h"
#include "eval/inception.h"
#include "eval/metric_record.h"
#include "eval/metrics.h"
#include "eval/report.h"
#include "tests/test_util.h"

namespace moh::eval {
namespace {

// Checksums of FixedWeightsOutputChecksum, recorded from this implementation on LibTorch 1.13 / OpenBLAS.
constexpr double kExpectPool = 4055.888184, kExpectSpatial = 3698.295654, kExpectLogits = 769.654785;

const std::string kFixtures = test::source_path("tests/fixtures/npz/");

TEST(InceptionScore, IdenticalPredictionsGiveOne) {
  at::Tensor logits = at::zeros({100, 10});
  logits.select(1, 3).fill_(50.0);  // every image confidently class 3
  EXPECT_NEAR(inception_score(logits, ISMode::adm).mean, 1.0, 1e-9);
}

TEST(InceptionScore, EvenOneHotGivesClassCount) {
  at::Tensor logits = at::full({120, 1008}, -100.0);
  for (int64_t i = 0; i < 120; ++i) logits[i][i % 12] = 100.0;  // 12 classes, 10 of each
  EXPECT_NEAR(inception_score(logits, ISMode::adm).mean, 12.0, 1e-6);
  const ISResult f = inception_score(logits.repeat({10, 1}), ISMode::fidelity);  // shuffled splits of 120
  EXPECT_EQ(f.splits, 10);
  EXPECT_GT(f.mean, 10.0);
  EXPECT_LE(f.mean, 12.0 + 1e-9);
}

TEST(InceptionScore, AdmSplitsAreConsecutiveFiveThousands) {
  // 5000 images all class 0, then 2000 spread over 2 classes: splits score 1 and 2 → mean 1.5.
  at::Tensor logits = at::full({7000, 4}, -100.0);
  logits.narrow(0, 0, 5000).select(1, 0).fill_(100.0);
  for (int64_t i = 5000; i < 7000; ++i) logits[i][i % 2 + 1] = 100.0;
  const ISResult r = inception_score(logits, ISMode::adm);
  EXPECT_EQ(r.splits, 2);
  EXPECT_NEAR(r.mean, 1.5, 1e-9);
}

TEST(InceptionScore, NumpyLegacyPermutationMatchesNumpy) {
  // np.random.RandomState(2020).permutation(20) with numpy 1.24.
  const std::vector<int64_t> expect{6, 9, 12, 4, 5, 14, 1, 2, 15, 10, 19, 18, 7, 16, 13, 11, 17, 3, 8, 0};
  EXPECT_EQ(numpy_legacy_permutation(20, 2020), expect);
  const std::vector<int64_t> big = numpy_legacy_permutation(100000, 2020);  // first/last entries from numpy
  EXPECT_EQ(std::vector<int64_t>(big.begin(), big.begin() + 4), (std::vector<int64_t>{36082, 31787, 33964, 26097}));
  EXPECT_EQ(std::vector<int64_t>(big.end() - 4, big.end()), (std::vector<int64_t>{44739, 40259, 61832, 41824}));
}

TEST(KID, DrawsContinueOneNumpyGenerator) {
  // r = np.random.RandomState(2020); r.choice(10, 4, replace=False), r.choice(7, 3, ...), r.choice(100000, 3, ...)
  NumpyLegacyRandom r(2020);
  EXPECT_EQ(r.choice(10, 4), (std::vector<int64_t>{2, 4, 9, 1}));
  EXPECT_EQ(r.choice(7, 3), (std::vector<int64_t>{4, 3, 1}));
  EXPECT_EQ(r.choice(100000, 3), (std::vector<int64_t>{24258, 37108, 96034}));
}

TEST(KID, UnbiasedMMDOfThePolynomialKernel) {
  torch::manual_seed(0);
  const at::Tensor a = torch::randn({6, 3}, at::kDouble), b = torch::randn({6, 3}, at::kDouble) + 0.5;
  // One subset holding every row: the estimator written as loops over pairs.
  const auto k = [](const at::Tensor& x, const at::Tensor& y) {
    return std::pow((x * y).sum().item<double>() / 3.0 + 1.0, 3);
  };
  double xx = 0, yy = 0, xy = 0;
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      if (i != j) xx += k(a[i], a[j]), yy += k(b[i], b[j]);
      xy += k(a[i], b[j]);
    }
  const KIDResult r = kernel_inception_distance(a, b, 1, 6);
  EXPECT_NEAR(r.mean, (xx + yy) / 30.0 - 2.0 * xy / 36.0, 1e-12);
  EXPECT_EQ(r.std, 0.0);
  EXPECT_EQ(r.subset_size, 6);
  const at::Tensor big = torch::randn({400, 8}, at::kDouble);
  const KIDResult same = kernel_inception_distance(big.narrow(0, 0, 200), big.narrow(0, 200, 200), 20, 100);
  const KIDResult shifted = kernel_inception_distance(big.narrow(0, 0, 200), big.narrow(0, 200, 200) + 1.0, 20, 100);
  EXPECT_LT(std::abs(same.mean), 5 * same.std + 1e-3);  // one distribution: unbiased, about 0
  EXPECT_GT(shifted.mean, 10 * (shifted.std + same.std));
  EXPECT_GT(same.std, 0.0);
}

TEST(PrecisionRecall, RadiusIsFourthSmallestCountingSelf) {
  // 1-D points 0, 1, 3, 6, 10: squared distances from 0 are 0, 1, 9, 36, 100 → radius 36.
  at::Tensor f = at::tensor({0.0f, 1.0f, 3.0f, 6.0f, 10.0f}).unsqueeze(1);
  at::Tensor r = manifold_radii(f, 3, 64);  // tiny blocks: several row blocks
  EXPECT_FLOAT_EQ(r[0].item<float>(), 36.0f);
  EXPECT_FLOAT_EQ(r[4].item<float>(), 81.0f);  // from 10: self 0, 16, 49, 81, 100 → 81
}

TEST(PrecisionRecall, IdenticalSetsAndTorchFidelityConvention) {
  torch::manual_seed(42);
  at::Tensor a = torch::randn({300, 16});
  PRResult same = precision_recall(a, a, 3, 4096);
  EXPECT_DOUBLE_EQ(same.precision, 1.0);
  EXPECT_DOUBLE_EQ(same.recall, 1.0);
  // Narrow samples inside a wide reference: high precision, low recall (torch-fidelity test_prc_convention).
  at::Tensor gen = 0.1 * torch::randn({200, 16}), real = 3.0 * torch::randn({200, 16});
  PRResult pr = precision_recall(real, gen);
  EXPECT_GT(pr.precision, 0.8);
  EXPECT_LT(pr.recall, 0.3);
  // Blocking does not change the answer.
  PRResult blocked = precision_recall(real, gen, 3, 1000);
  EXPECT_DOUBLE_EQ(blocked.precision, pr.precision);
  EXPECT_DOUBLE_EQ(blocked.recall, pr.recall);
}

TEST(Npz, RoundTripStoredAndDeflated) {
  test::TempDir dir;
  at::Tensor imgs = torch::randint(0, 256, {7, 5, 4, 3}).to(at::kByte);
  at::Tensor stats = torch::randn({9, 9}, torch::kDouble), half = torch::randn({3}).to(at::kHalf);
  for (auto c : {datasets::NpzCompression::stored, datasets::NpzCompression::deflated}) {
    const std::string path = dir.file(c == datasets::NpzCompression::stored ? "s.npz" : "d.npz");
    datasets::save_npz(path, {{"arr_0", imgs}, {"sigma", stats}, {"h", half}, {"scalar", at::scalar_tensor(2.5)}}, c);
    datasets::NpzReader r(path);
    EXPECT_TRUE(r.has("arr_0") && r.has("sigma") && !r.has("mu"));
    EXPECT_TRUE(r.read("arr_0").equal(imgs));
    EXPECT_TRUE(r.read("sigma").equal(stats));
    EXPECT_TRUE(r.read("h").equal(half));
    EXPECT_EQ(r.read("scalar").dim(), 0);
    auto rows = r.rows("arr_0");  // streaming in blocks
    EXPECT_TRUE(rows->next(3).equal(imgs.narrow(0, 0, 3)));
    EXPECT_TRUE(rows->next(100).equal(imgs.narrow(0, 3, 4)));
    EXPECT_EQ(rows->next(1).size(0), 0);
  }
}

TEST(Npz, ReadsNumpyWrittenZip64Files) {
  // np.savez / np.savez_compressed output: every member carries a Zip64 local extra field.
  for (const char* name : {"stored.npz", "deflated.npz"}) {
    datasets::NpzReader r(kFixtures + name);
    at::Tensor img = r.read("arr_0");
    ASSERT_EQ(img.sizes(), (at::IntArrayRef{5, 4, 3, 3}));
    at::Tensor expect = (at::arange(180, at::kLong) % 251).to(at::kByte).reshape({5, 4, 3, 3});
    EXPECT_TRUE(img.equal(expect)) << name;
    EXPECT_TRUE(r.read("arr_1").equal(at::tensor({3, 1, 4, 1, 5}, at::kLong)));
    EXPECT_TRUE(r.read("mu").allclose(at::arange(6, at::kFloat) / 7.0));
    auto src = datasets::open_image_source(kFixtures + name);  // the image-source view: labels from arr_1
    datasets::ImageBlock b;
    ASSERT_TRUE(src->next(10, b));
    EXPECT_EQ(b.labels.size(0), 5);
  }
}

TEST(Npz, MalformedFilesAreUserErrors) {
  EXPECT_THROW(datasets::NpzReader(kFixtures + "truncated.npz"), UserError);
  EXPECT_THROW(datasets::open_image_source(kFixtures + "wrong_dtype.npz"), UserError);
  EXPECT_THROW(datasets::open_image_source(kFixtures + "wrong_rank.npz"), UserError);
  EXPECT_THROW(datasets::NpzReader(kFixtures + "big_endian.npz").read("arr_0"), UserError);
  EXPECT_THROW(datasets::open_image_source(kFixtures + "missing.npz"), UserError);
  EXPECT_THROW(datasets::open_image_source("fashion_mnist:validation"), UserError);
  // A member whose data is shorter than its header says.
  test::TempDir dir;
  std::string npy = datasets::npy_bytes(at::zeros({4, 4}));
  EXPECT_THROW(datasets::parse_npy(npy.substr(0, npy.size() - 3), "x.npy"), UserError);
  EXPECT_THROW(datasets::parse_npy("\x93NUMPY\x09\x00", "x.npy"), UserError);
  // Reference statistics with NaN/inf are refused on loading (they would reach linalg.eigh).
  at::Tensor sigma = at::eye(3, at::kDouble);
  datasets::save_npz(dir.file("ok.npz"), {{"mu", at::zeros({3}, at::kDouble)}, {"sigma", sigma}});
  EXPECT_TRUE(load_reference_stats(dir.file("ok.npz")).has_value());
  sigma[1][2] = std::nan("");
  datasets::save_npz(dir.file("nan.npz"), {{"mu", at::zeros({3}, at::kDouble)}, {"sigma", sigma}});
  EXPECT_THROW(load_reference_stats(dir.file("nan.npz")), UserError);
  datasets::save_npz(dir.file("inf.npz"),
                     {{"mu", at::full({3}, INFINITY, at::kDouble)}, {"sigma", at::eye(3, at::kDouble)}});
  EXPECT_THROW(load_reference_stats(dir.file("inf.npz")), UserError);
}

TEST(InceptionResize, Tf1BilinearHandComputed4x4To3x3) {
  // src = dst·4/3 → rows/cols sampled at 0, 1.333…, 2.666…; a linear ramp v = 4y + x is reproduced exactly.
  at::Tensor x = at::arange(16, at::kFloat).reshape({1, 1, 4, 4});
  at::Tensor y = resize_bilinear_tf1(x, 3, 3);
  const float third = 4.0f / 3.0f;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(y[0][0][i][j].item<float>(), 4 * i * third + j * third, 1e-5);
  // A step image separates TF1 (no half-pixel offset) from PyTorch's align_corners=False.
  at::Tensor step = at::zeros({1, 1, 4, 4});
  step.narrow(3, 2, 2).fill_(1.0);
  at::Tensor t = resize_bilinear_tf1(step, 3, 3);
  EXPECT_FLOAT_EQ(t[0][0][0][0].item<float>(), 0.0f);
  EXPECT_NEAR(t[0][0][0][1].item<float>(), 1.0f / 3.0f, 1e-6);  // between cols 1 (0) and 2 (1) at 1.333
  EXPECT_FLOAT_EQ(t[0][0][0][2].item<float>(), 1.0f);           // cols 2..3 at 2.666
  // Upsampling keeps the last row/col clamped to the input edge.
  at::Tensor up = resize_bilinear_tf1(x, 8, 8);
  EXPECT_FLOAT_EQ(up[0][0][7][7].item<float>(), 15.0f);
}

// Deterministic, RNG-independent weights so the checksum holds on any LibTorch version.
void set_deterministic_weights(FIDInceptionV3& net) {
  torch::NoGradGuard ng;
  int64_t k = 0;
  for (auto& p : net->named_parameters()) {
    const auto n = p.value().numel();
    at::Tensor v = at::sin(at::arange(n, at::kDouble) * 0.731 + static_cast<double>(++k)).to(at::kFloat);
    const bool is_bn = p.key().find(".bn.") != std::string::npos;
    const double fan_in = p.value().dim() > 1 ? static_cast<double>(n / p.value().size(0)) : 1.0;
    p.value().copy_((is_bn ? 1.0 + 0.1 * v : v * std::sqrt(3.0 / fan_in)).view(p.value().sizes()));
  }
  for (auto& b : net->named_buffers()) {
    if (b.key().find("running_var") != std::string::npos) b.value().fill_(1.0);
    if (b.key().find("running_mean") != std::string::npos) b.value().fill_(0.01);
  }
}

TEST(Inception, ParameterCountKeysAndShapes) {
  FIDInceptionV3 net;
  EXPECT_EQ(test::count_params(net), kInceptionParams);  // 23,850,960 (spec §1.1)
  int64_t tensors = 0;
  for (const auto& b : net->named_buffers())
    if (b.key().find("num_batches_tracked") == std::string::npos) ++tensors;
  EXPECT_EQ(tensors + static_cast<int64_t>(net->named_parameters().size()), 472);  // 94 × 5 + fc.weight + fc.bias
  EXPECT_TRUE(net->named_parameters().contains("Mixed_6d.branch1x1.conv.weight"));
  EXPECT_TRUE(net->named_buffers().contains("Mixed_7c.branch3x3dbl_3b.bn.running_var"));
}

TEST(Inception, FixedWeightsOutputChecksum) {
  FIDInceptionV3 net;
  set_deterministic_weights(net);
  net->eval();
  at::Tensor img = (at::arange(2 * 32 * 32 * 3, at::kLong) * 37 % 256).to(at::kByte).reshape({2, 32, 32, 3});
  torch::NoGradGuard ng;
  InceptionFeatures f = net->forward(inception_preprocess(img, InceptionResize::tf1));
  ASSERT_EQ(f.pool.sizes(), (at::IntArrayRef{2, 2048}));
  ASSERT_EQ(f.spatial.sizes(), (at::IntArrayRef{2, 2023}));
  ASSERT_EQ(f.logits.sizes(), (at::IntArrayRef{2, 1008}));
  EXPECT_TRUE(f.pool.isfinite().all().item<bool>() && f.logits.isfinite().all().item<bool>());
  // Values recorded from this implementation (a regression guard for the wiring: pool branches, concat order, the
  // NHWC sFID tap); tolerance covers BLAS/conv algorithm differences.
  const double pool = f.pool.sum().item<double>(), spatial = f.spatial.sum().item<double>();
  const double logits = f.logits.abs().sum().item<double>();
  std::printf("checksums pool %.6f spatial %.6f logits %.6f\n", pool, spatial, logits);
  EXPECT_NEAR(pool, kExpectPool, 1e-3 * std::abs(kExpectPool));
  EXPECT_NEAR(spatial, kExpectSpatial, 1e-3 * std::abs(kExpectSpatial));
  EXPECT_NEAR(logits, kExpectLogits, 1e-3 * std::abs(kExpectLogits));
  // The sFID tap is channels 0..6 of Mixed_6d.branch1x1 flattened in NHWC order (ADM's mixed_6/conv[..., :7]).
  at::Tensor x = inception_preprocess(img, InceptionResize::tf1);
  at::Tensor h = net->Conv2d_2b_3x3->forward(net->Conv2d_2a_3x3->forward(net->Conv2d_1a_3x3->forward(x)));
  h = at::max_pool2d(h, {3, 3}, {2, 2});
  h = at::max_pool2d(net->Conv2d_4a_3x3->forward(net->Conv2d_3b_1x1->forward(h)), {3, 3}, {2, 2});
  h = net->Mixed_6c->forward(net->Mixed_6b->forward(
      net->Mixed_6a->forward(net->Mixed_5d->forward(net->Mixed_5c->forward(net->Mixed_5b->forward(h))))));
  at::Tensor tap = net->Mixed_6d->branch1x1->forward(h);  // (2, 192, 17, 17)
  EXPECT_TRUE(f.spatial.allclose(tap.narrow(1, 0, 7).permute({0, 2, 3, 1}).reshape({2, 2023})));
  // pytorch-fid preprocessing differs from TF1 on a non-smooth image.
  EXPECT_GT((x - inception_preprocess(img, InceptionResize::pytorch)).abs().max().item<double>(), 1e-2);
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),  // 56 bytes: padding spills
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// The SHA-extensions path against the plain rounds, on random states and blocks (skipped on a CPU without them).
TEST(Sha256, ExtensionsEqualThePlainRounds) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(64 * 257);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{1}, size_t{2}, size_t{5}, size_t{257}}) {
    uint32_t plain[8], fast[8];
    for (int i = 0; i < 8; ++i) plain[i] = fast[i] = static_cast<uint32_t>(rng());
    sha256_detail::blocks_plain(plain, data.data(), n);
    if (!sha256_detail::blocks_sha_ni(fast, data.data(), n)) GTEST_SKIP() << "this CPU has no SHA extensions";
    for (int i = 0; i < 8; ++i) EXPECT_EQ(fast[i], plain[i]) << n << " blocks, word " << i;
  }
  EXPECT_STREQ(sha256_detail::path(), "SHA extensions");
}

// Updates split anywhere (inside a block, across blocks, empty) give the digest of one update.
TEST(Sha256, SplitUpdatesEqualOneUpdate) {
  std::mt19937 rng(11);
  std::string bytes(300, '\0');
  for (auto& c : bytes) c = static_cast<char>(rng());
  for (size_t len : {size_t{0}, size_t{55}, size_t{56}, size_t{63}, size_t{64}, size_t{65}, size_t{129}, size_t{300}}) {
    const std::string whole = sha256_hex(bytes.substr(0, len));
    for (int trial = 0; trial < 20; ++trial) {
      Sha256 s;
      size_t at = 0;
      while (at < len) {
        const size_t take = std::min(len - at, static_cast<size_t>(rng() % 100));
        s.update(bytes.data() + at, take);
        at += take;
      }
      EXPECT_EQ(s.hex_digest(), whole) << len << " bytes, trial " << trial;
    }
  }
}

// A value that rounds to zero prints without a sign (FID of identical sets: -1e-13 printed as "-0.00").
TEST(Generative, MetricsRoundingToZeroHaveNoSign) {
  EXPECT_EQ(format_metric("fid", -1e-13), "0.00");
  EXPECT_EQ(format_metric("fid", -0.0), "0.00");
  EXPECT_EQ(format_metric("precision", -0.0004), "0.000");
  EXPECT_EQ(format_metric("fid", -0.006), "-0.01");
  EXPECT_EQ(format_metric("fid", 2.5), "2.50");
}

TEST(Generative, MetricListParsing) {
  MetricSet m = parse_metric_set("fid,pr");
  EXPECT_EQ(m.on, (std::set<MetricGroup>{MetricGroup::fid, MetricGroup::pr}));
  EXPECT_THROW(parse_metric_set("fid,sfdi"), UserError);
  // The words are the records' generative groups, each once, in their order, then "all".
  EXPECT_NE(test::user_error_of([] { parse_metric_set("nope"); }).find("choose from fid,sfid,is,pr,kid,all"),
            std::string::npos);
  const MetricSet all = parse_metric_set("all");
  EXPECT_EQ(all.on, MetricSet().on);
  EXPECT_EQ(all.on.size(), 5u);
}

// Every generative record's key is written by its group's computation (the hook beside its needs), and each group
// has one computation: a record without one, or a computation that forgets a key, fails here.
TEST(MetricRecords, EachGenerativeRecordIsWrittenByItsGroupsComputation) {
  at::manual_seed(11);
  FeatureSet s;
  s.pool = at::randn({64, 8}, at::kDouble), s.spatial = at::randn({64, 6}, at::kDouble);
  s.logits = at::randn({64, 10}, at::kDouble);
  const at::Tensor ref_pool = at::randn({64, 8}, at::kDouble) + 0.5;
  ReferenceStats ref;
  ref.pool = compute_stats(ref_pool), ref.spatial = compute_stats(at::randn({64, 6}, at::kDouble));
  ref.pr_features = ref_pool.to(at::kFloat);
  s.pool = s.pool.to(at::kFloat);
  for (const MetricRecord& r : metric_records()) {
    if (r.group == MetricGroup::classification) continue;
    SCOPED_TRACE(r.key);
    const auto& comps = metric_computations();
    ASSERT_EQ(std::count_if(comps.begin(), comps.end(), [&](const MetricComputation& c) { return c.group == r.group; }),
              1);
    const MetricComputation& c =
        *std::find_if(comps.begin(), comps.end(), [&](const MetricComputation& m) { return m.group == r.group; });
    EXPECT_GE(c.needs.min_images, 1);
    EXPECT_FALSE(c.needs.too_few.empty());
    nlohmann::json out = nlohmann::json::object();
    c.compute(MetricInputs{s, ref, ISMode::fidelity}, out);  // fidelity: the IS std is written too
    ASSERT_TRUE(out.contains(r.key));
    EXPECT_TRUE(std::isfinite(out[r.key].get<double>()));
  }
}

// One record per metric (eval/metric_record.h): every report key has its digits, direction and label there; a key
// finds its record exactly or as "KEY_ema", never by a prefix or suffix it happens to share.
TEST(MetricRecords, EveryMetricIsOneRecordReadByTheReportsAndTheSweep) {
  for (const MetricRecord& r : metric_records()) {
    SCOPED_TRACE(r.key);
    EXPECT_EQ(find_metric(r.key), &r);  // its own key finds it
    EXPECT_NE(std::string(r.label), "");
    EXPECT_GE(r.digits, 0);
    if (r.group != MetricGroup::classification) {
      MetricSet only = parse_metric_set(group_word(r.group));  // the --metrics word that computes it
      EXPECT_EQ(only.on, std::set<MetricGroup>{r.group});
    }
  }
  const auto digits_of = [](const std::string& key) {
    const MetricRecord* r = find_metric(key);
    return r ? r->digits : -1;
  };
  EXPECT_EQ(digits_of("top1_ema"), 2);  // the EMA weights' top-1 is top-1's record
  EXPECT_EQ(find_metric("val_loss_ema"), find_metric("val_loss"));
  EXPECT_EQ(digits_of("val_loss"), 4);
  EXPECT_EQ(digits_of("sample_accuracy"), 2);
  EXPECT_EQ(find_metric("my_loss"), nullptr);  // shares a suffix with "loss", is not it
  EXPECT_EQ(find_metric("top1x"), nullptr);
  EXPECT_EQ(find_metric("_ema"), nullptr);
  EXPECT_EQ(&metric_record("fid", "--metric"), find_metric("fid"));
  const std::string listed = test::user_error_of([] { metric_record("fdi", "--metric"); });
  EXPECT_NE(listed.find("--metric"), std::string::npos) << listed;
  EXPECT_NE(listed.find("fid"), std::string::npos) << listed;
  EXPECT_EQ(digits_of("inception_score_std"), 2);
  EXPECT_EQ(digits_of("lr"), -1);  // no record: the shortest exact form
  EXPECT_EQ(format_metric("lr", 0.0005), "0.0005");
  EXPECT_EQ(format_metric("kid_mean", 0.0012345678), "0.001235");
  EXPECT_TRUE(find_metric("fid")->lower_is_better && find_metric("kid_mean")->lower_is_better);
  EXPECT_TRUE(find_metric("val_loss")->lower_is_better);
  EXPECT_FALSE(find_metric("top1")->lower_is_better || find_metric("inception_score")->lower_is_better);
  EXPECT_EQ(metric_label("fid"), "FID");
  EXPECT_EQ(metric_label("fid", /*dinov2=*/true), "FD-DINOv2");
  EXPECT_EQ(metric_label("kid_mean", true), "KID");
  EXPECT_EQ(metric_label("unknown_key"), "unknown_key");
  // report.md lists the records' keys in their order before any other key.
  const std::string md = report_markdown({{"metrics", {{"zeta", 1.0}, {"recall", 0.5}, {"fid", 3.0}}}}, "t");
  EXPECT_LT(md.find("| fid |"), md.find("| recall |"));
  EXPECT_LT(md.find("| recall |"), md.find("| zeta |"));
}

}  // namespace
}  // namespace moh::eval
