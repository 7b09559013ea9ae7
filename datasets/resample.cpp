#include "datasets/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace moh::datasets {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's fixed point for 8-bit images: 22 fractional bits
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);
constexpr double kBicubicA = -0.5;  // Pillow's cubic (Keys) parameter; OpenCV uses −0.75

// Pillow's filters on the distance x (in input pixels, scaled by the antialiasing factor) and their supports.
double bicubic(double x) {
  x = std::abs(x);
  if (x < 1.0) return ((kBicubicA + 2.0) * x - (kBicubicA + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * kBicubicA;
  return 0.0;
}
double box(double x) {
  return x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
}
double filter_value(PillowFilter f, double x) {
  return f == PillowFilter::kBox ? box(x) : bicubic(x);
}
double filter_support(PillowFilter f) {
  return f == PillowFilter::kBox ? 0.5 : 2.0;
}

// Fixed-point sum → uint8: arithmetic shift, then clamp (Pillow's clip8).
inline uint8_t clip8(int32_t v) {
  return static_cast<uint8_t>(std::min(std::max(v >> kPrecisionBits, 0), 255));
}

// The taps of one axis, in_size → out_size: output i reads inputs [start[i], start[i] + count[i]) with weights
// w[i * ksize + k] (22-bit fixed point).
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> start, count;
  std::vector<int32_t> w;
};

Taps filter_taps(int64_t in_size, int64_t out_size, PillowFilter f) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);  // widen the kernel when shrinking (antialias)
  const double support = filter_support(f) * filterscale;
  Taps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.start.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.w.assign(static_cast<size_t>(out_size * t.ksize), 0);
  std::vector<double> k(static_cast<size_t>(t.ksize));
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // C truncation toward zero, then clamped: Pillow's "round the value".
    const int64_t lo = std::max<int64_t>(static_cast<int>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int>(center + support + 0.5), in_size);
    const int64_t n = hi - lo;
    double sum = 0;
    for (int64_t x = 0; x < n; ++x) {
      k[static_cast<size_t>(x)] = filter_value(f, (static_cast<double>(x + lo) - center + 0.5) * ss);
      sum += k[static_cast<size_t>(x)];
    }
    for (int64_t x = 0; x < n; ++x) {
      double v = k[static_cast<size_t>(x)];
      if (sum != 0.0) v /= sum;
      const double fixed = v * static_cast<double>(int64_t{1} << kPrecisionBits);
      t.w[static_cast<size_t>(i * t.ksize + x)] = static_cast<int32_t>(v < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    t.start[static_cast<size_t>(i)] = lo;
    t.count[static_cast<size_t>(i)] = n;
  }
  return t;
}

struct Source {
  const uint8_t* data;
  int64_t H, W, C, row_stride;
};

Source source_of(const at::Tensor& hwc, at::Tensor& keep) {
  TORCH_CHECK(hwc.dim() == 3 && hwc.scalar_type() == at::kByte && (hwc.size(2) == 1 || hwc.size(2) == 3),
              "resize_bicubic: expected uint8 (H, W, 1 or 3), got ", hwc.sizes(), " ", hwc.scalar_type());
  keep = (hwc.stride(2) == 1 && hwc.stride(1) == hwc.size(2)) ? hwc : hwc.contiguous();
  return {keep.data_ptr<uint8_t>(), keep.size(0), keep.size(1), keep.size(2), keep.stride(0)};
}

void check_sizes(const Source& s, int64_t out_h, int64_t out_w) {
  TORCH_CHECK(s.H > 0 && s.W > 0 && out_h > 0 && out_w > 0, "resize_bicubic: empty image or output (", s.H, "x", s.W,
              " -> ", out_h, "x", out_w, ")");
}

// out[i] = clip8(½ + Σ_k rows[k][i] · w[k]), i < n: one output row (or column, transposed) as a sum of input rows.
// Blocks of 64 keep the sums in vector registers across the taps; compiled twice where the compiler can (AVX2 and
// the baseline, picked at load time: integer sums, so both give the same bytes). GCC's unroll-and-jam would fuse
// two taps into a scalar loop here, so it is off for this function.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default"), optimize("no-loop-unroll-and-jam")))
#endif
void combine_rows(uint8_t* __restrict out, const uint8_t* const* rows, const int32_t* w, int64_t taps, int64_t n) {
  constexpr int64_t kBlock = 64;
  int64_t i = 0;
  // The last partial block is computed as a whole block ending at n (recomputing some outputs; out never aliases
  // the rows), so a row of 672 values does not end in 32 scalar sums.
  for (bool last = false; !last && i < n && n >= kBlock; i += kBlock) {
    if (i + kBlock >= n) {
      i = n - kBlock;
      last = true;
    }
    int32_t acc[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) acc[j] = kHalf;
    for (int64_t k = 0; k < taps; ++k) {
      const uint8_t* __restrict r = rows[k] + i;
      const int32_t wk = w[k];
      for (int64_t j = 0; j < kBlock; ++j) acc[j] += static_cast<int32_t>(r[j]) * wk;
    }
    for (int64_t j = 0; j < kBlock; ++j) out[i + j] = clip8(acc[j]);
  }
  for (; i < n; ++i) {
    int32_t acc = kHalf;
    for (int64_t k = 0; k < taps; ++k) acc += static_cast<int32_t>(rows[k][i]) * w[k];
    out[i] = clip8(acc);
  }
}

// dst (cols, rows, C) ← src rows × cols pixels (row stride `src_stride` bytes, C bytes per pixel). Column by
// column, so the writes are sequential; RGB pixels move as one 4-byte load and store each: the 4th byte stored is
// overwritten by the next pixel's (or, after a column's last pixel, by the next column's first), and the last column
// moves 3 bytes at a time, so nothing is read past the source's last pixel or written past dst's end.
template <int C>
void transpose_pixels(uint8_t* __restrict dst, const uint8_t* __restrict src, int64_t rows, int64_t cols,
                      int64_t src_stride) {
  for (int64_t x = 0; x < cols; ++x) {
    const uint8_t* s = src + x * C;
    uint8_t* d = dst + x * rows * C;
    if (C == 3 && x + 1 < cols) {
      for (int64_t y = 0; y < rows; ++y) {
        uint32_t px;
        std::memcpy(&px, s + y * src_stride, 4);
        std::memcpy(d + y * 3, &px, 4);
      }
    } else {
      for (int64_t y = 0; y < rows; ++y)
        for (int c = 0; c < C; ++c) d[y * C + c] = s[y * src_stride + c];
    }
  }
}

void transpose(uint8_t* dst, const uint8_t* src, int64_t rows, int64_t cols, int64_t src_stride, int64_t C) {
  if (C == 3)
    transpose_pixels<3>(dst, src, rows, cols, src_stride);
  else
    transpose_pixels<1>(dst, src, rows, cols, src_stride);
}

// Per-thread scratch that only grows (loader threads resize thousands of images: no allocation, zero fill or page
// fault per call).
uint8_t* scratch(int slot, int64_t bytes) {
  thread_local std::vector<uint8_t> buffers[2];
  std::vector<uint8_t>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < bytes) b.resize(static_cast<size_t>(bytes));
  return b.data();
}

}  // namespace

void mirror_columns_(at::Tensor& hwc) {
  TORCH_CHECK(hwc.dim() == 3 && hwc.scalar_type() == at::kByte && hwc.is_contiguous(),
              "mirror_columns_: expected a contiguous uint8 (H, W, C) image");
  const int64_t H = hwc.size(0), W = hwc.size(1), C = hwc.size(2);
  uint8_t* p = hwc.data_ptr<uint8_t>();
  for (int64_t y = 0; y < H; ++y) {
    uint8_t* row = p + y * W * C;
    for (int64_t a = 0, b = W - 1; a < b; ++a, --b) std::swap_ranges(row + a * C, row + a * C + C, row + b * C);
  }
}

at::Tensor resize_pillow(const at::Tensor& hwc, int64_t out_h, int64_t out_w, PillowFilter filter,
                         const PixelWindow& window, bool mirror) {
  at::Tensor keep;
  const Source s = source_of(hwc, keep);
  check_sizes(s, out_h, out_w);
  const int64_t top = window.top, left = window.left;
  const int64_t h = window.height < 0 ? out_h - top : window.height, w = window.width < 0 ? out_w - left : window.width;
  TORCH_CHECK(top >= 0 && left >= 0 && h > 0 && w > 0 && top + h <= out_h && left + w <= out_w,
              "resize_bicubic: window outside the ", out_h, "x", out_w, " output");
  const int64_t C = s.C;
  const bool horizontal = out_w != s.W, vertical = out_h != s.H;
  const Taps tv = vertical ? filter_taps(s.H, out_h, filter) : Taps{};
  const Taps th = horizontal ? filter_taps(s.W, out_w, filter) : Taps{};
  // Source rows the window needs: the vertical taps of its rows (or the rows themselves).
  int64_t y0 = top, y1 = top + h;
  if (vertical) {
    y0 = tv.start[static_cast<size_t>(top)];
    y1 = y0;
    for (int64_t i = top; i < top + h; ++i)
      y1 = std::max(y1, tv.start[static_cast<size_t>(i)] + tv.count[static_cast<size_t>(i)]);
  }
  const int64_t R = y1 - y0;
  at::Tensor out = at::empty({h, w, C}, at::kByte);
  uint8_t* o = out.data_ptr<uint8_t>();

  // Horizontal pass → mid: R rows × w window columns (or the source's window columns when the width is unchanged).
  const uint8_t* mid = nullptr;
  int64_t mid_stride = 0;
  if (horizontal) {
    int64_t x0 = th.start[static_cast<size_t>(left)], x1 = x0;
    for (int64_t j = left; j < left + w; ++j)
      x1 = std::max(x1, th.start[static_cast<size_t>(j)] + th.count[static_cast<size_t>(j)]);
    // The source block transposed to (x, y, c): each output column is then a sum of whole rows.
    uint8_t* block = scratch(0, (x1 - x0) * R * C);
    transpose(block, s.data + y0 * s.row_stride + x0 * C, R, x1 - x0, s.row_stride, C);
    uint8_t* cols = scratch(1, w * R * C);  // (w, R, C)
    std::vector<const uint8_t*> rows(static_cast<size_t>(th.ksize));
    for (int64_t j = 0; j < w; ++j) {
      const auto jj = static_cast<size_t>(left + j);
      for (int64_t k = 0; k < th.count[jj]; ++k) rows[static_cast<size_t>(k)] = block + (th.start[jj] + k - x0) * R * C;
      combine_rows(cols + j * R * C, rows.data(), th.w.data() + static_cast<int64_t>(jj) * th.ksize, th.count[jj],
                   R * C);
    }
    uint8_t* dst = vertical ? scratch(0, R * w * C) : o;  // the block is no longer needed
    if (mirror)                                           // (w, R, C) → (R, w, C), the columns read last to first
      transpose(dst, cols + (w - 1) * R * C, w, R, -R * C, C);
    else
      transpose(dst, cols, w, R, R * C, C);  // (w, R, C) → (R, w, C)
    mirror = false;                          // done
    if (!vertical) return out;
    mid = dst;
    mid_stride = w * C;
  } else {
    mid = s.data + y0 * s.row_stride + left * C;
    mid_stride = s.row_stride;
  }
  if (!vertical) {  // neither pass: the window of the source itself
    for (int64_t y = 0; y < h; ++y) std::copy_n(mid + y * mid_stride, w * C, o + y * w * C);
    if (mirror) mirror_columns_(out);
    return out;
  }
  // Vertical pass: each output row is a sum of mid rows.
  std::vector<const uint8_t*> rows(static_cast<size_t>(tv.ksize));
  for (int64_t i = 0; i < h; ++i) {
    const auto ii = static_cast<size_t>(top + i);
    for (int64_t k = 0; k < tv.count[ii]; ++k)
      rows[static_cast<size_t>(k)] = mid + (tv.start[ii] + k - y0) * mid_stride;
    combine_rows(o + i * w * C, rows.data(), tv.w.data() + static_cast<int64_t>(ii) * tv.ksize, tv.count[ii], w * C);
  }
  if (mirror) mirror_columns_(out);  // the width did not change: no pass to fold the flip into
  return out;
}

namespace {

// Pillow's vertical pass, per value: `in` holds rows y0, y0 + 1, ... of the (horizontally resized) image, row_values
// bytes each.
at::Tensor vertical_pass_reference(const uint8_t* in, int64_t y0, int64_t row_values, int64_t out_h, int64_t out_w,
                                   int64_t C, const Taps& tv) {
  at::Tensor out = at::empty({out_h, out_w, C}, at::kByte);
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t y = 0; y < out_h; ++y)
    for (int64_t x = 0; x < out_w * C; ++x) {
      int32_t acc = kHalf;
      for (int64_t k = 0; k < tv.count[static_cast<size_t>(y)]; ++k)
        acc += static_cast<int32_t>(in[(tv.start[static_cast<size_t>(y)] - y0 + k) * row_values + x]) *
               tv.w[static_cast<size_t>(y * tv.ksize + k)];
      o[y * out_w * C + x] = clip8(acc);
    }
  return out;
}

}  // namespace

at::Tensor resize_pillow_reference(const at::Tensor& hwc, int64_t out_h, int64_t out_w, PillowFilter filter) {
  at::Tensor keep;
  const Source s = source_of(hwc, keep);
  check_sizes(s, out_h, out_w);
  const int64_t C = s.C;
  // Pillow's ImagingResampleInner: horizontal over the rows the vertical pass uses, then vertical.
  at::Tensor img = keep.contiguous();
  if (out_w == s.W) {
    if (out_h == s.H) return img.clone();
    return vertical_pass_reference(img.data_ptr<uint8_t>(), 0, s.W * C, out_h, out_w, C,
                                   filter_taps(s.H, out_h, filter));
  }
  const Taps th = filter_taps(s.W, out_w, filter);
  int64_t y0 = 0, y1 = s.H;
  Taps tv;
  if (out_h != s.H) {
    tv = filter_taps(s.H, out_h, filter);
    y0 = tv.start[0];
    y1 = tv.start.back() + tv.count.back();
  }
  at::Tensor tmp = at::empty({y1 - y0, out_w, C}, at::kByte);
  const uint8_t* in = img.data_ptr<uint8_t>();
  uint8_t* t = tmp.data_ptr<uint8_t>();
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = 0; x < out_w; ++x)
      for (int64_t c = 0; c < C; ++c) {
        int32_t acc = kHalf;
        for (int64_t k = 0; k < th.count[static_cast<size_t>(x)]; ++k)
          acc += static_cast<int32_t>(in[(y * s.W + th.start[static_cast<size_t>(x)] + k) * C + c]) *
                 th.w[static_cast<size_t>(x * th.ksize + k)];
        t[((y - y0) * out_w + x) * C + c] = clip8(acc);
      }
  if (out_h == s.H) return tmp;
  return vertical_pass_reference(t, y0, out_w * C, out_h, out_w, C, tv);  // tmp's first row is source row y0
}

}  // namespace moh::datasets
