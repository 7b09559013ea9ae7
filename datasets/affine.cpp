#include "datasets/affine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// This file must not contract a·b + c into fused multiply-adds (CMake builds it with -ffp-contract=off): Pillow's
// wheels are built for baseline x86-64, whose products and sums round separately.

namespace moh::datasets {

namespace {

// Python's round(x, 15): the correctly rounded 15-decimal string (ties to even, as printf rounds), read back.
double round15(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15f", x);
  return std::strtod(buf, nullptr);
}

// Pillow's cubic convolution of four samples at fraction d, in its order of operations.
inline double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// Pillow's result for a filtered value: ≤ 0 → 0, ≥ 255 → 255, else truncated. |v| stays far below 2^31, so the
// truncation toward zero followed by an integer clamp gives the same bytes.
inline uint8_t clip_truncate(double v) {
  int i = static_cast<int>(v);
  i = i < 0 ? 0 : i;
  return static_cast<uint8_t>(i > 255 ? 255 : i);
}

inline int64_t clamp_index(int64_t i, int64_t n) {
  return i < 0 ? 0 : (i < n ? i : n - 1);
}

// The input position of output pixel (x, y), as Pillow's affine_transform computes it.
inline void source_point(const AffineCoeffs& a, int64_t x, int64_t y, double& xx, double& yy) {
  const double xin = static_cast<double>(x) + 0.5, yin = static_cast<double>(y) + 0.5;
  xx = a[0] * xin + a[1] * yin + a[2];
  yy = a[3] * xin + a[4] * yin + a[5];
}

typedef double v4d __attribute__((vector_size(32)));  // the three channels of a pixel (and one unused lane)
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint8_t v4u8 __attribute__((vector_size(4)));

inline v4d cubic4(v4d v1, v4d v2, v4d v3, v4d v4, double d) {
  const v4d p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}
// One pixel of the padded RGBx copy as 32-bit lanes (one 4-byte load, widened), and as doubles.
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef uint32_t v4u32 __attribute__((vector_size(16)));
inline v4i load_pixel_i(const uint8_t* p) {
  uint32_t word;
  std::memcpy(&word, p, 4);
  const v4u32 w = {word, 0, 0, 0};
  // Zero extension of the 4 bytes as one byte shuffle (pshufb where the target has it; lane 16 is a zero byte).
  const v16u8 b = __builtin_shuffle(reinterpret_cast<const v16u8&>(w), v16u8{},
                                    v16u8{0, 16, 16, 16, 1, 16, 16, 16, 2, 16, 16, 16, 3, 16, 16, 16});
  return reinterpret_cast<const v4i&>(b);
}
inline v4d load_pixel(const uint8_t* p) {
  return __builtin_convertvector(load_pixel_i(p), v4d);
}
// The horizontal cubic of one input row at byte offsets cx[0..3]. On uint8 samples Pillow's p2 … p4 are integer
// expressions (C promotes the bytes to int), converted to double only for the polynomial: the same here.
inline v4d row_cubic(const uint8_t* row, const int64_t* cx, double dx) {
  const v4i v1 = load_pixel_i(row + cx[0]), v2 = load_pixel_i(row + cx[1]), v3 = load_pixel_i(row + cx[2]),
            v4 = load_pixel_i(row + cx[3]);
  const v4d p1 = __builtin_convertvector(v2, v4d), p2 = __builtin_convertvector(-v1 + v3, v4d),
            p3 = __builtin_convertvector(2 * (v1 - v2) + v3 - v4, v4d),
            p4 = __builtin_convertvector(-v1 + v2 - v3 + v4, v4d);
  return p1 + dx * (p2 + dx * (p3 + dx * p4));
}

// Byte offsets (RGBx) of the four clamped columns around the second tap ix: ix − 1 … ix + 2.
struct ColumnTaps {
  int64_t offset[4];
};
inline ColumnTaps column_taps(int64_t ix, int64_t W) {
  return {{clamp_index(ix - 1, W) * 4, clamp_index(ix, W) * 4, clamp_index(ix + 1, W) * 4, clamp_index(ix + 2, W) * 4}};
}

// Where one output row samples the input: per pixel, whether the sample is inside the image, the second tap of each
// axis and the fractions, four pixels at a time. Each lane does the same IEEE operations as source_point and the
// reference's per-pixel code; floor is the truncation corrected downwards (exact: |x| < 2^31 after the clamp).
typedef double v4dx __attribute__((vector_size(32), aligned(8)));  // unaligned loads / stores of 4 doubles
typedef int64_t v4l __attribute__((vector_size(32)));

struct RowSamples {
  std::vector<double> dx, dy;
  std::vector<int32_t> ix, iy, inside;
  void resize(int64_t W) {
    const auto n = static_cast<size_t>((W + 3) / 4 * 4);  // whole vectors: lanes past W are computed and unused
    dx.resize(n), dy.resize(n), ix.resize(n), iy.resize(n), inside.resize(n);
  }
};

inline v4d floor4(v4d v) {
  const v4d t = __builtin_convertvector(__builtin_convertvector(v, v4i), v4d);
  return t > v ? t - 1.0 : t;
}

__attribute__((target_clones("avx2", "default"))) void row_samples(const AffineCoeffs& coeffs, int64_t y, int64_t H,
                                                                   int64_t W, RowSamples& rs) {
  const double a0 = coeffs[0], a2 = coeffs[2], a3 = coeffs[3], a5 = coeffs[5];
  const double yin = static_cast<double>(y) + 0.5, Wd = static_cast<double>(W), Hd = static_cast<double>(H);
  const double by = coeffs[1] * yin, cy = coeffs[4] * yin;
  for (int64_t x = 0; x < W; x += 4) {
    const double x0 = static_cast<double>(x) + 0.5;
    const v4d xin = {x0, x0 + 1.0, x0 + 2.0, x0 + 3.0};
    const v4d xx = a0 * xin + by + a2, yy = a3 * xin + cy + a5;
    const v4l in = (xx >= 0.0) & (xx < Wd) & (yy >= 0.0) & (yy < Hd);
    // Outside the image the taps are not used; the clamps only keep the conversions defined.
    v4d xi = xx < -4.0 ? -4.0 : xx, yi = yy < -4.0 ? -4.0 : yy;
    xi = (xi > Wd + 4.0 ? Wd + 4.0 : xi) - 0.5;
    yi = (yi > Hd + 4.0 ? Hd + 4.0 : yi) - 0.5;
    const v4d fx = floor4(xi), fy = floor4(yi);
    const v4dx dx = xi - fx, dy = yi - fy;
    const v4i ix = __builtin_convertvector(fx, v4i), iy = __builtin_convertvector(fy, v4i),
              inside = __builtin_convertvector(in, v4i);
    const auto i = static_cast<size_t>(x);
    std::memcpy(&rs.dx[i], &dx, sizeof dx), std::memcpy(&rs.dy[i], &dy, sizeof dy);
    std::memcpy(&rs.ix[i], &ix, sizeof ix), std::memcpy(&rs.iy[i], &iy, sizeof iy),
        std::memcpy(&rs.inside[i], &inside, sizeof inside);
  }
}

// RGB fast path on an RGBx copy (4 bytes per pixel, so a pixel is one load). Rows are clamped where Pillow's loop
// repeats the previous row's value: the two agree, because a sample inside the image has its second row in
// [−1, H − 1] (tests/datasets/test_resample.cpp compares the paths).
__attribute__((target_clones("avx2", "default"))) void affine_rgb(const uint8_t* __restrict in, uint8_t* __restrict out,
                                                                  int64_t H, int64_t W, const AffineCoeffs& coeffs,
                                                                  const uint8_t* fill_rgb) {
  const AffineCoeffs a = coeffs;  // copies: stores through `out` could alias them otherwise
  const uint8_t fill[4] = {fill_rgb[0], fill_rgb[1], fill_rgb[2], 0};
  const int64_t stride = W * 4;
  thread_local RowSamples rs;
  rs.resize(W);
  for (int64_t y = 0; y < H; ++y) {
    row_samples(a, y, H, W, rs);
    for (int64_t x = 0; x < W; ++x) {
      uint8_t* o = out + (y * W + x) * 3;  // written 4 bytes at a time: the 4th is the next pixel's (or the slack byte)
      if (!rs.inside[static_cast<size_t>(x)]) {
        std::memcpy(o, fill, 4);
        continue;
      }
      const double dx = rs.dx[static_cast<size_t>(x)], dy = rs.dy[static_cast<size_t>(x)];
      const int64_t ix = rs.ix[static_cast<size_t>(x)], iy = rs.iy[static_cast<size_t>(x)];  // each axis' second tap
      v4d v;
      if (dy == 0.0) {  // cubic(…, 0) is its second sample exactly: only row iy (inside the image) counts
        const uint8_t* row = in + iy * stride;
        if (dx == 0.0) {
          v = load_pixel(row + ix * 4);
        } else {
          const ColumnTaps cx = column_taps(ix, W);
          v = row_cubic(row, cx.offset, dx);
        }
      } else {
        const uint8_t* r0 = in + clamp_index(iy - 1, H) * stride;
        const uint8_t* r1 = in + clamp_index(iy, H) * stride;
        const uint8_t* r2 = in + clamp_index(iy + 1, H) * stride;
        const uint8_t* r3 = in + clamp_index(iy + 2, H) * stride;
        if (dx == 0.0) {  // each row's cubic is its pixel at column ix (inside the image)
          v = cubic4(load_pixel(r0 + ix * 4), load_pixel(r1 + ix * 4), load_pixel(r2 + ix * 4), load_pixel(r3 + ix * 4),
                     dy);
        } else {
          const ColumnTaps cx = column_taps(ix, W);
          v = cubic4(row_cubic(r0, cx.offset, dx), row_cubic(r1, cx.offset, dx), row_cubic(r2, cx.offset, dx),
                     row_cubic(r3, cx.offset, dx), dy);
        }
      }
      v4i t = __builtin_convertvector(v, v4i);  // truncation toward zero, then the clamp (clip_truncate per lane)
      t = t < 0 ? 0 : t;
      t = t > 255 ? 255 : t;
      const v4u8 bytes = __builtin_convertvector(t, v4u8);
      std::memcpy(o, &bytes, 4);
    }
  }
}

}  // namespace

AffineCoeffs pil_rotate_coeffs(double angle_deg, int64_t H, int64_t W) {
  // PIL first takes angle % 360 (Python's modulo: the sign of the divisor), so −17° is rotated as 343°. Its fast
  // paths for 0, 90, 180 and 270 degrees give the same pixels as this transform: the rounded cos / sin are then
  // exact, every sample lands on a pixel centre, and a zero fraction makes the cubic return that pixel.
  double mod = std::fmod(angle_deg, 360.0);
  mod = mod < 0.0 ? mod + 360.0 : (mod == 0.0 ? 0.0 : mod);
  const double angle = -(mod * (M_PI / 180.0));  // math.radians, negated
  AffineCoeffs m{round15(std::cos(angle)),  round15(std::sin(angle)), 0.0,
                 round15(-std::sin(angle)), round15(std::cos(angle)), 0.0};
  const double cx = static_cast<double>(W) / 2.0, cy = static_cast<double>(H) / 2.0;
  m[2] = m[0] * -cx + m[1] * -cy + m[2] + cx;  // PIL: transform(−centre) then += centre
  m[5] = m[3] * -cx + m[4] * -cy + m[5] + cy;
  return m;
}

at::Tensor affine_bicubic_reference(const at::Tensor& hwc, const AffineCoeffs& a, const std::array<uint8_t, 3>& fill) {
  TORCH_CHECK(hwc.dim() == 3 && hwc.scalar_type() == at::kByte && (hwc.size(2) == 1 || hwc.size(2) == 3),
              "affine_bicubic: expected a uint8 (H, W, 1 or 3) image");
  const at::Tensor img = hwc.contiguous();
  const int64_t H = img.size(0), W = img.size(1), C = img.size(2);
  at::Tensor out = at::empty_like(img);
  const uint8_t* in = img.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x) {
      double xx, yy;
      source_point(a, x, y, xx, yy);
      uint8_t* px = o + (y * W + x) * C;
      if (xx < 0.0 || xx >= static_cast<double>(W) || yy < 0.0 || yy >= static_cast<double>(H)) {
        for (int64_t c = 0; c < C; ++c) px[c] = fill[static_cast<size_t>(c)];
        continue;
      }
      const double xi = xx - 0.5, yi = yy - 0.5;
      const auto ix = static_cast<int64_t>(std::floor(xi)) - 1, iy = static_cast<int64_t>(std::floor(yi)) - 1;
      const double dx = xi - std::floor(xi), dy = yi - std::floor(yi);
      for (int64_t c = 0; c < C; ++c) {
        auto at_xy = [&](int64_t row, int64_t k) {
          return static_cast<double>(in[(row * W + clamp_index(ix + k, W)) * C + c]);
        };
        auto row_value = [&](int64_t row) {
          return cubic(at_xy(row, 0), at_xy(row, 1), at_xy(row, 2), at_xy(row, 3), dx);
        };
        // Pillow: the first row is clamped; a later row outside the image repeats the previous row's value.
        double v[4];
        v[0] = row_value(clamp_index(iy, H));
        for (int64_t k = 1; k < 4; ++k) v[k] = (iy + k >= 0 && iy + k < H) ? row_value(iy + k) : v[k - 1];
        const double r = cubic(v[0], v[1], v[2], v[3], dy);
        px[c] = r <= 0.0 ? 0 : (r >= 255.0 ? 255 : static_cast<uint8_t>(r));
      }
    }
  return out;
}

at::Tensor affine_bicubic(const at::Tensor& hwc, const AffineCoeffs& a, const std::array<uint8_t, 3>& fill) {
  if (hwc.dim() != 3 || hwc.size(2) != 3 || hwc.scalar_type() != at::kByte)
    return affine_bicubic_reference(hwc, a, fill);
  const at::Tensor img = hwc.contiguous();
  const int64_t H = img.size(0), W = img.size(1);
  thread_local std::vector<uint8_t> rgbx;  // loader threads reuse their buffer
  rgbx.resize(static_cast<size_t>(H * W * 4));
  const uint8_t* s = img.data_ptr<uint8_t>();
  const int64_t n = H * W;
  if (n == 0) return img.clone();
  uint8_t* d = rgbx.data();
  for (int64_t i = 0; i + 1 < n; ++i) {  // RGB → RGBx as 4-byte moves (the 4th byte, the next pixel's R, cleared)
    uint32_t px;
    std::memcpy(&px, s + i * 3, 4);
    px &= 0x00FFFFFFu;  // little-endian
    std::memcpy(d + i * 4, &px, 4);
  }
  d[(n - 1) * 4] = s[(n - 1) * 3], d[(n - 1) * 4 + 1] = s[(n - 1) * 3 + 1], d[(n - 1) * 4 + 2] = s[(n - 1) * 3 + 2];
  d[(n - 1) * 4 + 3] = 0;  // the last pixel: no read past the image
  // One slack byte after the pixels: the fast path writes each pixel as 4 bytes.
  at::Tensor out = at::empty({H * W * 3 + 1}, at::kByte).narrow(0, 0, H * W * 3).view({H, W, 3});
  affine_rgb(rgbx.data(), out.data_ptr<uint8_t>(), H, W, a, fill.data());
  return out;
}

}  // namespace moh::datasets
