// Pillow-exact bicubic resizing and affine transforms: the vectorised windowed path against the per-pixel reference on
// many shapes, both against Pillow 13.0.0 itself (tests/fixtures/pillow/bicubic.safetensors, made by
// tests/fixtures/gen/make_pillow.py), and the evaluation transform against torchvision's Resize + CenterCrop.
#include <random>

#include "core/io/safetensors.h"
#include "datasets/affine.h"
#include "datasets/augment.h"
#include "datasets/image_folder.h"
#include "datasets/resample.h"
#include "tests/test_util.h"

namespace moh::datasets {
namespace {

at::Tensor noisy_image(std::mt19937& rng, int64_t H, int64_t W, int64_t C) {
  at::Tensor t = at::empty({H, W, C}, at::kByte);
  uint8_t* p = t.data_ptr<uint8_t>();
  std::uniform_int_distribution<int> u(0, 255);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>(u(rng));
  return t;
}

SafetensorsFile pillow_fixture() {
  return load_safetensors(test::source_path("tests/fixtures/pillow/bicubic.safetensors"));
}

TEST(Resample, FastPathEqualsReferenceOnManyShapes) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> size(1, 90);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t C = trial % 3 == 0 ? 1 : 3, H = size(rng), W = size(rng);
    const int64_t oh = trial % 5 == 0 ? H : size(rng), ow = trial % 7 == 0 ? W : size(rng);  // one-axis cases too
    const at::Tensor img = noisy_image(rng, H, W, C);
    const at::Tensor ref = resize_bicubic_reference(img, oh, ow);
    EXPECT_TRUE(resize_bicubic(img, oh, ow).equal(ref)) << H << "x" << W << "x" << C << " -> " << oh << "x" << ow;
    // The flip folded into the resize (or applied after it, when the width does not change) = flipping the result.
    EXPECT_TRUE(resize_bicubic(img, oh, ow, {}, true).equal(ref.flip(1)))
        << "mirrored " << H << "x" << W << "x" << C << " -> " << oh << "x" << ow;
  }
}

TEST(Resample, CropViewsAndWindowsAreExact) {
  std::mt19937 rng(5);
  const at::Tensor big = noisy_image(rng, 70, 90, 3);
  // A crop read in place (row stride of the big image) = the same crop made contiguous.
  const at::Tensor crop = big.narrow(0, 7, 41).narrow(1, 13, 55);
  ASSERT_FALSE(crop.is_contiguous());
  EXPECT_TRUE(resize_bicubic(crop, 32, 32).equal(resize_bicubic_reference(crop.contiguous(), 32, 32)));
  // Any window of the output = that window of the whole output (each output pixel has its own taps).
  const at::Tensor full = resize_bicubic_reference(big, 47, 61);
  for (const PixelWindow w : {PixelWindow{0, 0, 47, 61}, PixelWindow{8, 15, 32, 32}, PixelWindow{46, 60, 1, 1},
                              PixelWindow{0, 29, 47, 1}, PixelWindow{5, 0, 3, 61}}) {
    EXPECT_TRUE(resize_bicubic(big, 47, 61, w).equal(full.narrow(0, w.top, w.height).narrow(1, w.left, w.width)))
        << w.top << "," << w.left << " " << w.height << "x" << w.width;
  }
  // Windows of one-axis resizes and of no resize at all.
  EXPECT_TRUE(resize_bicubic(big, 70, 33, {10, 4, 20, 20})
                  .equal(resize_bicubic_reference(big, 70, 33).narrow(0, 10, 20).narrow(1, 4, 20)));
  EXPECT_TRUE(resize_bicubic(big, 31, 90, {1, 50, 20, 20})
                  .equal(resize_bicubic_reference(big, 31, 90).narrow(0, 1, 20).narrow(1, 50, 20)));
  EXPECT_TRUE(resize_bicubic(big, 70, 90, {3, 4, 5, 6}).equal(big.narrow(0, 3, 5).narrow(1, 4, 6)));
  EXPECT_TRUE(resize_bicubic(crop, 32, 32, {2, 3, 20, 25}, true)
                  .equal(resize_bicubic_reference(crop.contiguous(), 32, 32)
                             .narrow(0, 2, 20)
                             .narrow(1, 3, 25)
                             .flip(1)));  // window, mirrored
  EXPECT_THROW(resize_bicubic(big, 47, 61, {40, 0, 8, 61}), c10::Error);
}

TEST(Resample, MatchesPillowBitForBit) {
  const SafetensorsFile f = pillow_fixture();
  int cases = 0;
  for (int i = 0; f.tensors.count("in_" + std::to_string(i)); ++i, ++cases) {
    const at::Tensor in = f.tensors.at("in_" + std::to_string(i)), want = f.tensors.at("out_" + std::to_string(i));
    EXPECT_TRUE(resize_bicubic(in, want.size(0), want.size(1)).equal(want)) << "case " << i;
    EXPECT_TRUE(resize_bicubic_reference(in, want.size(0), want.size(1)).equal(want)) << "case " << i;
  }
  EXPECT_EQ(cases, 6);
}

TEST(Resample, EvalTransformMatchesTorchvision) {
  // Resize(37, BICUBIC) + CenterCrop(32) of a 75 x 105 image; the crop offsets 2.5 / 9.5 round half to even as
  // Python's round does. Identity normalisation, so the floats are the pixels / 255.
  const SafetensorsFile f = pillow_fixture();
  SampleTransformOptions o;
  o.size = 32;
  o.crop_pct = 0.86;  // floor(32 / 0.86) = 37
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  const at::Tensor x = eval_transform(f.tensors.at("eval_in"), o);  // (3, 32, 32)
  const at::Tensor pixels = (x * 255).round().to(at::kByte).permute({1, 2, 0});
  EXPECT_TRUE(pixels.equal(f.tensors.at("eval_out")));
}

TEST(Resample, BoxAndCenterCropArrMatchPillowBitForBit) {
  const SafetensorsFile f = load_safetensors(test::source_path("tests/fixtures/pillow/box.safetensors"));
  int cases = 0, crops = 0;
  for (int i = 0; f.tensors.count("in_" + std::to_string(i)); ++i, ++cases) {
    const at::Tensor in = f.tensors.at("in_" + std::to_string(i)), want = f.tensors.at("out_" + std::to_string(i));
    EXPECT_TRUE(resize_pillow(in, want.size(0), want.size(1), PillowFilter::kBox).equal(want)) << "case " << i;
    EXPECT_TRUE(resize_pillow_reference(in, want.size(0), want.size(1), PillowFilter::kBox).equal(want))
        << "case " << i;
  }
  // ADM's center_crop_arr: BOX halvings, then the bicubic resize's centre window.
  for (int j = 0; f.tensors.count("crop_in_" + std::to_string(j)); ++j, ++crops) {
    const at::Tensor in = f.tensors.at("crop_in_" + std::to_string(j)),
                     want = f.tensors.at("crop_out_" + std::to_string(j));
    const int64_t size = f.tensors.at("crop_size_" + std::to_string(j)).item<int64_t>();
    EXPECT_TRUE(center_crop_arr(in, size).equal(want)) << "crop case " << j;
  }
  EXPECT_EQ(cases, 6);
  EXPECT_EQ(crops, 5);
  // The fast path equals the reference with BOX on many shapes too.
  std::mt19937 rng(13);
  std::uniform_int_distribution<int64_t> sz(1, 70);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t H = sz(rng), W = sz(rng), oh = sz(rng), ow = sz(rng);
    const at::Tensor img = noisy_image(rng, H, W, 3);
    EXPECT_TRUE(
        resize_pillow(img, oh, ow, PillowFilter::kBox).equal(resize_pillow_reference(img, oh, ow, PillowFilter::kBox)))
        << H << "x" << W << " -> " << oh << "x" << ow;
  }
}

constexpr std::array<uint8_t, 3> kFill{124, 116, 104};

TEST(Affine, FastPathEqualsReference) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int64_t> size(1, 60);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int trial = 0; trial < 80; ++trial) {
    const int64_t H = size(rng), W = size(rng);
    const at::Tensor img = noisy_image(rng, H, W, 3);
    AffineCoeffs a;
    switch (trial % 6) {  // RandAugment's kinds (dy = 0, dx = 0, both, neither), integer shifts, a general map
      case 0:
        a = pil_rotate_coeffs(30 * u(rng), H, W);
        break;
      case 1:
        a = {1, 0.3 * u(rng), 0, 0, 1, 0};
        break;
      case 2:
        a = {1, 0, 0, 0.3 * u(rng), 1, 0};
        break;
      case 3:
        a = {1, 0, 0.45 * static_cast<double>(W) * u(rng), 0, 1, 0};
        break;
      case 4:
        a = {1, 0, std::round(8 * u(rng)), 0, 1, std::round(8 * u(rng))};
        break;
      default:
        a = {1 + 0.2 * u(rng), 0.3 * u(rng), 3 * u(rng), 0.3 * u(rng), 1 + 0.2 * u(rng), 3 * u(rng)};
    }
    EXPECT_TRUE(affine_bicubic(img, a, kFill).equal(affine_bicubic_reference(img, a, kFill)))
        << "trial " << trial << " " << H << "x" << W;
  }
  // A rotation by 0 / 90 / 180 degrees lands on pixel centres: the pixels themselves, moved.
  const at::Tensor sq = noisy_image(rng, 16, 16, 3);
  EXPECT_TRUE(affine_bicubic(sq, pil_rotate_coeffs(0, 16, 16), kFill).equal(sq));
  EXPECT_TRUE(affine_bicubic(sq, pil_rotate_coeffs(180, 16, 16), kFill).equal(sq.flip({0, 1})));
  EXPECT_TRUE(affine_bicubic(sq, pil_rotate_coeffs(-270, 16, 16), kFill).equal(sq.transpose(0, 1).flip(0)));
}

TEST(Affine, MatchesPillowBitForBit) {
  // Image.rotate / Image.transform(AFFINE) with BICUBIC and timm's fill colour, written by Pillow 13.0.0
  // (tests/fixtures/gen/make_pillow_affine.py): rotations both ways, shears, translations, grey images.
  const SafetensorsFile f = load_safetensors(test::source_path("tests/fixtures/pillow/affine.safetensors"));
  int cases = 0;
  for (int i = 0; f.tensors.count("in_" + std::to_string(i)); ++i, ++cases) {
    const std::string k = std::to_string(i);
    const at::Tensor in = f.tensors.at("in_" + k), want = f.tensors.at("out_" + k);
    AffineCoeffs a;
    if (f.tensors.count("angle_" + k)) {
      a = pil_rotate_coeffs(f.tensors.at("angle_" + k).item<double>(), in.size(0), in.size(1));
    } else {
      const at::Tensor c = f.tensors.at("coeffs_" + k);
      for (int j = 0; j < 6; ++j) a[static_cast<size_t>(j)] = c[j].item<double>();
    }
    EXPECT_TRUE(affine_bicubic_reference(in, a, kFill).equal(want)) << "case " << i;
    EXPECT_TRUE(affine_bicubic(in, a, kFill).equal(want)) << "case " << i;
  }
  EXPECT_EQ(cases, 13);
}

}  // namespace
}  // namespace moh::datasets
