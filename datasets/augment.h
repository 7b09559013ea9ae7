#pragma once
// The ImageNet training and evaluation transforms of the TransNeXt / MoH-ViT recipe (timm create_transform as the
// official code configures it), written for this toolkit:
//   train  RandomResizedCrop (scale 0.08–1, ratio 3/4–4/3, bicubic) → horizontal flip → RandAugment
//          "rand-m9-mstd0.5-inc1" (2 ops of 15, each applied with p = 0.5, magnitude ~ N(9, 0.5) clipped to [0, 10],
//          geometric fill = ImageNet mean) → normalise → random erasing (p 0.25, per-pixel normal values)
//   eval   resize the short side to size / crop_pct (bicubic) → centre crop → normalise
//   batch  Mixup (α 0.8) / CutMix (α 1.0) with switch probability 0.5, one λ per batch mixed with the reversed batch,
//          label smoothing folded into the soft targets (timm Mixup, mode "batch", correct_lam)
// Every random draw comes from a generator the caller seeds per (seed, epoch, sample), so results do not depend on
// threads. Images are uint8 HWC (1 or 3 channels); outputs are float CHW. The resizes are Pillow's bicubic bit for bit
// (datasets/resample.h), as torchvision / timm compute them on PIL images, and so are RandAugment's geometric
// operations (PIL's bicubic affine transform and rotate, datasets/affine.h).
#include <ATen/ATen.h>

#include <array>
#include <random>
#include <string>
#include <vector>

namespace moh::datasets {

using AugRng = std::mt19937_64;

/// ImageNet statistics (pixels scaled to [0, 1]).
constexpr std::array<double, 3> kImageNetMean{0.485, 0.456, 0.406};
constexpr std::array<double, 3> kImageNetStd{0.229, 0.224, 0.225};

/// RandAugment settings parsed from timm's string form ("rand-m9-mstd0.5-inc1", "rand-n3-m10", "" = off).
struct RandAugmentSpec {
  bool enabled = false;
  int num_ops = 2;           ///< n: operations per image
  double magnitude = 10;     ///< m in [0, 10]
  double magnitude_std = 0;  ///< mstd: Gaussian noise on m per op (0 = fixed)
  bool increasing = false;   ///< inc1: the "increasing" op set (stronger with m for every op)
  double prob = 0.5;         ///< each chosen op is applied with this probability
  /// Parses timm's string; an unknown part is a UserError naming it.
  static RandAugmentSpec parse(const std::string& spec, const std::string& origin);
};

/// Per-sample transform settings.
struct SampleTransformOptions {
  int64_t size = 224;
  bool random_resized_crop = true;
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  double hflip = 0.5;  ///< probability
  RandAugmentSpec rand_augment;
  double erase_prob = 0.0;  ///< random erasing probability (mode "pixel", one box)
  double crop_pct = 0.875;  ///< eval: short side resized to size / crop_pct, then centre-cropped
  std::vector<double> mean{kImageNetMean.begin(), kImageNetMean.end()};
  std::vector<double> std{kImageNetStd.begin(), kImageNetStd.end()};
};

/// torchvision RandomResizedCrop.get_params: the crop box (top, left, height, width) of an H×W image.
std::array<int64_t, 4> random_resized_crop_box(int64_t H, int64_t W, const SampleTransformOptions& o, AugRng& rng);

/// The training transform of one decoded image (H, W, C) uint8 → (C, size, size) float, normalised. With `out` (a
/// contiguous float (C, size, size) tensor, e.g. one row of a batch) the result is written there and returned.
at::Tensor train_transform(const at::Tensor& image, const SampleTransformOptions& o, AugRng& rng, at::Tensor out = {});

/// The evaluation transform (resize short side to size / crop_pct, centre crop) → (C, size, size) float, normalised;
/// `out` as for train_transform.
at::Tensor eval_transform(const at::Tensor& image, const SampleTransformOptions& o, at::Tensor out = {});

/// Applies RandAugment to an (H, W, C) uint8 image (returns a new image of the same shape).
at::Tensor rand_augment(const at::Tensor& image, const RandAugmentSpec& spec, AugRng& rng);

/// One RandAugment operation by name at magnitude m ∈ [0, 10] (sign = ±1 for the signed ones), for tests and
/// inspection: AutoContrast, Equalize, Invert, Rotate, Posterize[Increasing], Solarize[Increasing], SolarizeAdd,
/// Color/Contrast/Brightness/Sharpness[Increasing], ShearX, ShearY, TranslateXRel, TranslateYRel.
/// Plain loops: pointwise operations as lookup tables built by the reference on the 256 values, Color and Sharpness
/// per pixel (vectorised), the geometric ones by `affine_bicubic`; the bytes equal `rand_augment_op_reference`
/// (tested).
at::Tensor rand_augment_op(const at::Tensor& image, const std::string& op, double magnitude, int sign);
/// The same operation as whole-tensor LibTorch expressions (and `affine_bicubic_reference`): the reference of the
/// loops above.
at::Tensor rand_augment_op_reference(const at::Tensor& image, const std::string& op, double magnitude, int sign);
/// The op names of the standard (false) or increasing (true) set, in timm's order.
const std::vector<std::string>& rand_augment_ops(bool increasing);

/// timm RandomErasing (mode "pixel", count 1, area 2 %–1/3, log aspect 0.3–3.3) on a normalised (C, H, W) float
/// image, in place, with probability p.
void random_erase_(at::Tensor& image, double p, AugRng& rng);

/// Mixup / CutMix settings (timm Mixup, mode "batch").
struct MixupOptions {
  double mixup_alpha = 0.0, cutmix_alpha = 0.0;
  double prob = 1.0, switch_prob = 0.5;
  double label_smoothing = 0.1;
  int64_t num_classes = 1000;
  bool enabled() const { return (mixup_alpha > 0 || cutmix_alpha > 0) && prob > 0; }
};

/// Mixes a batch x (B, C, H, W) in place with its reverse and returns the soft targets (B, classes): smoothed one-hot
/// of y weighted λ plus that of the reversed labels weighted 1 − λ (λ corrected to the pasted area for CutMix).
at::Tensor mixup_batch_(at::Tensor& x, const at::Tensor& y, const MixupOptions& o, AugRng& rng);

}  // namespace moh::datasets
