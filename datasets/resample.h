#pragma once
// Pillow's resampling (Image.resize(size, Image.BICUBIC), the filter torchvision and timm use on PIL images, and
// Image.BOX, ADM's halving), reproduced bit for bit: the separable two-pass resize of Pillow's Resample.c as its
// documented algorithm states it — the a = −0.5 cubic (or the box) kernel widened by the downscale factor
// (antialiasing), weights normalised per output pixel then rounded to 22-bit fixed point, horizontal pass first with
// its result rounded to uint8, then the vertical pass; a pass whose size does not change is skipped. Written for this
// toolkit, not taken from Pillow.
//
// Two paths compute the same bytes: `resize_pillow_reference` is the plain per-pixel loops; `resize_pillow` runs
// both passes as sums of whole rows (a transpose makes the horizontal pass one too) so the compiler vectorises them,
// and computes only a requested window of the output (the evaluation centre crop), which is exact because every
// output pixel depends on its own taps only. tests/datasets/test_resample.cpp checks the two against each other and
// against Pillow's output (fixtures made by tests/fixtures/gen/make_pillow*.py).
#include <ATen/ATen.h>

#include <cstdint>

namespace moh::datasets {

/// Rows [top, top + height) and columns [left, left + width) of an image; height / width −1 = to the end.
struct PixelWindow {
  int64_t top = 0, left = 0, height = -1, width = -1;
};

/// The Pillow filters this toolkit's pipelines use: BICUBIC (torchvision / timm transforms, ADM's final resize) and
/// BOX (ADM's `center_crop_arr` halving).
enum class PillowFilter { kBicubic, kBox };

/// Pillow `Image.resize((out_w, out_h), filter)` of a uint8 (H, W, C) image, C = 1 or 3 (any row stride, packed
/// pixels: a crop view is read in place), returning only `window` of the (out_h, out_w) result as a contiguous
/// (h, w, C) tensor; `mirror` returns it flipped left–right (Image.transpose(FLIP_LEFT_RIGHT) of the result), which
/// costs nothing when the width changes: the horizontal pass's columns are written back in reverse order.
at::Tensor resize_pillow(const at::Tensor& hwc, int64_t out_h, int64_t out_w, PillowFilter filter,
                         const PixelWindow& window = {}, bool mirror = false);

/// The same, whole output, by Pillow's per-pixel loops: the reference `resize_pillow` is tested against.
at::Tensor resize_pillow_reference(const at::Tensor& hwc, int64_t out_h, int64_t out_w, PillowFilter filter);

/// `resize_pillow` with BICUBIC.
inline at::Tensor resize_bicubic(const at::Tensor& hwc, int64_t out_h, int64_t out_w, const PixelWindow& window = {},
                                 bool mirror = false) {
  return resize_pillow(hwc, out_h, out_w, PillowFilter::kBicubic, window, mirror);
}
inline at::Tensor resize_bicubic_reference(const at::Tensor& hwc, int64_t out_h, int64_t out_w) {
  return resize_pillow_reference(hwc, out_h, out_w, PillowFilter::kBicubic);
}

/// Mirrors a contiguous uint8 (H, W, C) image left–right in place.
void mirror_columns_(at::Tensor& hwc);

/// The same, whole output, by Pillow's per-pixel loops: the reference `resize_bicubic` is tested against.
at::Tensor resize_bicubic_reference(const at::Tensor& hwc, int64_t out_h, int64_t out_w);

}  // namespace moh::datasets
