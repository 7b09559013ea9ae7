#include "vision/nn/attention_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "vision/nn/cpu_simd.h"

// The vector values below live only inside the always-inlined helpers of one instruction set's function (cpu_simd.h).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moh::nn {

namespace attention_kernels {
namespace {

using simd::exp_clamped;
using simd::load;
using simd::store;
using simd::Vec;

// Columns of every product block: kCols / W vectors of W lanes per row (two AVX2 registers, one AVX-512 one). The
// column dims of the products (keys: nk; head width: d) are padded with zeros to a multiple of it in the scratch,
// so that every block is whole.
constexpr int64_t kCols = 16;
int64_t padded(int64_t n) {
  return (n + kCols - 1) / kCols * kCols;
}

// R query rows at a time: each load of kᵀ, v or a gradient row serves R rows (R running sums in flight), where one
// row at a time left the loops waiting on loads and on each FMA's predecessor (block_rows()): kMidRows with AVX2's 16
// registers (six rows of two 8-lane sums: twelve chains keep both FMA units busy through each FMA's latency, where
// four rows' eight were short of it), kWideRows with AVX-512's 32, kRows for the baseline and for what is left past
// the last block. The scratch holds kWideRows.
constexpr int64_t kRows = 4, kMidRows = 6, kWideRows = 8;

// out[r][0, kCols) = scale[r] · Σ_i a[r·lda + i] · b[i·ldb, +kCols) for r < R.
template <int W, int64_t R>
MOH_INLINE_INTO_CLONES void product_block(const float* a, int64_t lda, const float* b, int64_t ldb, float* out,
                                          int64_t ldo, int64_t inner, const float* scale) {
  constexpr int64_t C = kCols / W;
  Vec<W> acc[R][C] = {};
  for (int64_t i = 0; i < inner; ++i) {
    Vec<W> bv[C];
    for (int64_t c = 0; c < C; ++c) bv[c] = load<W>(b + i * ldb + c * W);
    for (int64_t r = 0; r < R; ++r) {
      const float ar = a[r * lda + i];
      for (int64_t c = 0; c < C; ++c) acc[r][c] += ar * bv[c];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) store<W>(out + r * ldo + c * W, acc[r][c] * scale[r]);
}

// out (R, cols) = diag(scale) · a (R, inner) · b (inner, cols), cols a multiple of kCols, rows of a `lda` apart and of
// b and out `cols` apart: R query rows' scores against kᵀ (inner = d), or R rows of probabilities times v (inner = nk).
template <int W, int64_t R>
MOH_INLINE_INTO_CLONES void rows_product(const float* a, int64_t lda, const float* b, float* out, int64_t inner,
                                         int64_t cols, const float* scale) {
  for (int64_t j = 0; j < cols; j += kCols) product_block<W, R>(a, lda, b + j, cols, out + j, cols, inner, scale);
}

// out[r][0, kCols) += Σ_i a[i·lda + r] · (bscale · b[i·ldb, +kCols)) for r < R: R keys' gradient rows taken over
// the query rows i of a tile (a: the tile's probabilities or score gradients, one row per query, key j at column j).
// The running sums start from out, so that each element is one chain of FMAs over the query rows in order, whatever
// the tiles and blocks.
template <int W, int64_t R>
MOH_INLINE_INTO_CLONES void add_product_block(const float* a, int64_t lda, const float* b, int64_t ldb, float bscale,
                                              float* out, int64_t ldo, int64_t inner) {
  constexpr int64_t C = kCols / W;
  Vec<W> acc[R][C];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) acc[r][c] = load<W>(out + r * ldo + c * W);
  for (int64_t i = 0; i < inner; ++i) {
    Vec<W> bv[C];
    for (int64_t c = 0; c < C; ++c) bv[c] = load<W>(b + i * ldb + c * W) * bscale;
    for (int64_t r = 0; r < R; ++r) {
      const float ar = a[i * lda + r];
      for (int64_t c = 0; c < C; ++c) acc[r][c] += ar * bv[c];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) store<W>(out + r * ldo + c * W, acc[r][c]);
}

// out (nk, dp) += aᵀ · (bscale · b) for the m query rows of a tile: a (m, nkp), b (m, dp). Key rows in blocks of
// the instruction set's rows (as block_rows()), then one by one.
template <int W>
MOH_INLINE_INTO_CLONES void tile_add_outer(const float* a, int64_t nkp, const float* b, int64_t dp, float bscale,
                                           float* out, int64_t nk, int64_t m) {
  constexpr int64_t R = W == 16 ? kWideRows : W == 8 ? kMidRows : kRows;
  int64_t j = 0;
  for (; j + R <= nk; j += R)
    for (int64_t c = 0; c < dp; c += kCols)
      add_product_block<W, R>(a + j, nkp, b + c, dp, bscale, out + j * dp + c, dp, m);
  for (; j < nk; ++j)
    for (int64_t c = 0; c < dp; c += kCols)
      add_product_block<W, 1>(a + j, nkp, b + c, dp, bscale, out + j * dp + c, dp, m);
}

// The largest of x[0, n) (the padding [n, nkp) set to -∞ first).
template <int W>
MOH_INLINE_INTO_CLONES float row_max(float* x, int64_t n, int64_t nkp) {
  for (int64_t j = n; j < nkp; ++j) x[j] = -INFINITY;
  Vec<W> acc = load<W>(x);
  for (int64_t j = W; j < nkp; j += W) acc = simd::max<W>(acc, load<W>(x + j));
  return simd::lane_max<W>(acc);
}

// x[j] = e^(x[j] − shift) for j < n, 0 over the padding [n, nkp).
template <int W>
MOH_INLINE_INTO_CLONES void exp_shifted(float* x, float shift, int64_t n, int64_t nkp) {
  for (int64_t j = 0; j < nkp; j += W) store<W>(x + j, exp_clamped<W>(load<W>(x + j) - shift));
  for (int64_t j = n; j < nkp; ++j) x[j] = 0.f;
}

// Σ a[j] · b[j] over [0, nkp); b = nullptr: Σ a[j].
template <int W>
MOH_INLINE_INTO_CLONES float dot(const float* a, const float* b, int64_t nkp) {
  Vec<W> acc = {};
  for (int64_t j = 0; j < nkp; j += W) acc += b ? load<W>(a + j) * load<W>(b + j) : load<W>(a + j);
  return simd::lane_sum<W>(acc);
}

// Rows [i, i + R) of the forward: q (R, d), kᵀ (d, nkp), v (nk, dp) → o (R, dp), lse (R); p (R, nkp) scratch.
template <int W, int64_t R>
MOH_INLINE_INTO_CLONES void forward_rows(const float* q, const float* kt, const float* v, float* o, float* lse,
                                         int64_t nk, int64_t d, float scale, float* p) {
  const int64_t nkp = padded(nk), dp = padded(d);
  float scales[R], inv[R];
  std::fill(scales, scales + R, scale);
  rows_product<W, R>(q, d, kt, p, d, nkp, scales);
  for (int64_t r = 0; r < R; ++r) {
    float* pr = p + r * nkp;
    const float m = row_max<W>(pr, nk, nkp);
    exp_shifted<W>(pr, m, nk, nkp);
    const float l = dot<W>(pr, nullptr, nkp);
    inv[r] = 1.f / l;
    lse[r] = m + std::log(l);
  }
  rows_product<W, R>(p, nkp, v, o, nk, dp, inv);
}

// R query rows of a backward tile (see backward_group below): q and dout (R, dp) → their probabilities p and score
// gradients ds (R, nkp), and dq (R, dp).
template <int W, int64_t R>
MOH_INLINE_INTO_CLONES void backward_rows(const float* q, const float* dout, const float* lse, const float* kt,
                                          const float* vt, const float* k, float* p, float* ds, float* dq, int64_t nk,
                                          int64_t d, float scale) {
  const int64_t nkp = padded(nk), dp = padded(d);
  float scales[R], ones[R];
  std::fill(scales, scales + R, scale);
  std::fill(ones, ones + R, 1.f);
  rows_product<W, R>(q, dp, kt, p, d, nkp, scales);
  rows_product<W, R>(dout, dp, vt, ds, d, nkp, ones);
  for (int64_t r = 0; r < R; ++r) {
    float *pr = p + r * nkp, *dr = ds + r * nkp;
    exp_shifted<W>(pr, lse[r], nk, nkp);
    const float pd = dot<W>(pr, dr, nkp);
    for (int64_t j = 0; j < nkp; j += W) store<W>(dr + j, load<W>(pr + j) * (load<W>(dr + j) - pd));
  }
  rows_product<W, R>(ds, nkp, k, dq, nk, dp, scales);
}

// A stored element as fp32 and back: fp32 as is, bf16 (its raw bits) widened exactly and rounded to nearest even.
MOH_INLINE_INTO_CLONES float widen(float x) {
  return x;
}
MOH_INLINE_INTO_CLONES float widen(uint16_t x) {
  return simd::bf16_to_float(x);
}
template <class T>
MOH_INLINE_INTO_CLONES T narrow(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return simd::float_to_bf16(x);
}
template <class T>
MOH_INLINE_INTO_CLONES void widen_all(const T* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = widen(x[i]);
}
template <class T>
MOH_INLINE_INTO_CLONES void narrow_all(const float* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = narrow<T>(x[i]);
}
// x (rows, d) at row stride ld → y (rows, ldy) in fp32, the columns [d, ldy) zero; and back from (rows, ldx).
template <class T>
MOH_INLINE_INTO_CLONES void widen_rows(const T* x, int64_t ld, float* y, int64_t ldy, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    widen_all(x + r * ld, y + r * ldy, d);
    std::fill(y + r * ldy + d, y + (r + 1) * ldy, 0.f);
  }
}
template <class T>
MOH_INLINE_INTO_CLONES void narrow_rows(const float* x, int64_t ldx, T* y, int64_t ld, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) narrow_all(x + r * ldx, y + r * ld, d);
}
// a (rows, cols) at row stride ld → t (cols, padded(rows)) in fp32, the columns past `rows` zero. Eight rows of `a` at
// a time: each row of t gets eight contiguous values per pass, where one row of `a` at a time wrote one value into each
// of `cols` cache lines.
template <class T>
MOH_INLINE_INTO_CLONES void transpose_in(const T* a, int64_t ld, float* t, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 8;
  const int64_t ldt = padded(rows);
  for (int64_t c = 0; c < cols; ++c) std::fill(t + c * ldt + rows, t + (c + 1) * ldt, 0.f);
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = r0 + kBlock < rows ? r0 + kBlock : rows;
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = r0; r < r1; ++r) t[c * ldt + r] = widen(a[r * ld + c]);
  }
}

// The live query rows (all, or those `live` marks) R at a time; what is left past the last block of R in blocks of
// kRows, then row by row. A row that is not live is not computed: its output is zero and its lse +∞ (MoH's (token,
// head) pairs whose gate is 0: the gate multiplies the output by 0, and the backward skips the row, its gradient 0).
// A live row's values do not depend on which rows around it are live (each row's sums are its own).
template <int W, int64_t R, class T>
MOH_INLINE_INTO_CLONES void forward_group(const T* q, const T* k, const T* v, T* o, float* lse, int64_t n, int64_t nk,
                                          int64_t d, float scale, const Strides& s, float* scratch,
                                          const uint8_t* live) {
  const int64_t nkp = padded(nk), dp = padded(d);
  float *kt = scratch, *vf = kt + d * nkp;                         // kᵀ (d, nkp), v (nk, dp)
  float *p = vf + nk * dp, *qr = p + R * nkp, *orow = qr + R * d;  // (R, nkp): scores, then e^(s − max)
  float* lr = orow + R * dp;                                       // (R): the gathered rows' lse
  transpose_in(k, s.k, kt, nk, d);
  widen_rows(v, s.v, vf, dp, nk, d);
  int64_t rows[R];  // the live query rows gathered into qr
  int64_t m = 0;
  for (int64_t i = 0; i <= n; ++i) {
    if (i < n && live && !live[i]) {
      std::fill(o + i * s.o, o + i * s.o + d, narrow<T>(0.f));
      lse[i] = INFINITY;
      continue;
    }
    if (i < n) {
      widen_rows(q + i * s.q, s.q, qr + m * d, d, 1, d);
      rows[m] = i;
      if (++m < R) continue;
    }
    for (int64_t r = 0; r < m;) {  // a full block, or at the end what is left of one
      const int64_t at = r;
      if (m - r == R)
        forward_rows<W, R>(qr, kt, vf, orow, lr, nk, d, scale, p), r += R;
      else if (m - r >= kRows)
        forward_rows<W, kRows>(qr + at * d, kt, vf, orow + at * dp, lr + at, nk, d, scale, p), r += kRows;
      else
        forward_rows<W, 1>(qr + at * d, kt, vf, orow + at * dp, lr + at, nk, d, scale, p), r += 1;
    }
    for (int64_t r = 0; r < m; ++r) {
      narrow_rows(orow + r * dp, dp, o + rows[r] * s.o, s.o, 1, d);
      lse[rows[r]] = lr[r];
    }
    m = 0;
  }
}

template <class T>
MOH_INLINE_INTO_CLONES bool all_zero(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (widen(x[i]) != 0.f) return false;
  return true;
}

// Query rows per backward tile: their probabilities and score gradients (2 · tile · nkp floats) stay in the scratch
// while dk and dv take the whole tile in one pass each (per block of query rows, those two (nk, d) sums went through
// memory once per block).
constexpr int64_t kMaxTile = 64, kTileFloats = int64_t{1} << 15;
int64_t tile_rows(int64_t nkp) {
  const int64_t t = kTileFloats / (2 * nkp) / kWideRows * kWideRows;
  return t < kWideRows ? kWideRows : t > kMaxTile ? kMaxTile : t;
}

// The m gathered rows of a tile: blocks of R, what is left in blocks of kRows, then row by row.
template <int W, int64_t R>
MOH_INLINE_INTO_CLONES void backward_tile_rows(const float* qr, const float* gr, const float* lr, const float* kt,
                                               const float* vt, const float* kf, float* p, float* ds, float* dqr,
                                               int64_t m, int64_t nk, int64_t d, float scale) {
  const int64_t nkp = padded(nk), dp = padded(d);
  for (int64_t r = 0; r < m;) {
    const int64_t at = r;
    if (r + R <= m)
      backward_rows<W, R>(qr + at * dp, gr + at * dp, lr + at, kt, vt, kf, p + at * nkp, ds + at * nkp, dqr + at * dp,
                          nk, d, scale),
          r += R;
    else if (r + kRows <= m)
      backward_rows<W, kRows>(qr + at * dp, gr + at * dp, lr + at, kt, vt, kf, p + at * nkp, ds + at * nkp,
                              dqr + at * dp, nk, d, scale),
          r += kRows;
    else
      backward_rows<W, 1>(qr + at * dp, gr + at * dp, lr + at, kt, vt, kf, p + at * nkp, ds + at * nkp, dqr + at * dp,
                          nk, d, scale),
          r += 1;
  }
}

// With p = e^(s − lse) a row's probabilities and dp = dout_i · vᵀ: ds = p ⊙ (dp − Σ_j p dp) (softmax's backward,
// the sum standing for dout_i · o_i), dq_i = scale · ds · k, dk += scale · ds ⊗ q_i, dv += p ⊗ dout_i. A query row
// whose dout is zero has ds = 0 and adds nothing: such rows (MoH's unselected (token, head) pairs, gated by 0) are
// skipped and their dq rows set to zero; the other rows keep their order, so every sum is the one computed without
// the skip (bit for bit, up to the sign of an exact zero), and the same for any R and tile (dk and dv take the rows
// one after the other).
template <int W, int64_t R, class T>
MOH_INLINE_INTO_CLONES void backward_group(const T* q, const T* k, const T* v, const T* dout, const float* lse, T* dq,
                                           T* dk, T* dv, int64_t n, int64_t nk, int64_t d, float scale,
                                           const Strides& s, float* scratch) {
  const int64_t nkp = padded(nk), dp = padded(d), tile = tile_rows(nkp);
  float *kt = scratch, *vt = kt + d * nkp, *kf = vt + d * nkp;  // kᵀ, vᵀ (d, nkp); k (nk, dp)
  float *dkf = kf + nk * dp, *dvf = dkf + nk * dp;              // dk, dv (nk, dp)
  float *p = dvf + nk * dp, *ds = p + tile * nkp;               // (tile, nkp) each
  float *qr = ds + tile * nkp, *gr = qr + tile * dp, *dqr = gr + tile * dp, *lr = dqr + tile * dp;  // (tile, dp)
  transpose_in(k, s.k, kt, nk, d);
  transpose_in(v, s.v, vt, nk, d);
  widen_rows(k, s.k, kf, dp, nk, d);
  std::fill(dkf, dkf + 2 * nk * dp, 0.f);
  int64_t rows[kMaxTile];  // the query rows gathered into qr and gr
  int64_t m = 0;
  for (int64_t i = 0; i <= n; ++i) {
    if (i < n && all_zero(dout + i * s.o, d)) {
      std::fill(dq + i * s.dq, dq + i * s.dq + d, narrow<T>(0.f));
      continue;
    }
    if (i < n) {
      widen_rows(q + i * s.q, s.q, qr + m * dp, dp, 1, d);
      widen_rows(dout + i * s.o, s.o, gr + m * dp, dp, 1, d);
      rows[m] = i, lr[m] = lse[i];
      if (++m < tile) continue;
    }
    if (m == 0) continue;
    backward_tile_rows<W, R>(qr, gr, lr, kt, vt, kf, p, ds, dqr, m, nk, d, scale);
    tile_add_outer<W>(p, nkp, gr, dp, 1.f, dvf, nk, m);
    tile_add_outer<W>(ds, nkp, qr, dp, scale, dkf, nk, m);
    for (int64_t r = 0; r < m; ++r) narrow_all(dqr + r * dp, dq + rows[r] * s.dq, d);
    m = 0;
  }
  narrow_rows(dkf, dp, dk, s.dk, nk, d);
  narrow_rows(dvf, dp, dv, s.dv, nk, d);
}

template <int W, class T>
MOH_INLINE_INTO_CLONES void forward_any(const T* q, const T* k, const T* v, T* o, float* lse, int64_t n, int64_t nk,
                                        int64_t d, float scale, const Strides& s, float* scratch, const uint8_t* live) {
  switch (block_rows()) {
    case kWideRows:
      return forward_group<W, kWideRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch, live);
    case kMidRows:
      return forward_group<W, kMidRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch, live);
    default:
      return forward_group<W, kRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch, live);
  }
}

template <int W, class T>
MOH_INLINE_INTO_CLONES void backward_any(const T* q, const T* k, const T* v, const T* dout, const float* lse, T* dq,
                                         T* dk, T* dv, int64_t n, int64_t nk, int64_t d, float scale, const Strides& s,
                                         float* scratch) {
  switch (block_rows()) {
    case kWideRows:
      return backward_group<W, kWideRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
    case kMidRows:
      return backward_group<W, kMidRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
    default:
      return backward_group<W, kRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
  }
}

std::atomic<int> g_block_rows{0};  // 0: by the CPU

}  // namespace

int block_rows() {
  if (const int set = g_block_rows.load(std::memory_order_relaxed)) return set;
  switch (simd::isa()) {
    case simd::Isa::avx512:
      return static_cast<int>(kWideRows);
    case simd::Isa::avx2:
      return static_cast<int>(kMidRows);
    case simd::Isa::baseline:
      break;
  }
  return static_cast<int>(kRows);
}

void set_block_rows(int rows) {
  TORCH_CHECK(rows == 0 || rows == kRows || rows == kMidRows || rows == kWideRows,
              "attention_kernels::set_block_rows: 0, 4, 6 or 8");
  g_block_rows.store(rows, std::memory_order_relaxed);
}

int64_t forward_scratch(int64_t nk, int64_t d) {
  const int64_t nkp = padded(nk), dp = padded(d);
  return d * nkp + nk * dp + kWideRows * (nkp + d + dp + 1);
}
int64_t backward_scratch(int64_t nk, int64_t d) {
  const int64_t nkp = padded(nk), dp = padded(d), tile = tile_rows(nkp);
  return 2 * d * nkp + 3 * nk * dp + tile * (2 * nkp + 3 * dp + 1);
}

MOH_SIMD_VARIANTS(forward, forward_any,
                  (const float* q, const float* k, const float* v, float* o, float* lse, int64_t n, int64_t nk,
                   int64_t d, float scale, const Strides& s, float* scratch, const uint8_t* live),
                  (q, k, v, o, lse, n, nk, d, scale, s, scratch, live))
MOH_SIMD_VARIANTS(forward, forward_any,
                  (const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* o, float* lse, int64_t n,
                   int64_t nk, int64_t d, float scale, const Strides& s, float* scratch, const uint8_t* live),
                  (q, k, v, o, lse, n, nk, d, scale, s, scratch, live))
MOH_SIMD_VARIANTS(backward, backward_any,
                  (const float* q, const float* k, const float* v, const float* dout, const float* lse, float* dq,
                   float* dk, float* dv, int64_t n, int64_t nk, int64_t d, float scale, const Strides& s,
                   float* scratch),
                  (q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch))
MOH_SIMD_VARIANTS(backward, backward_any,
                  (const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout, const float* lse,
                   uint16_t* dq, uint16_t* dk, uint16_t* dv, int64_t n, int64_t nk, int64_t d, float scale,
                   const Strides& s, float* scratch),
                  (q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch))

}  // namespace attention_kernels

namespace {

// The operands' storage: bf16 when all three are, else fp32.
at::ScalarType storage_type(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const bool bf16 =
      q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16;
  return bf16 ? at::kBFloat16 : at::kFloat;
}

// An operand as the kernels read or write it: rows of d contiguous elements in `type`, each group (the leading dims
// flattened) at its own offset. Strided views (q, k, v of one qkv product; a transposed output) are read in place;
// anything else is copied first.
struct Operand {
  at::Tensor t;
  std::vector<int64_t> offset;  // elements from t's data to each group's first row
  int64_t ld = 0;               // elements between rows
};

Operand operand(const at::Tensor& x, at::ScalarType type) {
  Operand o;
  o.t = x.scalar_type() == type && x.stride(-1) == 1 ? x : at::empty(x.sizes(), x.options().dtype(type)).copy_(x);
  const int64_t lead = o.t.dim() - 2;
  int64_t groups = 1;
  for (int64_t i = 0; i < lead; ++i) groups *= o.t.size(i);
  o.offset.resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    int64_t rest = g, off = 0;
    for (int64_t i = lead - 1; i >= 0; --i) off += (rest % o.t.size(i)) * o.t.stride(i), rest /= o.t.size(i);
    o.offset[static_cast<size_t>(g)] = off;
  }
  o.ld = o.t.stride(-2);
  return o;
}

// A fresh dense tensor of x's shape in `type` whose dims lie in memory in the order of x's strides (the last one
// last): an output or gradient in the layout of its operand. For q (B, h, N, d) viewed from a (B, N, h·d) product
// that is (B, N, h, d) memory, which the output projection then reads as (B, N, h·d) without a copy.
at::Tensor dense_like(const at::Tensor& x, at::ScalarType type) {
  const int64_t D = x.dim();
  std::vector<int64_t> order(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end() - 1, [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  std::vector<int64_t> sizes, back(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) sizes.push_back(x.size(order[static_cast<size_t>(i)]));
  for (int64_t i = 0; i < D; ++i) back[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  return at::empty(sizes, x.options().dtype(type)).permute(back);
}

// body(g, scratch) for every group g in [0, groups), in parallel, each thread with its own scratch of `floats`.
void for_groups(int64_t groups, int64_t floats, const std::function<void(int64_t, float*)>& body) {
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(floats));
    for (int64_t g = begin; g < end; ++g) body(g, scratch.data());
  });
}

// fp32 tensors as float*, bf16 ones as their raw bits; group g's first row.
template <class T>
T* rows_of(const Operand& x, int64_t g) {
  return static_cast<T*>(x.t.data_ptr()) + x.offset[static_cast<size_t>(g)];
}

// `live`: (G, n) uint8 contiguous, or undefined (every row live).
template <class T>
void forward_groups(const Operand& q, const Operand& k, const Operand& v, const Operand& o, at::Tensor& lse,
                    float scale, const at::Tensor& live) {
  const int64_t G = static_cast<int64_t>(q.offset.size()), n = q.t.size(-2), nk = k.t.size(-2), d = q.t.size(-1);
  const attention_kernels::Strides s{q.ld, k.ld, v.ld, o.ld, 0, 0, 0};
  float* lp = lse.data_ptr<float>();
  const uint8_t* lv = live.defined() ? live.data_ptr<uint8_t>() : nullptr;
  for_groups(G, attention_kernels::forward_scratch(nk, d), [&](int64_t g, float* scratch) {
    attention_kernels::forward(rows_of<const T>(q, g), rows_of<const T>(k, g), rows_of<const T>(v, g), rows_of<T>(o, g),
                               lp + g * n, n, nk, d, scale, s, scratch, lv ? lv + g * n : nullptr);
  });
}

template <class T>
void backward_groups(const Operand& q, const Operand& k, const Operand& v, const Operand& dout, const at::Tensor& lse,
                     const Operand& dq, const Operand& dk, const Operand& dv, float scale) {
  const int64_t G = static_cast<int64_t>(q.offset.size()), n = q.t.size(-2), nk = k.t.size(-2), d = q.t.size(-1);
  const attention_kernels::Strides s{q.ld, k.ld, v.ld, dout.ld, dq.ld, dk.ld, dv.ld};
  const float* lp = lse.data_ptr<float>();
  for_groups(G, attention_kernels::backward_scratch(nk, d), [&](int64_t g, float* scratch) {
    attention_kernels::backward(rows_of<const T>(q, g), rows_of<const T>(k, g), rows_of<const T>(v, g),
                                rows_of<const T>(dout, g), lp + g * n, rows_of<T>(dq, g), rows_of<T>(dk, g),
                                rows_of<T>(dv, g), n, nk, d, scale, s, scratch);
  });
}

struct AttentionCpu : torch::autograd::Function<AttentionCpu> {
  // `live` optional: an undefined tensor argument is no variable autograd can describe.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale, const c10::optional<at::Tensor>& live) {
    AttentionCpuResult r = attention_cpu_forward(q, k, v, scale, live.value_or(at::Tensor()));
    ctx->save_for_backward({q, k, v, r.lse});
    ctx->saved_data["scale"] = scale;
    return r.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto g =
        attention_cpu_backward(grads[0], saved[0], saved[1], saved[2], saved[3], ctx->saved_data["scale"].toDouble());
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
};

bool cpu_float(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

}  // namespace

AttentionCpuResult attention_cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                         const at::Tensor& live) {
  TORCH_CHECK(attention_cpu_applies(q, k, v), "attention_cpu: CPU fp32/bf16 q (..., Nq, d), k and v (..., Nk, d)");
  TORCH_CHECK(!live.defined() || live.sizes() == q.sizes().slice(0, q.dim() - 1),
              "attention_cpu: live rows must be (..., Nq) as q's leading dims and rows");
  RECORD_FUNCTION("moh::attention_cpu_forward", std::vector<c10::IValue>({q, k}));  // profiles: class, FLOPs
  const at::ScalarType type = storage_type(q, k, v);
  const Operand qg = operand(q, type), kg = operand(k, type), vg = operand(v, type);
  const Operand o = operand(dense_like(q, type), type);
  at::Tensor lse = at::empty({static_cast<int64_t>(qg.offset.size()), q.size(-2)}, q.options().dtype(at::kFloat));
  const at::Tensor rows = live.defined() ? live.to(at::kByte).contiguous() : at::Tensor();
  if (type == at::kBFloat16)
    forward_groups<uint16_t>(qg, kg, vg, o, lse, static_cast<float>(scale), rows);
  else
    forward_groups<float>(qg, kg, vg, o, lse, static_cast<float>(scale), rows);
  std::vector<int64_t> lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  return {o.t, lse.view(lse_shape)};
}

std::array<at::Tensor, 3> attention_cpu_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& lse, double scale) {
  RECORD_FUNCTION("moh::attention_cpu_backward", std::vector<c10::IValue>({q, k}));
  const at::ScalarType type = storage_type(q, k, v);
  const Operand qg = operand(q, type), kg = operand(k, type), vg = operand(v, type), gg = operand(dout, type);
  const Operand dq = operand(dense_like(q, type), type), dk = operand(dense_like(k, type), type),
                dv = operand(dense_like(v, type), type);
  const at::Tensor lse_rows = lse.contiguous();
  if (type == at::kBFloat16)
    backward_groups<uint16_t>(qg, kg, vg, gg, lse_rows, dq, dk, dv, static_cast<float>(scale));
  else
    backward_groups<float>(qg, kg, vg, gg, lse_rows, dq, dk, dv, static_cast<float>(scale));
  return {dq.t.to(q.scalar_type()), dk.t.to(k.scalar_type()), dv.t.to(v.scalar_type())};
}

bool attention_cpu_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!cpu_float(q) || !cpu_float(k) || !cpu_float(v) || q.dim() < 2 || q.dim() != k.dim() || k.dim() != v.dim())
    return false;
  for (int64_t i = 0; i + 2 < q.dim(); ++i)
    if (q.size(i) != k.size(i) || k.size(i) != v.size(i)) return false;
  const int64_t d = q.size(-1);
  return k.size(-1) == d && v.size(-1) == d && v.size(-2) == k.size(-2) && d <= kMaxHeadDim && q.numel() > 0 &&
         k.numel() > 0;
}

bool attention_cpu_pays(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const auto all = [&](at::ScalarType t) {
    return q.scalar_type() == t && k.scalar_type() == t && v.scalar_type() == t;
  };
  const bool fp32 = all(at::kFloat), bf16 = all(at::kBFloat16);
  const bool shape = attention_cpu_applies(q, k, v) && (fp32 || bf16) && q.size(-1) <= 16 && k.size(-2) >= 128;
  return shape && (TORCH_VERSION_MAJOR < 2 || simd::isa() == simd::Isa::avx2);
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const at::Tensor& live) {
  TORCH_CHECK(attention_cpu_applies(q, k, v), "attention_cpu: CPU fp32/bf16 q (..., Nq, d), k and v (..., Nk, d)");
  return AttentionCpu::apply(q, k, v, scale, live.defined() ? c10::optional<at::Tensor>(live) : c10::nullopt);
}

}  // namespace moh::nn
