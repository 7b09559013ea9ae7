#pragma once
// Pillow's bicubic affine transform (Image.transform(size, AFFINE, data, BICUBIC, fillcolor) and Image.rotate(angle,
// BICUBIC, fillcolor=…)), the geometric operations of timm's RandAugment, reproduced bit for bit as Pillow's
// Geometry.c computes them: output pixel (x, y) samples the input at (a0·x' + a1·y' + a2, a3·x' + a4·y' + a5) with
// x' = x + ½, y' = y + ½; a sample outside [0, W) × [0, H) keeps the fill colour; otherwise the 4 × 4 taps around
// (xin − ½, yin − ½), clamped to the image, are combined by the a = −1 cubic convolution written as Pillow writes it
// (v2 + d·(p2 + d·(p3 + d·p4)) in double, rows first, then the column), and the result is clipped and truncated to
// uint8. Written for this toolkit from that description, not taken from Pillow.
//
// Two paths compute the same bytes: `affine_bicubic_reference` is the per-pixel, per-channel loop; `affine_bicubic`
// holds the three channels of a pixel in one 4-lane double vector (the same IEEE operations per lane) and skips the
// taps a zero fraction makes exact (a translation or shear along x has dy = 0 everywhere: one cubic instead of five).
// tests/datasets/test_resample.cpp checks both against each other and against Pillow 13.0.0.
#include <ATen/ATen.h>

#include <array>
#include <cstdint>

namespace moh::datasets {

/// The six coefficients of PIL's AFFINE transform (output pixel centre → input position).
using AffineCoeffs = std::array<double, 6>;

/// PIL `Image.rotate(angle_deg)` of an (H, W) image without expand: rotation about (W/2, H/2), counter-clockwise,
/// cos / sin rounded to 15 decimals as PIL does.
AffineCoeffs pil_rotate_coeffs(double angle_deg, int64_t H, int64_t W);

/// PIL's bicubic AFFINE transform of a contiguous uint8 (H, W, C) image, C = 1 or 3, into an image of the same size;
/// `fill` (per channel; C = 1 uses fill[0]) where the sample falls outside the input.
at::Tensor affine_bicubic(const at::Tensor& hwc, const AffineCoeffs& a, const std::array<uint8_t, 3>& fill);

/// The same by Pillow's per-pixel loops: the reference `affine_bicubic` is tested against.
at::Tensor affine_bicubic_reference(const at::Tensor& hwc, const AffineCoeffs& a, const std::array<uint8_t, 3>& fill);

}  // namespace moh::datasets
