#include "vision/nn/attention_cpu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "vision/nn/cpu_simd.h"

// The vector values below live only inside the always-inlined helpers of one clone: no call passes or returns them,
// so GCC's warning about the ABI of vector values without AVX does not apply. (Its separate note for a 64-byte
// vector parameter ignores this pragma: the helpers take such values by reference.)
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moh::nn {

namespace attention_kernels {
namespace {

// W floats as one value of GCC's vector extension: one AVX-512 register at W = 16 in that clone, two AVX2 ones in the
// next, four SSE ones in the baseline. The loops below keep their running sums in such values: written as arrays
// of W floats the compiler kept W scalar registers, and summed into the output row every step went through a store
// and a load.
template <int64_t W>
struct Lanes {
  typedef float type __attribute__((vector_size(W * sizeof(float))));
};
constexpr int64_t kWide = 16, kNarrow = 8, kQuarter = 4;
using Vec = Lanes<kWide>::type;

template <int64_t W>
MOH_INLINE_INTO_CLONES typename Lanes<W>::type load(const float* p) {
  typename Lanes<W>::type v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int64_t W>
MOH_INLINE_INTO_CLONES void store(float* p, const typename Lanes<W>::type& v) {
  std::memcpy(p, &v, sizeof v);
}
MOH_INLINE_INTO_CLONES float lane_sum(const Vec& v) {
  float s = 0.f;
  for (int64_t l = 0; l < kWide; ++l) s += v[l];
  return s;
}

// The largest of x[0, n), n >= 1 (NaNs skipped here; they reach the result through the exponentials).
MOH_INLINE_INTO_CLONES float max_of(const float* x, int64_t n) {
  float m = x[0];
  int64_t j = 0;
  if (n >= kWide) {
    Vec acc = load<kWide>(x);
    for (j = kWide; j + kWide <= n; j += kWide) {
      const Vec v = load<kWide>(x + j);
      acc = v > acc ? v : acc;
    }
    for (int64_t l = 0; l < kWide; ++l) m = acc[l] > m ? acc[l] : m;
  }
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// Σ a[j] · b[j] over [0, n); b = nullptr: Σ a[j].
MOH_INLINE_INTO_CLONES float dot(const float* a, const float* b, int64_t n) {
  Vec acc = {};
  int64_t j = 0;
  for (; j + kWide <= n; j += kWide) acc += b ? load<kWide>(a + j) * load<kWide>(b + j) : load<kWide>(a + j);
  float s = lane_sum(acc);
  for (; j < n; ++j) s += b ? a[j] * b[j] : a[j];
  return s;
}

// R query rows at a time: each load of kᵀ, v or a gradient row serves R rows (R running sums in flight), where one
// row at a time left the loops waiting on loads and on each FMA's predecessor. kRows with 16 vector registers (four
// rows of two 8-lane halves fill AVX2's), kWideRows with AVX-512's 32 (block_rows()); the scratch holds kWideRows.
constexpr int64_t kRows = 4, kWideRows = 8;

// out[r][0, W) = scale[r] · Σ_i a[r·inner + i] · b[i·cols, +W) for r < R.
template <int64_t R, int64_t W>
MOH_INLINE_INTO_CLONES void product_block(const float* a, const float* b, float* out, int64_t inner, int64_t cols,
                                          const float* scale) {
  typename Lanes<W>::type acc[R] = {};
  for (int64_t i = 0; i < inner; ++i) {
    const typename Lanes<W>::type bv = load<W>(b + i * cols);
    for (int64_t r = 0; r < R; ++r) acc[r] += a[r * inner + i] * bv;
  }
  for (int64_t r = 0; r < R; ++r) store<W>(out + r * cols, acc[r] * scale[r]);
}

// out (R, cols) = diag(scale) · a (R, inner) · b (inner, cols): R query rows' scores against kᵀ (inner = d), or R
// rows of probabilities times v (inner = nk).
template <int64_t R>
MOH_INLINE_INTO_CLONES void rows_product(const float* a, const float* b, float* out, int64_t inner, int64_t cols,
                                         const float* scale) {
  int64_t j = 0;
  for (; j + kWide <= cols; j += kWide) product_block<R, kWide>(a, b + j, out + j, inner, cols, scale);
  for (; j + kNarrow <= cols; j += kNarrow) product_block<R, kNarrow>(a, b + j, out + j, inner, cols, scale);
  for (; j + kQuarter <= cols; j += kQuarter) product_block<R, kQuarter>(a, b + j, out + j, inner, cols, scale);
  for (; j < cols; ++j)
    for (int64_t r = 0; r < R; ++r) {
      float acc = 0.f;
      for (int64_t i = 0; i < inner; ++i) acc += a[r * inner + i] * b[i * cols + j];
      out[r * cols + j] = acc * scale[r];
    }
}

// row[0, W) += Σ_r a[r] · w[r·nk, +W).
template <int64_t R, int64_t W>
MOH_INLINE_INTO_CLONES void add_block(const float* a, const float* w, float* row, int64_t nk) {
  typename Lanes<W>::type tv = load<W>(row);
  for (int64_t r = 0; r < R; ++r) tv += a[r] * load<W>(w + r * nk);
  store<W>(row, tv);
}

// t (d, nk) += scale · x (R, d)ᵀ · w (R, nk): each element of t read and written once per R rows.
template <int64_t R>
MOH_INLINE_INTO_CLONES void rows_add_outer(const float* x, const float* w, float* t, int64_t nk, int64_t d,
                                           float scale) {
  for (int64_t c = 0; c < d; ++c) {
    float a[R];
    for (int64_t r = 0; r < R; ++r) a[r] = x[r * d + c] * scale;
    float* row = t + c * nk;
    int64_t j = 0;
    for (; j + kWide <= nk; j += kWide) add_block<R, kWide>(a, w + j, row + j, nk);
    for (; j + kQuarter <= nk; j += kQuarter) add_block<R, kQuarter>(a, w + j, row + j, nk);
    for (; j < nk; ++j)
      for (int64_t r = 0; r < R; ++r) row[j] += a[r] * w[r * nk + j];
  }
}

// Rows [i, i + R) of the forward: p (R, nk) scratch.
template <int64_t R>
MOH_INLINE_INTO_CLONES void forward_rows(const float* q, const float* kt, const float* v, float* o, float* lse,
                                         int64_t nk, int64_t d, float scale, float* p) {
  float scales[R], inv[R];
  std::fill(scales, scales + R, scale);
  rows_product<R>(q, kt, p, d, nk, scales);
  for (int64_t r = 0; r < R; ++r) {
    float* pr = p + r * nk;
    const float m = max_of(pr, nk);
    for (int64_t j = 0; j < nk; ++j) pr[j] = simd::exp_clamped(pr[j] - m);
    const float l = dot(pr, nullptr, nk);
    inv[r] = 1.f / l;
    lse[r] = m + std::log(l);
  }
  rows_product<R>(p, v, o, nk, d, inv);
}

// Rows [i, i + R) of the backward (see backward below): p and ds (R, nk) scratch each.
template <int64_t R>
MOH_INLINE_INTO_CLONES void backward_rows(const float* q, const float* k, const float* kt, const float* vt,
                                          const float* dout, const float* lse, float* dq, float* dkt, float* dvt,
                                          int64_t nk, int64_t d, float scale, float* p, float* ds) {
  float scales[R], ones[R];
  std::fill(scales, scales + R, scale);
  std::fill(ones, ones + R, 1.f);
  rows_product<R>(q, kt, p, d, nk, scales);
  rows_product<R>(dout, vt, ds, d, nk, ones);
  for (int64_t r = 0; r < R; ++r) {
    float *pr = p + r * nk, *dr = ds + r * nk;
    for (int64_t j = 0; j < nk; ++j) pr[j] = simd::exp_clamped(pr[j] - lse[r]);
    const float pd = dot(pr, dr, nk);
    for (int64_t j = 0; j < nk; ++j) dr[j] = pr[j] * (dr[j] - pd);
  }
  rows_product<R>(ds, k, dq, nk, d, scales);
  rows_add_outer<R>(q, ds, dkt, nk, d, scale);
  rows_add_outer<R>(dout, p, dvt, nk, d, 1.f);
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
// x (rows, d) at row stride ld → y (rows, d) contiguous, and back.
template <class T>
MOH_INLINE_INTO_CLONES void widen_rows(const T* x, int64_t ld, float* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) widen_all(x + r * ld, y + r * d, d);
}
template <class T>
MOH_INLINE_INTO_CLONES void narrow_rows(const float* x, T* y, int64_t ld, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) narrow_all(x + r * d, y + r * ld, d);
}
// a (rows, cols) at row stride ld → t (cols, rows) in fp32; t (rows, cols) in fp32 → a (cols, rows) at row stride ld.
template <class T>
MOH_INLINE_INTO_CLONES void transpose_in(const T* a, int64_t ld, float* t, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = widen(a[r * ld + c]);
}
// (Row by row of `a`: written column by column, rows of `a` far apart would each be a cache line touched d times.)
template <class T>
MOH_INLINE_INTO_CLONES void transpose_out(const float* t, T* a, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) a[c * ld + r] = narrow<T>(t[r * cols + c]);
}

// R query rows at a time; what is left past the last block of R in blocks of kRows, then row by row.
template <int64_t R, class T>
MOH_INLINE_INTO_CLONES void forward_group(const T* q, const T* k, const T* v, T* o, float* lse, int64_t n, int64_t nk,
                                          int64_t d, float scale, const Strides& s, float* scratch) {
  float *kt = scratch, *vf = kt + d * nk;                        // kᵀ (d, nk), v (nk, d)
  float *p = vf + nk * d, *qr = p + R * nk, *orow = qr + R * d;  // (R, nk): scores, then e^(s − max)
  transpose_in(k, s.k, kt, nk, d);
  widen_rows(v, s.v, vf, nk, d);
  for (int64_t i = 0; i < n;) {
    const int64_t rows = i + R <= n ? R : i + kRows <= n ? kRows : 1;
    widen_rows(q + i * s.q, s.q, qr, rows, d);
    if (rows == R)
      forward_rows<R>(qr, kt, vf, orow, lse + i, nk, d, scale, p);
    else if (rows == kRows)
      forward_rows<kRows>(qr, kt, vf, orow, lse + i, nk, d, scale, p);
    else
      forward_rows<1>(qr, kt, vf, orow, lse + i, nk, d, scale, p);
    narrow_rows(orow, o + i * s.o, s.o, rows, d);
    i += rows;
  }
}

template <class T>
MOH_INLINE_INTO_CLONES bool all_zero(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (widen(x[i]) != 0.f) return false;
  return true;
}

// With p = e^(s − lse) a row's probabilities and dp = dout_i · vᵀ: ds = p ⊙ (dp − Σ_j p dp) (softmax's backward,
// the sum standing for dout_i · o_i), dq_i = scale · ds · k, dk += scale · ds ⊗ q_i, dv += p ⊗ dout_i. A query row
// whose dout is zero has ds = 0 and adds nothing: such rows (MoH's unselected (token, head) pairs, gated by 0) are
// skipped and their dq rows set to zero; the other rows keep their order, so every sum is the one computed without
// the skip (bit for bit, up to the sign of an exact zero), and the same for any R (dk and dv take the rows one after
// the other whatever the block).
template <int64_t R, class T>
MOH_INLINE_INTO_CLONES void backward_group(const T* q, const T* k, const T* v, const T* dout, const float* lse, T* dq,
                                           T* dk, T* dv, int64_t n, int64_t nk, int64_t d, float scale,
                                           const Strides& s, float* scratch) {
  float *kt = scratch, *vt = kt + d * nk, *kf = vt + d * nk, *dkt = kf + d * nk, *dvt = dkt + d * nk;
  float *p = dvt + d * nk, *ds = p + R * nk;                     // (R, nk) each
  float *qr = ds + R * nk, *gr = qr + R * d, *dqr = gr + R * d;  // (R, d) each
  transpose_in(k, s.k, kt, nk, d);
  transpose_in(v, s.v, vt, nk, d);
  widen_rows(k, s.k, kf, nk, d);
  std::fill(dkt, dkt + 2 * d * nk, 0.f);
  int64_t rows[R];  // the query rows gathered into qr and gr
  float lr[R];      // and their log-sum-exps
  int64_t m = 0;
  for (int64_t i = 0; i <= n; ++i) {
    if (i < n && all_zero(dout + i * s.o, d)) {
      std::fill(dq + i * s.dq, dq + i * s.dq + d, narrow<T>(0.f));
      continue;
    }
    if (i < n) {
      widen_all(q + i * s.q, qr + m * d, d);
      widen_all(dout + i * s.o, gr + m * d, d);
      rows[m] = i, lr[m] = lse[i];
      if (++m < R) continue;
    }
    // A full block, or at the end what is left of one: a block of kRows when that many are left, then row by row.
    int64_t done = 0;
    if (m == R)
      backward_rows<R>(qr, kf, kt, vt, gr, lr, dqr, dkt, dvt, nk, d, scale, p, ds), done = R;
    else if (m >= kRows)
      backward_rows<kRows>(qr, kf, kt, vt, gr, lr, dqr, dkt, dvt, nk, d, scale, p, ds), done = kRows;
    for (int64_t r = done; r < m; ++r)
      backward_rows<1>(qr + r * d, kf, kt, vt, gr + r * d, lr + r, dqr + r * d, dkt, dvt, nk, d, scale, p, ds);
    for (int64_t r = 0; r < m; ++r) narrow_all(dqr + r * d, dq + rows[r] * s.dq, d);
    m = 0;
  }
  transpose_out(dkt, dk, s.dk, d, nk);
  transpose_out(dvt, dv, s.dv, d, nk);
}

}  // namespace

namespace {
std::atomic<int> g_block_rows{0};  // 0: by the CPU
}  // namespace

int block_rows() {
  if (const int set = g_block_rows.load(std::memory_order_relaxed)) return set;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool wide = __builtin_cpu_supports("avx512f");
  return wide ? static_cast<int>(kWideRows) : static_cast<int>(kRows);
#else
  return static_cast<int>(kRows);
#endif
}

void set_block_rows(int rows) {
  TORCH_CHECK(rows == 0 || rows == kRows || rows == kWideRows, "attention_kernels::set_block_rows: 0, 4 or 8");
  g_block_rows.store(rows, std::memory_order_relaxed);
}

int64_t forward_scratch(int64_t nk, int64_t d) {
  return 2 * d * nk + kWideRows * nk + 2 * kWideRows * d;
}
int64_t backward_scratch(int64_t nk, int64_t d) {
  return 5 * d * nk + 2 * kWideRows * nk + 3 * kWideRows * d;
}

MOH_CPU_CLONES void forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t n, int64_t nk,
                            int64_t d, float scale, const Strides& s, float* scratch) {
  if (block_rows() == kWideRows)
    forward_group<kWideRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch);
  else
    forward_group<kRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch);
}
MOH_CPU_CLONES void forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* o, float* lse, int64_t n,
                            int64_t nk, int64_t d, float scale, const Strides& s, float* scratch) {
  if (block_rows() == kWideRows)
    forward_group<kWideRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch);
  else
    forward_group<kRows>(q, k, v, o, lse, n, nk, d, scale, s, scratch);
}

MOH_CPU_CLONES void backward(const float* q, const float* k, const float* v, const float* dout, const float* lse,
                             float* dq, float* dk, float* dv, int64_t n, int64_t nk, int64_t d, float scale,
                             const Strides& s, float* scratch) {
  if (block_rows() == kWideRows)
    backward_group<kWideRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
  else
    backward_group<kRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
}
MOH_CPU_CLONES void backward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                             const float* lse, uint16_t* dq, uint16_t* dk, uint16_t* dv, int64_t n, int64_t nk,
                             int64_t d, float scale, const Strides& s, float* scratch) {
  if (block_rows() == kWideRows)
    backward_group<kWideRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
  else
    backward_group<kRows>(q, k, v, dout, lse, dq, dk, dv, n, nk, d, scale, s, scratch);
}

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

template <class T>
void forward_groups(const Operand& q, const Operand& k, const Operand& v, const Operand& o, at::Tensor& lse,
                    float scale) {
  const int64_t G = static_cast<int64_t>(q.offset.size()), n = q.t.size(-2), nk = k.t.size(-2), d = q.t.size(-1);
  const attention_kernels::Strides s{q.ld, k.ld, v.ld, o.ld, 0, 0, 0};
  float* lp = lse.data_ptr<float>();
  for_groups(G, attention_kernels::forward_scratch(nk, d), [&](int64_t g, float* scratch) {
    attention_kernels::forward(rows_of<const T>(q, g), rows_of<const T>(k, g), rows_of<const T>(v, g), rows_of<T>(o, g),
                               lp + g * n, n, nk, d, scale, s, scratch);
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
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale) {
    AttentionCpuResult r = attention_cpu_forward(q, k, v, scale);
    ctx->save_for_backward({q, k, v, r.lse});
    ctx->saved_data["scale"] = scale;
    return r.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto g =
        attention_cpu_backward(grads[0], saved[0], saved[1], saved[2], saved[3], ctx->saved_data["scale"].toDouble());
    return {g[0], g[1], g[2], at::Tensor()};
  }
};

bool cpu_float(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

}  // namespace

AttentionCpuResult attention_cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(attention_cpu_applies(q, k, v), "attention_cpu: CPU fp32/bf16 q (..., Nq, d), k and v (..., Nk, d)");
  const at::ScalarType type = storage_type(q, k, v);
  const Operand qg = operand(q, type), kg = operand(k, type), vg = operand(v, type);
  const Operand o = operand(dense_like(q, type), type);
  at::Tensor lse = at::empty({static_cast<int64_t>(qg.offset.size()), q.size(-2)}, q.options().dtype(at::kFloat));
  if (type == at::kBFloat16)
    forward_groups<uint16_t>(qg, kg, vg, o, lse, static_cast<float>(scale));
  else
    forward_groups<float>(qg, kg, vg, o, lse, static_cast<float>(scale));
  std::vector<int64_t> lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  return {o.t, lse.view(lse_shape)};
}

std::array<at::Tensor, 3> attention_cpu_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& lse, double scale) {
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
  return attention_cpu_applies(q, k, v) && (fp32 || bf16) && q.size(-1) <= 16 && k.size(-2) >= 128;
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(attention_cpu_applies(q, k, v), "attention_cpu: CPU fp32/bf16 q (..., Nq, d), k and v (..., Nk, d)");
  return AttentionCpu::apply(q, k, v, scale);
}

}  // namespace moh::nn
