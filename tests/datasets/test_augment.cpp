// The ImageNet recipe's transforms on fixed images (shapes, value ranges, exact values where the operation defines
// them, determinism under a seed), Mixup/CutMix target sums and areas, the repeated-augmentation sampler, and the
// streaming ImageFolder loader (order, resume, corrupt files).
#include "core/error.h"
#include "datasets/augment.h"
#include "datasets/resample.h"
#include "datasets/stream_loader.h"
#include "tests/test_util.h"

namespace moh::datasets {
namespace {

// A deterministic colourful (H, W, 3) uint8 image.
at::Tensor test_image(int64_t H = 20, int64_t W = 24, int64_t C = 3) {
  return (at::arange(H * W * C, at::kLong).reshape({H, W, C}) * 37 % 251).to(at::kByte).contiguous();
}

TEST(Augment, RandAugmentSpecParsing) {
  const RandAugmentSpec r = RandAugmentSpec::parse("rand-m9-mstd0.5-inc1", "t");
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.num_ops, 2);
  EXPECT_DOUBLE_EQ(r.magnitude, 9);
  EXPECT_DOUBLE_EQ(r.magnitude_std, 0.5);
  EXPECT_TRUE(r.increasing);
  const RandAugmentSpec n = RandAugmentSpec::parse("rand-n3-m10", "t");
  EXPECT_EQ(n.num_ops, 3);
  EXPECT_FALSE(n.increasing);
  EXPECT_FALSE(RandAugmentSpec::parse("", "t").enabled);
  EXPECT_THROW(RandAugmentSpec::parse("auto-m9", "t"), UserError);
  EXPECT_THROW(RandAugmentSpec::parse("rand-m9-x3", "t"), UserError);
  EXPECT_THROW(RandAugmentSpec::parse("rand-m11", "t"), UserError);
  EXPECT_THROW(RandAugmentSpec::parse("rand-mfoo", "t"), UserError);
}

TEST(Augment, PixelOperationsExactValues) {
  const at::Tensor img = test_image();
  const at::Tensor i32 = img.to(at::kInt);
  EXPECT_TRUE(rand_augment_op(img, "Invert", 5, 1).equal((255 - i32).to(at::kByte)));
  // Posterize (increasing) at m = 9 keeps 4 − int(3.6) = 1 bit.
  const at::Tensor post = rand_augment_op(img, "PosterizeIncreasing", 9, 1);
  EXPECT_TRUE(post.eq(0).logical_or(post.eq(128)).all().item<bool>());
  // Solarize (increasing) at m = 5: threshold 256 − 128 = 128.
  EXPECT_TRUE(
      rand_augment_op(img, "SolarizeIncreasing", 5, 1).equal(at::where(i32 < 128, i32, 255 - i32).to(at::kByte)));
  // SolarizeAdd at m = 10 adds 110 below 128.
  EXPECT_TRUE(rand_augment_op(img, "SolarizeAdd", 10, 1)
                  .equal(at::where(i32 < 128, (i32 + 110).clamp_max(255), i32).to(at::kByte)));
  // Enhancements with factor 1 (increasing ops at m = 0) and geometric ops at m = 0 are the identity.
  for (const char* op : {"ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
                         "Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"})
    EXPECT_TRUE(rand_augment_op(img, op, 0, 1).equal(img)) << op;
  // Brightness factor 1 + 0.9 = 1.9 at m = 10 (sign +): scaled and clipped.
  EXPECT_TRUE(rand_augment_op(img, "BrightnessIncreasing", 10, 1)
                  .equal((img.to(at::kFloat) * 1.9).clamp(0, 255).round().to(at::kByte)));
  // Colour on a grey image and contrast on a constant image change nothing.
  const at::Tensor grey = test_image(20, 24, 1);
  EXPECT_TRUE(rand_augment_op(grey, "ColorIncreasing", 10, 1).equal(grey));
  const at::Tensor flat = at::full({8, 8, 3}, 77, at::kByte);
  EXPECT_TRUE(rand_augment_op(flat, "ContrastIncreasing", 10, -1).equal(flat));
  EXPECT_TRUE(rand_augment_op(flat, "Equalize", 10, 1).equal(flat));
  EXPECT_TRUE(rand_augment_op(flat, "AutoContrast", 10, 1).equal(flat));
  // AutoContrast stretches every channel to [0, 255]; Equalize spreads a narrow ramp over the range.
  const at::Tensor narrow = (at::arange(4096, at::kLong).reshape({64, 64, 1}) / 256 + 100).to(at::kByte);  // 100..115
  const at::Tensor ac = rand_augment_op(narrow, "AutoContrast", 0, 1);
  EXPECT_EQ(ac.min().item<int>(), 0);
  EXPECT_EQ(ac.max().item<int>(), 255);
  const at::Tensor eq = rand_augment_op(narrow, "Equalize", 0, 1);
  EXPECT_EQ(eq.min().item<int>(), 0);  // PIL: step = (4096 − 256) // 255 = 15, lut[100] = 7 // 15, lut[115] = 255
  EXPECT_EQ(eq.max().item<int>(), 255);
  EXPECT_TRUE(rand_augment_op(narrow.narrow(0, 0, 1).narrow(1, 0, 16), "Equalize", 0, 1)
                  .equal(narrow.narrow(0, 0, 1).narrow(1, 0, 16)));  // one value only: unchanged
  EXPECT_THROW(rand_augment_op(img, "Smear", 5, 1), UserError);
}

#ifdef MOH_WITH_OPENCV
// The loops (lookup tables built by the reference on the 256 values; Color and Sharpness per pixel) give the bytes
// of the whole-tensor reference for every operation, magnitude and sign, on noise, a smooth ramp and grey images.
TEST(Augment, RandAugmentLoopsEqualReference) {
  at::manual_seed(11);
  const std::vector<at::Tensor> images{at::randint(0, 256, {29, 31, 3}, at::kByte), test_image(24, 20, 3),
                                       at::randint(40, 90, {17, 13, 3}, at::kByte),  // narrow range: AutoContrast
                                       at::randint(0, 256, {19, 23, 1}, at::kByte), at::full({6, 5, 3}, 77, at::kByte)};
  for (const bool inc : {false, true})
    for (const auto& op : rand_augment_ops(inc))
      for (const double m : {0.0, 3.7, 9.0, 10.0})
        for (const int sign : {-1, 1})
          for (size_t i = 0; i < images.size(); ++i)
            EXPECT_TRUE(
                rand_augment_op(images[i], op, m, sign).equal(rand_augment_op_reference(images[i], op, m, sign)))
                << op << " m " << m << " sign " << sign << " image " << i;
}

TEST(Augment, GeometricOperations) {
  const at::Tensor img = test_image(20, 20, 3);
  // TranslateXRel at m = 10: 0.45 · 20 = 9 pixels; output column x shows input column x + 9, the rest is the fill.
  const at::Tensor t = rand_augment_op(img, "TranslateXRel", 10, 1);
  EXPECT_TRUE(t.narrow(1, 0, 11).equal(img.narrow(1, 9, 11)));
  EXPECT_EQ(t[0][15][0].item<int>(), 124);
  EXPECT_EQ(t[0][15][2].item<int>(), 104);
  const at::Tensor ty = rand_augment_op(img, "TranslateYRel", 10, -1);  // 9 pixels down
  EXPECT_TRUE(ty.narrow(0, 9, 11).equal(img.narrow(0, 0, 11)));
  // Rotation by 30° keeps the centre pixel's neighbourhood roughly and changes the corners to fill.
  const at::Tensor r = rand_augment_op(img, "Rotate", 10, 1);
  EXPECT_EQ(r.sizes(), img.sizes());
  EXPECT_EQ(r[0][0][0].item<int>(), 124);
  for (const auto& op : rand_augment_ops(true)) EXPECT_EQ(rand_augment_op(img, op, 9, -1).sizes(), img.sizes()) << op;
}

TEST(Augment, RandAugmentIsDeterministicUnderASeed) {
  const at::Tensor img = test_image(32, 32, 3);
  const RandAugmentSpec spec = RandAugmentSpec::parse("rand-m9-mstd0.5-inc1", "t");
  int changed = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    AugRng a(seed), b(seed);
    const at::Tensor x = rand_augment(img, spec, a), y = rand_augment(img, spec, b);
    EXPECT_TRUE(x.equal(y));
    changed += !x.equal(img);
  }
  EXPECT_GT(changed, 10);  // two ops at p = 0.5 each: about 3/4 of the images change
}

TEST(Augment, RandomResizedCropBoxes) {
  SampleTransformOptions o;
  AugRng rng(3);
  for (int i = 0; i < 2000; ++i) {
    const auto [top, left, h, w] = random_resized_crop_box(300, 400, o, rng);
    ASSERT_GE(top, 0);
    ASSERT_GE(left, 0);
    ASSERT_LE(top + h, 300);
    ASSERT_LE(left + w, 400);
    const double area = static_cast<double>(h * w) / (300.0 * 400.0), ratio = static_cast<double>(w) / h;
    ASSERT_GE(area, 0.07);
    ASSERT_LE(area, 1.0);
    ASSERT_GE(ratio, 0.74);
    ASSERT_LE(ratio, 1.35);
  }
  // A 2×100 strip never fits a crop of ratio ≤ 4/3 by sampling: the fallback keeps the full height, centred.
  const auto [top, left, h, w] = random_resized_crop_box(2, 100, o, rng);
  EXPECT_EQ(h, 2);
  EXPECT_EQ(w, 3);
  EXPECT_EQ(top, 0);
  EXPECT_EQ(left, 48);
}

TEST(Augment, TrainAndEvalTransforms) {
  SampleTransformOptions o;
  o.size = 32;
  o.rand_augment = RandAugmentSpec::parse("rand-m9-mstd0.5-inc1", "t");
  o.erase_prob = 0.25;
  const at::Tensor img = test_image(60, 80, 3);
  AugRng a(11), b(11);
  const at::Tensor x = train_transform(img, o, a);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{3, 32, 32}));
  EXPECT_TRUE(x.equal(train_transform(img, o, b)));
  // Eval: constant image → constant normalised value; 60×80 is resized to 36×48 (short side 32/0.875 = 36), cropped.
  const at::Tensor flat = at::full({60, 80, 3}, 255, at::kByte);
  const at::Tensor e = eval_transform(flat, o);
  EXPECT_EQ(e.sizes(), (at::IntArrayRef{3, 32, 32}));
  EXPECT_NEAR(e[0][5][5].item<double>(), (1.0 - kImageNetMean[0]) / kImageNetStd[0], 1e-5);
  EXPECT_NEAR(e[2][31][0].item<double>(), (1.0 - kImageNetMean[2]) / kImageNetStd[2], 1e-5);
  // Crop + resize + flip = the pieces composed by hand with the same draws (box, then the flip coin), flips included;
  // an image already at the size is flipped without touching the caller's tensor.
  SampleTransformOptions plain;
  plain.size = 32;
  plain.mean = {0, 0, 0};
  plain.std = {1, 1, 1};
  int flipped = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    AugRng r(seed), r2(seed);
    const at::Tensor got = ((train_transform(img, plain, r) * 255).round().to(at::kByte)).permute({1, 2, 0});
    const auto [top, left, h, w] = random_resized_crop_box(60, 80, plain, r2);
    const bool flip = std::uniform_real_distribution<double>(0, 1)(r2) < plain.hflip;
    flipped += flip;
    const at::Tensor want = resize_bicubic_reference(img.narrow(0, top, h).narrow(1, left, w).contiguous(), 32, 32);
    EXPECT_TRUE(got.equal(flip ? want.flip(1) : want)) << seed;
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 12);
  plain.random_resized_crop = false;
  const at::Tensor sq = test_image(32, 32, 3), before = sq.clone();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    AugRng r(seed);
    train_transform(sq, plain, r);
  }
  EXPECT_TRUE(sq.equal(before));
  // A grey image keeps one channel.
  SampleTransformOptions g = o;
  g.mean = {0.5};
  g.std = {0.5};
  AugRng c(1);
  EXPECT_EQ(train_transform(test_image(40, 40, 1), g, c).sizes(), (at::IntArrayRef{1, 32, 32}));
}
#endif

TEST(Augment, RandomErasing) {
  at::Tensor x = at::zeros({3, 40, 40});
  AugRng rng(5);
  random_erase_(x, 0.0, rng);
  EXPECT_EQ(x.count_nonzero().item<int64_t>(), 0);
  int erased = 0;
  for (int i = 0; i < 50; ++i) {
    at::Tensor y = at::zeros({3, 40, 40});
    random_erase_(y, 1.0, rng);
    const double frac = static_cast<double>(y.ne(0).any(0).sum().item<int64_t>()) / 1600.0;
    if (frac > 0) {
      ++erased;
      EXPECT_GE(frac, 0.015);
      EXPECT_LE(frac, 0.34);
      EXPECT_NEAR(y.ne(0).any(0).to(at::kFloat).sum().item<double>(),
                  y.ne(0).all(0).to(at::kFloat).sum().item<double>(), 0);
    }
  }
  EXPECT_GE(erased, 45);  // ten attempts per image almost always find a box
  // The noise is standard normal: moments and tail masses of ~10^6 values (mean ± 0.005, std ± 0.005, the tails within
  // 5 standard errors), and a non-contiguous image gets the same kind of noise through the copy.
  std::vector<at::Tensor> values;
  for (int i = 0; i < 60; ++i) {
    at::Tensor z = at::zeros({3, 200, 200});
    random_erase_(z, 1.0, rng);
    values.push_back(z.masked_select(z.ne(0)));
  }
  at::Tensor t = at::zeros({3, 200, 200}).transpose(1, 2);
  random_erase_(t, 1.0, rng);
  values.push_back(t.masked_select(t.ne(0)));
  const at::Tensor v = at::cat(values).to(at::kDouble);
  const double n = static_cast<double>(v.numel());
  ASSERT_GT(n, 5e5);
  EXPECT_NEAR(v.mean().item<double>(), 0.0, 0.005);
  EXPECT_NEAR(v.std().item<double>(), 1.0, 0.005);
  const double p2 = v.abs().gt(2.0).sum().item<double>() / n, p3 = v.abs().gt(3.0).sum().item<double>() / n;
  EXPECT_NEAR(p2, 0.0455, 5 * std::sqrt(0.0455 / n));
  EXPECT_NEAR(p3, 0.0027, 5 * std::sqrt(0.0027 / n));
  EXPECT_GT(v.abs().max().item<double>(), 4.0);
}

TEST(Augment, MixupAndCutmixTargets) {
  const int64_t B = 6, K = 5;
  const at::Tensor y = at::tensor({0, 1, 2, 3, 4, 0}, at::kLong);
  auto batch = [&] {  // image i is the constant i + 1
    return (at::arange(1, B + 1, at::kFloat).view({B, 1, 1, 1}) * at::ones({B, 2, 8, 8})).contiguous();
  };
  MixupOptions m;
  m.mixup_alpha = 0.8;
  m.label_smoothing = 0.1;
  m.num_classes = K;
  AugRng rng(7);
  at::Tensor x = batch();
  at::Tensor t = mixup_batch_(x, y, m, rng);
  EXPECT_TRUE(at::allclose(t.sum(1), at::ones({B})));
  // Mixup: x_i = λ·x_i + (1 − λ)·x_{B−1−i}; recover λ from image 0 (values 1 and 6) and check the targets.
  const double lam = (x[0][0][0][0].item<double>() - 6.0) / (1.0 - 6.0);
  EXPECT_GT(lam, 0.0);
  EXPECT_LT(lam, 1.0);
  const double off = 0.1 / K, on = 1 - 0.1 + off;
  EXPECT_NEAR(t[1][1].item<double>(), lam * on + (1 - lam) * off, 1e-6);
  EXPECT_NEAR(t[1][4].item<double>(), lam * off + (1 - lam) * on, 1e-6);  // partner of 1 is 4 (label 4)
  // CutMix: the fraction of pixels from the partner equals 1 − λ of the targets.
  MixupOptions c = m;
  c.mixup_alpha = 0;
  c.cutmix_alpha = 1.0;
  for (int rep = 0; rep < 20; ++rep) {
    at::Tensor xc = batch();
    const at::Tensor tc = mixup_batch_(xc, y, c, rng);
    const double pasted = xc[1].eq(5).to(at::kFloat).mean().item<double>();  // image 1 (label 1) pairs with image 4
    const double lam_c = (tc[1][1].item<double>() - off) / (on - off);
    EXPECT_NEAR(pasted, 1.0 - lam_c, 1e-6);
    EXPECT_TRUE(at::allclose(tc.sum(1), at::ones({B})));
  }
  // Off: plain smoothed one-hot targets, images untouched.
  MixupOptions none;
  none.num_classes = K;
  at::Tensor xn = batch();
  const at::Tensor tn = mixup_batch_(xn, y, none, rng);
  EXPECT_TRUE(xn.equal(batch()));
  EXPECT_NEAR(tn[2][2].item<double>(), 0.9 + 0.1 / K, 1e-6);
}

TEST(Augment, RepeatedAugmentationSampler) {
  const std::vector<int64_t> one = repeated_order(600, 3, 1, 0, true, 0, 1);
  ASSERT_EQ(one.size(), 512u);  // ⌊600 / 256⌋ · 256
  for (size_t i = 0; i + 2 < one.size(); i += 3) {
    EXPECT_EQ(one[i], one[i + 1]);
    EXPECT_EQ(one[i], one[i + 2]);
  }
  // Two ranks: 256 each; together the first 2·256 of the same repeated sequence (strided).
  const auto r0 = repeated_order(600, 3, 1, 0, true, 0, 2), r1 = repeated_order(600, 3, 1, 0, true, 1, 2);
  ASSERT_EQ(r0.size(), 256u);
  ASSERT_EQ(r1.size(), 256u);
  const auto full = repeated_order(600, 3, 1, 0, true, 0, 1);
  for (size_t i = 0; i < 256; ++i) {
    EXPECT_EQ(r0[i], full[2 * i]);
    EXPECT_EQ(r1[i], full[2 * i + 1]);
  }
  EXPECT_NE(repeated_order(600, 3, 1, 1, true, 0, 1), one);  // a new epoch reshuffles
  EXPECT_EQ(repeated_order(10, 1, 1, 0, false, 0, 1).size(), 10u);
}

#ifdef MOH_WITH_OPENCV
TEST(Augment, StreamLoaderOrderResumeAndCorruptFiles) {
  test::TempDir d;
  ImageSet set{(at::arange(10 * 24 * 24 * 3, at::kLong).reshape({10, 24, 24, 3}) * 7 % 253).to(at::kByte),
               at::tensor({0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, at::kLong)};
  write_image_folder(d.file("tree/train"), set, {"a", "b"});
  d.write("tree/train/b/zz_bad.jpg", "not an image");
  const ImageFolderIndex index = scan_image_folder(d.file("tree"), "train");
  ASSERT_EQ(index.files.size(), 11u);
  SampleTransformOptions tf;
  tf.size = 16;
  tf.rand_augment = RandAugmentSpec::parse("rand-m9-mstd0.5-inc1", "t");
  StreamOptions o;
  o.batch_size = 3;
  o.seed = 4;
  o.epoch = 2;
  o.workers = 3;
  o.max_bad_fraction = 0.2;
  auto all = [&](StreamOptions opt) {
    StreamLoader l(index, tf, opt);
    std::vector<std::pair<at::Tensor, at::Tensor>> out;
    at::Tensor x, y;
    while (l.next(x, y)) out.emplace_back(x, y);
    return std::make_pair(out, l.bad_files());
  };
  const auto [a, bad_a] = all(o);
  ASSERT_EQ(a.size(), 3u);  // 11 files, batches of 3, last partial dropped
  EXPECT_EQ(a[0].first.sizes(), (at::IntArrayRef{3, 3, 16, 16}));
  StreamOptions single = o;
  single.workers = 1;
  const auto [b, bad_b] = all(single);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].first.equal(b[i].first)) << i;  // thread count does not change batches
    EXPECT_TRUE(a[i].second.equal(b[i].second)) << i;
  }
  // Batch tensors are reused once the consumer lets go of them: batches (or views of them) still held stay intact,
  // and batches copied and dropped at once equal them.
  StreamOptions small = single;
  small.batch_size = 1;
  small.prefetch = 1;
  const auto [held, bad_h] = all(small);
  std::vector<at::Tensor> views, copies;
  {
    StreamLoader l(index, tf, small);
    at::Tensor x, y;
    for (int i = 0; l.next(x, y); ++i) {
      copies.push_back(x.clone());
      // Held storage must not be reused: a detached alias (its own TensorImpl, no link to x) and a narrowed view.
      if (i % 3 == 0) views.push_back(x.detach());
      if (i % 3 == 1) views.push_back(x.narrow(1, 1, 1));
    }
  }
  ASSERT_EQ(copies.size(), held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_TRUE(copies[i].equal(held[i].first)) << i;
    if (i % 3 == 0) {
      EXPECT_TRUE(views[i / 3 * 2].equal(held[i].first)) << i;
    } else if (i % 3 == 1) {
      EXPECT_TRUE(views[i / 3 * 2 + 1].equal(held[i].first.narrow(1, 1, 1))) << i;
    }
  }
  StreamOptions resumed = o;
  resumed.start_batch = 1;
  const auto [c, bad_c] = all(resumed);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(c[0].first.equal(a[1].first));
  EXPECT_TRUE(c[1].first.equal(a[2].first));
  EXPECT_LE(bad_a, 1);  // the unreadable file is replaced when it falls into the used part of the epoch
  StreamOptions ev = o;
  ev.train = false;
  ev.drop_last = false;
  const auto [e, bad_e] = all(ev);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(bad_e, 1);
  EXPECT_EQ(e[0].second[0].item<int64_t>(), 0);
  StreamOptions strict = ev;
  strict.max_bad_fraction = 0.05;  // 1 of 11 files is more than 5 %: the epoch is refused, not silently patched
  EXPECT_THROW(all(strict), UserError);
}
#endif

}  // namespace
}  // namespace moh::datasets
