#include "datasets/augment.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/parse.h"
#include "datasets/affine.h"
#include "datasets/resample.h"

namespace moh::datasets {

namespace {

constexpr double kMaxLevel = 10.0;

double uniform(AugRng& rng, double a, double b) {
  return std::uniform_real_distribution<double>(a, b)(rng);
}
int64_t randint(AugRng& rng, int64_t lo, int64_t hi_inclusive) {
  return std::uniform_int_distribution<int64_t>(lo, hi_inclusive)(rng);
}

// Three float planes (x · scale[c] + shift[c]) from n interleaved RGB pixels, in one pass; compiled for AVX2 too,
// where the byte de-interleaving vectorises well (the same float operations, so the same values).
__attribute__((target_clones("avx2", "default"))) void normalise_rgb_planes(const uint8_t* __restrict s,
                                                                            float* __restrict d, int64_t n,
                                                                            const float* scale, const float* shift) {
  const float s0 = scale[0], s1 = scale[1], s2 = scale[2], t0 = shift[0], t1 = shift[1], t2 = shift[2];
  float* __restrict d0 = d;
  float* __restrict d1 = d + n;
  float* __restrict d2 = d + 2 * n;
  for (int64_t i = 0; i < n; ++i) {
    d0[i] = static_cast<float>(s[3 * i]) * s0 + t0;
    d1[i] = static_cast<float>(s[3 * i + 1]) * s1 + t1;
    d2[i] = static_cast<float>(s[3 * i + 2]) * s2 + t2;
  }
}

// Normalised float (C, S, S) from a uint8 (S, S, C) image. A plain loop: loader worker threads call this, and an
// ATen kernel here could start OpenMP teams that compete with the training step for the cores.
at::Tensor to_normalised_chw(const at::Tensor& hwc, const SampleTransformOptions& o, at::Tensor out) {
  const at::Tensor src = hwc.contiguous();
  const int64_t H = src.size(0), W = src.size(1), C = src.size(2);
  if (!out.defined()) out = at::empty({C, H, W}, at::kFloat);
  TORCH_CHECK(out.sizes() == at::IntArrayRef({C, H, W}) && out.scalar_type() == at::kFloat && out.is_contiguous(),
              "transform: the output slot is not a contiguous float (", C, ", ", H, ", ", W, ") tensor");
  const uint8_t* s = src.data_ptr<uint8_t>();
  float* d = out.data_ptr<float>();
  float scale[3], shift[3];
  for (int64_t c = 0; c < C && c < 3; ++c) {
    const size_t k = std::min<size_t>(static_cast<size_t>(c), o.mean.size() - 1);
    scale[c] = static_cast<float>(1.0 / (255.0 * o.std[k]));
    shift[c] = static_cast<float>(-o.mean[k] / o.std[k]);
  }
  const int64_t n = H * W;
  if (C == 3) {  // one pass over the pixels, three planes written (the compiler de-interleaves the bytes)
    normalise_rgb_planes(s, d, n, scale, shift);
  } else {
    for (int64_t c = 0; c < C; ++c) {
      const float sc = scale[std::min<int64_t>(c, 2)], sh = shift[std::min<int64_t>(c, 2)];
      for (int64_t i = 0; i < n; ++i) d[c * n + i] = static_cast<float>(s[i * C + c]) * sc + sh;
    }
  }
  return out;
}

// timm's geometric operations as PIL affine coefficients (output → input): Rotate (PIL's rotate about the centre),
// ShearX / ShearY (factor level · 0.3), TranslateXRel / TranslateYRel (level · 0.45 of the width / height). False for
// the other operations.
bool geometric_coeffs(const std::string& base, double level, int sign, int64_t H, int64_t W, AffineCoeffs& a) {
  const double s = sign;
  if (base == "Rotate")
    a = pil_rotate_coeffs(s * level * 30.0, H, W);
  else if (base == "ShearX")
    a = {1, s * level * 0.3, 0, 0, 1, 0};
  else if (base == "ShearY")
    a = {1, 0, 0, s * level * 0.3, 1, 0};
  else if (base == "TranslateXRel")
    a = {1, 0, s * level * 0.45 * static_cast<double>(W), 0, 1, 0};
  else if (base == "TranslateYRel")
    a = {1, 0, 0, 0, 1, s * level * 0.45 * static_cast<double>(H)};
  else
    return false;
  return true;
}
constexpr std::array<uint8_t, 3> kFill{124, 116, 104};  // timm's img_mean fill: the ImageNet mean in 0–255

// PIL's grayscale (L = (299 R + 587 G + 114 B) / 1000) as float (H, W, 1).
at::Tensor luminance(const at::Tensor& f) {
  if (f.size(2) == 1) return f;
  return (f.select(2, 0) * 0.299 + f.select(2, 1) * 0.587 + f.select(2, 2) * 0.114).unsqueeze(2);
}

// PIL ImageEnhance: degenerate + factor · (image − degenerate), clipped.
at::Tensor blend(const at::Tensor& degenerate, const at::Tensor& img_f, double factor) {
  return (degenerate + (img_f - degenerate) * factor).clamp(0, 255).round().to(at::kByte).contiguous();
}

// AutoContrast of float pixels f given the per-channel extremes lo / hi (1, 1, C): stretched to [0, 255], floored; a
// flat channel is kept.
at::Tensor autocontrast_map(const at::Tensor& f, const at::Tensor& lo, const at::Tensor& hi) {
  const at::Tensor span = hi - lo;
  const at::Tensor out = ((f - lo) * (255.0 / span.clamp_min(1))).clamp(0, 255).floor();
  return at::where(span > 0, out, f).to(at::kByte).contiguous();
}

// PIL ImageEnhance.Contrast's degenerate value: the rounded mean of the grey image.
double contrast_mean(const at::Tensor& f) {
  return std::floor(luminance(f).mean().item<double>() + 0.5);
}

bool is_increasing(const std::string& op) {
  return op.size() > 10 && op.compare(op.size() - 10, 10, "Increasing") == 0;
}
std::string op_base(const std::string& op) {
  return is_increasing(op) ? op.substr(0, op.size() - 10) : op;
}
// timm's enhance level → factor (the "Increasing" form is signed around 1).
double enhance_factor(bool increasing, double level, int sign) {
  return increasing ? 1.0 + sign * level * 0.9 : level * 1.8 + 0.1;
}

// PIL ImageOps.equalize on one channel.
void equalize_channel(uint8_t* p, int64_t n, int64_t stride) {
  std::array<int64_t, 256> h{};
  for (int64_t i = 0; i < n; ++i) ++h[p[i * stride]];
  int64_t last = 0, total = 0, nonzero = 0;
  for (int64_t v = 0; v < 256; ++v)
    if (h[v]) {
      last = h[v];
      total += h[v];
      ++nonzero;
    }
  if (nonzero <= 1) return;
  const int64_t step = (total - last) / 255;
  if (step == 0) return;
  std::array<uint8_t, 256> lut{};
  int64_t acc = step / 2;
  for (int64_t v = 0; v < 256; ++v) {
    lut[v] = static_cast<uint8_t>(std::min<int64_t>(255, acc / step));
    acc += h[v];
  }
  for (int64_t i = 0; i < n; ++i) p[i * stride] = lut[p[i * stride]];
}

}  // namespace

RandAugmentSpec RandAugmentSpec::parse(const std::string& spec, const std::string& origin) {
  RandAugmentSpec r;
  if (spec.empty() || spec == "none") return r;
  std::stringstream ss(spec);
  std::string part;
  std::getline(ss, part, '-');
  if (part != "rand")
    throw UserError(origin, "RandAugment spec must start with 'rand-', got '" + spec + "'",
                    "e.g. rand-m9-mstd0.5-inc1");
  r.enabled = true;
  while (std::getline(ss, part, '-')) {
    auto value = [&](size_t skip) {
      if (const std::optional<double> v = parse_double(part.substr(skip))) return *v;
      throw UserError(origin, "bad RandAugment part '" + part + "' in '" + spec + "'",
                      "parts: mN, nN, mstdX, incN, pX");
    };
    if (part.rfind("mstd", 0) == 0)
      r.magnitude_std = value(4);
    else if (part.rfind("inc", 0) == 0)
      r.increasing = value(3) != 0;
    else if (part[0] == 'm')
      r.magnitude = value(1);
    else if (part[0] == 'n')
      r.num_ops = static_cast<int>(value(1));
    else if (part[0] == 'p')
      r.prob = value(1);
    else
      throw UserError(origin, "unknown RandAugment part '" + part + "' in '" + spec + "'",
                      "parts: mN, nN, mstdX, incN, pX");
  }
  if (r.num_ops < 1 || r.magnitude < 0 || r.magnitude > kMaxLevel || r.magnitude_std < 0 || r.prob < 0 || r.prob > 1)
    throw UserError(origin, "RandAugment '" + spec + "' out of range", "n ≥ 1, 0 ≤ m ≤ 10, mstd ≥ 0, 0 ≤ p ≤ 1");
  return r;
}

const std::vector<std::string>& rand_augment_ops(bool increasing) {
  static const std::vector<std::string> standard{
      "AutoContrast", "Equalize",   "Invert",    "Rotate", "Posterize", "Solarize",      "SolarizeAdd",  "Color",
      "Contrast",     "Brightness", "Sharpness", "ShearX", "ShearY",    "TranslateXRel", "TranslateYRel"};
  static const std::vector<std::string> inc{"AutoContrast",
                                            "Equalize",
                                            "Invert",
                                            "Rotate",
                                            "PosterizeIncreasing",
                                            "SolarizeIncreasing",
                                            "SolarizeAdd",
                                            "ColorIncreasing",
                                            "ContrastIncreasing",
                                            "BrightnessIncreasing",
                                            "SharpnessIncreasing",
                                            "ShearX",
                                            "ShearY",
                                            "TranslateXRel",
                                            "TranslateYRel"};
  return increasing ? inc : standard;
}

at::Tensor rand_augment_op_reference(const at::Tensor& image, const std::string& op, double m, int sign) {
  const at::Tensor img = image.contiguous();
  const double level = std::clamp(m, 0.0, kMaxLevel) / kMaxLevel;  // timm's level / _LEVEL_DENOM
  const int64_t H = img.size(0), W = img.size(1), C = img.size(2);
  const bool inc = is_increasing(op);
  const std::string base = op_base(op);
  if (base == "AutoContrast") {
    const at::Tensor f = img.to(at::kFloat);
    return autocontrast_map(f, f.amin({0, 1}, true), f.amax({0, 1}, true));  // per channel
  }
  if (base == "Equalize") {
    at::Tensor out = img.clone();
    for (int64_t c = 0; c < C; ++c) equalize_channel(out.data_ptr<uint8_t>() + c, H * W, C);
    return out;
  }
  if (base == "Invert") return (255 - img.to(at::kInt)).to(at::kByte).contiguous();
  if (base == "Posterize") {
    const int bits = inc ? 4 - static_cast<int>(level * 4) : static_cast<int>(level * 4);  // bits kept
    if (bits >= 8) return img.clone();
    const int mask = ~((1 << (8 - std::max(bits, 0))) - 1) & 0xFF;
    return img.bitwise_and(mask).contiguous();
  }
  if (base == "Solarize") {
    const int64_t thresh = inc ? 256 - static_cast<int64_t>(level * 256) : static_cast<int64_t>(level * 256);
    return at::where(img.to(at::kInt) < thresh, img, 255 - img).to(at::kByte).contiguous();
  }
  if (base == "SolarizeAdd") {
    const int64_t add = static_cast<int64_t>(level * 110);
    at::Tensor i = img.to(at::kInt);
    return at::where(i < 128, (i + add).clamp_max(255), i).to(at::kByte).contiguous();
  }
  const at::Tensor f = img.to(at::kFloat);
  const double factor = enhance_factor(inc, level, sign);
  if (base == "Color") return C == 1 ? img.clone() : blend(luminance(f), f, factor);
  if (base == "Contrast") return blend(at::full_like(f, contrast_mean(f)), f, factor);
  if (base == "Brightness") return blend(at::zeros_like(f), f, factor);
  if (base == "Sharpness") {
    // PIL ImageFilter.SMOOTH ([[1,1,1],[1,5,1],[1,1,1]] / 13) inside, the original on the 1-pixel border.
    at::Tensor chw = f.permute({2, 0, 1}).unsqueeze(1);  // (C, 1, H, W)
    at::Tensor k = at::ones({1, 1, 3, 3}, at::kFloat);
    k[0][0][1][1] = 5;
    at::Tensor sm = at::conv2d(chw, k / 13.0).round();  // (C, 1, H−2, W−2)
    at::Tensor degenerate = f.clone();
    if (H > 2 && W > 2) degenerate.narrow(0, 1, H - 2).narrow(1, 1, W - 2).copy_(sm.squeeze(1).permute({1, 2, 0}));
    return blend(degenerate, f, factor);
  }
  AffineCoeffs a;
  if (geometric_coeffs(base, level, sign, H, W, a)) return affine_bicubic_reference(img, a, kFill);
  throw UserError("RandAugment", "unknown operation '" + op + "'", "see rand_augment_ops()");
}

namespace {

// lut (256, 1, C) uint8 applied per channel to a contiguous (H, W, C) image.
at::Tensor apply_lut(const at::Tensor& img, const at::Tensor& lut) {
  const int64_t C = img.size(2), n = img.numel() / C;
  at::Tensor out = at::empty_like(img);
  const uint8_t *s = img.data_ptr<uint8_t>(), *l = lut.data_ptr<uint8_t>();
  uint8_t* d = out.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < C; ++c) d[i * C + c] = l[s[i * C + c] * C + c];
  return out;
}

// The 256 values of every channel as a (256, 1, C) image: a pointwise operation applied to it is its lookup table.
at::Tensor value_ramp(int64_t C) {
  return at::arange(256, at::kInt).to(at::kByte).view({256, 1, 1}).expand({256, 1, C}).contiguous();
}

// Rounding half to even of |t| < 2^22, as std::nearbyint in the default rounding mode: adding 1.5 · 2^23 leaves no
// fraction bits, so the addition itself rounds. std::nearbyint is a library call on baseline x86-64.
inline float round_half_even_small(float t) {
  constexpr float kShift = 12582912.f;  // 1.5 · 2^23 (this file is never built with -ffast-math)
  return (t + kShift) - kShift;
}
// The reference's blend for one value: degenerate + (v − degenerate) · factor in float, clamped to [0, 255], rounded
// half to even. Rounded first, then clamped as an integer (the same value: rounding is monotone and 0, 255 are
// integers), so that the loops below have no float compares and vectorise.
inline uint8_t blend_value(float degenerate, float v, float factor) {
  int i = static_cast<int>(round_half_even_small(degenerate + (v - degenerate) * factor));
  i = i < 0 ? 0 : i;
  return static_cast<uint8_t>(i > 255 ? 255 : i);
}

// ImageEnhance.Color on n RGB pixels: the degenerate image is the float luminance of each pixel.
__attribute__((target_clones("avx2", "default"))) void color_pixels(const uint8_t* __restrict s, uint8_t* __restrict d,
                                                                    int64_t n, float fac) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = s + i * 3;
    const float l =
        static_cast<float>(p[0]) * 0.299f + static_cast<float>(p[1]) * 0.587f + static_cast<float>(p[2]) * 0.114f;
    for (int c = 0; c < 3; ++c) d[i * 3 + c] = blend_value(l, static_cast<float>(p[c]), fac);
  }
}

// ImageEnhance.Sharpness on the interior of one row (elements [C, (W − 1)·C) of the flat row): the degenerate value
// is SMOOTH's round(S / 13) of the integer sum S (weights 1 … 5 … 1). S / 13 is never within 1/26 of a half and the
// float product's error is below 1e-3, so this equals the reference's rounded float convolution exactly.
__attribute__((target_clones("avx2", "default"))) void sharpness_row(const uint8_t* __restrict up,
                                                                     const uint8_t* __restrict mid,
                                                                     const uint8_t* __restrict down,
                                                                     uint8_t* __restrict d, int64_t W, int64_t C,
                                                                     float fac) {
  for (int64_t j = C; j < (W - 1) * C; ++j) {
    const int sum =
        up[j - C] + up[j] + up[j + C] + mid[j - C] + 5 * mid[j] + mid[j + C] + down[j - C] + down[j] + down[j + C];
    const float degenerate = round_half_even_small(static_cast<float>(sum) * (1.f / 13.f));
    d[j] = blend_value(degenerate, static_cast<float>(mid[j]), fac);
  }
}

}  // namespace

at::Tensor rand_augment_op(const at::Tensor& image, const std::string& op, double m, int sign) {
  const std::string base = op_base(op);
  const at::Tensor img = image.contiguous();
  const int64_t C = img.size(2), n = img.size(0) * img.size(1);
  // Pointwise operations: the reference applied to the 256 values gives their table.
  if (base == "Invert" || base == "Posterize" || base == "Solarize" || base == "SolarizeAdd" || base == "Brightness")
    return apply_lut(img, rand_augment_op_reference(value_ramp(C), op, m, sign));
  const double level = std::clamp(m, 0.0, kMaxLevel) / kMaxLevel;
  const double factor = enhance_factor(is_increasing(op), level, sign);
  const uint8_t* s = img.data_ptr<uint8_t>();
  if (base == "AutoContrast") {  // per-channel extremes by a loop, then the reference's map as a table
    std::vector<float> lo(static_cast<size_t>(C)), hi(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {  // integer extremes of one channel (vectorises; float compares would branch)
      uint8_t l = 255, h = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t v = s[i * C + c];
        l = v < l ? v : l;
        h = v > h ? v : h;
      }
      lo[static_cast<size_t>(c)] = l, hi[static_cast<size_t>(c)] = h;
    }
    const at::Tensor lo_t = at::tensor(lo).view({1, 1, C}), hi_t = at::tensor(hi).view({1, 1, C});
    return apply_lut(img, autocontrast_map(value_ramp(C).to(at::kFloat), lo_t, hi_t));
  }
  if (base == "Contrast") {
    const at::Tensor ramp = value_ramp(C).to(at::kFloat);
    return apply_lut(img, blend(at::full_like(ramp, contrast_mean(img.to(at::kFloat))), ramp, factor));
  }
  const auto fac = static_cast<float>(factor);  // the reference multiplies float pixels by the factor as a float
  if (base == "Color" && C == 3) {              // degenerate: the float luminance of each pixel, as luminance()
    at::Tensor out = at::empty_like(img);
    color_pixels(s, out.data_ptr<uint8_t>(), n, fac);
    return out;
  }
  if (base == "Sharpness") {  // the 1-pixel border keeps the pixel (the blend of a value with itself)
    const int64_t H = img.size(0), W = img.size(1), row = W * C;
    at::Tensor out = img.clone();
    uint8_t* d = out.data_ptr<uint8_t>();
    if (W > 2)
      for (int64_t y = 1; y < H - 1; ++y)
        sharpness_row(s + (y - 1) * row, s + y * row, s + (y + 1) * row, d + y * row, W, C, fac);
    return out;
  }
  AffineCoeffs a;
  if (geometric_coeffs(base, level, sign, img.size(0), img.size(1), a)) return affine_bicubic(img, a, kFill);
  return rand_augment_op_reference(img, op, m, sign);  // Equalize (a loop already), Color on grey
}

at::Tensor rand_augment(const at::Tensor& image, const RandAugmentSpec& spec, AugRng& rng) {
  if (!spec.enabled) return image;
  const auto& ops = rand_augment_ops(spec.increasing);
  at::Tensor img = image.contiguous();
  for (int i = 0; i < spec.num_ops; ++i) {
    const std::string& op = ops[static_cast<size_t>(randint(rng, 0, static_cast<int64_t>(ops.size()) - 1))];
    if (spec.prob < 1.0 && uniform(rng, 0, 1) > spec.prob) continue;
    double m = spec.magnitude;
    if (spec.magnitude_std > 0) m = std::normal_distribution<double>(m, spec.magnitude_std)(rng);
    m = std::clamp(m, 0.0, kMaxLevel);
    const int sign = uniform(rng, 0, 1) < 0.5 ? -1 : 1;
    img = rand_augment_op(img, op, m, sign);
  }
  return img;
}

std::array<int64_t, 4> random_resized_crop_box(int64_t H, int64_t W, const SampleTransformOptions& o, AugRng& rng) {
  const double area = static_cast<double>(H * W);
  const double lr0 = std::log(o.ratio_min), lr1 = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(rng, o.scale_min, o.scale_max);
    const double ratio = std::exp(uniform(rng, lr0, lr1));
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target * ratio)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && h > 0 && w <= W && h <= H) return {randint(rng, 0, H - h), randint(rng, 0, W - w), h, w};
  }
  // Fallback: the whole image cropped to the nearest allowed aspect ratio, centred.
  const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
  int64_t w = W, h = H;
  if (in_ratio < o.ratio_min)
    h = static_cast<int64_t>(std::lround(static_cast<double>(w) / o.ratio_min));
  else if (in_ratio > o.ratio_max)
    w = static_cast<int64_t>(std::lround(static_cast<double>(h) * o.ratio_max));
  return {(H - h) / 2, (W - w) / 2, h, w};
}

at::Tensor train_transform(const at::Tensor& image, const SampleTransformOptions& o, AugRng& rng, at::Tensor out) {
  at::Tensor img = image;
  std::array<int64_t, 4> box{0, 0, img.size(0), img.size(1)};  // torchvision resized_crop: crop, then resize the crop
  if (o.random_resized_crop) box = random_resized_crop_box(img.size(0), img.size(1), o, rng);
  const bool flip = o.hflip > 0 && uniform(rng, 0, 1) < o.hflip;  // RandomHorizontalFlip, folded into the resize
  if (o.random_resized_crop || img.size(0) != o.size || img.size(1) != o.size) {
    img = resize_bicubic(img.narrow(0, box[0], box[2]).narrow(1, box[1], box[3]), o.size, o.size, {}, flip);
  } else if (flip) {
    img = img.contiguous().clone();  // the caller's image stays as it is
    mirror_columns_(img);
  }
  img = rand_augment(img, o.rand_augment, rng);
  at::Tensor x = to_normalised_chw(img, o, std::move(out));
  if (o.erase_prob > 0) random_erase_(x, o.erase_prob, rng);
  return x;
}

at::Tensor eval_transform(const at::Tensor& image, const SampleTransformOptions& o, at::Tensor out) {
  const int64_t H = image.size(0), W = image.size(1);
  const auto scale = static_cast<int64_t>(std::floor(static_cast<double>(o.size) / o.crop_pct));
  // torchvision Resize(int): the short side becomes `scale`, the long side keeps the aspect ratio (truncated).
  const int64_t nh = H <= W ? scale : static_cast<int64_t>(static_cast<double>(scale) * H / W);
  const int64_t nw = H <= W ? static_cast<int64_t>(static_cast<double>(scale) * W / H) : scale;
  // torchvision CenterCrop: int(round((n − size) / 2)), Python's round (half to even). Only the crop is resized.
  const auto top = static_cast<int64_t>(std::nearbyint(static_cast<double>(nh - o.size) / 2.0));
  const auto left = static_cast<int64_t>(std::nearbyint(static_cast<double>(nw - o.size) / 2.0));
  return to_normalised_chw(resize_bicubic(image, nh, nw, {top, left, o.size, o.size}), o, std::move(out));
}

namespace {

// n standard normal floats by the Box–Muller transform in blocks of 16, laid out as torch's normal_ lays its blocks
// out (d[i] = r·cos θ, d[i + 8] = r·sin θ from the uniforms u[i], u[i + 8]). Each 64-bit draw gives two 24-bit
// uniforms; 1 − u ∈ (0, 1] keeps the logarithm finite.
void fill_standard_normal(float* d, int64_t n, AugRng& rng) {
  constexpr float kTwoPi = 6.28318530717958647692f, kUnit = 1.0f / 16777216.0f;
  for (int64_t i = 0; i < n; i += 16) {
    float u[16], z[16];
    for (int k = 0; k < 16; k += 2) {
      const uint64_t bits = rng();
      u[k] = static_cast<float>(bits >> 40) * kUnit;
      u[k + 1] = static_cast<float>((bits >> 8) & 0xFFFFFFu) * kUnit;
    }
    for (int k = 0; k < 8; ++k) {
      const float r = std::sqrt(-2.0f * std::log(1.0f - u[k])), theta = kTwoPi * u[k + 8];
      z[k] = r * std::cos(theta), z[k + 8] = r * std::sin(theta);
    }
    std::copy_n(z, std::min<int64_t>(16, n - i), d + i);
  }
}

}  // namespace

void random_erase_(at::Tensor& image, double p, AugRng& rng) {
  if (uniform(rng, 0, 1) >= p) return;
  const int64_t C = image.size(0), H = image.size(1), W = image.size(2);
  const double area = static_cast<double>(H * W);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(rng, 0.02, 1.0 / 3.0);
    const double aspect = std::exp(uniform(rng, std::log(0.3), std::log(1.0 / 0.3)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target * aspect)));
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target / aspect)));
    if (w < W && h < H && w > 0 && h > 0) {
      const int64_t top = randint(rng, 0, H - h), left = randint(rng, 0, W - w);
      thread_local std::vector<float> noise;  // (C, h, w) per-pixel normal noise (timm's mode "pixel")
      noise.resize(static_cast<size_t>(C * h * w));
      fill_standard_normal(noise.data(), C * h * w, rng);
      if (image.is_contiguous() && image.scalar_type() == at::kFloat) {  // rows copied straight into the image
        float* d = image.data_ptr<float>();
        for (int64_t c = 0; c < C; ++c)
          for (int64_t y = 0; y < h; ++y)
            std::copy_n(noise.data() + (c * h + y) * w, w, d + (c * H + top + y) * W + left);
      } else {
        image.narrow(1, top, h).narrow(2, left, w).copy_(at::from_blob(noise.data(), {C, h, w}, at::kFloat));
      }
      return;
    }
  }
}

at::Tensor mixup_batch_(at::Tensor& x, const at::Tensor& y, const MixupOptions& o, AugRng& rng) {
  const int64_t B = x.size(0), H = x.size(2), W = x.size(3);
  auto beta = [&](double a) {
    const double g1 = std::gamma_distribution<double>(a, 1.0)(rng), g2 = std::gamma_distribution<double>(a, 1.0)(rng);
    return g1 / (g1 + g2);
  };
  double lam = 1.0;
  bool cutmix = false;
  if (o.enabled() && uniform(rng, 0, 1) < o.prob) {
    if (o.mixup_alpha > 0 && o.cutmix_alpha > 0)
      cutmix = uniform(rng, 0, 1) < o.switch_prob;
    else
      cutmix = o.cutmix_alpha > 0;
    lam = beta(cutmix ? o.cutmix_alpha : o.mixup_alpha);
  }
  if (lam < 1.0) {
    const at::Tensor flipped = x.flip(0);
    if (cutmix) {  // a box of area ≈ (1 − λ) pasted from the reversed batch; λ corrected to the clipped box
      const double r = std::sqrt(1.0 - lam);
      const auto ch = static_cast<int64_t>(static_cast<double>(H) * r),
                 cw = static_cast<int64_t>(static_cast<double>(W) * r);
      const int64_t cy = randint(rng, 0, H - 1), cx = randint(rng, 0, W - 1);
      const int64_t y0 = std::clamp<int64_t>(cy - ch / 2, 0, H), y1 = std::clamp<int64_t>(cy + ch / 2, 0, H);
      const int64_t x0 = std::clamp<int64_t>(cx - cw / 2, 0, W), x1 = std::clamp<int64_t>(cx + cw / 2, 0, W);
      if (y1 > y0 && x1 > x0)
        x.narrow(2, y0, y1 - y0).narrow(3, x0, x1 - x0).copy_(flipped.narrow(2, y0, y1 - y0).narrow(3, x0, x1 - x0));
      lam = 1.0 - static_cast<double>((y1 - y0) * (x1 - x0)) / static_cast<double>(H * W);
    } else {
      x.mul_(lam).add_(flipped, 1.0 - lam);
    }
  }
  const double off = o.label_smoothing / static_cast<double>(o.num_classes), on = 1.0 - o.label_smoothing + off;
  auto soft = [&](const at::Tensor& labels) {
    return at::full({B, o.num_classes}, off, at::kFloat).scatter_(1, labels.view({B, 1}), on);
  };
  return soft(y) * lam + soft(y.flip(0)) * (1.0 - lam);
}

}  // namespace moh::datasets
